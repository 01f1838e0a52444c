"""``fxshape plan``: the parallel plans for training on N GPUs, ranked."""

from __future__ import annotations

import argparse
import contextlib
import json

from tabulate import tabulate

from ..hardware.gpus import get_gpu
from .analyze import _job_dict
from .args import _int_list, _positive_int, _recompute_list, _torchtitan_args, setup_flag
from .shared import _titan_job


def run(args) -> int:
    from ..planning import plan
    from ..presets import load_target

    job = _titan_job(args, gpus=args.gpus)
    if job is not None:
        # --dtype defaults to bf16: only another value is known to be the user's
        given_dtype = None if args.dtype == "bf16" else args.dtype
        for opt, given, theirs in (("--global-batch", args.global_batch, job.global_batch),
                                   ("--seq-len", args.seq_len, job.seq_len),
                                   ("--dtype", given_dtype, job.dtype)):
            if given is not None and given != theirs:
                raise ValueError(f"{opt} {given} differs from the torchtitan job's {theirs}: "
                                 f"drop {opt} (the job sets it)")
        model, name = job.model(), f"torchtitan {job.name} {job.flavor}"
        gpus, batch, seq, dtype = job.gpus, job.global_batch, job.seq_len, job.dtype
    else:
        missing = [o for o, v in (("--gpus", args.gpus), ("--global-batch", args.global_batch),
                                  ("--seq-len", args.seq_len)) if v is None]
        if missing:
            raise ValueError(f"plan needs {', '.join(missing)} (or --torchtitan CONFIG)")
        model, name = load_target(args.target), args.target
        gpus, batch, seq, dtype = args.gpus, args.global_batch, args.seq_len, args.dtype
    found = plan(model, gpus=gpus, gpu=args.gpu, dtype=dtype, global_batch=batch,
                 seq_len=seq, topology=args.topology, micro_batches=args.micro_batches,
                 zero=args.zero, recompute=args.recompute, top=args.top)
    mine = _job_plan(model, job, found, args) if job is not None else None
    advice = _plan_advice(model, found, args, dtype) if args.advise else None
    if args.format == "json":
        out = found.as_dict()
        if job is not None:
            out["torchtitan"] = {**_job_dict(job), **mine}
        if advice is not None:
            out["advice"] = advice
        print(json.dumps(out, indent=2))
        return 0 if found.results else 3
    print(f"plan search: {name} on {found.gpus} x {found.gpu}, global batch "
          f"{found.global_batch} x {found.seq_len} tokens")
    rows = [(i + 1, r.candidate.label(), f"{r.step_s:.3f}", f"{r.tokens_per_s_per_gpu:,.0f}",
             f"{100 * r.mfu:.1f}%", f"{r.peak_bytes / 2**30:.1f}", f"{r.bubble_s:.3f}",
             f"{r.exposed_comm_s:.3f}") for i, r in enumerate(found.results)]
    if rows:
        print(tabulate(rows, headers=("#", "plan", "step s", "tok/s/GPU", "MFU", "peak GiB",
                                      "bubble s", "exposed comm s")))
    else:
        n = found.nearest
        over = "" if n is None else (
            f"; nearest: {n.candidate.label()} at {n.peak_bytes / 2**30:.1f} GiB, "
            f"{(n.peak_bytes - n.capacity_bytes) / 2**30:.1f} GiB over the "
            f"{n.capacity_bytes / 2**30:.0f} GiB of a {found.gpu}")
        print(f"no plan fits{over}")
    if job is not None:
        print(f"\nthe torchtitan job: {job.describe()}")
        print(f"  {mine['summary']}")
        for n in job.notes:
            print(f"  note: {n}")
    if advice is not None:
        print("\n" + _advice_text(advice))
    print("\nleft out: " + "; ".join(f"{r} ({n})" for r, n in found.dropped))
    print("notes: " + "; ".join(found.notes))
    print("plan: tp(+sp: sequence parallel) cp pp(x virtual stages) dp ep zero "
          "mb<micro-batch size>x<micro-batches> rc-<recompute>")
    return 0 if found.results else 3


