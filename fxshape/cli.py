"""The ``fxshape`` command line: ``analyze``, ``advise``, ``sweep``, ``presets``, ``predict``,
``gpus``."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys

from tabulate import tabulate

from .cost.attention import ATTENTION_CHOICES
from .cost.gemm import LAYOUTS, is_default_params, predict_matmul, resolve_params_path, use_params
from .hardware.gpus import ALIASES, get_gpu, list_gpus
from .parallelism.plan import GRAD_DTYPES, SCHEDULES, ZERO_STAGES, Parallel
from .serving.batch import FUSE_CHOICES
from .tracing.export import MAX_SIZE

__all__ = ["main", "format_prediction"]


def _topology_arg(text: str) -> str:
    from .hardware.topology import get_topology

    try:
        get_topology(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v <= 0 or v > MAX_SIZE:
        raise argparse.ArgumentTypeError(f"expected a positive integer up to {MAX_SIZE}, got "
                                         f"{v}")
    return v


def _stage_layers(text: str):
    """``--stage-layers``: ``torchtitan`` or comma-separated layer counts per chunk."""
    from .parallelism.plan import STAGE_SPLITS

    if text in STAGE_SPLITS:
        return text
    try:
        counts = tuple(int(x) for x in text.split(","))
    except ValueError:
        counts = ()
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(
            f"expected {' or '.join(STAGE_SPLITS)} or layer counts of at least 1 per chunk, "
            f"comma-separated (15,16,15), got {text!r}")
    return counts


_INPUT_DTYPES = {"long": "int64", "int64": "int64", "int": "int32", "int32": "int32",
                 "float": "float32", "float32": "float32", "fp32": "float32",
                 "half": "float16", "float16": "float16", "fp16": "float16",
                 "bfloat16": "bfloat16", "bf16": "bfloat16", "bool": "bool"}


def _input_spec(text: str) -> tuple:
    """``8x1024:long`` -> ((8, 1024), "int64"); the dtype defaults to float32."""
    shape_text, _, dtype = text.partition(":")
    dtype = dtype.strip().lower() or "float32"
    if dtype not in _INPUT_DTYPES:
        raise argparse.ArgumentTypeError(
            f"unknown dtype {dtype!r} in --input {text!r}; accepted: "
            f"{', '.join(sorted(_INPUT_DTYPES))}")
    try:
        shape = tuple(int(d) for d in shape_text.lower().split("x"))
    except ValueError:
        shape = ()
    if not shape or any(d <= 0 or d > MAX_SIZE for d in shape):
        raise argparse.ArgumentTypeError(
            f"--input {text!r}: expected SHAPE[:DTYPE], e.g. 8x1024:long (positive sizes)")
    return shape, _INPUT_DTYPES[dtype]


def _check_plot_path(path, option: str) -> None:
    """Fail before any work on a plot path that cannot be written, or without matplotlib."""
    import importlib.util

    from .report.plot import check_path

    check_path(path, option)
    if importlib.util.find_spec("matplotlib") is None:
        raise ValueError(f"{option} needs matplotlib, which is not installed: pip install "
                         "'fxshape[plot]'")


def format_prediction(p) -> str:
    """A two-column table of one prediction."""
    align = ", ".join(
        f"{a.dim}={a.size} ({a.status}" + (f", next aligned {a.next_aligned}" if
                                            a.status == "misaligned" else "") + ")"
        for a in p.alignment)
    rows = [
        ("GEMM", f"C[{p.batch}, {p.m}, {p.n}] = A[{p.batch}, {p.m}, {p.k}] @ B[{p.batch}, "
                 f"{p.k}, {p.n}]  (layout {p.layout})"),
        ("GPU / dtype", f"{p.gpu} / {p.dtype} (dense peak {p.peak_tflops:.1f} TFLOP/s)"),
        ("predicted time", f"{p.time_s * 1e6:.2f} us"),
        ("predicted TFLOP/s", f"{p.tflops:.1f}"),
        ("% of peak", f"{100 * p.efficiency:.1f}%"),
        ("bound", p.bound),
        ("tile (tm, tn)", f"{p.tile[0]} x {p.tile[1]}" + (f", split-K {p.split_k}"
                                                            if p.split_k > 1 else "")),
        ("tile efficiency", f"{100 * p.tile_efficiency:.1f}%"),
        ("CTAs / waves", f"{p.ctas} / {p.waves}"),
        ("wave efficiency", f"{100 * p.wave_efficiency:.1f}%"),
        ("compute / memory time", f"{p.compute_time_s * 1e6:.2f} / {p.memory_time_s * 1e6:.2f} us"),
        ("alignment", align),
    ]
    return tabulate(rows, tablefmt="simple")


def _cmd_predict(args) -> int:
    p = predict_matmul(args.m, args.n, args.k, batch=args.batch, dtype=args.dtype,
                       gpu=args.gpu, layout=args.layout)
    if args.json:
        print(json.dumps(p.to_dict(), indent=2, sort_keys=True))
    else:
        print(format_prediction(p))
        path = resolve_params_path()
        if not is_default_params(path):
            print(f"note: GEMM model constants from {path} (over the packaged ones)")
    return 0


def _cmd_gpus(args) -> int:
    rows = []
    back = {}
    for alias, name in ALIASES.items():
        back.setdefault(name, []).append(alias)
    from .hardware.topology import default_topology

    for name in list_gpus():
        g = get_gpu(name)
        pk = g.peaks
        fmt = lambda v: "-" if v is None else f"{v:g}"  # noqa: E731
        fp32 = fmt(pk.fp32) + ("" if pk.fp32_matrix is None else f" ({pk.fp32_matrix:g}m)")
        watts = fmt(g.power_w) + ("" if g.power_limit_w is None or g.tdp_w is None
                                  or g.power_limit_w == g.tdp_w else f" of {g.tdp_w:g}")
        rows.append((name, ", ".join(sorted(a for a in back.get(name, []) if a != name)),
                     g.arch, g.sm_count, g.boost_clock_mhz, fmt(pk.fp16), fmt(pk.bf16),
                     fmt(pk.tf32), fmt(pk.fp8), fmt(pk.fp4), fp32, f"{g.memory_gb:g}",
                     f"{g.memory_bandwidth_gbs:g}", f"{g.l2_mb:g}", watts,
                     default_topology(name).name))
    print(tabulate(rows, headers=("gpu", "aliases", "arch", "SMs", "MHz", "fp16", "bf16",
                                  "tf32", "fp8", "fp4", "fp32", "memory GiB", "GB/s", "L2 MB",
                                  "W", "machine"),
                   disable_numparse=True))
    print("\npeaks: dense TFLOP/s per dtype (- = not supported; fp32 (Nm): GEMMs run on "
          "matrix cores at N); memory GiB: the capacity a report's 'fits' is checked against; "
          "W: the power limit a long job's clocks follow (of the board's, where lower; "
          "'h100-sxm@500w' sets one); machine: the topology it is priced in by default")
    print("\n" + _constants_table())
    print("\n" + _validation_table())
    return 0


def _constants_table() -> str:
    """Whose fitted tensor-core GEMM constants each GPU uses, and the libraries they
    describe."""
    from .cost.gemm import constants_library, constants_source

    rows = []
    for name in list_gpus():
        src = constants_source(name)
        rows.append((name, "own fit" if src == name else
                     f"{src}'s ({get_gpu(name).arch} family; no measurement of its own)",
                     constants_library(name)))
    return ("tensor-core GEMM constants (--params 2024: the 2022-2024 fits of the GPUs "
            "refitted since):\n" + tabulate(rows, headers=("gpu", "constants", "library"),
                                              disable_numparse=True))


def _validation_table() -> str:
    """Each GPU's held-out validation per regime (fxshape.hardware.validation), or
    'unvalidated'."""
    from .hardware.validation import validations

    rows = []
    for name in list_gpus():
        got = validations(name)
        if not got:
            rows.append((name, "unvalidated", "", "", "", ""))
        for regime, v in got.items():
            rows.append((name, regime, v.n, f"{100 * v.median:.1f}%", f"{100 * v.p90:.1f}%",
                         "" if v.signed_median is None else f"{100 * v.signed_median:+.1f}%"))
    return ("held-out validation (bench/validation_summary.py: published measurements "
            "nothing was fitted to; + = predicted slower):\n"
            + tabulate(rows, headers=("gpu", "regime", "rows", "median abs error",
                                      "p90 abs error", "median signed"),
                       disable_numparse=True))


def _capture_failure(exc, verbose: bool) -> str:
    """A CaptureError for the terminal: the first line and the first path's reason; every
    path with ``--verbose``."""
    lines = str(exc).splitlines()
    if verbose or len(lines) < 2:
        return str(exc)
    return f"{lines[0]} {lines[1].strip()} (--verbose: every capture path tried)"


def _cmd_analyze(args) -> int:
    import torch

    from .report.build import analyze
    from .presets import resolve_target
    from .tracing.export import CaptureError

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
    plan_args = dict(pp=args.pp, cp=args.cp, ep=args.ep, capacity_factor=args.capacity_factor,
                     zero=args.zero, microbatches=args.microbatches,
                     virtual_stages=args.virtual_stages, schedule=args.schedule,
                     dp_shard=args.dp_shard, grad_dtype=args.grad_dtype,
                     stage_layers=args.stage_layers, async_tp=args.async_tp)
    parallel = None
    tp, dp, sp = args.tp, args.dp, args.sequence_parallel
    if any(v != getattr(Parallel(), k) for k, v in plan_args.items()):
        parallel = Parallel(tp=tp, dp=dp, sequence_parallel=sp, **plan_args)
        tp, dp, sp = 1, 1, False
    try:
        report = analyze(model, inputs, kwargs, gpu=args.gpu, dtype=args.dtype,
                         batch_size=args.batch_size, seq_len=args.seq_len,
                         mode="train" if args.train else args.mode, tp=tp,
                         attention=args.attention,
                         provenance=None if args.provenance == "none" else args.provenance,
                         execution=args.execution,
                         optimizer=None if args.optimizer == "none" else args.optimizer,
                         dp=dp, topology=args.topology, sequence_parallel=sp,
                         context_len=args.context_len, kv_dtype=args.kv_dtype,
                         page_size=args.page_size, parallel=parallel,
                         recompute=args.recompute, allreduce=args.allreduce,
                         gemv=args.gemv, quantize=_quantization(args),
                         float8=args.float8)
    except CaptureError as exc:
        raise ValueError(_capture_failure(exc, args.verbose)) from None
    if args.plot:
        from .report.plot import plot_report

        plot_report(report, args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)
    if args.pad:
        from .padding.plan import plan_padding

        plan = plan_padding(report)
        if args.format == "json":  # the report and the plan, one document
            print(json.dumps({**report.to_dict(), "padding_plan": plan.to_dict()}, indent=2,
                             sort_keys=True))
        elif args.format == "csv":  # one row per GEMM: its sizes, the plan's and the why
            print(plan.to_csv(), end="")
        else:
            print(report.table(fmt="github" if args.format == "markdown" else "simple"))
            print("\npadding plan (fxshape.pad applies it to linear layers; the compile backend to "
                  "any mm/addmm/bmm):")
            print(plan.table(fmt="github" if args.format == "markdown" else "simple"))
        return 0
    if args.format == "json":
        print(report.to_json())
    elif args.format == "csv":
        print(report.to_csv(), end="")
    elif args.format == "ops-csv":  # every op of the step, one line each
        print(report.ops_csv(), end="")
    elif args.format == "chrome-trace":
        _print_chrome_trace(report)
    elif args.format == "markdown":
        print(report.to_markdown())
    else:
        print(report.table())
    return 0


def _print_chrome_trace(report) -> None:
    from .report.chrome import chrome_trace

    print(json.dumps(chrome_trace(report), sort_keys=True))


#: analyze options a torchtitan job sets, with their defaults (given otherwise: refused)
_TITAN_SETS = {"batch_size": None, "seq_len": None, "tp": 1, "dp": 1, "pp": 1, "cp": 1,
               "ep": 1, "capacity_factor": None, "zero": 0, "microbatches": 1,
               "virtual_stages": 1, "schedule": "1f1b", "dp_shard": None, "grad_dtype": "fp32",
               "stage_layers": None, "async_tp": False,
               "sequence_parallel": False, "mode": None, "train": False, "recompute": None,
               "execution": None, "dtype": "bf16", "input": None, "context_len": None}


def _analyze_titan(args, job) -> int:
    """``analyze --torchtitan``: one GPU of the job's training step."""
    from .report.build import analyze
    from .tracing.export import CaptureError

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
                         optimizer=None if args.optimizer == "none" else args.optimizer,
                         topology=args.topology, parallel=job.parallel, float8=job.float8)
    except CaptureError as exc:
        raise ValueError(_capture_failure(exc, args.verbose)) from None
    report = dataclasses.replace(report, notes=report.notes + tuple(
        f"torchtitan: {n}" for n in job.notes))
    if args.plot:
        from .report.plot import plot_report

        plot_report(report, args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)
    if args.format == "json":
        print(json.dumps({**report.to_dict(), "torchtitan": _job_dict(job)}, indent=2,
                         sort_keys=True))
        return 0
    if args.format == "csv":
        print(report.to_csv(), end="")
    elif args.format == "ops-csv":
        print(report.ops_csv(), end="")
    elif args.format == "chrome-trace":
        _print_chrome_trace(report)
    elif args.format == "markdown":
        print(report.to_markdown())
    else:
        print(job.describe())
        print(report.table())
    return 0


