"""Read a PyTorch profiler (Kineto) trace: the JSON ``prof.export_chrome_trace(path)`` writes,
gzipped or not, from a CUDA or a ROCm run.

:func:`read_trace` keeps what the comparison needs, as frozen records: the host's operators
(``cpu_op`` events, with the ``Input Dims`` / ``Input type`` / ``Input Strides`` that
``record_shapes=True`` adds; the first Kineto traces' ``Operator`` events and ``Input
dims`` too) and the ``nccl:*`` annotations of ``torch.distributed``; the
runtime's launches (``cudaLaunchKernel``, ``hipExtModuleLaunchKernel``, ... with their
``correlation`` id); the device's kernels, copies and memsets (``kernel``, ``gpu_memcpy``,
``gpu_memset``, each with the launch's ``correlation``); the device properties and the
distributed info. Times are microseconds, as in the file.

A file that is not such a trace, a trace without GPU activity and one recorded without
``record_shapes`` are refused in one line that says how to record one.

Pure reading: no prediction here (``fxshape.traces.compare``).
"""

from __future__ import annotations

import gzip
import json
import math
import os
import zlib
from dataclasses import dataclass

__all__ = ["TraceOp", "Launch", "DeviceEvent", "Trace", "read_trace", "RECORD_HINT"]

#: How to record a trace fxshape can read (quoted by every refusal).
RECORD_HINT = ("record one with torch.profiler.profile(activities=[ProfilerActivity.CPU, "
               "ProfilerActivity.CUDA], record_shapes=True) and prof.export_chrome_trace(path)")

#: Event categories, compared in lower case. Today's PyTorch writes ``cpu_op``,
#: ``cuda_runtime`` (``cuda_driver``, ROCm's ``hip_runtime`` ...), ``kernel``, ``gpu_memcpy``
#: and ``gpu_memset``; its first Kineto traces (PyTorch 1.8 on) wrote ``Operator``,
#: ``Runtime``, ``Kernel``, ``Memcpy`` and ``Memset``, and ``Input dims`` (the same map,
#: and the same fallback, in pytorch/kineto's TensorBoard plugin,
#: ``tb_plugin/torch_tb_profiler/profiler/trace.py``: ``EventTypeMap``, ``OperatorEvent``).
_OP_CATS = ("cpu_op", "operator")
_DEVICE_CATS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset",
                "memcpy": "memcpy", "memset": "memset"}
_RUNTIME_CATS = ("cuda_runtime", "cuda_driver", "hip_runtime", "hip_driver", "runtime")


@dataclass(frozen=True)
class TraceOp:
    """One host-side operator (a ``cpu_op``) or collective annotation (``nccl:*``).

    ``dims``: the ``Input Dims`` (one list per input; a tensor list nests further, a scalar
    is ``[]``); ``types``: the ``Input type`` strings (``"float"``, ``"c10::BFloat16"``,
    ``"Scalar"`` ...); ``strides``: ``Input Strides`` where the trace has them, else None.
    ``args``: other scalar arguments the event carries (``Concrete Inputs``, ``Group size``,
    ``In msg nelems`` ...), as ``(key, value)`` pairs.
    """

    index: int
    name: str
    cat: str
    pid: object
    tid: object
    ts: float
    dur: float
    dims: tuple
    types: tuple
    strides: tuple | None
    args: tuple = ()

    @property
    def end(self) -> float:
        return self.ts + self.dur

    def arg(self, key: str, default=None):
        for k, v in self.args:
            if k == key:
                return v
        return default


@dataclass(frozen=True)
class Launch:
    """One runtime call that puts work on the device (its ``correlation`` id names it)."""

    name: str
    pid: object
    tid: object
    ts: float
    dur: float
    correlation: int


@dataclass(frozen=True)
class DeviceEvent:
    """One kernel, copy or memset on the device. ``kind``: ``"kernel"``, ``"memcpy"`` or
    ``"memset"``."""

    index: int
    name: str
    kind: str
    device: object
    stream: object
    ts: float
    dur: float
    correlation: int | None
    grid: tuple | None = None
    block: tuple | None = None
    bytes: int | None = None

    @property
    def end(self) -> float:
        return self.ts + self.dur


@dataclass(frozen=True)
class Trace:
    """A read trace: its operators, launches and device events in file order."""

    path: str
    ops: tuple
    launches: tuple
    device_events: tuple
    device_properties: tuple  # dicts, one per device, as the file has them
    distributed: dict | None
    world_size: int | None


def _load_json(path: str):
    if not isinstance(path, (str, os.PathLike)):
        raise ValueError(f"a trace path must be a file path, got {path!r}")
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ValueError(f"no trace file {path!r}; {RECORD_HINT}")
    with open(path, "rb") as f:
        head = f.read(2)
    opener = gzip.open if head == b"\x1f\x8b" else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            return json.load(f)
    except (OSError, EOFError, zlib.error, UnicodeDecodeError, json.JSONDecodeError,
            RecursionError) as exc:
        cut = isinstance(exc, (EOFError, zlib.error)) or "Compressed file ended" in str(exc)
        raise ValueError(f"{path!r} is not a PyTorch profiler trace ("
                         + ("a truncated gzip file" if cut else f"not JSON: "
                            f"{type(exc).__name__}") + f"); {RECORD_HINT}") from None