def _job_plan(model, job, found, args) -> dict:
    """The torchtitan job's own plan, costed as the search costs its plans, and where it
    stands among them."""
    from ..report.build import analyze

    with contextlib.redirect_stdout(None):
        rep = analyze(model, gpu=args.gpu, dtype=job.dtype, batch_size=job.micro_batch,
                      seq_len=job.seq_len, mode="train", parallel=job.parallel,
                      topology=args.topology, provenance=None,
                      execution=job.execution, float8=job.float8)
    step = rep.step
    capacity = int(get_gpu(args.gpu).memory_gb * 1024 ** 3)
    fits = rep.memory.peak <= capacity
    tokens = job.global_batch * job.seq_len
    per_gpu = tokens / step.time_s / job.gpus
    faster = [r for r in found.results if r.step_s < step.time_s]
    best = found.best
    rank = len(faster) + 1
    summary = (f"predicted {step.time_s:.3f} s per step, {per_gpu:,.0f} tokens/s/GPU, MFU "
               f"{100 * step.mfu:.1f}%, {rep.memory.peak / 2**30:.1f} GiB"
               + ("" if fits else f" (over the {capacity / 2**30:.0f} GiB: does not fit)"))
    if best is not None and fits:
        summary += (f"; {len(faster)} searched plan(s) faster" if faster else
                    "; no searched plan is faster")
        if faster:
            summary += (f": the best, {best.candidate.label()}, {best.step_s:.3f} s "
                        f"({100 * (step.time_s / best.step_s - 1):.1f}% more tokens/s)")
    if job.execution != "eager":
        summary += " (the job runs compiled; the search compares eager plans)"
    return {"step_s": step.time_s, "tokens_per_s_per_gpu": per_gpu, "mfu": step.mfu,
            "peak_bytes": int(rep.memory.peak), "fits": fits, "rank": rank,
            "summary": summary}


def _plan_advice(model, found, args, dtype) -> dict | None:
    """``plan --advise``: the co-design advice for the best plan's workload (its micro-batch,
    tensor parallelism and dtype), each change priced on that plan's whole step."""
    from ..codesign.advise import advise

    best = found.best
    if best is None:
        return {"plan": None, "recommendations": [],
                "note": "no plan fits: nothing to advise on"}
    c = best.candidate
    adv = advise(model, gpu=args.gpu, dtype=dtype, batch_size=c.micro_batch,
                 seq_len=found.seq_len, tp=c.parallel.tp, mode="train",
                 parallel=c.parallel, recompute=c.recompute, topology=args.topology)
    return {"plan": c.label(), "recommendations": [
        {"hyperparameter": r.hyperparameter, "current": r.current, "suggested": r.suggested,
         "step_gain": r.predicted_speedup, "gemm_speedup": r.gemm_speedup,
         "param_delta": r.param_delta, "reason": r.reason} for r in adv.recommendations],
        "note": "; ".join(adv.notes) if getattr(adv, "notes", None) else ""}


def _advice_text(advice: dict) -> str:
    if not advice["recommendations"]:
        return (f"advice for the best plan ({advice['plan']}): no shape change is "
                "predicted to make it faster" if advice["plan"] else
                "advice: " + advice["note"])
    rows = [(r["hyperparameter"], r["current"], r["suggested"],
             f"{100 * (r['step_gain'] or 0):+.1f}%", f"{r['param_delta'] or 0:+,}",
             r["reason"]) for r in advice["recommendations"]]
    return (f"advice for the best plan ({advice['plan']}), each change priced on its whole "
            "step:\n" + tabulate(rows, headers=("hyperparameter", "now", "suggested",
                                                "step tokens/s", "params", "why")))


def add_parser(sub) -> argparse.ArgumentParser:
    """The ``plan`` command's parser."""
    pn = sub.add_parser("plan", help="search the parallel plans for training on N GPUs",
                        description="Enumerate the plans (tp, cp, pp, virtual stages, dp, ep, "
                                    "ZeRO, micro-batch size, recomputation) that divide the "
                                    "model and the GPUs, drop those that do not fit, and rank "
                                    "the rest by predicted step time.")
    pn.add_argument("target", nargs="?",
                    help="preset name or path to a Hugging Face config.json; none with "
                         "--torchtitan")
    pn.add_argument("--gpus", type=_positive_int, default=None,
                    help="GPUs to train on (with --torchtitan: default what its degrees "
                         "multiply to)")
    setup_flag(pn, "gpu")
    setup_flag(pn, "dtype")
    pn.add_argument("--global-batch", type=_positive_int, default=None,
                    help="sequences per optimizer step, over all GPUs (required unless "
                         "--torchtitan gives it)")
    pn.add_argument("--seq-len", type=_positive_int, default=None,
                    help="tokens per sequence (required unless --torchtitan gives it)")
    _torchtitan_args(pn)
    pn.add_argument("--advise", action="store_true",
                    help="also the shape changes that make the best plan faster, each "
                         "priced on the whole step of that plan")
    setup_flag(pn, "topology")
    pn.add_argument("--micro-batches", type=_int_list, default=(1, 2, 4),
                    help="micro-batch sizes to try, comma-separated (default 1,2,4)")
    pn.add_argument("--zero", type=_int_list, default=(0, 1, 3),
                    help="ZeRO stages to try (default 0,1,3)")
    pn.add_argument("--recompute", type=_recompute_list, default=(None, "selective", "full"),
                    help="recomputation to try: none, selective, full, op (default: none, "
                         "selective, full)")
    pn.add_argument("--top", type=_positive_int, default=10,
                    help="plans to show (default 10)")
    pn.add_argument("--format", choices=("table", "json"), default="table")
    pn.add_argument("--verbose", action="store_true",
                    help="show warnings and log lines from torch and transformers")
    pn.set_defaults(func=run)
    return pn