def _job_dict(job) -> dict:
    return {"source": job.source, "model": f"{job.name} {job.flavor}", "gpus": job.gpus,
            "parallel": job.parallel.as_dict(), "micro_batch": job.micro_batch,
            "global_batch": job.global_batch, "seq_len": job.seq_len, "dtype": job.dtype,
            "recompute": job.recompute, "execution": job.execution, "notes": list(job.notes),
            **({"float8": job.float8} if job.float8 else {})}


def _model_config(target):
    from .presets import load_target

    model = load_target(target)
    if getattr(model, "config", None) is None:
        raise ValueError(f"{target}: advise and sweep need a Hugging Face model (a preset or "
                         "a config.json); this target has no config")
    return model


def _cmd_advise(args) -> int:
    from .codesign.advise import advise

    advice = advise(_model_config(args.target), gpu=args.gpu, dtype=args.dtype,
                    batch_size=args.batch_size, seq_len=args.seq_len, tp=args.tp,
                    mode=args.mode, attention=args.attention, param_tolerance=args.tolerance,
                    min_speedup=args.min_speedup, execution=args.execution,
                    optimizer=None if args.optimizer == "none" else args.optimizer,
                    context_len=args.context_len, kv_dtype=args.kv_dtype,
                    page_size=args.page_size, quantize=_quantization(args),
                    float8=args.float8)
    if args.format == "json":
        recs = [{"hyperparameter": r.hyperparameter, "current": r.current,
                 "suggested": r.suggested, "predicted_speedup": r.predicted_speedup,
                 "gemm_speedup": r.gemm_speedup,
                 "throughput_gain": r.throughput_gain, "param_delta": r.param_delta,
                 "kv_bytes_per_token": r.kv_bytes_per_token,
                 "reason": r.reason} for r in advice.recommendations]
        print(json.dumps({"model": advice.model_name, "gpu": advice.gpu, "dtype": advice.dtype,
                          "mode": advice.mode, "tp": advice.tp, "params": advice.params,
                          "time_s": advice.time_s, "step_s": advice.step_s,
                          "execution": advice.execution, "recommendations": recs,
                          "kv_bytes_per_token": advice.kv_bytes_per_token,
                          "notes": list(advice.notes)}, indent=2, sort_keys=True))
    else:
        print(advice.table(fmt="github" if args.format == "markdown" else "simple"))
    return 0


