"""The GEMM performance model: predicted time of ``C[b,M,N] = A[b,M,K] @ B[b,K,N]`` on a GPU.

Pure functions of (M, N, K, batch, dtype, layout, GPU). The model, in one paragraph
(docs/model.md has the long version):

For every CTA tile shape the GPU's GEMM library offers, and every split-K factor it would use,
the output is cut into ``ceil(M/tm) * ceil(N/tn)`` tiles per batch (tile quantization), the tiles
are scheduled over the SMs in waves (wave quantization), and each tile runs its K loop at the
slowest of its tensor-core rate (``e_max`` of the dense peak, ``batched_eff`` for
strided-batched kernels) plus the issue time of the extra load instructions a misaligned
operand's kernel class needs (:func:`load_class`, ``ld_issue_clk``), its share of the L2-to-SM
bandwidth, and what one SM can stream alone (operand rows counted in the whole 32-byte sectors
they touch). Each wave pays a fixed cost, and the chip as a whole cannot beat its power limit
(``power_eff`` of peak over all padded tile work). The DRAM time is the minimum traffic, at
16-byte granularity, over the achievable bandwidth; compute and memory times are combined with
a smooth maximum, and a launch latency is added. Misaligned shapes can only use the library's
narrow-vector kernels (large or skinny tiles). The library is assumed to pick the candidate
predicted fastest, as a tuned heuristic would. The constants are fitted by
``bench/fit_model.py`` and read from ``fxshape/data/perf_params.json``.

The same core function runs on Python scalars (``predict_matmul``) and on numpy arrays (the fit
and validation scripts), so the model that is fitted is the model that ships.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import json
import math
import numbers
import os
import re
from dataclasses import asdict, dataclass
from types import SimpleNamespace
from typing import NamedTuple

from ..hardware.dtypes import canonical_dtype, itemsize, output_itemsize
from ..hardware.gpus import GPUSpec, get_gpu
from .gemm_kernels import parse_gemm_tile
from .paramfile import read_json
from .simt import sgemm_issue_efficiency, simt_menu, sustained_fp32_peak, tile_fma_efficiency

__all__ = [
    "DimAlignment",
    "MatmulPrediction",
    "ModelParams",
    "predict_matmul",
    "model_params",
    "use_params",
    "resolve_params_path",
    "LAYOUTS",
    "LOAD_CLASSES",
    "load_class",
    "operand_alignment",
    "tf32_issue_ratio",
    "tf32_mainloop_eff",
    "dtype_params",
    "CURRENT_LIBRARY",
    "LIBRARY_GENERATIONS",
    "constants_library",
]

#: Operand layouts: first letter A, second B; "n" = row-major as written, "t" = transposed
#: storage. ``"nn"`` is ``torch.mm(A, B)``; ``"nt"`` is ``F.linear`` (weight stored (N, K)).
LAYOUTS = ("nn", "nt", "tn", "tt")

_SPLIT_K = (1, 2, 4, 8, 16)
_SPLIT_MAX_WAVES = 4  # split-K is considered while tiles x split <= 4 waves
_K_TILE_BYTES = 64  # depth of one mainloop step: 32 fp16 / 64 fp8 / 16 fp32 elements
# cuBLAS's SIMT sgemm splits K by any factor (the data shows 2 to 162); these cover the range
_SIMT_SPLIT_K = (1, 2, 3, 4, 6, 8, 12, 16)
_SIMT_K_TILE = 8  # sgemm mainloop depth (sgemm_128x128x8)
_DEFAULT_PARAMS_PATH = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data",
                                    "perf_params.json")

#: What the packaged constants of a GPU fitted to current measurements describe (the
#: ``library`` of its entry in ``perf_params.json``): the default, what a current PyTorch or
#: vLLM install runs.
CURRENT_LIBRARY = "cuBLAS 12.8+ (vLLM 0.24, 2026)"
#: Older library generations kept reachable, by name: ``params="2024"`` (``--params 2024``)
#: prices with these packaged constants, overlaid on the current ones as any parameter file
#: is. ``"2024"``: the H100 fitted to Vidur's 2024 measurements (PyTorch 2.1-era cuBLAS),
#: which the Blackwell family borrowed before it had measurements of its own
#: (``bench/fit_model.py`` writes it).
LIBRARY_GENERATIONS = {
    "2024": os.path.join(os.path.dirname(_DEFAULT_PARAMS_PATH), "perf_params_2024.json"),
}


@dataclass(frozen=True)
class ModelParams:
    """Fitted constants for one GPU (or architecture family).

    Attributes:
        e_max: fraction of the datasheet dense peak a large aligned tile sustains.
        l2_bytes_per_clk_per_sm: L2-to-SM bandwidth shared by all active CTAs, in bytes per
            clock per SM (total = value * SMs * boost clock).
        dram_eff: achievable fraction of datasheet DRAM bandwidth.
        launch_s: fixed kernel launch / ramp latency.
        wave_s: prologue + epilogue cost paid once per wave.
        align_mem_eff: DRAM-bandwidth multiplier per step of misalignment (narrow loads).
        sm_stream_bytes_per_clk: the most one SM's load path moves per clock for a kernel
            with 16-byte vectors (``cp.async.cg``), counted in the 32-byte sectors it touches:
            bound by the SM's outstanding loads over memory latency when few CTAs run, which
            makes a GEMM with few, long tiles slow (why libraries split K for such shapes),
            and by sector traffic when operand rows straddle sectors (a K that is 16- but not
            32-byte aligned in ``nt``).
        ld_issue_clk: SM clocks of mainloop time per warp-level operand load instruction.
            On sm80-style kernels the warps that issue the MMAs also issue the loads (no
            warp specialization), with their address and predicate arithmetic, so each
            load instruction delays the MMAs; the count depends on the vector width the
            alignment leaves (:func:`load_instructions_per_byte`): 16 bytes per thread
            when every operand is 16-byte aligned, 4 when the worst is 4- or 8-byte
            aligned, one element plus a shared-memory store when it is 1- or 2-byte
            aligned. One constant for every class; 0 for SIMT kernels (fitted apart).
        smooth_q: exponent of the smooth maximum of compute and memory time.
        split_k_s: extra cost of a split-K reduction (second pass over the partial sums).
        power_eff: fraction of peak the whole chip sustains under its power limit, counting
            padded tile work (below ``e_max`` on power-limited parts: a partial wave then
            costs less than a full one, because the active SMs clock higher).
        tile_overhead: SIMT (fp32 ``sgemm``) kernels only: shared-memory operand loads per
            FMA, as a fraction of FMA time for a 1x1 register tile (see
            ``fxshape.cost.simt.tile_fma_efficiency``); 0 for tensor-core kernels. Used for
            kernels without a fitted ``kernel_eff``.
        kernel_eff: SIMT kernels only: ``(kernel name, FMA efficiency)`` pairs fitted with
            the kernel each measured call ran (its name is in the data).
        throttle_s, throttle_ratio: compute that lasts longer than ``throttle_s`` runs the
            rest at ``throttle_ratio`` of the rate (a 70-75 W card's power and thermal
            limiter pulling the clock down under sustained load: T4, P4); 1 = no throttling.
        batched_eff: tensor-core kernels only: MMA rate of the library's strided-batched
            kernels relative to its single-GEMM ones (``batch > 1``). cuBLAS runs batched
            GEMMs with a kernel set of their own: on the V100 a batch of two 4096^3 GEMMs
            runs at 65 TFLOP/s where one runs at 84. Fitted where the data have batched
            calls (the cookbook's ``bmm/bsweep``); 1 elsewhere.
    """

    e_max: float
    l2_bytes_per_clk_per_sm: float
    dram_eff: float
    launch_s: float
    wave_s: float
    ld_issue_clk: float
    smooth_q: float
    split_k_s: float
    power_eff: float
    align_mem_eff: float
    sm_stream_bytes_per_clk: float
    tile_overhead: float = 0.0
    kernel_eff: tuple = ()
    throttle_s: float = 1.0
    throttle_ratio: float = 1.0
    batched_eff: float = 1.0

    #: Constants every parameter-file entry has; ``OPTIONAL`` ones default when absent;
    #: ``STORED``: what the fitters write.
    OPTIONAL = ("batched_eff",)
    FIELDS = ("e_max", "l2_bytes_per_clk_per_sm", "dram_eff", "launch_s", "wave_s",
              "ld_issue_clk", "smooth_q", "split_k_s", "power_eff", "align_mem_eff",
              "sm_stream_bytes_per_clk")
    STORED = FIELDS + OPTIONAL
    #: The constants only misaligned shapes identify.
    ALIGNMENT = ("ld_issue_clk", "align_mem_eff")


class DimAlignment(NamedTuple):
    """Alignment of one GEMM dimension for one dtype."""

    dim: str  # "M", "N" or "K"
    size: int
    multiple: int  # largest power of two dividing size, capped at the best alignment
    status: str  # "best" (>= 128 B), "ok" (>= 16 B) or "misaligned"
    leading: bool  # is it the contiguous (leading) dimension of an operand in this layout?
    next_aligned: int  # smallest size >= size that meets the 16-byte rule


@dataclass(frozen=True)
class MatmulPrediction:
    """What the model predicts for one GEMM. Times in seconds, throughput in TFLOP/s."""

    gpu: str
    dtype: str
    layout: str
    batch: int
    m: int
    n: int
    k: int
    flops: int
    bytes: int  # minimum DRAM traffic
    time_s: float
    tflops: float
    efficiency: float  # achieved / dense peak for this dtype
    peak_tflops: float
    tile: tuple[int, int]
    tile_efficiency: float  # useful outputs / padded tile outputs
    split_k: int
    ctas: int
    waves: int
    wave_efficiency: float  # CTAs / (waves * SMs)
    compute_time_s: float
    memory_time_s: float
    launch_s: float
    bound: str  # "compute", "memory" or "latency"
    alignment: tuple[DimAlignment, DimAlignment, DimAlignment]
    aligned: bool  # every leading dimension meets the 16-byte rule
    # fp32: the cuBLAS SIMT sgemm kernel predicted to run; tensor cores: "" (the model's
    # choice) or "TMxTN tile as run" (a kernel= name's tile)
    kernel: str = ""

    def to_dict(self) -> dict:
        d = asdict(self)
        d["tile"] = list(self.tile)
        d["alignment"] = [a._asdict() for a in self.alignment]
        return d


# ---------------------------------------------------------------------------------------
# Parameters
# ---------------------------------------------------------------------------------------

_ACTIVE_PARAMS: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "fxshape_params", default=None)
_SECTIONS = ("gpus", "families", "measurement")


def resolve_params_path(params_path: str | None = None, gpu=None) -> str:
    """The parameter file a prediction for ``gpu`` uses: ``params_path``, else the GPU's
    own (``GPUSpec.constants``: an analysis sets it from its setup's ``Machine``), else the
    one set by :func:`use_params`, else ``$FXSHAPE_PARAMS``, else the packaged
    ``fxshape/data/perf_params.json``."""
    path = (params_path or getattr(gpu, "constants", None) or _ACTIVE_PARAMS.get()
            or os.environ.get("FXSHAPE_PARAMS") or _DEFAULT_PARAMS_PATH)
    return _named(os.fspath(path))


def params_in_force(path=None) -> str:
    """The parameter file ``path`` names, checked (a bad file fails here, with its one-line
    error) and made absolute (a library generation's name: its packaged file); ``None``:
    the file in force (:func:`resolve_params_path`). What a setup's ``Machine`` gives its
    GPU (``GPUSpec.with_constants``)."""
    path = resolve_params_path() if path is None else \
        os.path.abspath(_named(os.fspath(path)))
    _load_params(path)
    return path


def _named(path: str) -> str:
    """A packaged library generation's file for its name (:data:`LIBRARY_GENERATIONS`);
    any other path as given."""
    return LIBRARY_GENERATIONS.get(path, path) if isinstance(path, str) else path


@contextlib.contextmanager
def use_params(path):
    """Within the block, predictions use the parameter file ``path`` (e.g. one written by
    ``fxshape calibrate``) or the packaged library generation of that name
    (:data:`LIBRARY_GENERATIONS`: ``"2024"``); ``None`` leaves the current choice. The file
    is checked first."""
    if path is None:
        yield
        return
    token = _ACTIVE_PARAMS.set(params_in_force(path))
    try:
        yield
    finally:
        _ACTIVE_PARAMS.reset(token)


def is_default_params(path: str) -> bool:
    return os.path.abspath(path) == os.path.abspath(_DEFAULT_PARAMS_PATH)


@functools.lru_cache(maxsize=None)
def _load_params(path: str) -> dict:
    """The packaged constants, overlaid with those of ``path`` (a partial file, such as one
    ``fxshape calibrate`` writes for one GPU, replaces only the entries it has)."""
    with open(_DEFAULT_PARAMS_PATH) as f:
        base = json.load(f)
    if is_default_params(path):
        return base
    if not os.path.exists(path) and not os.path.splitext(path)[1]:
        raise ValueError(f"no parameter file {path!r}: params= takes a file written by "
                         f"fxshape calibrate or bench/fit_model.py, or a library generation "
                         f"({', '.join(sorted(LIBRARY_GENERATIONS))})")
    user = read_json(path, "fxshape parameter file")
    if not isinstance(user, dict) or not any(k in user for k in _SECTIONS + ("fp32",)):
        raise ValueError(f"{path!r} is not an fxshape parameter file: expected a JSON object "
                         f"with 'gpus' (and optionally 'families', 'fp32'), as written by "
                         f"fxshape calibrate or bench/fit_model.py")
    need = set(ModelParams.FIELDS)
    for sec, where in ((user, ""), (user.get("fp32") or {}, "fp32.")):
        if not isinstance(sec, dict):
            raise ValueError(f"{path!r}: its {where.rstrip('.') or 'top level'} is not a JSON "
                             "object")
        for key in _SECTIONS:
            if not isinstance(sec.get(key) or {}, dict):
                raise ValueError(f"{path!r}: its {where}{key} section is not an object of "
                                 f"entries by name, got {type(sec.get(key)).__name__}")
    for sec in (user, user.get("fp32") or {}):
        for name, entry in (sec.get("gpus") or {}).items():
            missing = sorted(need - set(entry)) if isinstance(entry, dict) else ["all"]
            if missing == ["ld_issue_clk"] and "align_eff" in entry:
                raise ValueError(f"{path!r}: entry for GPU {name!r} has align_eff, the "
                                 f"misalignment constant fxshape used before ld_issue_clk; "
                                 f"rerun fxshape calibrate (or bench/fit_model.py)")
            if missing:
                raise ValueError(f"{path!r}: entry for GPU {name!r} lacks {', '.join(missing)}")
    merged = json.loads(json.dumps(base))
    for dst, src in ((merged, user), (merged.setdefault("fp32", {}), user.get("fp32") or {})):
        for key in _SECTIONS:
            dst.setdefault(key, {}).update(src.get(key) or {})
    return merged


def model_params(gpu, params_path: str | None = None, *, simt: bool = False) -> ModelParams:
    """Fitted constants for ``gpu``: its own fit if it has measured data, else its family's.

    Args:
        gpu: a name or ``GPUSpec``.
        params_path: a JSON file written by ``bench/fit_model.py`` (default: the packaged one,
            or ``$FXSHAPE_PARAMS`` when set).
        simt: the constants of the fp32 SIMT ``sgemm`` kernels (``bench/fit_fp32.py``)
            instead of the tensor-core ones.
    """
    spec = get_gpu(gpu)
    return _model_params(spec, resolve_params_path(params_path, spec), simt)


def constants_source(gpu, params_path: str | None = None, *, simt: bool = False) -> str:
    """The GPU whose fitted entry :func:`model_params` returns for ``gpu``: its own name
    when it has measured data, else the one its architecture family borrows from."""
    spec = get_gpu(gpu)
    data = _load_params(resolve_params_path(params_path, spec))
    data = (data.get("fp32") or {}) if simt else data
    if spec.name in data.get("gpus", {}):
        return spec.name
    fam = data.get("families", {}).get(spec.arch)
    return fam.get("from") if isinstance(fam, dict) and fam.get("from") else spec.name


def constants_library(gpu, params_path: str | None = None) -> str:
    """What the tensor-core constants :func:`model_params` gives ``gpu`` describe: the
    ``library`` their fit recorded (:data:`CURRENT_LIBRARY` for today's), else the 2022-2024
    measurements the older fits came from."""
    path = resolve_params_path(params_path, gpu)
    src = constants_source(gpu, params_path)
    entry = _load_params(path).get("gpus", {}).get(src)
    lib = entry.get("library") if isinstance(entry, dict) else None
    if lib is None and not is_default_params(path) and \
            path not in LIBRARY_GENERATIONS.values() and \
            src in (read_json(path, "fxshape parameter file").get("gpus") or {}):
        return f"the parameter file {os.path.basename(path)} (fxshape calibrate)"
    return lib or "2022-2024 (PyTorch 1.13-2.1, CUDA 11-12.1)"


@functools.lru_cache(maxsize=None)
def _model_params(spec: GPUSpec, path: str, simt: bool = False) -> ModelParams:
    data = _load_params(path)
    if simt:
        data = data.get("fp32")
        if data is None:
            raise ValueError(f"{path} has no fp32 (SIMT) section; run bench/fit_fp32.py")
    entry = data["gpus"].get(spec.name)
    if entry is None:
        fam = data["families"].get(spec.arch)
        if fam is None:
            what = "fp32 SIMT" if simt else "tensor-core"
            raise ValueError(f"no fitted {what} constants for {spec.name} "
                             f"(architecture {spec.arch})")
        entry = data["gpus"].get(fam.get("from") if isinstance(fam, dict) else None)
        if entry is None:
            raise ValueError(f"{path}: family {spec.arch!r} takes its constants from "
                             f"{fam!r}, which has no entry under 'gpus'")
    vals = {f: float(entry[f]) for f in ModelParams.FIELDS}
    return ModelParams(**vals, tile_overhead=float(entry.get("tile_overhead", 0.0)),
                       throttle_s=float(entry.get("throttle_s", 1.0)),
                       throttle_ratio=float(entry.get("throttle_ratio", 1.0)),
                       batched_eff=float(entry.get("batched_eff", 1.0)),
                       kernel_eff=tuple(sorted((str(k), float(v)) for k, v in
                                               entry.get("kernel_eff", {}).items())))


_TF32_PARAMS_PATH = os.path.join(os.path.dirname(_DEFAULT_PARAMS_PATH), "tf32_params.json")


@functools.lru_cache(maxsize=None)
def _tf32_params() -> dict:
    return read_json(_TF32_PARAMS_PATH, "fxshape TF32 parameter file")


def tf32_issue_ratio(gpu) -> float:
    """How many times ``ld_issue_clk`` a TF32 kernel pays per narrow operand load on
    ``gpu``'s architecture: fitted by ``bench/fit_tf32_trace.py`` from the TF32 GEMMs of a
    profiler trace (``fxshape/data/tf32_params.json`` says which); 1 for architectures
    without such a fit (the fp16 figure, unvalidated for TF32).

    cuBLAS's sm80 TF32 kernels for operands that are not 16-byte aligned (``..._align1``)
    copy one 4-byte element per ``cp.async``; in the shared traces they run about twice as
    slow against their aligned twins as the fp16 kernels of the same load width do, which
    the fp16 sweeps ``ld_issue_clk`` was fitted on cannot show.
    """
    return _tf32_constant(gpu, "ld_issue_ratio")


def tf32_mainloop_eff(gpu) -> float:
    """The fraction of its fp16 mainloop efficiency (``e_max``, of the datasheet peak) a
    TF32 tensor-core kernel sustains on ``gpu``'s architecture: fitted with
    :func:`tf32_issue_ratio` by ``bench/fit_tf32_trace.py``; 1 for architectures without
    such a fit.

    On the shared A100 trace cuBLAS's aligned sm80 TF32 kernels (``..._s1688gemm_...``)
    with a long reduction per CTA (K/split > 1024, where the mainloop dominates) were
    predicted 40% too fast with the fp16 ``e_max``, while short ones matched. A likely
    cause, not measured here: their MMAs are fed from shared memory by 32-bit loads where
    the fp16 kernels use ``ldmatrix``.
    """
    return _tf32_constant(gpu, "mainloop_eff")


def _tf32_constant(gpu, key: str) -> float:
    """``key`` of ``gpu``'s architecture in ``tf32_params.json``; 1 where it has none."""
    entry = (_tf32_params().get("archs") or {}).get(get_gpu(gpu).arch)
    return float(entry.get(key, 1.0)) if isinstance(entry, dict) else 1.0


def dtype_params(p: ModelParams, gpu, dkey: str) -> ModelParams:
    """The constants ``p`` as a ``dkey`` kernel uses them: for TF32, ``ld_issue_clk`` times
    :func:`tf32_issue_ratio` and ``e_max`` times :func:`tf32_mainloop_eff`; other dtypes
    unchanged. :func:`predict_matmul` prices with these; a calibration that fits TF32 rows
    fits them, and stores them divided back (``fxshape.fit.calibrate.write_params``)."""
    if dkey != "tf32":
        return p
    return dataclasses.replace(p, ld_issue_clk=p.ld_issue_clk * tf32_issue_ratio(gpu),
                               e_max=p.e_max * tf32_mainloop_eff(gpu))


# ---------------------------------------------------------------------------------------
# The core (scalar or numpy)
# ---------------------------------------------------------------------------------------

_SCALAR = SimpleNamespace(
    maximum=max,
    minimum=min,
    where=lambda c, a, b: a if c else b,
)


def _cdiv(a, b):
    return -((-a) // b)


def _pow2_part(x):
    """Largest power of two dividing a positive integer (works on ints and int arrays)."""
    return x & (-x)


def operand_alignment(m: int, n: int, k: int, dtype, layout: str = "nn") -> tuple[int, int, int]:
    """Byte alignment (capped at 16) of the leading dimension of A, B and C.

    ``layout[0]`` says how A is stored (``"n"``: M x K row-major, leading dimension K;
    ``"t"``: K x M, leading M), ``layout[1]`` B (``"n"``: K x N, leading N; ``"t"``: N x K,
    leading K); C is M x N row-major, leading N. The library's kernel has one alignment for
    all three (CUTLASS's generator emits each sm80 kernel for one ``alignment`` shared by
    A, B and C), so the worst of the three picks the kernel class: see :func:`load_class`.
    """
    dkey = canonical_dtype(dtype)
    e, eo = itemsize(dkey), output_itemsize(dkey)
    if not isinstance(layout, str) or layout.lower() not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; accepted: {', '.join(LAYOUTS)}")
    m, n, k = (_check_size(x, v) for x, v in (("m", m), ("n", n), ("k", k)))
    layout = layout.lower()
    a_ld, b_ld = (k if layout[0] == "n" else m), (n if layout[1] == "n" else k)
    return (min(_pow2_part(a_ld * e), 16), min(_pow2_part(b_ld * e), 16),
            min(_pow2_part(n * eo), 16))  # C is written in the output dtype


#: The kernel classes by the worst operand alignment (index = :func:`load_class`).
LOAD_CLASSES = ("16-byte vectors", "4-byte vectors", "element loads")


def load_class(m: int, n: int, k: int, dtype, layout: str = "nn") -> int:
    """0 when every operand's leading dimension is 16-byte aligned (``cp.async`` of 16
    bytes), 1 when the worst is 4- or 8-byte aligned (the narrow kernels), 2 when it is 1- or
    2-byte aligned (odd fp16/bf16 sizes, odd or 2-aligned fp8: element-wise loads)."""
    return int(_class_of(_SCALAR, min(operand_alignment(m, n, k, dtype, layout))))


def _class_of(xp, worst):
    """The kernel class of the worst operand alignment in bytes (see :func:`load_class`)."""
    return xp.where(worst >= 16, 0, xp.where(worst >= 4, 1, 2))


def _misalign_steps(xp, m, n, k, e, layout: str, eo=None):
    """0 if every leading dimension is 16-byte aligned, 1 if the worst is 4/8-byte aligned,
    2 if the worst is 1/2-byte aligned (odd fp16 sizes)."""
    eo = e if eo is None else eo
    a_ld = k if layout[0] == "n" else m
    b_ld = n if layout[1] == "n" else k
    worst = xp.minimum(xp.minimum(_pow2_part(a_ld * e), _pow2_part(b_ld * e)),
                       _pow2_part(n * eo))  # C is row-major (leading N), in the output dtype
    return _class_of(xp, xp.minimum(worst, 16))


#: Bytes one thread moves per load instruction in each kernel class (0: 16-byte vectors;
#: 1: the library's narrow kernels for 4- and 8-byte aligned operands, which run both at
#: one speed, as with 4-byte vectors; 2: one element per load, plus a shared-memory store).
_CLASS_VECTOR_BYTES = (16, 4)
_WARP = 32


def load_instructions_per_byte(xp, steps, e: int):
    """Warp-level load instructions a GEMM mainloop issues per operand byte, by kernel class.

    Class 0 (every leading dimension 16-byte aligned) copies 16 bytes per thread per
    ``cp.async``; class 1 (worst operand 4- or 8-byte aligned) 4 bytes; class 2 (1- or
    2-byte aligned: ``cp.async`` has no smaller size) loads one element of ``e`` bytes into
    a register and stores it to shared memory: two instructions per element.
    """
    scalar = 2.0 / (_WARP * e)
    return xp.where(steps == 0, 1.0 / (_WARP * _CLASS_VECTOR_BYTES[0]),
                    xp.where(steps == 1, 1.0 / (_WARP * _CLASS_VECTOR_BYTES[1]), scalar))


def _pad16(x, e):
    """Size rounded up to whole 16-byte vectors: the granularity memory is moved at."""
    per = max(1, 16 // e)
    return _cdiv(x, per) * per


_SECTOR_BYTES = 32  # L2-to-SM transfers move whole 32-byte sectors


def _sector_inflation(xp, ld, e: int, run_bytes):
    """Sectors moved per useful sector when a CTA loads rows of ``run_bytes`` contiguous bytes
    from an operand whose leading dimension is ``ld`` elements of ``e`` bytes.

    Rows start at multiples of the leading dimension's byte alignment ``a`` (the largest power
    of two dividing ``ld * e``); a row that does not start on a sector boundary touches one
    more sector than it needs. With ``a < 32`` the starting offsets cycle evenly through the
    ``32 / a`` multiples of ``a`` below 32, all but one of which straddle, so on average a
    row of ``L`` bytes (a multiple of 32) moves ``L/32 + 1 - a/32`` sectors:
    ``1 + (32 - a) / L`` times the useful traffic. Rows that run along K are one mainloop
    step deep (64 bytes), so a K that is 16-byte but not 32-byte aligned costs 25% more
    operand traffic; rows along M or N are a whole tile wide and barely notice.
    """
    a = xp.minimum(_pow2_part(ld * e), _SECTOR_BYTES)
    return 1.0 + (_SECTOR_BYTES - a) / xp.maximum(run_bytes, 16)


def _narrow_ok(tm: int, tn: int) -> bool:
    """Does the library have a narrow-vector (misaligned) kernel with this tile?

    Kernels for leading dimensions that are not 16-byte aligned come in few shapes: large
    tiles (both sides >= 128) and the skinny GEMV-like ones. The A100 alignment sweep shows
    it: misaligned N quantizes in steps of 128 where aligned N steps by 64.
    """
    return (tm >= 128 and tn >= 128) or tm < 64


def _core(xp, b, m, n, k, steps, *, spec: GPUSpec, p: ModelParams, peak_flops: float,
          e: int, eo: int, kernels=None, splits=_SPLIT_K, k_tile=None, layout: str = "nn",
          forced_tile: bool = False, forced_split: bool = False, sms_free=None,
          tensor_core=None):
    """Predicted time for every candidate; returns the best candidate's figures
    ``(time, tile index, split, ctas, waves, compute time, memory time)``.

    ``kernels`` is a sequence of ``(tm, tn, rate multiplier)``, default the GPU's tensor-core
    tiles at full rate (the fp32 path passes the SIMT sgemm menu); ``splits`` the split-K
    factors the library uses. ``layout`` says which dimension is each operand's leading one:
    the operand rows a CTA streams from L2 are charged whole 32-byte sectors
    (:func:`_sector_inflation`). ``forced_tile`` / ``forced_split``: the kernel's tile /
    its split-K factor is the one that ran (a trace says so), so the library's rule for
    which tiles it offers misaligned shapes / which splits it uses is not applied.
    ``sms_free``: SMs the kernel may use (fewer than the GPU's while another
    kernel, such as a collective's, holds some); each SM keeps its own rate and L2 share.
    ``tensor_core``: the kernels are the library's tensor-core ones (``batched_eff`` applies
    to their strided-batched calls); default: when ``kernels`` is None.

    Every term is non-decreasing in b, m, n and k, and a larger output never admits more
    split-K candidates, so the minimum over candidates is non-decreasing too: more work in
    the same alignment class is never predicted faster.
    """
    scalar = xp is _SCALAR
    c = _CoreSetup(xp, b, m, n, k, steps, spec=spec, p=p, peak_flops=peak_flops, e=e,
                   eo=eo, k_tile=k_tile, layout=layout, sms_free=sms_free,
                   tensor_core=kernels is None if tensor_core is None else tensor_core)
    best = None
    best_t = math.inf
    if kernels is None:
        kernels = tuple((tm, tn, 1.0) for tm, tn in spec.tiles)
    # the split loop runs for every tile of every prediction: its constants as locals
    sms, tk, maximum = c.sms, c.tk, xp.maximum
    q, inv_q = p.smooth_q, 1.0 / p.smooth_q
    throttled = p.throttle_ratio < 1.0
    wave_s, launch_s, split_k_s = p.wave_s, p.launch_s, p.split_k_s
    t_mem1 = c.t_mem1
    for ti, (tm, tn, mult) in enumerate(kernels):
        if scalar and steps and not forced_tile and not _narrow_ok(tm, tn):
            continue
        tile = c.tile(tm, tn, mult)
        for s in splits:
            if s > 1:
                # split-K only while the split CTAs fit in a few waves (as libraries do)
                allowed = forced_split or tile.tiles_mn * s <= _SPLIT_MAX_WAVES * sms
                if scalar and not allowed:
                    break
            ctas = tile.tiles_mn * s
            k_split = -(-k // s)  # ceil(k / s)
            kq = -(-k_split // tk) * tk  # rounded up to whole k-tiles
            waves = -(-ctas // sms)
            last = ctas - (waves - 1) * sms
            mma = tile.mma_per_k * kq
            load = tile.load_per_k * kq
            stream = tile.stream_per_k * kq
            t_waves = ((waves - 1) * maximum(maximum(mma, sms * load), stream)
                       + maximum(maximum(mma, last * load), stream)
                       + waves * wave_s)
            # power/clock limit: the whole chip cannot sustain more than power_eff of peak,
            # however the tiles fall into waves (padded tile work counts: it burns power)
            t_comp = maximum(t_waves, tile.power_per_k * ctas * kq)
            if throttled:
                t_comp = (xp.minimum(t_comp, p.throttle_s)
                          + maximum(t_comp - p.throttle_s, 0.0) / p.throttle_ratio)
            if s > 1:
                t_mem = t_mem1 + s * c.split_bytes / c.dram_bw
                t = (t_comp ** q + t_mem ** q) ** inv_q + launch_s + split_k_s
            else:
                t_mem = t_mem1
                t = (t_comp ** q + t_mem ** q) ** inv_q + launch_s
            if scalar:
                if t < best_t:
                    best_t = t
                    best = (t, ti, s, ctas, waves, t_comp, t_mem)
                continue
            if s > 1:
                t = xp.where(allowed, t, math.inf)
            if not forced_tile and not _narrow_ok(tm, tn):
                t = xp.where(steps == 0, t, math.inf)
            cand = (t, ti, s, ctas, waves, t_comp, t_mem)
            if best is None:
                best = cand
            else:
                better = t < best[0]
                best = tuple(xp.where(better, x, o) for x, o in zip(cand, best))
    return best


class _TileCost:
    """One CTA tile's costs per element of K it steps through: the MMAs (with the operand
    loads an unaligned kernel issues beyond an aligned one's), the L2 loads, its SM's own
    stream, the chip's power-limited rate; and the output tiles over M and N. (Slotted, not
    a frozen dataclass: one is made per tile of every prediction.)"""

    __slots__ = ("tiles_mn", "mma_per_k", "load_per_k", "stream_per_k", "power_per_k")

    def __init__(self, tiles_mn, mma_per_k, load_per_k, stream_per_k, power_per_k):
        self.tiles_mn, self.mma_per_k, self.load_per_k = tiles_mn, mma_per_k, load_per_k
        self.stream_per_k, self.power_per_k = stream_per_k, power_per_k


class _CoreSetup:
    """What :func:`_core` prices every candidate with (scalars or arrays, by ``xp``): the
    problem, the SMs it may use, the rates and bandwidths, the operands' load classes and
    sector inflation along K, the memory time without split-K. Set once in ``__init__``
    (slotted, not a frozen dataclass: one is made per prediction)."""

    __slots__ = ("xp", "b", "m", "n", "k", "steps", "p", "e", "sms", "tk", "rate",
                 "chip_rate", "l2_bw", "sm_bw", "dram_bw", "issue_s", "ld_per_byte",
                 "ld_per_byte0", "mp", "np_", "t_mem1", "split_bytes", "a_ld", "a_run_k",
                 "b_ld", "b_run_k", "infl_a_k", "infl_b_k")

    def __init__(self, xp, b, m, n, k, steps, *, spec, p, peak_flops, e, eo, k_tile, layout,
                 sms_free, tensor_core):
        self.xp, self.b, self.m, self.n, self.k, self.steps, self.p, self.e = \
            xp, b, m, n, k, steps, p, e
        self.sms = sms = spec.sm_count if sms_free is None else \
            max(1, min(int(sms_free), spec.sm_count))
        clock = spec.boost_clock_mhz * 1e6
        self.l2_bw = p.l2_bytes_per_clk_per_sm * sms * spec.boost_clock_mhz * 1e6
        self.sm_bw = p.sm_stream_bytes_per_clk * clock
        # Operand load instructions per operand byte, by the kernel class the alignment
        # leaves (:func:`load_instructions_per_byte`), and the mainloop time each costs its
        # warps.
        self.ld_per_byte = load_instructions_per_byte(xp, steps, e)
        self.ld_per_byte0 = load_instructions_per_byte(_SCALAR, 0, e)
        self.issue_s = p.ld_issue_clk / clock
        self.dram_bw = dram_bw = spec.memory_bandwidth_gbs * 1e9 * p.dram_eff * \
            p.align_mem_eff ** steps
        batched = 1.0
        if tensor_core and p.batched_eff != 1.0:  # strided-batched tensor-core kernels
            batched = xp.where(b > 1, p.batched_eff, 1.0)
        self.rate = peak_flops / spec.sm_count * p.e_max * batched  # FLOP/s per SM
        self.chip_rate = peak_flops * p.power_eff * batched * sms / spec.sm_count
        self.tk = tk = k_tile or max(1, _K_TILE_BYTES // e)
        # traffic at 16-byte granularity: a misaligned row costs as much as its padded size
        self.mp, self.np_ = mp, np_ = _pad16(m, e), _pad16(n, e)
        kp = _pad16(k, e)
        self.t_mem1 = (b * (mp * kp + kp * np_) * e + b * mp * _pad16(n, eo) * eo) / dram_bw
        self.split_bytes = 2.0 * b * mp * np_ * 4  # fp32 partial sums, written and read
        # Contiguous run of each operand row per CTA and mainloop step: along K one step
        # deep, along M or N the tile's width (inflation computed per tile).
        self.a_ld, self.a_run_k = (k, True) if layout[0] == "n" else (m, False)
        self.b_ld, self.b_run_k = (n, False) if layout[1] == "n" else (k, True)
        self.infl_a_k = _sector_inflation(xp, k, e, tk * e) if self.a_run_k else None
        self.infl_b_k = _sector_inflation(xp, k, e, tk * e) if self.b_run_k else None

    def tile(self, tm, tn, mult) -> _TileCost:
        """The costs of a ``tm × tn`` tile whose kernel runs at ``mult`` of the rate."""
        xp, e = self.xp, self.e
        rows_a, rows_b = xp.minimum(self.mp, tm), xp.minimum(self.np_, tn)  # per CTA
        infl_a = self.infl_a_k if self.a_run_k else _sector_inflation(xp, self.a_ld, e,
                                                                      rows_a * e)
        infl_b = self.infl_b_k if self.b_run_k else _sector_inflation(xp, self.b_ld, e,
                                                                      rows_b * e)
        rows = rows_a * infl_a + rows_b * infl_b  # in sectors actually moved
        # the MMAs, plus the issue time of the operand loads the same warps execute beyond
        # those of an aligned kernel (whose loads the MMAs hide: e_max is fitted with them):
        # a vector load that straddles a sector boundary is replayed for the extra sector,
        # so vector classes pay per sector moved; element loads pay per element
        useful = rows_a + rows_b
        ld_rows = xp.where(self.steps == 2, useful, rows)
        extra_ld = ld_rows * self.ld_per_byte - useful * self.ld_per_byte0
        return _TileCost(
            tiles_mn=self.b * _cdiv(self.m, tm) * _cdiv(self.n, tn),
            mma_per_k=2.0 * tm * tn / (self.rate * mult) + extra_ld * e * self.issue_s,
            load_per_k=rows * e / self.l2_bw,
            # one CTA cannot stream faster than its SM's own memory pipeline allows
            stream_per_k=rows * e / self.sm_bw,
            power_per_k=2.0 * tm * tn / self.chip_rate)


# ---------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------

def _check_size(name: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise ValueError(f"{name} must be a positive integer, got {v!r}")
    v = int(v)
    if v <= 0:
        raise ValueError(f"{name} must be a positive integer, got {v}")
    return v


def _alignment(spec: GPUSpec, dkey: str, m: int, n: int, k: int, layout: str):
    e = itemsize(dkey)
    min_el = max(1, spec.align_min_bytes // e)
    best_el = max(1, spec.align_best_bytes // e)
    leading = {"M": layout[0] == "t", "N": True, "K": layout[0] == "n" or layout[1] == "t"}
    out = []
    for dim, size in (("M", m), ("N", n), ("K", k)):
        mult = min(_pow2_part(size), best_el)
        status = "best" if mult >= best_el else ("ok" if mult >= min_el else "misaligned")
        out.append(DimAlignment(dim, size, mult, status, leading[dim], _cdiv(size, min_el) * min_el))
    return tuple(out)


def predict_matmul(m, n, k, *, batch=1, dtype="bf16", gpu="h100", layout="nn",
                   params_path: str | None = None, params=None,
                   kernel: str | None = None, split_k: int | None = None,
                   sms: int | None = None,
                   constants: ModelParams | None = None) -> MatmulPrediction:
    """Predict time and efficiency of ``C[batch, M, N] = A[batch, M, K] @ B[batch, K, N]``.

    Args:
        m, n, k: GEMM sizes (K is the reduction). Positive integers.
        batch: number of independent GEMMs in one batched call (bmm).
        dtype: ``torch.float16`` / ``"fp16"``, ``torch.bfloat16`` / ``"bf16"``,
            ``torch.float32`` / ``"fp32"`` (no TF32), ``"tf32"``, ``"fp8"``.
        gpu: name or alias from :func:`fxshape.list_gpus`, or a ``GPUSpec``.
        layout: ``"nn"`` (torch.mm on contiguous tensors), ``"nt"`` (F.linear, weight
            stored (N, K)), ``"tn"`` or ``"tt"``. It decides which dimensions are leading
            dimensions and so which misalignments cost vector width.
        params_path, params: a parameter file (``fxshape calibrate``, ``bench/fit_model.py``)
            whose entries replace the packaged constants; default ``$FXSHAPE_PARAMS`` if set.
        kernel: the library kernel that ran (its name, from a profiler trace). For fp32
            without TF32 a cuBLAS SIMT kernel (``"ampere_sgemm_128x64_tn"``): the prediction
            prices that kernel instead of the model's choice; a name outside the GPU's
            sgemm menu leaves the choice to the model (``MatmulPrediction.kernel`` says
            which ran). For tensor-core dtypes a name with a CTA tile
            (``fxshape.cost.gemm_kernels.parse_gemm_tile``:
            ``"cutlass_80_tensorop_s1688gemm_128x64_32x6_tn_align4"``): that tile is priced,
            whether or not the model's menu offers it; a name without one leaves the
            choice to the model.
        split_k: the split-K factor that ran (a trace's ``grid.z``); default the model's
            choice.
        sms: SMs the kernel may use, when another kernel holds some (a collective's CTAs
            beside it, as a trace shows); default all of the GPU's.
        constants: tensor-core constants to price with in place of the GPU's fitted ones:
            a library kernel with a fit of its own (vLLM's CUTLASS FP8 GEMM,
            ``fxshape.cost.quant``). Default: the parameter file's.

    Returns:
        A frozen :class:`MatmulPrediction`.

    Raises:
        ValueError: non-positive or non-integer sizes, unknown dtype or layout, unknown GPU,
            or a dtype the GPU has no tensor-core path for.

    Example:
        >>> p = predict_matmul(8192, 50257, 768, dtype="fp16", gpu="a100")
        >>> p.tile, round(p.tile_efficiency, 3)  # doctest: +SKIP
    """
    m, n, k = (_check_size(x, v) for x, v in (("m", m), ("n", n), ("k", k)))
    batch = _check_size("batch", batch)
    dkey = canonical_dtype(dtype)
    if not isinstance(layout, str) or layout.lower() not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; accepted: {', '.join(LAYOUTS)}")
    spec = get_gpu(gpu)
    spec.peak_tflops(dkey)  # raises if there is no tensor-core path for dkey
    path = resolve_params_path(params_path or params, spec)
    _load_params(path)  # cached; a bad file: one-line ValueError here, not a KeyError later
    ran = None
    if kernel is not None and _is_simt(spec, dkey):
        base = re.sub(r"_(nn|nt|tn|tt)$", "", str(kernel))
        if any(kk.name == base for kk in simt_menu(spec.arch, batch > 1)):
            ran = base
    elif kernel is not None:
        ran = parse_gemm_tile(str(kernel))
    if split_k is not None:
        split_k = _check_size("split_k", split_k)
    if sms is not None:
        sms = _check_size("sms", sms)
        if sms > spec.sm_count:
            raise ValueError(f"sms={sms} is more than {spec.name}'s {spec.sm_count} SMs")
    if constants is not None and not isinstance(constants, ModelParams):
        raise ValueError(f"constants must be a ModelParams, got {type(constants).__name__}")
    return _predict_cached(m, n, k, batch, dkey, spec, layout.lower(), path, ran, split_k,
                           sms, constants)


def _simt_kernels(spec: GPUSpec, batched: bool, p: ModelParams):
    """The SIMT sgemm menu as ``_core`` candidates: ``(tm, tn, FMA efficiency)``."""
    menu = simt_menu(spec.arch, batched)
    fitted = dict(p.kernel_eff)
    return menu, tuple((kk.tm, kk.tn, (fitted.get(kk.name) or
                                       tile_fma_efficiency(kk, p.tile_overhead))
                        * sgemm_issue_efficiency(spec, kk)) for kk in menu)


def _is_simt(spec: GPUSpec, dkey: str) -> bool:
    """fp32 without TF32 on an NVIDIA GPU runs SIMT sgemm kernels (AMD's use matrix cores)."""
    return dkey == "fp32" and spec.vendor == "nvidia"


@functools.lru_cache(maxsize=1 << 18)
def _predict_cached(m, n, k, batch, dkey, spec, layout, params_path,
                    ran=None, split_k=None, sms=None, constants=None) -> MatmulPrediction:
    simt = _is_simt(spec, dkey)
    if constants is not None:  # a kernel with constants of its own
        p = constants
    else:
        p = model_params(spec, params_path, simt=simt)
        p = dtype_params(p, spec, dkey)  # TF32: its own narrow-load and mainloop constants
    peak = spec.peak_tflops(dkey) * 1e12  # the datasheet peak, which efficiency is of
    core_peak = peak
    if simt:  # the sgemm peak at the power-limited clock (fxshape.cost.simt)
        core_peak = sustained_fp32_peak(spec, get_gpu(constants_source(spec, params_path,
                                                                       simt=True)))
    e, eo = itemsize(dkey), output_itemsize(dkey)
    steps = 0 if dkey == "fp32" else _misalign_steps(_SCALAR, m, n, k, e, layout, eo)
    if simt:
        menu, kernels = _simt_kernels(spec, batch > 1, p)
        if ran is not None:  # the kernel that ran, not the model's choice
            keep = [i for i, kk in enumerate(menu) if kk.name == ran]
            menu, kernels = tuple(menu[i] for i in keep), tuple(kernels[i] for i in keep)
        splits = (split_k,) if split_k else (_SIMT_SPLIT_K if batch == 1 else (1,))
        t, ti, s, ctas, waves, t_comp, t_mem = _core(
            _SCALAR, batch, m, n, k, steps, spec=spec, p=p, peak_flops=core_peak, e=e, eo=eo,
            kernels=kernels, splits=splits, k_tile=_SIMT_K_TILE, layout=layout,
            forced_tile=ran is not None, forced_split=split_k is not None, sms_free=sms)
        tm, tn = menu[ti].tm, menu[ti].tn
        kernel = f"{menu[ti].name}_{'nn' if layout[1] == 'n' else 'tn'}"
    else:
        tiles = (ran,) if ran is not None else spec.tiles
        t, ti, s, ctas, waves, t_comp, t_mem = _core(
            _SCALAR, batch, m, n, k, steps, spec=spec, p=p, peak_flops=core_peak, e=e, eo=eo,
            kernels=tuple((a, b, 1.0) for a, b in tiles),
            splits=(split_k,) if split_k else _SPLIT_K, layout=layout,
            forced_tile=ran is not None, forced_split=split_k is not None, sms_free=sms,
            tensor_core=True)
        tm, tn = tiles[ti]
        kernel = f"{tm}x{tn} tile as run" if ran is not None else ""
    flops = 2 * batch * m * n * k
    tiles_mn = batch * _cdiv(m, tm) * _cdiv(n, tn)
    tflops = flops / t / 1e12
    if p.launch_s >= max(t_comp, t_mem):
        bound = "latency"
    else:
        bound = "memory" if t_mem > t_comp else "compute"
    align = _alignment(spec, dkey, m, n, k, layout)
    return MatmulPrediction(
        gpu=spec.name, dtype=dkey, layout=layout, batch=batch, m=m, n=n, k=k,
        flops=flops, bytes=batch * (m * k + k * n) * e + batch * m * n * eo,
        time_s=float(t), tflops=tflops, efficiency=tflops * 1e12 / peak,
        peak_tflops=peak / 1e12, tile=(tm, tn),
        tile_efficiency=(batch * m * n) / (tiles_mn * tm * tn),
        split_k=int(s), ctas=int(ctas), waves=int(waves),
        wave_efficiency=ctas / (waves * (sms or spec.sm_count)),
        compute_time_s=float(t_comp), memory_time_s=float(t_mem), launch_s=p.launch_s,
        bound=bound, alignment=align, aligned=steps == 0, kernel=kernel,
    )


def _numpy_xp():
    """The array operations ``_core`` needs, on numpy (imported only when asked for)."""
    import numpy as np

    return SimpleNamespace(maximum=np.maximum, minimum=np.minimum, where=np.where)


def predict_times_array(spec: GPUSpec, dkey: str, b, m, n, k, layouts, p: ModelParams,
                        *, return_tile: bool = False, reference: GPUSpec | None = None):
    """Vectorized predicted times (numpy arrays in, numpy array out) for fitting/validation.

    ``layouts`` is an array of layout strings; the model is evaluated per distinct layout
    (and, for fp32 SIMT kernels, separately for single and batched GEMMs). With
    ``return_tile`` it also returns the chosen ``(tm, tn)`` per row. ``reference``: for fp32
    SIMT, the GPU ``p`` was fitted on when it is not ``spec`` (its power-limited clock then
    applies, as in :func:`predict_matmul` for a GPU without fp32 data).
    """
    import numpy as np

    xp = _numpy_xp()
    peak = spec.peak_tflops(dkey) * 1e12
    e, eo = itemsize(dkey), output_itemsize(dkey)
    simt = _is_simt(spec, dkey)
    if simt:  # the power rule, only for constants of another GPU
        peak = sustained_fp32_peak(spec, reference)
    b = np.asarray(b, dtype=np.int64)
    out = np.empty(len(m), dtype=np.float64)
    tiles = np.zeros((len(m), 2), dtype=np.int64)
    layouts = np.asarray(layouts)
    batched_opts = (False, True) if simt else (None,)
    for lay in sorted(set(layouts.tolist())):
        for batched in batched_opts:
            sel = layouts == lay
            if batched is not None:
                sel = sel & ((b > 1) if batched else (b == 1))
            if not sel.any():
                continue
            bb, mm, nn, kk = (np.asarray(x, dtype=np.int64)[sel] for x in (b, m, n, k))
            if simt:
                menu, kernels = _simt_kernels(spec, batched, p)
                res = _core(xp, bb, mm, nn, kk, np.zeros_like(mm), spec=spec, p=p,
                            peak_flops=peak, e=e, eo=eo, kernels=kernels,
                            splits=(1,) if batched else _SIMT_SPLIT_K, k_tile=_SIMT_K_TILE,
                            layout=lay)
                shapes = np.array([(kk_.tm, kk_.tn) for kk_ in menu])
            else:
                steps = (np.zeros_like(mm) if dkey == "fp32"
                         else _misalign_steps(xp, mm, nn, kk, e, lay, eo))
                res = _core(xp, bb, mm, nn, kk, steps, spec=spec, p=p, peak_flops=peak,
                            e=e, eo=eo, layout=lay)
                shapes = np.array(spec.tiles)
            out[sel] = res[0]
            tiles[sel] = shapes[np.asarray(res[1], dtype=np.int64)]
    return (out, tiles) if return_tile else out


def predict_times_as_run(spec: GPUSpec, dkey: str, b, m, n, k, layouts, p: ModelParams,
                         tiles, splits):
    """Like :func:`predict_times_array`, each row priced as the tensor-core kernel that ran
    (what ``predict_matmul(..., kernel=, split_k=)`` prices): ``tiles[i]`` its ``(tm, tn)``
    (None: the model's choice), ``splits[i]`` its split-K factor (0: the model's choice).
    Rows with the same layout, tile and split are priced together."""
    import numpy as np

    b, m, n, k = (np.asarray(x, dtype=np.int64) for x in (b, m, n, k))
    layouts = np.asarray(layouts)
    out = np.empty(len(m), dtype=np.float64)
    keys = [(str(layouts[i]), tiles[i] and tuple(tiles[i]), int(splits[i] or 0))
            for i in range(len(m))]
    for key in sorted(set(keys), key=repr):
        lay, tile, split = key
        sel = np.array([kk == key for kk in keys])
        if tile is None and not split:  # nothing forced: the model's own choice
            out[sel] = predict_times_array(spec, dkey, b[sel], m[sel], n[sel], k[sel],
                                           layouts[sel], p)
        else:
            out[sel] = predict_terms_as_run(spec, dkey, b[sel], m[sel], n[sel], k[sel], lay,
                                            p, tile, split)[0]
    return out


def predict_terms_as_run(spec: GPUSpec, dkey: str, b, m, n, k, layout: str, p: ModelParams,
                         tile, split: int):
    """``(time, compute time, memory time)`` arrays of GEMMs that all ran one kernel:
    ``tile`` its ``(tm, tn)`` (None: the model's choice per row), ``split`` its split-K
    factor (0: the model's choice). The terms :func:`predict_matmul` reports as
    ``compute_time_s`` and ``memory_time_s``; ``fxshape.cost.quant`` rescales them for the
    block-scaled formats."""
    import numpy as np

    xp = _numpy_xp()
    peak = spec.peak_tflops(dkey) * 1e12
    e, eo = itemsize(dkey), output_itemsize(dkey)
    b, m, n, k = (np.asarray(x, dtype=np.int64) for x in (b, m, n, k))
    steps = np.zeros_like(m) if dkey == "fp32" else _misalign_steps(xp, m, n, k, e, layout,
                                                                       eo)
    kernels = (((tile[0], tile[1], 1.0),) if tile is not None
               else tuple((a, c, 1.0) for a, c in spec.tiles))
    res = _core(xp, b, m, n, k, steps, spec=spec, p=p, peak_flops=peak, e=e, eo=eo,
                kernels=kernels, splits=(split,) if split else _SPLIT_K, layout=layout,
                forced_tile=tile is not None, forced_split=bool(split), tensor_core=True)
    return (np.asarray(res[0], dtype=np.float64), np.asarray(res[5], dtype=np.float64),
            np.asarray(res[6], dtype=np.float64))
