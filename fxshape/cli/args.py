"""Argument types and the option groups several commands share."""

from __future__ import annotations

import argparse
import dataclasses


from ..cost.attention import ATTENTION_CHOICES
from ..parallelism.plan import Parallel
from ..tracing.export import MAX_SIZE


def _topology_arg(text: str) -> str:
    from ..hardware.topology import get_topology

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

    from ..report.plot import check_path

    check_path(path, option)
    if importlib.util.find_spec("matplotlib") is None:
        raise ValueError(f"{option} needs matplotlib, which is not installed: pip install "
                         "'fxshape[plot]'")


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
    from ..cost.allreduce import ALGORITHMS

    p.add_argument("--allreduce", choices=ALGORITHMS, default=default,
                   help="how tensor parallelism's all-reduces run under CUDA graphs: auto "
                        "(vLLM's choice: one-shot / two-shot for small buffers on NVLink, "
                        "symmetric memory's multimem on Hopper and Blackwell NVSwitch, NCCL "
                        "otherwise), one-shot, two-shot, multimem, or nccl (LL / LL128 / "
                        "Simple by size)" + ("; default: auto in decode, NCCL as measured from "
                                      "eager PyTorch otherwise" if default is None else ""))


def _quantize_args(p, training: bool = False) -> None:
    from ..cost.quant import GROUP_SIZES, QUANT_METHODS

    p.add_argument("--quantize", choices=QUANT_METHODS, default=None,
                   help="quantized linear layers as inference engines run them: int8 or "
                        "int4 (weight-only, gpt-fast/torchao), fp8 (weights and "
                        "activations, torch._scaled_mm; Hopper, Ada, Blackwell), nvfp4 or "
                        "mxfp8 (block-scaled weights and activations; Blackwell)")
    p.add_argument("--group-size", type=int, choices=GROUP_SIZES, default=None,
                   help="--quantize int4: elements of K per scale and zero (default 128)")
    if training:
        from ..cost.float8 import FLOAT8_RECIPES

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


def _gemv_arg(p) -> None:
    from ..cost.gemv import GEMV_CHOICES

    p.add_argument("--gemv", choices=GEMV_CHOICES, default=None,
                   help="how GEMMs with M = 1 (batch-1 decode) run: library (the BLAS GEMM, "
                        "the default) or inductor (torch.compile with "
                        "coordinate_descent_tuning, as gpt-fast: one Triton reduction each)")


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


def advise_args(p, mode_default) -> None:
    """The target, workload, step and KV-cache options advise and sweep share."""
    _workload_args(p, "preset name or path to a Hugging Face config.json")
    _step_args(p)
    p.add_argument("--mode", choices=("train", "inference", "prefill", "decode"),
                   default=None,
                   help=f"a training step, inference (= prefill) or a decode step over "
                        f"a KV cache of --context-len (default {mode_default})")
    _kv_args(p)


def params_arg(p) -> None:
    """``--params``: a parameter file or a library generation to predict with."""
    p.add_argument("--params", default=None, metavar="PATH",
                   help="parameter file (from fxshape calibrate) to predict with, or "
                        "a library generation: 2024 (the 2022-2024 fits of the GPUs "
                        "refitted to today's libraries since); default $FXSHAPE_PARAMS "
                        "if set, else the packaged constants (today's libraries)")


#: the plan's fields with flags of their own, shared with commands that take no plan
PLAN_SHORTHANDS = ("tp", "dp", "sequence_parallel", "recompute")


def plan_fields() -> tuple:
    """The fields of :class:`fxshape.Parallel` ``fxshape analyze`` reads from flags
    generated by :func:`plan_flags`: all but :data:`PLAN_SHORTHANDS`."""
    return tuple(f for f in dataclasses.fields(Parallel) if f.name not in PLAN_SHORTHANDS)


def field_docs(cls) -> dict:
    """Each field's text in the ``Args:`` section of ``cls``'s docstring, its markup
    (````x````, ``:func:`x```) dropped: the help a generated flag shows."""
    import inspect
    import re

    doc = inspect.getdoc(cls) or ""
    out: dict = {}
    name = None
    in_args = False
    for line in doc.splitlines():
        if line.strip() == "Args:":
            in_args = True
            continue
        if in_args and line and not line.startswith(" "):
            break
        m = re.match(r"^    (\w+): (.*)$", line)
        if in_args and m:
            name, out[m.group(1)] = m.group(1), m.group(2)
        elif in_args and name and line.startswith("        "):
            out[name] += " " + line.strip()
    clean = {k: re.sub(r":\w+:`~?([^`]+)`", r"\1", v).replace("``", "") for k, v in out.items()}
    return {k: v.replace("%", "%%") for k, v in clean.items()}


def _parsed(parse):
    """An argparse type of a function that reads a value from text (its ``ValueError``
    becomes argparse's one-line error)."""
    def read(text: str):
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    read.__name__ = parse.__name__
    return read


def plan_flags(p) -> None:
    """A flag per field of :func:`plan_fields`, generated from the field: ``--name`` (a
    boolean that defaults to True: ``--no-name``), its type from its annotation (a count:
    a positive integer; a float; a boolean: a switch), its ``choices`` and its ``parse``
    function from its metadata, its help from ``Parallel``'s docstring. A new field of
    ``Parallel`` is a new flag without touching the parser."""
    docs = field_docs(Parallel)
    for f in plan_fields():
        flag = "--" + f.name.replace("_", "-")
        kind = str(f.type).replace(" ", "")
        help_ = docs.get(f.name) or f.name.replace("_", " ")
        if kind == "bool":
            if f.default:
                p.add_argument("--no-" + flag[2:], dest=f.name, action="store_false",
                               help="not: " + help_)
            else:
                p.add_argument(flag, action="store_true", help=help_)
        elif "parse" in f.metadata:
            p.add_argument(flag, type=_parsed(f.metadata["parse"]), default=f.default,
                           help=help_)
        elif "choices" in f.metadata:
            choices = f.metadata["choices"]
            p.add_argument(flag, choices=choices, type=type(choices[0]), default=f.default,
                           help=help_)
        elif kind.startswith("float"):
            p.add_argument(flag, type=float, default=f.default, help=help_)
        elif kind.startswith("int"):
            p.add_argument(flag, type=_positive_int, default=f.default, help=help_)
        else:
            raise TypeError(f"Parallel.{f.name} ({f.type}): no flag is generated for this "
                            "type; give the field a 'parse' function in its metadata")


def plan_of_flags(args) -> dict:
    """The plan's fields as the generated flags gave them."""
    return {f.name: getattr(args, f.name) for f in plan_fields()}
