"""Memory-bound kernels: elementwise ops, LayerNorm and softmax as PyTorch's CUDA kernels run
them, and any kernel by its bytes (``kernel_time``: what the step's graph walk prices every
memory-bound op with, ``fxshape.execution.step``).

A memory-bound kernel costs the bytes it must move — its full-size inputs read and its
outputs written; a broadcast operand or a Python scalar moves nothing — at the bandwidth that
kernel family reaches on the GPU, plus a launch latency:

    time = launch_s + bytes / (efficiency[family] * datasheet DRAM bandwidth)

The families are PyTorch's kernels, as the kernel names in the measurements show them
(``../shared/calibration/neusight/memops_train.csv``):

- ``elementwise``: ``vectorized_elementwise_kernel`` (add, mul, div, pow, relu, gelu, tanh,
  casts, where, dropout's apply ...), one pass;
- ``layer_norm``: ``vectorized_layer_norm_kernel`` (``native_layer_norm``): reads the row,
  writes the row and its fp32 mean and rstd;
- ``softmax_warp``: ``softmax_warp_forward``, one warp per row, the row held in registers:
  PyTorch dispatches it when the softmax dimension has at most 1,024 elements;
- ``softmax_block``: ``cunn_SoftMaxForward``, one CTA per row, longer rows.

The efficiencies are fitted per GPU by ``bench/fit_memops.py`` (``fxshape/data/
memops_params.json``); a GPU without measurements takes its architecture family's, with its
own bandwidth. The measurements are fp32 tensors of 2-63 M elements (8-250 MB): they fix
the bandwidth each family reaches, not the small-tensor regime, where the launch latency
(the GEMM model's ``launch_s`` of the same GPU family) is the floor. Transcendental work
(gelu's erf, tanh, pow) is not charged: on the measured GPUs those ops run within 4% of
relu's bandwidth, but for the P100's scalar pow (10% slower; docs/memops.md). Pure
functions; nothing here imports torch.
"""

from __future__ import annotations

import functools
import numbers
import os
from dataclasses import asdict, dataclass

from ..hardware.dtypes import canonical_dtype, itemsize
from ..hardware.gpus import GPUSpec, get_gpu
from .gemm import is_default_params, resolve_params_path
from .paramfile import gpu_section, read_json

__all__ = ["FAMILIES", "KERNEL_FAMILIES", "KernelTime", "MemOpPrediction", "kernel_time",
           "memop_bytes", "memop_family", "predict_memop",
           "memops_params", "forget_params_files", "PACKAGED_PATH", "transfer_s"]

#: The kernel families (see the module docstring).
FAMILIES = ("elementwise", "layer_norm", "softmax_warp", "softmax_block")
#: The largest softmax dimension PyTorch runs with ``softmax_warp_forward`` (aten
#: ``SoftMax.cu``: ``dim_size <= 1024 && dim_size * sizeof(scalar_t) <= 4096``).
SOFTMAX_WARP_MAX = 1024
_KINDS = ("elementwise", "layer_norm", "softmax")
_DEFAULT_PATH = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data",
                             "memops_params.json")
#: the packaged memory-bound constants (``bench/fit_memops.py`` writes them)
PACKAGED_PATH = _DEFAULT_PATH


@dataclass(frozen=True)
class MemOpPrediction:
    """One memory-bound kernel. Times in seconds, bandwidth in GB/s (10^9 bytes/s)."""

    gpu: str
    kind: str
    family: str
    dtype: str
    rows: int
    cols: int
    bytes: int
    time_s: float
    bandwidth_gbs: float  # achieved: bytes / time
    efficiency: float  # achieved bandwidth / datasheet bandwidth
    bound: str  # "memory" or "latency" (launch latency above the transfer time)
    constants_from: str  # the GPU whose fitted efficiencies were used

    def to_dict(self) -> dict:
        return asdict(self)


def _check_count(name, v, minimum=1) -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {v!r}")
    return int(v)


def memop_family(kind: str, cols: int, dtype="fp32") -> str:
    """The kernel family PyTorch runs for ``kind`` over rows of ``cols`` elements."""
    if kind not in _KINDS:
        raise ValueError(f"unknown memory-bound op kind {kind!r}; accepted: {', '.join(_KINDS)}")
    if kind != "softmax":
        return kind
    e = itemsize(canonical_dtype(dtype))
    return "softmax_warp" if cols <= SOFTMAX_WARP_MAX and cols * e <= 4096 else "softmax_block"


