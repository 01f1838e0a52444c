"""Argument types and the option groups several commands share."""

from __future__ import annotations

import argparse
import dataclasses


from ..codesign.advise import SWEEP_SETUP
from ..parallelism.plan import Parallel
from ..tracing.export import MAX_SIZE


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
    setup_flag(p, "execution")
    setup_flag(p, "optimizer")


def _kv_args(p) -> None:
    """--context-len, --kv-dtype, --page-size: the KV cache of a decode step."""
    for name in ("context_len", "kv_dtype", "page_size"):
        setup_flag(p, name)


def _allreduce_arg(p, default) -> None:
    setup_flag(p, "allreduce", default=default)


def _quantize_args(p, training: bool = False) -> None:
    setup_flag(p, "quantize")
    setup_flag(p, "group_size")
    if training:
        setup_flag(p, "float8")
    p.add_argument("--activation-scales", choices=("dynamic", "static"), default=None,
                   help="--quantize fp8: per-token scales computed by a kernel (dynamic, "
                        "vLLM; the default) or a static per-tensor scale fused into the "
                        "producer (TensorRT-LLM)")


def _gemv_arg(p) -> None:
    setup_flag(p, "gemv")


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
    setup_flag(p, "gpu")
    setup_flag(p, "dtype")
    setup_flag(p, "batch_size")
    setup_flag(p, "seq_len")
    p.add_argument("--tp", type=_positive_int, default=1,
                   help="Megatron tensor-parallel degree: per-GPU shapes (default 1)")
    p.add_argument("--verbose", action="store_true",
                   help="show warnings and log lines from torch and transformers")
    setup_flag(p, "attention")


def _torchtitan_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--torchtitan", default=None, metavar="CONFIG",
                   help="a torchtitan job (.toml, or the .json torchtitan 0.3 saves with "
                        "--debug.save_config_file): its model, batch, sequence length, "
                        "parallelism, checkpointing and compile settings")


#: the flags of the setup fields advise and sweep pass on (the API's list: --group-size
#: goes in with --quantize)
SWEEP_FLAGS = tuple(n for n in SWEEP_SETUP if n != "group_size")


def advise_args(p, mode_default) -> None:
    """The target, workload, step and KV-cache options advise and sweep share."""
    _workload_args(p, "preset name or path to a Hugging Face config.json")
    _step_args(p)
    setup_flag(p, "mode", help=f"a training step, inference (= prefill) or a decode step "
                               f"over a KV cache of --context-len (default {mode_default})")
    _kv_args(p)


def params_arg(p) -> None:
    """``--params``: a parameter file or a library generation to predict with."""
    setup_flag(p, "params")


#: the plan's fields with flags of their own, shared with commands that take no plan
PLAN_SHORTHANDS = ("tp", "dp", "sequence_parallel", "recompute")


def plan_fields() -> tuple:
    """The fields of :class:`fxshape.Parallel` ``fxshape analyze`` reads from flags
    generated by :func:`plan_flags`: all but :data:`PLAN_SHORTHANDS`."""
    return tuple(f for f in dataclasses.fields(Parallel) if f.name not in PLAN_SHORTHANDS)


_FROM_FIELD = object()


def _plain(text: str) -> str:
    """A docstring's text as a flag's help: its markup (````x````, ``:func:`x```) dropped,
    ``%`` escaped for argparse."""
    import re

    return re.sub(r":\w+:`~?([^`]+)`", r"\1", text).replace("``", "").replace("%", "%%")


class _Choices(tuple):
    """A flag's choices where the field's None is said ``none``: the help and the errors
    show ``none``, the value parsed is None (``none_or``)."""

    def __contains__(self, value) -> bool:
        return super().__contains__("none" if value is None else value)


def _none_or(kind):
    def read(text: str):
        return None if text == "none" else kind(text)

    read.__name__ = kind.__name__  # argparse names the type in its errors
    return read


def setup_flag(p, name: str, *, default=_FROM_FIELD, help: str | None = None) -> None:
    """``--name`` for the keyword ``name`` of :class:`fxshape.Setup`, generated from its
    field (``fxshape.config.setup.setup_field``): its choices (None said ``none``, parsed
    as None) or its ``parse`` function from the field's metadata, else a positive integer
    for a size (``int | None``) and text otherwise; its help the field's text (a command
    whose default differs says so with ``help``); its default the field's (a dtype by its
    short name) unless the command gives one. A new field is a new flag where a command
    adds it, with no parser written."""
    import torch

    from ..config.setup import setup_field
    from ..hardware.dtypes import canonical_dtype

    f = setup_field(name)
    kw: dict = {}
    if "choices" in f.metadata:
        choices = _Choices("none" if c is None else c for c in f.metadata["choices"])
        kw.update(choices=choices, type=_none_or(type(choices[0])))
    elif "parse" in f.metadata:
        kw["type"] = _parsed(f.metadata["parse"])
    elif str(f.type).replace(" ", "") == "int|None":
        kw["type"] = _positive_int
    if default is _FROM_FIELD:
        default = canonical_dtype(f.default) if isinstance(f.default, torch.dtype) \
            else f.default
    p.add_argument("--" + name.replace("_", "-"), default=default,
                   help=_plain(f.metadata["doc"]) if help is None else help, **kw)


def setup_keywords(args, names) -> dict:
    """The keywords of ``fxshape.Setup`` fields ``names`` as their flags parsed them
    (``quantize``: with ``--group-size`` and ``--activation-scales``, as one
    quantization), for a command to pass to the API it calls."""
    from .shared import _quantization

    return {n: _quantization(args) if n == "quantize" else getattr(args, n) for n in names}


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
    return {k: _plain(v) for k, v in out.items()}


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
