"""``fxshape analyze``: a model's GEMMs, step and memory on a GPU (or a torchtitan job's)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys


from ..parallelism.plan import Parallel
from .args import plan_fields, plan_flags, plan_of_flags, _allreduce_arg, _check_plot_path, _gemv_arg, _input_spec, _kv_args, _positive_int, _quantize_args, _step_args, _torchtitan_args, _workload_args, params_arg, setup_flag, setup_keywords
from .shared import _capture_failure, _print_chrome_trace, _titan_job


#: the setup fields analyze's flags give as they parsed them (the mode and the plan are
#: read apart: --train, the plan's flags)
_FLAGS = ("gpu", "dtype", "batch_size", "seq_len", "attention", "provenance", "execution",
          "optimizer", "topology", "context_len", "kv_dtype", "page_size", "allreduce", "gemv",
          "quantize", "float8")


def run(args) -> int:
    import torch

    from ..report.build import analyze
    from ..presets import resolve_target
    from ..tracing.export import CaptureError

    if args.plot:
        _check_plot_path(args.plot, "--plot")
    if args.gpus is not None and args.torchtitan is None:
        raise ValueError("--gpus is the world size of a --torchtitan job; analyze predicts "
                         "one GPU of a plan: give --tp, --dp, --pp ... instead")
    job = _titan_job(args, gpus=args.gpus)
    if job is not None:
        return _analyze_titan(args, job)
    model, inputs, kwargs = resolve_target(args.target)
    if args.input:
        device = next((t.device for t in list(model.parameters()) + list(model.buffers())),
                      torch.device("cpu"))
        inputs = tuple(torch.zeros(shape, dtype=getattr(torch, dtype), device=device)
                       for shape, dtype in args.input)
        kwargs = None
    if args.pad and args.format in ("ops-csv", "chrome-trace"):
        raise ValueError(f"--pad adds the padding plan, which --format {args.format} has no "
                         "place for: use --format table, json, csv or markdown")
    if args.train and args.mode not in (None, "train"):
        raise ValueError(f"--train means --mode train, but --mode {args.mode} was given: "
                         "give one of them")
    plan_args = plan_of_flags(args)
    parallel = None
    tp, dp, sp = args.tp, args.dp, args.sequence_parallel
    if any(v != getattr(Parallel(), k) for k, v in plan_args.items()):
        parallel = Parallel(tp=tp, dp=dp, sequence_parallel=sp, **plan_args)
        tp, dp, sp = 1, 1, False
    try:
        report = analyze(model, inputs, kwargs, mode="train" if args.train else args.mode,
                         tp=tp, dp=dp, sequence_parallel=sp, parallel=parallel,
                         recompute=args.recompute, **setup_keywords(args, _FLAGS))
    except CaptureError as exc:
        raise ValueError(_capture_failure(exc, args.verbose)) from None
    _plot(report, args.plot)
    if args.pad:
        from ..padding.plan import plan_padding

        plan = plan_padding(report)
        if args.format == "json":  # the report and the plan, one document
            _print_report(report, "json", extra={"padding_plan": plan.to_dict()})
        elif args.format == "csv":  # one row per GEMM: its sizes, the plan's and the why
            print(plan.to_csv(), end="")
        else:
            print(report.table(fmt="github" if args.format == "markdown" else "simple"))
            print("\npadding plan (fxshape.pad applies it to linear layers; the compile backend to "
                  "any mm/addmm/bmm):")
            print(plan.table(fmt="github" if args.format == "markdown" else "simple"))
        return 0
    _print_report(report, args.format)
    return 0


def _plot(report, path) -> None:
    """``--plot``: where the time goes, drawn to ``path`` (nothing without one)."""
    if path:
        from ..report.plot import plot_report

        plot_report(report, path)
        print(f"wrote {path}", file=sys.stderr)


def _print_report(report, fmt: str, *, extra=None, title=None) -> None:
    """``report`` as ``--format`` says; ``extra``: more keys of its JSON document, ``title``:
    a line above its table."""
    if fmt == "json":
        print(json.dumps({**report.to_dict(), **extra}, indent=2, sort_keys=True)
              if extra else report.to_json())
    elif fmt == "csv":
        print(report.to_csv(), end="")
    elif fmt == "ops-csv":  # every op of the step, one line each
        print(report.ops_csv(), end="")
    elif fmt == "chrome-trace":
        _print_chrome_trace(report)
    elif fmt == "markdown":
        print(report.to_markdown())
    else:
        if title:
            print(title)
        print(report.table())


#: analyze options a torchtitan job sets, with their defaults (given otherwise: refused)
_TITAN_SETS = {"batch_size": None, "seq_len": None, "tp": 1, "dp": 1,
               "sequence_parallel": False, "mode": None, "train": False, "recompute": None,
               "execution": None, "dtype": "bf16", "input": None, "context_len": None,
               # every flag of the plan (fxshape.cli.args.plan_flags)
               **{f.name: f.default for f in plan_fields()}}


def _analyze_titan(args, job) -> int:
    """``analyze --torchtitan``: one GPU of the job's training step."""
    from ..report.build import analyze
    from ..tracing.export import CaptureError

    clash = [k for k, v in _TITAN_SETS.items() if getattr(args, k, v) != v]
    if clash:
        raise ValueError("--torchtitan sets the workload and the plan; drop "
                         + ", ".join("--" + k.replace("_", "-") for k in clash))
    if args.pad:
        raise ValueError("--pad is not available with --torchtitan (a plan's step): analyze "
                         "the model alone for its padding plan")
    try:
        report = analyze(job.model(), gpu=args.gpu, dtype=job.dtype,
                         batch_size=job.micro_batch, seq_len=job.seq_len, mode="train",
                         attention=args.attention, provenance=None, execution=job.execution,
                         optimizer=args.optimizer, topology=args.topology,
                         parallel=job.parallel, float8=job.float8)
    except CaptureError as exc:
        raise ValueError(_capture_failure(exc, args.verbose)) from None
    report = dataclasses.replace(report, notes=report.notes + tuple(
        f"torchtitan: {n}" for n in job.notes))
    _plot(report, args.plot)
    _print_report(report, args.format, extra={"torchtitan": _job_dict(job)},
                  title=job.describe())
    return 0


