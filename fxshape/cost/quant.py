"""Quantized linear layers as inference engines run them.

A quantized model runs its linear layers on other kernels than a bf16 one, and moves fewer
bytes: this module prices one linear layer's GEMM ``C[M, N] = X[M, K] @ W[K, N]`` under a
:class:`Quantization`. Pure functions of shapes and a ``GPUSpec``; nothing here imports
torch.

Methods (:data:`QUANT_METHODS`):

``"int8"``, weight-only, as gpt-fast's ``WeightOnlyInt8Linear`` and torchao's
``int8_weight_only`` compute it: ``F.linear(x, W.to(bf16)) * scales``, one bf16 scale per
output channel. Under ``torch.compile`` with coordinate-descent tuning (``gemv="inductor"``,
``fxshape.cost.gemv``) a matrix-vector product is one Triton reduction that loads the int8
weight and converts each element in registers. Otherwise the conversion is its own
elementwise kernel that writes the whole weight in bf16, and the library's GEMM reads it
back (eager PyTorch; Inductor without coordinate-descent tuning cannot fuse a pointwise
producer into the library's ``mm``).

``"int4"``, weight-only, as gpt-fast's ``WeightOnlyInt4Linear`` and torchao's
``int4_weight_only`` run it: ``aten._weight_int4pack_mm`` (tinygemm), one kernel that reads
the packed weight (two elements a byte) with a bf16 scale and zero for every
``group_size`` elements of K of each output channel, dequantizes in registers and multiplies
on the tensor cores. It works on blocks of 16 rows of M (its ``m16n8k16`` MMA): every block
dequantizes the whole weight again (torchao's HQQ benchmark shows tinygemm's time growing in
proportion to M from 16 rows on).

``"fp8"``, weights and activations in FP8 (e4m3), as vLLM's ``Fp8LinearMethod`` and
TensorRT-LLM run them: ``torch._scaled_mm`` (cuBLASLt) with a bf16 output, one scale per
output channel of the weight. ``activations="dynamic"``: each activation is quantized per
token by a kernel of its own before the GEMM (vLLM's ``scaled_fp8_quant``: it reads the bf16
activation and writes FP8 and a scale per row); ``"static"``: a calibrated per-tensor scale,
the cast fused into the kernel that produces the activation (TensorRT-LLM's fused plugins), no
kernel of its own. FP8 GEMMs need K and N multiples of 16 (16-byte rows, cuBLASLt's rule for
``_scaled_mm``); a layer that misses it stays in bf16, and the analysis says so. On Hopper
and datacenter Blackwell, where vLLM 0.24's kernels have been measured, FP8 (and NVFP4 on
Blackwell) is priced as those kernels run with constants fitted to them
(``fxshape.cost.quant_kernels``): CUTLASS's ``cutlass_scaled_mm`` at vLLM's dispatched tile
without split-K, after the dynamic per-tensor quantization (three kernels).

``"nvfp4"`` and ``"mxfp8"``, Blackwell's block-scaled formats, weights and activations, as
vLLM's NVFP4 and MX linear methods and TensorRT-LLM run them on B200: ``"nvfp4"`` stores
e2m1 (two elements a byte) with an e4m3 scale per 16 elements of K and a float per tensor;
``"mxfp8"`` e4m3 with an e8m0 scale per 32 elements of K. The scales are laid out in
cuBLAS's and CUTLASS's swizzled 128 x 4 tiles: ``round_up(rows, 128) x round_up(K / block,
4)`` bytes per operand (``cutlass_scaled_fp4_mm`` checks exactly those shapes). Each GEMM's
activation is quantized by a kernel of its own (vLLM's ``scaled_fp4_quant``: read bf16,
write the packed values and the block scales; the fusions into the RMSNorm or SiLU kernel
that TensorRT-LLM and vLLM's fusion passes make are not modelled). The block-scaled GEMM is
``tcgen05``'s ``kind::mxf4nvf4`` / ``kind::mxf8f6f4`` MMA: priced as the same GEMM in FP8
with its compute at the format's datasheet peak (``Peaks.fp4`` for NVFP4: twice FP8's on
B200) and its operand bytes (values and scales) in place of FP8's; K and N must be
multiples of 32 (``cutlass_scaled_fp4_mm``: 16-byte rows of e2m1, and MX's 32-element
blocks). A layer that misses it stays in bf16, and the analysis says so.

The dequantization's arithmetic is priced from instruction throughputs, not fitted: the
CUDA C++ Programming Guide's table of arithmetic instruction throughputs (results per clock
per SM) gives 16 for "all other type conversions" (int8 -> fp32 among them) on compute
capability 8.x and 9.0, and 64 (8.0, 9.0) for 32-bit integer and logical operations and
32-bit floating-point add and FMA. Inductor's int8 reduction converts each element once.
tinygemm (``aten/src/ATen/native/cuda/int4mm.cu``) spends, per 32-bit word of 8 int4
elements in a lane: ``convert_i4x8_to_bf16x2x4``'s 4 ``lop3`` (the ``0x4300`` exponent
trick), 3 shifts and 4 ``fma.rn.bf16x2`` (the bias), 4 ``__hfma2`` for the scale and zero,
and 8 fp32 adds folding its two MMAs' partial sums into the accumulator: 23 operations per 8
elements, counted at the 64 per clock rate (its ``mma.sync`` run on the tensor cores beside
them). AMD's rates are not in a source we found: CDNA's conversions are assumed at its
FP32 vector rate (64 per CU per clock), so the term is a lower bound there. A kernel's time
is the smooth maximum (the GEMM family's fitted ``smooth_q``, ``fxshape.cost.gemm``) of its
bytes at the streaming bandwidth (``fxshape.cost.memops``) and this arithmetic, plus its
launch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..hardware.gpus import get_gpu, gpus_of_arch
from .gemm import MatmulPrediction, model_params, predict_matmul, predict_terms_as_run
from .gemv import decomposes
from .memops import kernel_time, memops_params
from .quant_kernels import activation_quant_s, quant_kernel_params, vllm_fp8_tile

__all__ = ["QUANT_METHODS", "ACTIVATION_SCHEMES", "Quantization", "QuantizedGemm",
           "quantization_of", "check_quantization", "packed_weight_bytes", "fp8_eligible",
           "predict_quantized", "DEFAULT_GROUP_SIZE", "GROUP_SIZES", "BLOCK_FORMATS",
           "block_eligible", "block_scale_bytes", "block_peak", "BLOCK_ALIGN_RULE",
           "predict_block_gemm", "predict_quantized_times"]

#: ``"fp8"`` (weights and activations), ``"int8"`` and ``"int4"`` (weight-only),
#: ``"nvfp4"`` and ``"mxfp8"`` (Blackwell's block-scaled formats, weights and activations).
QUANT_METHODS = ("fp8", "int8", "int4", "nvfp4", "mxfp8")
#: FP8 activations: per-token scales computed by a kernel (vLLM), or a static per-tensor
#: scale fused into the producer (TensorRT-LLM).
ACTIVATION_SCHEMES = ("dynamic", "static")
#: int4 group sizes tinygemm packs (``_convert_weight_to_int4pack``; gpt-fast's choices).
GROUP_SIZES = (32, 64, 128, 256)


class PackingRefused(ValueError):
    """An int4 group size that does not divide a layer's K, refused in one line (a
    ``ValueError``, its message unchanged): the weight cannot be packed; what a search over
    shapes (``fxshape.advise``'s candidates) leaves out, by type, never by its message."""
#: gpt-fast's and torchao's default group size.
DEFAULT_GROUP_SIZE = 128
#: M rows per tinygemm block (its ``m16n8k16`` MMA).
TINYGEMM_M_BLOCK = 16
#: Elements FP8 GEMM dimensions must be multiples of (16 bytes of e4m3).
FP8_ALIGN = 16
#: Block formats: (elements per scale, bytes per value, the ``Peaks`` field of its tensor
#: cores, elements K and N must be multiples of).
BLOCK_FORMATS = {"nvfp4": (16, 0.5, "fp4", 32), "mxfp8": (32, 1.0, "fp8", 32)}
#: Why each block format needs its alignment, for the notes and errors.
BLOCK_ALIGN_RULE = {"nvfp4": "16-byte rows of e2m1 and whole 16-element blocks: "
                             "cutlass_scaled_fp4_mm's rule",
                    "mxfp8": "whole 32-element scale blocks of K"}
# the swizzled scale layout's tile: 128 rows x 4 scale columns (cuBLAS block scaling)
_SF_ROWS, _SF_COLS = 128, 4

# Bytes per stored scale or zero.
_BF16, _FP32 = 2, 4
# (operations per weight element, the pipe's results per clock per SM) for the
# dequantization (module docstring): int8 -> float conversion (16/clk, "all other type
# conversions"); tinygemm's 23 integer, bf16 and fp32 operations per 8 elements (64/clk).
_CONVERT = {"int8": (1.0, 16), "int4": (23 / 8, 64)}
_AMD_RATE = 64


@dataclass(frozen=True)
class Quantization:
    """How the linear layers are quantized.

    Attributes:
        method: ``"fp8"``, ``"int8"`` or ``"int4"`` (:data:`QUANT_METHODS`).
        group_size: int4: elements of K sharing one scale and zero (:data:`GROUP_SIZES`);
            ``None`` for the other methods (a scale per output channel).
        activations: fp8: ``"dynamic"`` (per-token scales, a quantization kernel before
            each GEMM that reads a new activation) or ``"static"`` (per-tensor, fused into
            the producer); ``None`` for weight-only methods.
    """

    method: str
    group_size: int | None = None
    activations: str | None = None

    @property
    def label(self) -> str:
        """``"int4 (group 128)"``, ``"int8 weight-only"``, ``"fp8 (dynamic activations)"``."""
        if self.method == "nvfp4":
            return ("nvfp4 weights and activations (e2m1, an e4m3 scale per 16 elements, "
                    "Blackwell)")
        if self.method == "mxfp8":
            return ("mxfp8 weights and activations (e4m3, an e8m0 scale per 32 elements, "
                    "Blackwell)")
        if self.method == "int4":
            return f"int4 weight-only (group {self.group_size})"
        if self.method == "int8":
            return "int8 weight-only (per-channel scales)"
        return f"fp8 weights and activations ({self.activations} activation scales)"

    @property
    def weight_only(self) -> bool:
        return self.method in ("int8", "int4")

    @property
    def key(self) -> str:
        """A short spelling :func:`quantization_of` reads back: ``"int4:g128"``, ``"int8"``,
        ``"fp8:dynamic"``."""
        if self.method == "int4":
            return f"int4:g{self.group_size}"
        return f"fp8:{self.activations}" if self.method == "fp8" else self.method


def check_quantization(method) -> str:
    if not isinstance(method, str) or method not in QUANT_METHODS:
        raise ValueError(f"unknown quantize {method!r}; accepted: {', '.join(QUANT_METHODS)} "
                         "('int8', 'int4': weight-only; 'fp8': weights and activations)")
    return method


def quantization_of(quantize, group_size=None, activations=None) -> Quantization | None:
    """The :class:`Quantization` that ``analyze(quantize=, group_size=, ...)`` asks for
    (``None`` when ``quantize`` is None), checked.

    Raises:
        ValueError: an unknown method, a group size for a method without groups or not one
            of :data:`GROUP_SIZES`, an activation scheme for a weight-only method.
    """
    if quantize is None:
        for name, v in (("group_size", group_size), ("activations", activations)):
            if v is not None:
                raise ValueError(f"{name}={v!r} is for quantized layers: give quantize= too "
                                 f"(accepted: {', '.join(QUANT_METHODS)})")
        return None
    if isinstance(quantize, str) and ":" in quantize:  # a Quantization.key
        method, _, rest = quantize.partition(":")
        if method == "int4" and rest.startswith("g") and rest[1:].isdigit() and \
                group_size is None:
            quantize, group_size = method, int(rest[1:])
        elif method == "fp8" and activations is None:
            quantize, activations = method, rest
    if isinstance(quantize, Quantization):
        quantize, group_size, activations = (quantize.method,
                                             group_size or quantize.group_size,
                                             activations or quantize.activations)
    method = check_quantization(quantize)
    if method == "int4":
        g = DEFAULT_GROUP_SIZE if group_size is None else group_size
        if isinstance(g, bool) or not isinstance(g, int) or g not in GROUP_SIZES:
            raise ValueError(f"group_size={group_size!r}; accepted for int4: "
                             f"{', '.join(map(str, GROUP_SIZES))} (tinygemm's packings)")
    elif group_size is not None:
        raise ValueError(f"group_size is for quantize='int4' (a scale per group of K); "
                         f"{method!r} keeps one scale per output channel")
    else:
        g = None
    if method == "fp8":
        act = "dynamic" if activations is None else activations
        if act not in ACTIVATION_SCHEMES:
            raise ValueError(f"activations={activations!r}; accepted: "
                             f"{', '.join(ACTIVATION_SCHEMES)}")
    elif activations is not None:
        what = ("quantizes activations per block, by a kernel before each GEMM"
                if method in BLOCK_FORMATS else "is weight-only (activations stay bf16)")
        raise ValueError(f"activations= is for quantize='fp8'; {method!r} {what}")
    else:
        act = None
    return Quantization(method, g, act)


def packed_weight_bytes(k: int, n: int, q: Quantization) -> int:
    """Bytes of one quantized ``K x N`` weight with its scales (and zeros).

    int4: ``K N / 2`` packed bytes plus a bf16 scale and a bf16 zero per group of
    ``group_size`` along K per output channel; int8: ``K N`` plus a bf16 scale per output
    channel; fp8: ``K N`` plus an fp32 scale per output channel.

    Raises:
        ValueError: sizes below 1; PackingRefused (a ValueError): an int4 group size that
            does not divide ``k``.
    """
    for name, v in (("k", k), ("n", n)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    if q.method == "int4":
        if k % q.group_size:
            raise PackingRefused(f"group_size={q.group_size} does not divide K={k}; accepted: "
                                 f"a group size of {', '.join(map(str, GROUP_SIZES))} "
                                 "dividing K")
        return k * n // 2 + (k // q.group_size) * n * 2 * _BF16
    if q.method == "int8":
        return k * n + n * _BF16
    if q.method in BLOCK_FORMATS:
        block, value, _, _ = BLOCK_FORMATS[q.method]
        if k % block:
            raise ValueError(f"{q.method} scales blocks of {block} elements of K; K={k} is "
                             f"not a multiple (accepted: K a multiple of {block})")
        return int(k * n * value) + block_scale_bytes(n, k, q.method) + _FP32
    return k * n + n * _FP32


def block_scale_bytes(rows: int, k: int, method: str) -> int:
    """Bytes of one operand's block scales (one byte each) in the swizzled layout:
    ``round_up(rows, 128) x round_up(K / block, 4)``."""
    block = BLOCK_FORMATS[method][0]
    return (-(-rows // _SF_ROWS) * _SF_ROWS) * (-(-(k // block) // _SF_COLS) * _SF_COLS)


def block_eligible(n: int, k: int, method: str) -> bool:
    """Can the block-scaled GEMM take ``K`` and ``N`` (multiples of 32)?"""
    a = BLOCK_FORMATS[method][3]
    return k % a == 0 and n % a == 0


def fp8_eligible(n: int, k: int) -> bool:
    """Can ``torch._scaled_mm`` run this GEMM (K and N multiples of 16 elements)?"""
    return k % FP8_ALIGN == 0 and n % FP8_ALIGN == 0


@dataclass(frozen=True)
class QuantizedGemm:
    """One quantized linear layer's GEMM: the prediction (its ``time_s`` is the whole
    layer's: every kernel it runs), the kernels it launches and what they are."""

    prediction: MatmulPrediction
    kernels: int
    what: str


def _convert_s(elements: float, method: str, spec) -> float:
    ops, rate = _CONVERT[method]
    if spec.vendor != "nvidia":
        rate = _AMD_RATE
    return elements * ops / (rate * spec.sm_count * spec.boost_clock_mhz * 1e6)


def _smooth(a: float, b: float, q: float) -> float:
    return (a ** q + b ** q) ** (1.0 / q) if a > 0 or b > 0 else 0.0


def _stream(nbytes: int, arithmetic_s: float, spec) -> tuple[float, float, float]:
    """(time, transfer, launch) of one kernel that streams ``nbytes`` and does
    ``arithmetic_s`` of dequantization, overlapped as a GEMM's compute and memory are."""
    kt = kernel_time("reduction", nbytes, gpu=spec)
    launch = float(memops_params(spec)[1]["launch_s"])
    transfer = kt.time_s - launch
    q = float(model_params(spec).smooth_q)
    return launch + _smooth(transfer, arithmetic_s, q), transfer, launch


def predict_quantized(m: int, n: int, k: int, q: Quantization, *, gpu="h100",
                      dtype="bf16", batch: int = 1, op: str = "linear",
                      gemv: str = "library", layout: str = "nt") -> QuantizedGemm:
    """One quantized linear layer's GEMM ``[M, K] x [K, N]`` (``batch`` of them) under
    ``q`` on ``gpu`` (module docstring). ``dtype`` is the activations' (bf16 or fp16);
    ``gemv`` as in ``fxshape.cost.gemv`` (``"inductor"``: int8 matrix-vector products run as
    Inductor's reduction).

    Raises:
        ValueError: fp8 on a GPU without FP8 tensor cores, or dimensions that
            ``_scaled_mm`` cannot take (check :func:`fp8_eligible` first); an int4 group size
            that does not divide K.
    """
    spec = get_gpu(gpu)
    act_item = 2
    if q.method in BLOCK_FORMATS:
        return _predict_block(m, n, k, q.method, spec, batch, layout, act_item)
    base = predict_matmul(m, n, k, batch=batch, dtype=dtype, gpu=spec, layout=layout)
    weights = packed_weight_bytes(k, n, q) * batch
    if q.method == "fp8":
        if spec.peaks.fp8 is None:
            raise ValueError(f"{spec.name} has no FP8 tensor cores; quantize='fp8' needs "
                             "one that has (Hopper, Ada, Blackwell, MI300X); accepted here: "
                             "'int8', 'int4'")
        if not fp8_eligible(n, k):
            raise ValueError(f"_scaled_mm needs K and N multiples of {FP8_ALIGN}; got "
                             f"K={k}, N={n}")
        qp = quant_kernel_params(spec, "fp8")
        if qp is not None:  # vLLM's CUTLASS kernel, with constants fitted to it
            return _predict_fp8_fitted(m, n, k, q, spec, batch, layout, qp)
        gemm = predict_matmul(m, n, k, batch=batch, dtype="fp8", gpu=spec, layout=layout)
        t, kernels, what = gemm.time_s, 1, "torch._scaled_mm (FP8, bf16 out)"
        if q.activations == "dynamic":
            # read the bf16 activation, write it in FP8 and a float scale per row
            qbytes = batch * (m * k * act_item + m * k + m * _FP32)
            t += kernel_time("reduction", qbytes, gpu=spec).time_s
            kernels += 1
            what = "per-token FP8 quantization + " + what
        pred = dataclasses.replace(gemm, time_s=t, dtype="fp8",
                                   tflops=gemm.flops / t / 1e12,
                                   efficiency=gemm.flops / t / 1e12 / gemm.peak_tflops,
                                   kernel=what)
        return QuantizedGemm(pred, kernels, what)
    io = batch * (m * k + m * n) * act_item
    if q.method == "int8" and gemv == "inductor" and decomposes(op, m, n):
        conv = _convert_s(float(batch) * k * n, "int8", spec)
        t, transfer, launch = _stream(weights + io, conv, spec)
        what = "inductor reduction over the int8 weight (dequantized in registers)"
        return QuantizedGemm(_replace(base, t, transfer, conv, launch, weights + io, what),
                             1, what)
    if q.method == "int8":
        # W.to(bf16) as a kernel of its own: read int8, write bf16; then the bf16 GEMM
        conv = _convert_s(float(batch) * k * n, "int8", spec)
        t_conv, _, _ = _stream(batch * k * n * (1 + act_item), conv, spec)
        what = "int8 -> bf16 weight conversion kernel + " + (base.kernel or "bf16 GEMM")
        pred = dataclasses.replace(base, time_s=base.time_s + t_conv,
                                   tflops=base.flops / (base.time_s + t_conv) / 1e12,
                                   efficiency=base.flops / (base.time_s + t_conv) / 1e12
                                   / base.peak_tflops, kernel=what)
        return QuantizedGemm(pred, 2, what)
    # int4: tinygemm; every block of 16 rows of M dequantizes the weight again
    blocks = -(-m // TINYGEMM_M_BLOCK)
    conv = _convert_s(float(batch) * k * n * blocks, "int4", spec)
    t, transfer, launch = _stream(weights + io, conv, spec)
    # it cannot beat the tensor cores on the same GEMM in bf16
    t = max(t, launch + base.compute_time_s)
    what = "tinygemm _weight_int4pack_mm (int4 dequantized in registers)"
    return QuantizedGemm(_replace(base, t, transfer, conv, launch, weights + io, what), 1, what)


def _tile_kernel(spec, tile) -> str:
    """A CUTLASS 3 kernel name carrying ``tile`` (rows of M, columns of N) as
    ``fxshape.cost.gemm_kernels.parse_gemm_tile`` reads it (N first, as CUTLASS names
    its tile in the column-major view)."""
    sm = "sm90" if spec.arch == "hopper" else "sm100"
    return f"cutlass3x_{sm}_tensorop_gemm_e4m3_e4m3_f32_bf16_bf16_{tile[1]}x{tile[0]}x128_1x1x1"


def _predict_fp8_fitted(m, n, k, q, spec, batch, layout, qp) -> QuantizedGemm:
    """FP8 on vLLM's CUTLASS kernel (``fxshape.cost.quant_kernels``): the GEMM at its
    dispatched tile without split-K, priced with its fitted constants, after the dynamic
    per-tensor quantization of the activation (``activations="dynamic"``)."""
    tile = vllm_fp8_tile(spec, m, n, k)
    gemm = predict_matmul(m, n, k, batch=batch, dtype="fp8", gpu=spec, layout=layout,
                          kernel=_tile_kernel(spec, tile), split_k=1,
                          constants=qp.constants(spec))
    src = "" if qp.gpu == spec.name else f", constants of the {qp.gpu}"
    what = (f"vLLM cutlass_scaled_mm (FP8, bf16 out, {tile[0]}x{tile[1]} tile, no split-K; "
            f"fitted{src})")
    t, kernels = gemm.time_s, 1
    if q.activations == "dynamic":
        t += activation_quant_s(batch * m, k, "fp8", qp, spec)
        kernels += qp.quant_kernels
        what = (f"dynamic per-tensor FP8 quantization ({qp.quant_kernels} kernels) + "
                + what)
    pred = dataclasses.replace(gemm, time_s=t, dtype="fp8", tflops=gemm.flops / t / 1e12,
                               efficiency=gemm.flops / t / 1e12 / gemm.peak_tflops,
                               kernel=what)
    return QuantizedGemm(pred, kernels, what)


def predict_quantized_times(spec, method: str, m, n, k, qp=None):
    """Vectorized :func:`predict_quantized` (numpy arrays of M, N, K in, times out) of one
    linear layer under ``method`` (``"fp8"`` with dynamic activations, or ``"nvfp4"``) on
    the kernels fitted to it, with the constants ``qp`` (default: the GPU's,
    ``fxshape.cost.quant_kernels.quant_kernel_params``): what
    ``bench/fit_quant_aiconfigurator.py`` fits and the tests check against the scalar path.
    Layout ``nt`` (``F.linear``), batch 1.

    Raises:
        ValueError: a method or GPU without fitted kernels.
    """
    import numpy as np

    spec = get_gpu(spec)
    qp = qp or quant_kernel_params(spec, method)
    if qp is None:
        raise ValueError(f"no fitted {method} kernels for {spec.name}; fitted: "
                         "fp8 on Hopper and datacenter Blackwell, nvfp4 on datacenter "
                         "Blackwell (fxshape.cost.quant_kernels)")
    m, n, k = (np.asarray(x, dtype=np.int64) for x in (m, n, k))
    p = qp.constants(spec)
    quant = activation_quant_s(m, k, method, qp, spec)
    if method == "fp8":
        tiles = [vllm_fp8_tile(spec, int(a), int(b), int(c)) for a, b, c in zip(m, n, k)]
        out = np.empty(len(m))
        for tile in sorted(set(tiles)):
            sel = np.array([t == tile for t in tiles])
            out[sel] = predict_terms_as_run(spec, "fp8", np.ones(int(sel.sum()), np.int64),
                                            m[sel], n[sel], k[sel], "nt", p, tile, 1)[0]
        return out + quant
    ones = np.ones(len(m), dtype=np.int64)
    _, comp, mem = predict_terms_as_run(spec, "fp8", ones, m, n, k, "nt", p, None, 1)
    comp, mem = _block_terms(spec, method, m, n, k, comp, mem)
    q = float(p.smooth_q)
    return (comp ** q + mem ** q) ** (1.0 / q) + p.launch_s + quant


def _block_bytes(method, m, n, k, batch=1):
    """``(operand bytes, output bytes)`` of ``method``'s block-scaled GEMM (ints or int
    arrays): the values of both operands and their swizzled scales, and the bf16 output."""
    bits = int(BLOCK_FORMATS[method][1] * 8)  # e2m1: 4, e4m3: 8
    ops = batch * (m * k * bits // 8 + k * n * bits // 8
                   + block_scale_bytes(m, k, method) + block_scale_bytes(n, k, method))
    return ops, batch * m * n * 2


def _block_terms(spec, method, m, n, k, comp, mem, batch=1):
    """The FP8 GEMM's compute and memory terms rescaled to ``method``'s block-scaled GEMM:
    compute at the format's peak, operand bytes (values and swizzled scales) in place of
    FP8's (ints or arrays)."""
    ops, out = _block_bytes(method, m, n, k, batch)
    fp8_ops = batch * (m * k + k * n)
    return (comp * spec.peaks.fp8 / block_peak(spec, method),
            mem * (ops + out) / (fp8_ops + out))


def block_peak(spec, method: str) -> float | None:
    """The datasheet peak (TFLOP/s) of ``method``'s block-scaled GEMMs on ``spec``; None
    where the GPU has no block-scaled tensor cores (before Blackwell)."""
    if spec.arch != "blackwell":
        return None
    return spec.peaks.get(BLOCK_FORMATS[method][2])


def predict_block_gemm(m: int, n: int, k: int, method: str, *, gpu="b200", batch: int = 1,
                       layout: str = "nt"):
    """The block-scaled GEMM alone (operands already quantized: ``method``'s values and
    swizzled scales in, bf16 out), as a ``MatmulPrediction`` with ``dtype=method``: the
    same GEMM in FP8 with its compute at the format's peak and its operand bytes in place of
    FP8's (module docstring).

    Raises:
        ValueError: a GPU without block-scaled tensor cores, or K or N not multiples of 32.
    """
    spec = get_gpu(gpu)
    peak = block_peak(spec, method)
    if peak is None:
        raise ValueError(f"{spec.name} has no block-scaled tensor cores: quantize="
                         f"{method!r} needs Blackwell (accepted: {gpus_of_arch('blackwell')}; "
                         "elsewhere 'fp8', 'int8', 'int4')")
    if not block_eligible(n, k, method):
        raise ValueError(f"the {method} GEMM needs K and N multiples of "
                         f"{BLOCK_FORMATS[method][3]} ({BLOCK_ALIGN_RULE[method]}); got "
                         f"K={k}, N={n}")
    qp = quant_kernel_params(spec, method)
    if qp is not None:  # the library's kernel, fitted: its constants, no split-K
        p = qp.constants(spec)
        g8 = predict_matmul(m, n, k, batch=batch, dtype="fp8", gpu=spec, layout=layout,
                            split_k=1, constants=p)
    else:
        p = model_params(spec)
        g8 = predict_matmul(m, n, k, batch=batch, dtype="fp8", gpu=spec, layout=layout)
    # compute at the format's peak; operands (values and swizzled scales) in place of FP8's
    comp, mem = _block_terms(spec, method, m, n, k, g8.compute_time_s, g8.memory_time_s,
                             batch)
    ops, out = _block_bytes(method, m, n, k, batch)
    split = p.split_k_s if g8.split_k > 1 else 0.0
    t = _smooth(comp, mem, float(p.smooth_q)) + g8.launch_s + split
    what = f"block-scaled GEMM ({'e2m1' if method == 'nvfp4' else 'e4m3'}, bf16 out)"
    if qp is not None:
        src = "" if qp.gpu == spec.name else f", constants of the {qp.gpu}"
        what = f"FlashInfer CuTe-DSL {what[0].lower()}{what[1:]}, no split-K; fitted{src}"
    return dataclasses.replace(
        g8, dtype=method, time_s=t, tflops=g8.flops / t / 1e12,
        efficiency=g8.flops / t / 1e12 / peak, peak_tflops=peak, bytes=ops + out,
        compute_time_s=comp, memory_time_s=mem,
        bound="memory" if mem >= comp else "compute", kernel=what)


def _predict_block(m, n, k, method, spec, batch, layout, act_item) -> QuantizedGemm:
    """An NVFP4 or MXFP8 linear layer: the activation's quantization kernel, then the
    block-scaled GEMM (module docstring)."""
    gemm = predict_block_gemm(m, n, k, method, gpu=spec, batch=batch, layout=layout)
    _, value, _, _ = BLOCK_FORMATS[method]
    qp = quant_kernel_params(spec, method)
    if qp is not None:  # scaled_fp4_quant, fitted
        t = gemm.time_s + activation_quant_s(batch * m, k, method, qp, spec)
    else:
        # the activation's quantization: read bf16, write the values and the block scales
        qbytes = batch * (m * k * act_item + int(m * k * value)
                          + block_scale_bytes(m, k, method))
        t = gemm.time_s + kernel_time("reduction", qbytes, gpu=spec).time_s
    what = f"{method} activation quantization + {gemm.kernel}"
    pred = dataclasses.replace(gemm, time_s=t, tflops=gemm.flops / t / 1e12,
                               efficiency=gemm.flops / t / 1e12 / gemm.peak_tflops,
                               kernel=what)
    return QuantizedGemm(pred, 2, what)


def _replace(base, t, transfer, arithmetic, launch, nbytes, what) -> MatmulPrediction:
    tflops = base.flops / t / 1e12
    return dataclasses.replace(
        base, time_s=t, tflops=tflops, efficiency=tflops / base.peak_tflops, bytes=nbytes,
        compute_time_s=arithmetic, memory_time_s=transfer, launch_s=launch,
        bound="memory" if transfer >= arithmetic else "compute", kernel=what)