def _cmd_sweep(args) -> int:
    from .report.plot import plot_sweep
    from .codesign.advise import parse_range, sweep

    values = parse_range(args.range)
    if args.out:
        _check_plot_path(args.out, "--out")
    model = _model_config(args.target)
    points = sweep(model, args.param, values, gpu=args.gpu, dtype=args.dtype,
                   batch_size=args.batch_size, seq_len=args.seq_len, tp=args.tp,
                   mode=args.mode, attention=args.attention, execution=args.execution,
                   optimizer=None if args.optimizer == "none" else args.optimizer,
                   context_len=args.context_len, kv_dtype=args.kv_dtype,
                   page_size=args.page_size, quantize=_quantization(args),
                   float8=args.float8)
    rows = [(p.value, "-" if p.tflops is None else f"{p.tflops:.1f}",
             "-" if p.time_s is None else f"{p.time_s * 1e3:.3f}",
             "-" if p.step_s is None else f"{p.step_s * 1e3:.3f}",
             "-" if p.tokens_per_s is None else f"{p.tokens_per_s:,.0f}",
             "-" if p.params is None else f"{p.params:,}", p.note) for p in points]
    print(points.header() + "\n")
    print(tabulate(rows, headers=(args.param, "TFLOP/s", "GEMM ms/step", "step ms",
                                  "tokens/s", "params", "note"), disable_numparse=True))
    if points.notes:
        print("\nnotes:\n" + "\n".join(f"- {n}" for n in points.notes))
    if points.failed:
        raise ValueError(f"every value of the sweep failed ({len(points)} of {len(points)}); "
                         f"the first: {points[0].value}: {points[0].note}")
    if args.out:
        plot_sweep(points, args.param, args.out, title=f"{args.target}: " + points.header())
        print(f"\nwrote {args.out}")
    return 0


def _step_args(p) -> None:
    """--execution and --optimizer: how the predicted step runs."""
    p.add_argument("--execution", choices=("eager", "compiled", "cudagraphs"),
                   default=None,
                   help="how the step runs: eager (one kernel per aten op, the host "
                        "dispatching each; the default, but for decode), compiled "
                        "(torch.compile's fused kernels), cudagraphs (torch.compile "
                        "mode=reduce-overhead; the default for decode)")
    p.add_argument("--optimizer", choices=("adamw", "adamw-fused", "sgd", "none"),
                   default="adamw", help="the optimizer step of a training step (default "
                                         "adamw: torch.optim.AdamW, foreach)")


def _kv_args(p) -> None:
    """--context-len, --kv-dtype, --page-size: the KV cache of a decode step."""
    p.add_argument("--context-len", type=_positive_int, default=None,
                   help="decode: the tokens already in the KV cache (default 1024, capped "
                        "at the model's positions)")
    p.add_argument("--kv-dtype", default=None,
                   help="decode: the KV cache's dtype when it is not --dtype: fp8, int8 or "
                        "nvfp4 (Blackwell)")
    p.add_argument("--page-size", type=_positive_int, default=None,
                   help="decode: tokens per page of a paged KV cache (vLLM 16); default "
                        "a contiguous cache")


def _allreduce_arg(p, default) -> None:
    from .cost.allreduce import ALGORITHMS

    p.add_argument("--allreduce", choices=ALGORITHMS, default=default,
                   help="how tensor parallelism's all-reduces run under CUDA graphs: auto "
                        "(vLLM's choice: one-shot / two-shot for small buffers on NVLink, "
                        "symmetric memory's multimem on Hopper and Blackwell NVSwitch, NCCL "
                        "otherwise), one-shot, two-shot, multimem, or nccl (LL / LL128 / "
                        "Simple by size)" + ("; default: auto in decode, NCCL as measured from "
                                      "eager PyTorch otherwise" if default is None else ""))


def _quantize_args(p, training: bool = False) -> None:
    from .cost.quant import GROUP_SIZES, QUANT_METHODS

    p.add_argument("--quantize", choices=QUANT_METHODS, default=None,
                   help="quantized linear layers as inference engines run them: int8 or "
                        "int4 (weight-only, gpt-fast/torchao), fp8 (weights and "
                        "activations, torch._scaled_mm; Hopper, Ada, Blackwell), nvfp4 or "
                        "mxfp8 (block-scaled weights and activations; Blackwell)")
    p.add_argument("--group-size", type=int, choices=GROUP_SIZES, default=None,
                   help="--quantize int4: elements of K per scale and zero (default 128)")
    if training:
        from .cost.float8 import FLOAT8_RECIPES

        p.add_argument("--float8", choices=FLOAT8_RECIPES, default=None,
                       help="training in FP8: torchao's float8 under torch.compile "
                            "(tensorwise: FP8 all-gather under FSDP; rowwise; mxfp8 on "
                            "Blackwell; needs --execution compiled) or Transformer Engine's "
                            "te.Linear, eager or compiled (te-delayed, te-current; te-mxfp8 "
                            "on Blackwell); needs an FP8 GPU")
    p.add_argument("--activation-scales", choices=("dynamic", "static"), default=None,
                   help="--quantize fp8: per-token scales computed by a kernel (dynamic, "
                        "vLLM; the default) or a static per-tensor scale fused into the "
                        "producer (TensorRT-LLM)")


def _quantization(args):
    """The quantize= value of the --quantize, --group-size and --activation-scales flags."""
    from .cost.quant import quantization_of

    if args.quantize is None:
        given = [f for f, v in (("--group-size", args.group_size),
                                ("--activation-scales", args.activation_scales))
                 if v is not None]
        if given:
            raise ValueError(f"{' and '.join(given)} apply to quantized layers: give "
                             "--quantize too")
        return None
    return quantization_of(args.quantize, args.group_size, args.activation_scales)