def _job_dict(job) -> dict:
    return {"source": job.source, "model": f"{job.name} {job.flavor}", "gpus": job.gpus,
            "parallel": job.parallel.as_dict(), "micro_batch": job.micro_batch,
            "global_batch": job.global_batch, "seq_len": job.seq_len, "dtype": job.dtype,
            "recompute": job.recompute, "execution": job.execution, "notes": list(job.notes),
            **({"float8": job.float8} if job.float8 else {})}


def add_parser(sub) -> argparse.ArgumentParser:
    """The ``analyze`` command's parser."""
    pa = sub.add_parser("analyze", help="predict a model's GEMMs, step and memory on a GPU",
                        description="Capture a model (no weights) and print every GEMM, the "
                                    "whole step (time, tokens/s, MFU), its memory and, in "
                                    "decode, what fits; mode inference unless --mode or "
                                    "--train says otherwise.")
    _workload_args(pa, "preset name (see `fxshape presets`), path to a Hugging Face "
                       "config.json, a Hugging Face Hub id whose config is in the local "
                       "cache, or package.module:factory (returning a module, or (module, "
                       "example_inputs[, example_kwargs])); none with --torchtitan",
                   optional=True)
    _torchtitan_args(pa)
    pa.add_argument("--input", action="append", type=_input_spec, default=None,
                    metavar="SHAPE[:DTYPE]",
                    help="an example input of the model's forward, in order (repeatable), "
                         "e.g. --input 8x1024:long; dtype default float32")
    pa.add_argument("--pad", action="store_true",
                    help="also the padding plan: per GEMM before/after and totals (json: "
                         "under 'padding_plan'; csv: the plan, one row per GEMM)")
    pa.add_argument("--train", action="store_true",
                    help="the same as --mode train: a training step, the backward GEMMs "
                         "autograd runs included")
    pa.add_argument("--format", choices=("table", "json", "csv", "ops-csv", "markdown",
                                         "chrome-trace"),
                    default="table", help="csv: one line per GEMM; ops-csv: one line per op "
                                          "of the step (report.ops); chrome-trace: the "
                                          "predicted step as a Chrome/Perfetto trace (JSON)")
    _step_args(pa)
    setup_flag(pa, "mode")
    _kv_args(pa)
    _allreduce_arg(pa, None)
    _gemv_arg(pa)
    _quantize_args(pa, training=True)
    pa.add_argument("--dp", type=_positive_int, default=1,
                    help="data-parallel degree: the gradient all-reduce of a --train step")
    setup_flag(pa, "topology")
    pa.add_argument("--sequence-parallel", action="store_true",
                    help="with --tp: Megatron sequence parallelism")
    plan_flags(pa)  # one per field of fxshape.Parallel
    pa.add_argument("--gpus", type=_positive_int, default=None,
                    help="with --torchtitan: the job's world size (needed when its "
                         "data_parallel_shard_degree is -1)")
    pa.add_argument("--recompute", choices=("full", "selective", "op"), default=None,
                    help="activation recomputation in --train: every layer's forward "
                         "(full), the attention core (selective, Megatron's) or every "
                         "second matmul and the memory-bound ops (op, torchtitan's op-level "
                         "selective checkpointing)")
    setup_flag(pa, "provenance")
    pa.add_argument("--plot", default=None, metavar="PATH",
                    help="also draw where the time goes (.png or .svg; needs matplotlib)")
    pa.set_defaults(func=run)
    params_arg(pa)
    return pa