def memop_bytes(kind: str, rows: int, cols: int, dtype="fp32", *, inputs: int = 1,
                outputs: int = 1) -> int:
    """Bytes a kernel must move: ``inputs`` full-size ``rows x cols`` operands read and
    ``outputs`` written (elementwise; broadcast operands and scalars are not inputs here);
    LayerNorm reads x, its weight and bias (``cols`` each) and writes y and the fp32 mean and
    rstd per row; softmax reads x and writes y."""
    rows, cols = _check_count("rows", rows), _check_count("cols", cols)
    e = itemsize(canonical_dtype(dtype))
    n = rows * cols
    if kind == "elementwise":
        inputs = _check_count("inputs", inputs, 0)
        outputs = _check_count("outputs", outputs)
        return (inputs + outputs) * n * e
    if kind == "layer_norm":
        return 2 * n * e + 2 * cols * e + 2 * rows * 4
    if kind == "softmax":
        return 2 * n * e
    raise ValueError(f"unknown memory-bound op kind {kind!r}; accepted: {', '.join(_KINDS)}")


@functools.lru_cache(maxsize=None)
def _load(path: str) -> dict:
    data = read_json(path, "memory-op parameter file")
    if not isinstance(data, dict) or "gpus" not in data:
        raise ValueError(f"{path!r} is not a memory-op parameter file (written by "
                         f"bench/fit_memops.py): it has no 'gpus'")
    return data


#: what a memory-op entry holds (the families' efficiencies and the launch latency)
_ENTRY_KEYS = FAMILIES + ("launch_s",)


@functools.lru_cache(maxsize=None)
def _overlay(path: str) -> dict | None:
    """The ``memops`` section of a GEMM parameter file (``fxshape calibrate --trace``
    writes one: ``{gpu: entry}``), or None for a file without one."""
    def check(name, entry):
        missing = sorted(set(_ENTRY_KEYS) - set(entry))
        if missing:
            raise ValueError(f"{path!r}: memops entry for GPU {name!r} lacks "
                             f"{', '.join(missing)}")

    return gpu_section(path, "memops", check)


@functools.lru_cache(maxsize=None)
def _file_kind(path: str) -> str:
    """``"memops"``: a file in ``fxshape/data/memops_params.json``'s format
    (``bench/fit_memops.py``); ``"gemm"``: a GEMM parameter file (``fxshape calibrate``:
    its ``gpus`` entries hold no family efficiencies; perhaps a ``memops`` section);
    ``"other"``: neither (refused by :func:`_load` with its reason)."""
    data = read_json(path, "parameter file")
    if not isinstance(data, dict):
        return "other"
    gpus = data.get("gpus")
    if "memops" in data:
        return "gemm"
    if isinstance(gpus, dict) and any(isinstance(e, dict) and "elementwise" in e
                                      for e in gpus.values()):
        return "memops"
    return "gemm" if isinstance(gpus, dict) else "other"


@functools.lru_cache(maxsize=None)
def _route(path: str, in_force: bool) -> tuple[str | None, str]:
    """``(GEMM parameter file whose memops section to look in, or None; the memory-op
    parameter file)`` for ``path``: the GEMM parameter file in force (``in_force``) or one
    given. Cached: memops_params runs for every kernel a step prices."""
    if in_force and is_default_params(path):
        return None, _DEFAULT_PATH
    if os.path.abspath(path) != os.path.abspath(_DEFAULT_PATH) and _file_kind(path) == "gemm":
        return path, _DEFAULT_PATH
    return None, path


def forget_params_files() -> None:
    """Drop the cached reading of parameter files (after one is rewritten)."""
    for f in (_load, _overlay, _file_kind, _route):
        f.cache_clear()


def memops_params(gpu, params_path: str | None = None) -> tuple[str, dict]:
    """``(source GPU, {family: efficiency, "launch_s": seconds})`` for ``gpu``: its own fit,
    else its architecture family's.

    ``params_path``: a memory-op parameter file (``bench/fit_memops.py``'s format), or a GEMM
    parameter file; default the GEMM parameter file the GPU is priced with (its
    ``constants``, ``use_params``, ``$FXSHAPE_PARAMS``:
    ``fxshape.cost.gemm.resolve_params_path``). A GEMM parameter file
    with a ``memops`` section (``fxshape calibrate --trace`` writes one) overlays the
    packaged constants for the GPUs it names; one without leaves them.
    """
    spec = get_gpu(gpu)
    if params_path is None:
        overlay, path = _route(resolve_params_path(None, spec), True)
    else:
        overlay, path = _route(os.fspath(params_path), False)
    if overlay is not None:
        sec = _overlay(overlay)
        if sec and spec.name in sec:
            return spec.name, sec[spec.name]
    data = _load(path)
    name = spec.name if spec.name in data["gpus"] else (data.get("families", {})
                                                           .get(spec.arch, {}).get("from"))
    entry = data["gpus"].get(name) if name else None
    if entry is None:
        raise ValueError(f"no fitted memory-op constants for {spec.name} "
                         f"(architecture {spec.arch})")
    return name, entry