def _gemv_arg(p) -> None:
    from .cost.gemv import GEMV_CHOICES

    p.add_argument("--gemv", choices=GEMV_CHOICES, default=None,
                   help="how GEMMs with M = 1 (batch-1 decode) run: library (the BLAS GEMM, "
                        "the default) or inductor (torch.compile with "
                        "coordinate_descent_tuning, as gpt-fast: one Triton reduction each)")


_SPEC_FLAGS = ("num_speculative_tokens", "acceptance", "acceptance_length")
_LOAD_FLAGS = ("num_requests", "rate", "trace", "max_concurrency", "max_num_seqs",
               "max_num_batched_tokens", "block_size", "gpu_memory_utilization", "seed")


def _length_arg(text: str):
    from .serving.traffic import parse_length

    try:
        lo, hi = parse_length("length", text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer or a range lo:hi, got "
                                         f"{text!r}") from None
    if hi > MAX_SIZE:
        raise argparse.ArgumentTypeError(f"expected lengths up to {MAX_SIZE}, got {text!r}")
    return lo if lo == hi else (lo, hi)


def _float_arg(ok, expected: str):
    """An argparse type: a float for which ``ok`` holds, else "expected ``expected``"."""
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            v = float("nan")
        if not ok(v):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return v
    return parse


_rate_arg = _float_arg(lambda v: v > 0, "a positive number of requests per second or inf")
_unit_arg = _float_arg(lambda v: 0 <= v <= 1, "a probability in [0, 1]")
_fraction_arg = _float_arg(lambda v: 0 < v <= 1, "a fraction in (0, 1]")
_tokens_arg = _float_arg(lambda v: 1 <= v < float("inf"),
                         "a mean number of tokens per step of at least 1")


def _cmd_serve(args) -> int:
    from .presets import load_target

    load = args.rate is not None or args.num_requests is not None or args.trace is not None
    if args.gemv is not None and (load or args.draft is not None or args.slo_ttft is not None
                                  or args.slo_itl is not None):
        raise ValueError("--gemv applies to one batch without --draft (gpt-fast's batch-1 "
                         "decode); under load, speculation or capacity planning the engine "
                         "runs the library's GEMMs")
    if args.slo_ttft is not None or args.slo_itl is not None:
        return _serve_capacity(args, load_target)
    slo = [f"--{f.replace('_', '-')}" for f in ("slo_percentile", "tp_choices")
           if getattr(args, f) is not None]
    if slo:
        raise ValueError(f"{', '.join(slo)}: only with --slo-ttft or --slo-itl (capacity "
                         "planning)")
    given = [f"--{f.replace('_', '-')}" for f in _LOAD_FLAGS
             if getattr(args, f) is not None]
    spec = [f"--{f.replace('_', '-')}" for f in _SPEC_FLAGS if getattr(args, f) is not None]
    if spec and args.draft is None:
        raise ValueError(f"{', '.join(spec)}: only with --draft (speculative decoding)")
    if not load and given:
        raise ValueError(f"{', '.join(given)}: only for a server under load; give --rate and "
                         "--num-requests, or --trace")
    if load:
        if args.batch_size is not None or args.page_size is not None:
            raise ValueError("--batch-size and --page-size apply to one batch; under load the "
                             "scheduler makes the batches (--max-num-seqs, "
                             "--max-num-batched-tokens) in KV blocks of --block-size")
        return _serve_load(args, load_target(args.target))
    for name in ("prompt_len", "output_len"):
        v = getattr(args, name)
        if v is None:
            raise ValueError(f"--{name.replace('_', '-')} is required (tokens per request)")
        if isinstance(v, tuple):
            raise ValueError(f"--{name.replace('_', '-')} {v[0]}:{v[1]}: a range applies to "
                             "a server under load (--rate, --num-requests); one batch takes "
                             "one length")
    if args.draft is not None:
        if args.page_size is not None:
            raise ValueError("--page-size: speculative decoding is priced with vLLM's 16-token "
                             "KV blocks")
        return _serve_speculative(args, load_target(args.target))
    return _serve_batch(args, load_target(args.target))


def _serve_capacity(args, load_target) -> int:
    import json

    from .serving import plan_capacity

    bad = [f"--{f.replace('_', '-')}" for f in ("trace", "max_concurrency", "batch_size",
                                                 "page_size")
           if getattr(args, f) is not None]
    if args.tp != 1:
        bad.append("--tp (give the degrees to try with --tp-choices)")
    if bad:
        raise ValueError(f"{', '.join(bad)}: not with --slo-ttft / --slo-itl (capacity "
                         "planning tries --tp-choices, each with Poisson arrivals)")
    for name in ("prompt_len", "output_len"):
        if getattr(args, name) is None:
            raise ValueError(f"capacity planning needs --{name.replace('_', '-')}")
    engine = {k: getattr(args, k) for k in ("max_num_seqs", "max_num_batched_tokens")
              if getattr(args, k) is not None}
    if args.block_size is not None:
        engine["block_size"] = args.block_size
    if args.gpu_memory_utilization is not None:
        engine["gpu_memory_utilization"] = args.gpu_memory_utilization
    engine.update(_draft_options(args, load_target))
    if args.quantize is not None:
        engine["quantize"] = _quantization(args)
    engine["fuse"] = args.fuse or "all"
    r = plan_capacity(
        load_target(args.target), gpu=args.gpu, prompt_len=args.prompt_len,
        output_len=args.output_len, slo_ttft=args.slo_ttft, slo_itl=args.slo_itl,
        percentile=99 if args.slo_percentile is None else args.slo_percentile,
        rate=None if args.rate is None else args.rate,
        tp=args.tp_choices or (1, 2, 4, 8),
        num_requests=300 if args.num_requests is None else args.num_requests,
        seed=0 if args.seed is None else args.seed, dtype=args.dtype,
        allreduce=args.allreduce, topology=args.topology, attention=args.attention,
        kv_dtype=args.kv_dtype, **engine)
    if args.format == "json":
        print(json.dumps(r.to_dict(), indent=1, sort_keys=True))
        return 0
    print(f"{r.model} on {r.gpu}: p{r.percentile} SLOs"
          + (f" TTFT {r.slo_ttft_s * 1e3:g} ms" if r.slo_ttft_s else "")
          + (f" ITL {r.slo_itl_s * 1e3:g} ms" if r.slo_itl_s else "")
          + (f", target {r.rate:g} requests/s" if r.rate is not None else "")
          + f"; {r.num_requests} Poisson requests a trial; GEMMs fused: {r.fuse}"
          + (f"; speculative decoding: {r.draft}, k {r.num_speculative_tokens}" if r.draft
             else ""))
    rows = []
    for o in r.options:
        rows.append((o.tp, f"{o.max_rate:.2f}" if o.possible else "-",
                     f"{o.max_rate / o.tp:.2f}" if o.possible else "-",
                     f"{o.ttft_s * 1e3:.1f}" if o.possible else "-",
                     f"{o.itl_s * 1e3:.2f}" if o.possible else "-",
                     o.replicas if o.replicas is not None else "-",
                     o.gpus if o.gpus is not None else "-", o.note))
    print(tabulate(rows, headers=("tp", "requests/s", "per GPU", "TTFT ms", "ITL ms",
                                  "replicas", "GPUs", "note")))
    print(r.summary())
    return 0