def _num(v, default=None):
    if isinstance(v, bool):
        return default
    if isinstance(v, (int, float)):
        return v
    try:
        return float(v)
    except (TypeError, ValueError):
        return default


def _corr(v, i: int, name: str, path) -> int | None:
    """A correlation id: an integer (a whole float too, as some writers store it), None
    when absent; anything else is a broken trace, refused naming the event."""
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        ok = None
    else:
        f = _num(v)
        ok = int(f) if f is not None and math.isfinite(f) and f == int(f) else None
    if ok is None:
        raise ValueError(f"{os.fspath(path)!r}: event {i} ({name[:60]}) has correlation "
                         f"{v!r}, not an integer id; {RECORD_HINT}")
    return ok


def _tup(v):
    if isinstance(v, list):
        return tuple(_tup(x) for x in v)
    return v


_SCALAR_ARGS = ("Concrete Inputs", "Group size", "Process Group Name", "Process Group Ranks",
                "In msg nelems", "Out msg nelems", "dtype", "Collective name", "Sequence number")


def read_trace(path) -> Trace:
    """Read the Kineto JSON at ``path`` (``.json`` or ``.json.gz``).

    Raises:
        ValueError: not a file, not JSON, no ``traceEvents``, no GPU kernels (a CPU-only
            trace), or no operator with recorded input shapes (``record_shapes`` off); each
            says how to record a trace that works.
    """
    doc = _load_json(path)
    events = doc.get("traceEvents") if isinstance(doc, dict) else (
        doc if isinstance(doc, list) else None)
    if not isinstance(events, list):
        raise ValueError(f"{os.fspath(path)!r} is not a PyTorch profiler trace (no "
                         f"'traceEvents' list); {RECORD_HINT}")
    ops, launches, dev = [], [], []
    for i, e in enumerate(events):
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        cat, name = e.get("cat"), e.get("name")
        cat = cat.lower() if isinstance(cat, str) else cat
        ts, dur = _num(e.get("ts")), _num(e.get("dur"), 0.0)
        if not isinstance(name, str) or ts is None:
            continue
        if not (math.isfinite(ts) and math.isfinite(dur)) or dur < 0:
            raise ValueError(f"{os.fspath(path)!r}: event {i} ({name[:60]}) has ts {ts!r} and "
                             f"dur {dur!r}: a profiler writes finite times and durations of "
                             f"0 or more; {RECORD_HINT}")
        a = e.get("args") if isinstance(e.get("args"), dict) else {}
        if cat == "operator" and "#" in name and "::" not in name:
            continue  # the first traces' record_function ranges (ProfilerStep#3,
            # Optimizer.step#SGD.step), which today's write as user_annotation
        if cat in _OP_CATS or (cat == "user_annotation" and name.startswith("nccl:")):
            strides = a.get("Input Strides")
            dims = a.get("Input Dims") or a.get("Input dims") or []  # the latter: the first traces
            ops.append(TraceOp(
                len(ops), name, "cpu_op" if cat in _OP_CATS else cat, e.get("pid"),
                e.get("tid"), float(ts), float(dur),
                _tup(dims), tuple(a.get("Input type") or ()),
                _tup(strides) if isinstance(strides, list) else None,
                tuple((k, _tup(a[k])) for k in _SCALAR_ARGS if k in a)))
        elif cat in _RUNTIME_CATS and "correlation" in a:
            launches.append(Launch(name, e.get("pid"), e.get("tid"), float(ts), float(dur),
                                   _corr(a["correlation"], i, name, path)))
        elif cat in _DEVICE_CATS:
            corr = _corr(a.get("correlation"), i, name, path)
            grid, block = a.get("grid"), a.get("block")
            dev.append(DeviceEvent(
                len(dev), name, _DEVICE_CATS[cat], a.get("device"), a.get("stream"),
                float(ts), float(dur), corr,
                tuple(grid) if isinstance(grid, list) else None,
                tuple(block) if isinstance(block, list) else None,
                int(nb) if (nb := _num(a.get("bytes"))) is not None and math.isfinite(nb)
                and nb >= 0 else None))
    where = repr(os.fspath(path))
    if not any(d.kind == "kernel" for d in dev):
        raise ValueError(f"{where} has no GPU kernels (a CPU-only trace?); {RECORD_HINT}")
    if not any(o.dims for o in ops if o.cat == "cpu_op"):
        raise ValueError(f"{where} has no operator input shapes (recorded without "
                         f"record_shapes=True); {RECORD_HINT}")
    props = doc.get("deviceProperties") if isinstance(doc, dict) else None
    dist = doc.get("distributedInfo") if isinstance(doc, dict) else None
    dist = dist if isinstance(dist, dict) else None
    world = _num(dist.get("world_size")) if dist else None
    return Trace(os.fspath(path), tuple(ops), tuple(launches), tuple(dev),
                 tuple(p for p in props if isinstance(p, dict)) if isinstance(props, list)
                 else (), dist, int(world) if world else None)