def predict_memop(kind: str, rows: int, cols: int, *, dtype="fp32", gpu="h100",
                  inputs: int = 1, outputs: int = 1,
                  params_path: str | None = None) -> MemOpPrediction:
    """Predict one memory-bound kernel over a ``rows x cols`` tensor (the op's last dimension
    is ``cols``: the normalized or softmax dimension).

    Args:
        kind: ``"elementwise"``, ``"layer_norm"`` or ``"softmax"``.
        rows, cols: positive integers.
        dtype: the tensors' dtype (``torch.float16``, ``"bf16"``, ``"fp32"`` ...).
        gpu: a name or alias from :func:`fxshape.list_gpus`, or a ``GPUSpec``.
        inputs, outputs: full-size operands read and written (elementwise only; ``add``
            of two tensors has 2 inputs, ``x + 1`` has 1, a fill has 0).

    Raises:
        ValueError: an unknown kind or dtype, sizes that are not positive integers, an
            unknown GPU, or a GPU whose family has no fitted constants.
    """
    family = memop_family(kind, _check_count("cols", cols), dtype)
    nbytes = memop_bytes(kind, rows, cols, dtype, inputs=inputs, outputs=outputs)
    spec: GPUSpec = get_gpu(gpu)
    source, entry = memops_params(spec, params_path)
    transfer = transfer_s(entry, spec, family, nbytes)
    launch = float(entry["launch_s"])
    t = launch + transfer
    return MemOpPrediction(
        gpu=spec.name, kind=kind, family=family, dtype=canonical_dtype(dtype), rows=int(rows),
        cols=int(cols), bytes=nbytes, time_s=t, bandwidth_gbs=nbytes / t / 1e9,
        efficiency=nbytes / t / (spec.memory_bandwidth_gbs * 1e9),
        bound="latency" if launch >= transfer else "memory", constants_from=source)


#: What the graph walk's kernels are priced as: the measured family whose efficiency each
#: takes. Copies, fills, RNG, gathers and reductions have no measurements here; each takes
#: the measured family nearest in structure (one streaming pass: elementwise; a row-wise
#: normalisation, forward or backward: layer_norm), which docs/step.md lists as unvalidated.
KERNEL_FAMILIES = {"elementwise": "elementwise", "copy": "elementwise", "fill": "elementwise",
                   "rng": "elementwise", "gather": "elementwise", "scatter": "elementwise",
                   "reduction": "elementwise", "layer_norm": "layer_norm",
                   "softmax_warp": "softmax_warp", "softmax_block": "softmax_block"}


@dataclass(frozen=True)
class KernelTime:
    """One memory-bound kernel priced by its bytes (``kernel_time``)."""

    family: str  # the kernel's family (a key of KERNEL_FAMILIES)
    bytes: int
    time_s: float
    efficiency: float  # the fitted efficiency used (of the datasheet bandwidth)
    bound: str  # "memory" or "latency"
    constants_from: str


def transfer_s(entry: dict, spec: GPUSpec, family: str, nbytes: int) -> float:
    """Seconds ``nbytes`` take to stream at ``family``'s efficiency (a key of
    :data:`KERNEL_FAMILIES`) in a memory-op entry (``memops_params``) on ``spec``: the
    model's time less its launch latency."""
    return nbytes / (spec.memory_bandwidth_gbs * 1e9 * float(entry[KERNEL_FAMILIES[family]]))


def kernel_time(family: str, nbytes: int, *, gpu="h100",
                params_path: str | None = None) -> KernelTime:
    """Time of one memory-bound kernel of ``family`` moving ``nbytes`` bytes (read plus
    written): ``launch_s + bytes / (efficiency * datasheet bandwidth)``. A kernel that moves
    nothing (a fill of an empty tensor) still pays the launch.

    Raises:
        ValueError: an unknown family, or bytes that are not a non-negative integer.
    """
    if family not in KERNEL_FAMILIES:
        raise ValueError(f"unknown kernel family {family!r}; accepted: "
                         + ", ".join(KERNEL_FAMILIES))
    nbytes = _check_count("bytes", nbytes, 0)
    spec: GPUSpec = get_gpu(gpu)
    source, entry = memops_params(spec, params_path)
    eff = float(entry[KERNEL_FAMILIES[family]])
    transfer = transfer_s(entry, spec, family, nbytes)
    launch = float(entry["launch_s"])
    return KernelTime(family=family, bytes=nbytes, time_s=launch + transfer, efficiency=eff,
                      bound="latency" if launch >= transfer else "memory",
                      constants_from=source)