def _serve_speculative(args, model) -> int:
    import json

    from .presets import load_target
    from .serving import speculate

    draft = "eagle" if args.draft == "eagle" else load_target(args.draft)
    r = speculate(model, prompt_len=args.prompt_len, output_len=args.output_len,
                  draft=draft, k=3 if args.num_speculative_tokens is None
                  else args.num_speculative_tokens, acceptance=args.acceptance,
                  acceptance_length=args.acceptance_length, batch_size=args.batch_size or 1,
                  gpu=args.gpu, tp=args.tp, dtype=args.dtype, allreduce=args.allreduce,
                  topology=args.topology, attention=args.attention, kv_dtype=args.kv_dtype,
                  fuse=args.fuse or "all", quantize=_quantization(args))
    if args.format == "json":
        print(json.dumps(r.to_dict(), indent=1, sort_keys=True))
        return 0
    print(f"{r.model} on {r.tp} x {r.gpu}, batch {r.batch_size}, {r.draft} draft, k {r.k}, "
          f"acceptance {r.acceptance:.3f} ({r.tokens_per_step:.2f} tokens a step), "
          f"all-reduce {args.allreduce}, GEMMs fused: {r.fuse}")
    print(tabulate([("verify step", f"{r.verify_s * 1e3:.2f} ms"),
                    ("draft passes", f"{r.draft_s * 1e3:.2f} ms"),
                    ("time per output token", f"{r.tpot_s * 1e3:.2f} ms"),
                    ("plain decode, per token", f"{r.plain_tpot_s * 1e3:.2f} ms"),
                    ("speedup", f"{r.speedup:.2f}x"),
                    ("output tokens/s", f"{r.output_tokens_per_s:,.1f}")],
                   headers=("", "predicted")))
    print()
    print(tabulate([(b, f"{x:.2f}x") for b, x in r.by_batch], headers=("batch", "speedup")))
    print("speculation " + ("pays at every batch that fits" if r.breakeven_batch is None
                            else f"stops paying at batch {r.breakeven_batch}"))
    for n in r.notes:
        print(f"note: {n}")
    return 0


def _draft_options(args, load_target) -> dict:
    """Speculative decoding's options of a server under load (none without --draft)."""
    if args.draft is None:
        return {}
    return {"draft": "eagle" if args.draft == "eagle" else load_target(args.draft),
            "num_speculative_tokens": 3 if args.num_speculative_tokens is None
            else args.num_speculative_tokens, "acceptance": args.acceptance,
            "acceptance_length": args.acceptance_length}


def _serve_load(args, model) -> int:
    import json

    from .presets import load_target
    from .serving import simulate_serving

    trace = args.trace
    if trace is not None and (args.num_requests is not None or args.rate is not None
                              or args.prompt_len is not None or args.output_len is not None):
        raise ValueError("--trace gives the requests: drop --num-requests, --rate, "
                         "--prompt-len and --output-len")
    if trace is None:
        missing = [f for f, v in (("--num-requests", args.num_requests),
                                  ("--prompt-len", args.prompt_len),
                                  ("--output-len", args.output_len)) if v is None]
        if missing:
            raise ValueError(f"a server under load needs {', '.join(missing)} (or --trace)")
    r = simulate_serving(
        model, gpu=args.gpu, tp=args.tp, requests=trace, num_requests=args.num_requests,
        rate=args.rate, prompt_len=args.prompt_len, output_len=args.output_len,
        seed=0 if args.seed is None else args.seed, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_concurrency=args.max_concurrency,
        block_size=16 if args.block_size is None else args.block_size,
        gpu_memory_utilization=(0.9 if args.gpu_memory_utilization is None
                                else args.gpu_memory_utilization),
        dtype=args.dtype, allreduce=args.allreduce, topology=args.topology,
        attention=args.attention, kv_dtype=args.kv_dtype, fuse=args.fuse or "all",
        quantize=_quantization(args), **_draft_options(args, load_target))
    if args.format == "json":
        print(json.dumps(r.to_dict(), indent=1, sort_keys=True))
        return 0
    c = r.config
    print(f"{r.model} on {r.tp} x {r.gpu}, {r.num_requests:,} requests, all-reduce "
          f"{r.allreduce}, GEMMs fused: {r.fuse}; max_num_seqs {c.max_num_seqs}, "
          "max_num_batched_tokens "
          f"{c.max_num_batched_tokens:,}, {r.kv_blocks:,} KV blocks of {c.block_size} tokens "
          f"(gpu_memory_utilization {r.gpu_memory_utilization:g})"
          + (f", at most {c.max_concurrency} in flight" if c.max_concurrency else "")
          + (f"; requests drawn with seed {r.seed}" if r.seed is not None else ""))
    print(tabulate([("duration", f"{r.duration_s:,.2f} s"),
                    ("requests/s", f"{r.request_throughput:,.2f}"),
                    ("output tokens/s", f"{r.output_tokens_per_s:,.1f}"),
                    ("total tokens/s", f"{r.total_tokens_per_s:,.1f}"),
                    ("steps", f"{r.steps:,}"),
                    ("requests running (mean)", f"{r.mean_running:,.1f}"),
                    ("KV cache in use (mean / peak)", f"{r.kv_mean:.0%} / {r.kv_peak:.0%}"),
                    ("preemptions", f"{r.preemptions:,}")]
                   + ([("speculative decoding", f"{r.draft}, k {r.num_speculative_tokens}, "
                                                f"acceptance {r.acceptance:.3f}"),
                       ("tokens per verification (drawn)", f"{r.acceptance_length:.2f}"
                        if r.acceptance_length else "-")] if r.draft else []),
                   headers=("", "predicted")))
    print()
    rows = [(name, *(f"{getattr(s, k) * 1e3:,.2f}" for k in ("mean", "p50", "p90", "p99")))
            for name, s in (("time to first token", r.ttft_s),
                            ("time per output token", r.tpot_s),
                            ("inter-token latency", r.itl_s),
                            ("end-to-end latency", r.latency_s))]
    print(tabulate(rows, headers=("ms", "mean", "p50", "p90", "p99")))
    for n in r.notes:
        print(f"note: {n}")
    return 0


def _serve_batch(args, model) -> int:
    import json

    from .serving import serve

    r = serve(model, gpu=args.gpu, prompt_len=args.prompt_len, output_len=args.output_len,
              batch_size=args.batch_size or 1, tp=args.tp, dtype=args.dtype,
              allreduce=args.allreduce, topology=args.topology, attention=args.attention,
              kv_dtype=args.kv_dtype, page_size=args.page_size, fuse=args.fuse,
              gemv=args.gemv or "library", quantize=_quantization(args))
    if args.format == "json":
        print(json.dumps(r.to_dict(), indent=1, sort_keys=True))
        return 0
    steps = r.decode_steps_s
    rows = [("time to first token", f"{r.time_to_first_token_s * 1e3:.2f} ms"),
            ("inter-token latency (mean)", f"{r.inter_token_latency_s * 1e3:.2f} ms")]
    if steps:
        rows += [(f"first decode step ({r.prompt_len + 1:,} tokens)", f"{steps[0] * 1e3:.2f} ms"),
                 (f"last decode step ({r.prompt_len + r.output_len - 1:,} tokens)",
                  f"{steps[-1] * 1e3:.2f} ms")]
    rows += [("request latency", f"{r.latency_s * 1e3:.1f} ms"),
             ("output tokens/s (batch)", f"{r.output_tokens_per_s:,.1f}"),
             ("output tokens/s per request", f"{r.output_tokens_per_s / r.batch_size:,.1f}")]
    print(f"{r.model} on {r.tp} x {r.gpu}, batch {r.batch_size}, prompt {r.prompt_len:,}, "
          f"output {r.output_len:,}, all-reduce {r.allreduce}, GEMMs fused: {r.fuse}")
    print(tabulate(rows, headers=("", "predicted")))
    for n in r.notes:
        print(f"note: {n}")
    return 0


def _int_list(text: str) -> tuple:
    try:
        out = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")
    if not out or any(v < 0 for v in out):
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 0, got "
                                         f"{text!r}")
    return out


def _recompute_list(text: str) -> tuple:
    names = {"none": None, "selective": "selective", "full": "full", "op": "op"}
    parts = [x.strip() for x in text.split(",")]
    bad = [x for x in parts if x not in names]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown recompute {bad[0]!r}; accepted: none, "
                                         "selective, full, op")
    return tuple(names[x] for x in parts)


def _cmd_plan(args) -> int:
    from .planning import plan
    from .presets import load_target

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
    from .report.build import analyze

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
    from .codesign.advise import advise

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


def _cmd_presets(args) -> int:
    from .presets import list_presets

    print(tabulate(list_presets(), headers=("preset", "model")))
    return 0


def _workload_args(p: argparse.ArgumentParser, target_help: str,
                   optional: bool = False) -> None:
    """The target and the workload options analyze, advise and sweep share."""
    p.add_argument("target", help=target_help, nargs="?" if optional else None)
    p.add_argument("--gpu", default="h100", help="GPU name or alias (default h100)")
    p.add_argument("--dtype", default="bf16", help="dtype the GEMMs run in (default bf16)")
    p.add_argument("--batch-size", type=_positive_int, default=None,
                   help="sequences per batch (default 1)")
    p.add_argument("--seq-len", type=_positive_int, default=None,
                   help="tokens per sequence (default min(1024, max positions))")
    p.add_argument("--tp", type=_positive_int, default=1,
                   help="Megatron tensor-parallel degree: per-GPU shapes (default 1)")
    p.add_argument("--verbose", action="store_true",
                   help="show warnings and log lines from torch and transformers")
    p.add_argument("--attention", choices=ATTENTION_CHOICES, default="flash",
                   help="kernel attention is predicted as: flash (what PyTorch's SDPA runs "
                        "on the GPU; default), fa2, fa3 (Hopper only) or math (unfused)")


def _torchtitan_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--torchtitan", default=None, metavar="CONFIG",
                   help="a torchtitan job (.toml, or the .json torchtitan 0.3 saves with "
                        "--debug.save_config_file): its model, batch, sequence length, "
                        "parallelism, checkpointing and compile settings")


def _titan_job(args, gpus=None):
    """The torchtitan job of ``--torchtitan`` (None without), refusing a target beside it."""
    if args.torchtitan is None:
        if args.target is None:
            raise ValueError("give a model (a preset, a config.json ...) or --torchtitan "
                             "CONFIG")
        return None
    if args.target is not None:
        raise ValueError(f"--torchtitan sets the model, but a target ({args.target}) was "
                         "given too: give one of them")
    from .torchtitan import read_torchtitan

    return read_torchtitan(args.torchtitan, gpus=gpus)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="fxshape", description="GEMM shape efficiency on GPUs.")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    pp = sub.add_parser("predict", help="predict one GEMM's time and efficiency",
                        description="Predict C[batch,M,N] = A[batch,M,K] @ B[batch,K,N].")
    pp.add_argument("--m", type=_positive_int, required=True, help="rows of A and C (tokens)")
    pp.add_argument("--n", type=_positive_int, required=True, help="columns of B and C")
    pp.add_argument("--k", type=_positive_int, required=True, help="reduction dimension")
    pp.add_argument("--batch", type=_positive_int, default=1, help="batched GEMMs (default 1)")
    pp.add_argument("--gpu", default="h100", help="GPU name or alias (default h100; "
                                                  "see `fxshape gpus`)")
    pp.add_argument("--dtype", default="bf16",
                    help="fp16, bf16, tf32, fp32 (no TF32) or fp8 (default bf16)")
    pp.add_argument("--layout", default="nn", choices=LAYOUTS,
                    help="operand layout: nn = torch.mm, nt = F.linear (default nn)")
    pp.add_argument("--json", action="store_true", help="print JSON instead of a table")
    pp.set_defaults(func=_cmd_predict)

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
    from .hardware.topology import TOPOLOGIES

    pa.add_argument("--mode", choices=("inference", "prefill", "train", "decode"),
                    default=None,
                    help="inference (= prefill: a prompt's forward; the default), train, or "
                         "decode: one token per sequence over a KV cache of --context-len")
    _kv_args(pa)
    _allreduce_arg(pa, None)
    _gemv_arg(pa)
    _quantize_args(pa, training=True)
    pa.add_argument("--dp", type=_positive_int, default=1,
                    help="data-parallel degree: the gradient all-reduce of a --train step")
    pa.add_argument("--topology", type=_topology_arg, default=None,
                    help="the machine the GPUs are in: " + ", ".join(TOPOLOGIES)
                         + ", each optionally ':NODES' (dgx-h100:4; default: the GPU's "
                           "usual node, as many as the plan needs)")
    pa.add_argument("--sequence-parallel", action="store_true",
                    help="with --tp: Megatron sequence parallelism")
    pa.add_argument("--pp", type=_positive_int, default=1,
                    help="pipeline-parallel stages (with --train)")
    pa.add_argument("--cp", type=_positive_int, default=1,
                    help="context-parallel ranks (with --train): each sequence split over "
                         "them, attention as ring attention; --seq-len a multiple of 2 x cp")
    pa.add_argument("--ep", type=_positive_int, default=1,
                    help="expert-parallel ranks (with --train, a MoE model): each MoE layer's "
                         "experts spread over ep of the dp x cp ranks, tokens exchanged by "
                         "all-to-all; must divide dp x cp and the experts")
    pa.add_argument("--capacity-factor", type=float, default=None,
                    help="with --ep: each expert's rows capped and padded to this factor "
                         "times its balanced share (default: dropless)")
    pa.add_argument("--zero", type=int, choices=ZERO_STAGES, default=0,
                    help="ZeRO stage over the data-parallel ranks: 1 optimizer state, 2 and "
                         "gradients, 3 and parameters (FSDP)")
    pa.add_argument("--dp-shard", type=_positive_int, default=None,
                    help="with --zero: shard over this many data-parallel ranks, replicate "
                         "across the rest (hybrid sharding)")
    pa.add_argument("--microbatches", type=_positive_int, default=1,
                    help="micro-batches per optimizer step (gradient accumulation; the "
                         "pipeline's micro-batches)")
    pa.add_argument("--virtual-stages", type=_positive_int, default=1,
                    help="model chunks per pipeline rank (interleaved 1F1B)")
    pa.add_argument("--schedule", choices=SCHEDULES, default="1f1b",
                    help="the pipeline schedule (default 1f1b)")
    pa.add_argument("--stage-layers", type=_stage_layers, default=None,
                    help="how the layers split into pipeline chunks: 'torchtitan' (the "
                         "embedding and the head weighed as a layer each) or layer counts "
                         "per chunk, comma-separated (15,16,16,16,16,16,16,15); default "
                         "equal chunks")
    pa.add_argument("--async-tp", action="store_true",
                    help="asynchronous tensor parallelism (torch.compile's micro-pipeline "
                         "TP, torchtitan's async TP): the sequence-parallel collectives fused "
                         "into the GEMMs beside them; needs --tp, --sequence-parallel and "
                         "--execution compiled")
    pa.add_argument("--grad-dtype", choices=tuple(GRAD_DTYPES), default="fp32",
                    help="the dtype gradients are held and reduced in (with --train; "
                         "default fp32, as fp32 master weights have them)")
    pa.add_argument("--gpus", type=_positive_int, default=None,
                    help="with --torchtitan: the job's world size (needed when its "
                         "data_parallel_shard_degree is -1)")
    pa.add_argument("--recompute", choices=("full", "selective", "op"), default=None,
                    help="activation recomputation in --train: every layer's forward "
                         "(full), the attention core (selective, Megatron's) or every "
                         "second matmul and the memory-bound ops (op, torchtitan's op-level "
                         "selective checkpointing)")
    pa.add_argument("--provenance", choices=("traced", "matched", "none"), default="traced",
                    help="how the 'set by' column is decided: traced (default: by cause, "
                         "re-tracing with one hyperparameter or input size changed at a "
                         "time), matched (by value, faster, can confuse equal values), none")
    pa.add_argument("--plot", default=None, metavar="PATH",
                    help="also draw where the time goes (.png or .svg; needs matplotlib)")
    pa.set_defaults(func=_cmd_analyze)

    def common(p, mode_default):
        _workload_args(p, "preset name or path to a Hugging Face config.json")
        _step_args(p)
        p.add_argument("--mode", choices=("train", "inference", "prefill", "decode"),
                       default=None,
                       help=f"a training step, inference (= prefill) or a decode step over "
                            f"a KV cache of --context-len (default {mode_default})")
        _kv_args(p)

    pv = sub.add_parser("advise", help="recommend hyperparameters with efficient GEMM shapes",
                        description="Search vocab, hidden size, heads and MLP width for "
                                    "shapes the GPU runs faster; re-analyze each candidate.")
    common(pv, "train")
    pv.add_argument("--tolerance", type=float, default=0.02,
                    help="largest relative change of the parameter count (default 0.02)")
    pv.add_argument("--min-speedup", type=float, default=0.01,
                    help="significance threshold (default 0.01 = 1%%)")
    pv.add_argument("--format", choices=("table", "json", "markdown"), default="table")
    _quantize_args(pv, training=True)
    pv.set_defaults(func=_cmd_advise)

    ps = sub.add_parser("sweep", help="predicted throughput across a hyperparameter range",
                        description="Predict GEMM TFLOP/s for each value of one config "
                                    "attribute; draw it with --out (matplotlib).")
    common(ps, "inference")
    ps.add_argument("--param", required=True, help="config attribute, e.g. hidden_size")
    ps.add_argument("--range", required=True, help="START:STOP[:STEP], STOP included")
    ps.add_argument("--out", default=None, help="write a plot (.png or .svg)")
    _quantize_args(ps, training=True)
    ps.set_defaults(func=_cmd_sweep)

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
    pn.add_argument("--gpu", default="h100", help="GPU name or alias (default h100)")
    pn.add_argument("--dtype", default="bf16", help="compute dtype (default bf16)")
    pn.add_argument("--global-batch", type=_positive_int, default=None,
                    help="sequences per optimizer step, over all GPUs (required unless "
                         "--torchtitan gives it)")
    pn.add_argument("--seq-len", type=_positive_int, default=None,
                    help="tokens per sequence (required unless --torchtitan gives it)")
    _torchtitan_args(pn)
    pn.add_argument("--advise", action="store_true",
                    help="also the shape changes that make the best plan faster, each "
                         "priced on the whole step of that plan")
    pn.add_argument("--topology", type=_topology_arg, default=None,
                    help="the machine (default: the GPU's usual node, as many as needed)")
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
    pn.set_defaults(func=_cmd_plan)

    pw = sub.add_parser("serve", help="a batch of requests end to end, or a server under "
                                      "load: time to first token, inter-token latency, "
                                      "latency, throughput",
                        description="Predict batch-size requests of --prompt-len tokens "
                                    "generating --output-len tokens each, as a serving "
                                    "engine runs them: the prefill (time to the first "
                                    "token), then every decode step at its own context. "
                                    "With --rate / --num-requests or --trace: a server "
                                    "under load, requests played through vLLM's continuous "
                                    "batching with chunked prefill (throughput, TTFT, "
                                    "TPOT, ITL and latency percentiles, KV cache, "
                                    "preemptions).")
    pw.add_argument("target", help="a causal LM: preset name, config.json path, cached Hub id "
                                   "or package.module:factory")
    pw.add_argument("--gpu", default="h100", help="GPU name or alias (default h100)")
    pw.add_argument("--dtype", default="bf16", help="dtype the model runs in (default bf16)")
    pw.add_argument("--prompt-len", type=_length_arg, default=None,
                    help="prompt tokens per request (under load also a range lo:hi, drawn "
                         "uniformly)")
    pw.add_argument("--output-len", type=_length_arg, default=None,
                    help="tokens each request generates (under load also a range lo:hi)")
    pw.add_argument("--batch-size", type=_positive_int, default=None,
                    help="requests run together (default 1; one batch only)")
    pw.add_argument("--num-requests", type=_positive_int, default=None,
                    help="under load: requests sent")
    pw.add_argument("--rate", type=_rate_arg, default=None,
                    help="under load: requests per second, a Poisson process (default inf: "
                         "all at once)")
    pw.add_argument("--trace", default=None,
                    help="under load: a CSV of requests with columns arrival_s, prompt_len, "
                         "output_len")
    pw.add_argument("--max-concurrency", type=_positive_int, default=None,
                    help="under load: at most this many requests in flight (the client's cap)")
    pw.add_argument("--max-num-seqs", type=_positive_int, default=None,
                    help="under load: requests running at once (default vLLM's: 1024 on "
                         "GPUs of 70 GiB or more but the A100, else 256)")
    pw.add_argument("--max-num-batched-tokens", type=_positive_int, default=None,
                    help="under load: tokens per step, the chunked prefill budget (default "
                         "vLLM's: 8192 / 2048 as for --max-num-seqs)")
    pw.add_argument("--block-size", type=_positive_int, default=None,
                    help="under load: tokens per KV block (default 16)")
    pw.add_argument("--gpu-memory-utilization", type=_fraction_arg, default=None,
                    help="under load: the share of GPU memory the engine takes (default 0.9)")
    pw.add_argument("--seed", type=int, default=None,
                    help="under load: seed of the arrivals and lengths (default 0)")
    pw.add_argument("--slo-ttft", default=None,
                    help="capacity planning: the time-to-first-token SLO (200ms, 0.2s; a bare "
                         "number is milliseconds)")
    pw.add_argument("--slo-itl", default=None,
                    help="capacity planning: the inter-token latency SLO (30ms)")
    pw.add_argument("--slo-percentile", type=int, choices=(50, 90, 99), default=None,
                    help="capacity planning: the percentile the SLOs hold at (default 99)")
    pw.add_argument("--tp-choices", type=_int_list, default=None,
                    help="capacity planning: tensor-parallel degrees to try (default 1,2,4,8)")
    pw.add_argument("--fuse", choices=FUSE_CHOICES, default=None,
                    help="which GEMMs reading one activation run as one: all (engines': "
                         "Q/K/V and gate/up, the default), qkv (gpt-fast's wqkv), none (as "
                         "the Hugging Face model is written)")
    pw.add_argument("--draft", default=None,
                    help="speculative decoding: 'eagle' (one decoder layer of the target's "
                         "shapes) or a draft causal LM (preset, config.json, ...)")
    pw.add_argument("--num-speculative-tokens", type=_positive_int, default=None,
                    help="speculative decoding: draft tokens per step, k (default 3)")
    pw.add_argument("--acceptance", type=_unit_arg, default=None,
                    help="speculative decoding: the probability a draft token is accepted "
                         "(default 0.57, a published EAGLE figure)")
    pw.add_argument("--acceptance-length", type=_tokens_arg, default=None,
                    help="speculative decoding: the measured mean tokens per step instead "
                         "of --acceptance")
    pw.add_argument("--tp", type=_positive_int, default=1,
                    help="tensor-parallel GPUs (default 1)")
    pw.add_argument("--topology", default=None, choices=sorted(TOPOLOGIES),
                    help="the machine (default: the one --gpu usually comes in)")
    pw.add_argument("--attention", choices=ATTENTION_CHOICES, default="flash",
                    help="attention kernel (default flash)")
    pw.add_argument("--kv-dtype", default=None,
                    help="the KV cache's dtype: fp8, int8 or nvfp4 (Blackwell)")
    pw.add_argument("--page-size", type=_positive_int, default=None,
                    help="tokens per page of a paged KV cache (vLLM 16)")
    _allreduce_arg(pw, "auto")
    _gemv_arg(pw)
    _quantize_args(pw)
    pw.add_argument("--format", choices=("table", "json"), default="table")
    pw.add_argument("--verbose", action="store_true",
                    help="show warnings and log lines from torch and transformers")
    pw.set_defaults(func=_cmd_serve)

    pl = sub.add_parser("presets", help="list the built-in model presets")
    pl.set_defaults(func=_cmd_presets)

    pg = sub.add_parser("gpus", help="list the GPU table")
    pg.set_defaults(func=_cmd_gpus)

    pt = sub.add_parser("compare", help="compare a PyTorch profiler trace with the model",
                        description="Pair every kernel of a PyTorch profiler (Kineto) trace "
                                    "with the operator that launched it, predict each "
                                    "operator from its recorded shapes, and report the "
                                    "error per class, the worst operators and the device "
                                    "time the model cannot attribute.")
    pt.add_argument("trace", help="the trace: prof.export_chrome_trace's JSON, or .json.gz")
    pt.add_argument("--gpu", default=None,
                    help="the GPU it ran on (default: the trace's deviceProperties)")
    pt.add_argument("--format", choices=("markdown", "json", "csv"), default="markdown",
                    help="markdown (default): the summary; json: every record; csv: one "
                         "line per operator")
    pt.add_argument("--worst", type=int, default=10,
                    help="operators listed as the worst (markdown; default 10)")
    pt.set_defaults(func=_cmd_compare)

    pc = sub.add_parser("calibrate", help="fit the GEMM model to this machine's GPU",
                        description="Time a built-in GEMM sweep on the local CUDA device, "
                                    "fit the model's constants, write a parameter file.")
    pc.add_argument("--quick", action="store_true",
                    help="a coarser sweep and fewer repeats (under 3 minutes)")
    pc.add_argument("--out", default="fxshape_params.json",
                    help="parameter file to write (default fxshape_params.json)")
    pc.add_argument("--gpu", default=None,
                    help="fxshape GPU name (default: detected from the device name)")
    pc.add_argument("--dtype", default=None,
                    help="fp16, bf16 or tf32 (default bf16; with --trace, the trace's most "
                         "common GEMM dtype)")
    pc.add_argument("--trace", default=None, metavar="TRACE",
                    help="fit to the GEMM and memory-bound kernels of this PyTorch "
                         "profiler trace instead of timing a sweep on the local GPU (no GPU "
                         "needed)")
    pc.set_defaults(func=_cmd_calibrate)
    for sp in (pp, pa, pv, ps, pt):
        sp.add_argument("--params", default=None, metavar="PATH",
                        help="parameter file (from fxshape calibrate) to predict with, or "
                             "a library generation: 2024 (the 2022-2024 fits of the GPUs "
                             "refitted to today's libraries since); default $FXSHAPE_PARAMS "
                             "if set, else the packaged constants (today's libraries)")
    return ap


def _cmd_compare(args) -> int:
    from .traces import compare_trace

    if args.worst < 0:
        raise ValueError(f"--worst must be 0 or more, got {args.worst}")
    got = compare_trace(args.trace, gpu=args.gpu)
    if args.format == "json":
        print(got.to_json())
    elif args.format == "csv":
        sys.stdout.write(got.to_csv())
    else:
        sys.stdout.write(got.to_markdown(worst=args.worst))
    return 0


def _cmd_calibrate(args) -> int:
    from .fit.calibrate import main as calibrate_main

    if args.trace is None:
        if args.dtype is None:
            args.dtype = "bf16"
        return calibrate_main(args)
    if args.quick:
        raise ValueError("--quick sets the sweep timed on the local GPU; with --trace the "
                         "trace's kernels are the measurements: drop one of them")
    from .traces.calibrate import calibrate_from_trace

    got = calibrate_from_trace(args.trace, gpu=args.gpu, out=args.out, dtype=args.dtype)
    print(got.describe())
    print(f"use it with: FXSHAPE_PARAMS={got.out} fxshape analyze ...   or   "
          f"params={got.out!r}")
    return 0


@contextlib.contextmanager
def _quiet(verbose: bool):
    """Warnings and log lines from torch and transformers internals stay out of the
    terminal unless ``--verbose``; both are restored afterwards."""
    if verbose:
        yield
        return
    import importlib.util
    import logging
    import warnings

    from .tracing.export import quiet_loggers

    if importlib.util.find_spec("transformers") is not None:
        # transformers sets its loggers' levels when first imported: import it first
        importlib.import_module("transformers")
    with quiet_loggers("torch", "transformers", level=logging.ERROR), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def main(argv=None) -> int:
    """Entry point; returns the exit status. Errors are one line on stderr (exit 2); an
    unexpected exception is one line too, its traceback shown with ``--verbose``."""
    parser = build_parser()
    args = parser.parse_args(argv)
    verbose = getattr(args, "verbose", False)
    try:
        with _quiet(verbose), use_params(getattr(args, "params", None)):
            code = args.func(args)
        sys.stdout.flush()  # a closed pipe shows here, inside the handler below
        return code
    except ValueError as exc:
        print(f"fxshape: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # the reader went away (`fxshape gpus | head`): stop quietly, as cat does
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print("fxshape: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - no traceback reaches the user without --verbose
        if verbose:
            raise
        first = (str(exc).strip().splitlines() or [""])[0][:500]
        print(f"fxshape: error: {type(exc).__name__}: {first} (--verbose shows the "
              "traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
