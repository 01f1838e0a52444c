"""Quantized linear layers on the kernels today's inference engines run, with constants fitted
to them.

``fxshape.cost.quant`` prices a quantized linear layer as its kernels: the activation's
quantization, then the GEMM. Where a kernel has been measured as vLLM 0.24 runs it
(``bench/fit_quant_aiconfigurator.py`` on ai-dynamo/aiconfigurator's H100 SXM and B200
tables), this module holds what is known of it, and the quantized GEMM is priced with it:

``"fp8"`` on Hopper and datacenter Blackwell: vLLM's ``CutlassFP8ScaledMMLinearKernel``,
CUTLASS 3 ``cutlass_scaled_mm`` with one scale for the weight and one for the activation,
computed per call (dynamic per-tensor: ``scaled_fp8_quant`` zeroes the scale, reduces the
activation's absolute maximum into it and writes the FP8 copy: two kernels over the bf16
activation, one block per token row). The GEMM is a persistent CUTLASS kernel **without
split-K**: one CTA reduces all of K for its tile, so a long reduction over few tiles runs on
few SMs. Its tile is vLLM's dispatch by the GEMM's shape (:func:`vllm_fp8_tile`:
``csrc/quantization/cutlass_w8a8/c3x/scaled_mm_sm90_fp8_dispatch.cuh`` and
``scaled_mm_sm100_fp8_dispatch.cuh``): below 64 rows the operands are swapped so the
weight's N runs along the MMA's wide side.

``"nvfp4"`` on datacenter Blackwell: vLLM's ``FlashInferCuteDslNvFp4LinearKernel``, the
activation quantized by ``scaled_fp4_quant`` (one kernel: bf16 in, e2m1 values and the
swizzled e4m3 block scales out; the tensor's global scale is calibrated, static) and
FlashInfer's CuTe-DSL block-scaled GEMM (autotuned: its tile is the model's choice), also
without split-K.

Each kernel's constants (:class:`QuantKernelParams`): the GEMM's tensor-core constants
that differ from the GPU's bf16 fit (``e_max``, ``power_eff``, ``launch_s``, ``wave_s``,
``sm_stream_bytes_per_clk``, ``dram_eff``; the rest are the GPU's), and the quantization
kernels' (a cost per kernel, the fraction of the datasheet bandwidth they stream at, a cost
per token row). A GPU without a measured entry takes its family's (Hopper from the H100
SXM; Blackwell parts with ``tcgen05``, the B200's kernels, from the B200); other GPUs
(Ada, the sm120 RTX PRO 6000, AMD) run other kernels, which nothing here measures: they keep
the generic pricing of ``fxshape.cost.quant``, and the note says so. ``params="2024"`` (an
older library generation) drops these constants too.

Pure functions of shapes and a ``GPUSpec``; nothing here imports torch.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, replace

from ..hardware.gpus import GPUSpec, get_gpu
from .gemm import LIBRARY_GENERATIONS, ModelParams, model_params, resolve_params_path
from .paramfile import read_json

__all__ = ["QuantKernelParams", "QUANT_KERNEL_METHODS", "GEMM_FIELDS", "QUANT_FIELDS",
           "quant_kernel_params", "quant_kernel_source", "vllm_fp8_tile",
           "activation_quant_bytes", "activation_quant_s", "QUANT_KERNEL_NAMES"]

_DEFAULT_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                             "data", "quant_params.json")
#: the methods with kernels fitted here
QUANT_KERNEL_METHODS = ("fp8", "nvfp4")
#: the library kernel each method's constants describe
QUANT_KERNEL_NAMES = {"fp8": "vLLM CutlassFP8ScaledMMLinearKernel (CUTLASS 3 scaled_mm, "
                             "dynamic per-tensor activation scale)",
                      "nvfp4": "vLLM FlashInferCuteDslNvFp4LinearKernel (scaled_fp4_quant + "
                               "FlashInfer CuTe-DSL block-scaled GEMM)"}
#: the GEMM constants a kernel's fit replaces (the others stay the GPU's bf16 fit's)
GEMM_FIELDS = ("e_max", "power_eff", "launch_s", "wave_s", "sm_stream_bytes_per_clk",
               "dram_eff")
#: the activation quantization's constants
QUANT_FIELDS = ("quant_launch_s", "quant_bw_eff", "quant_row_s")
#: kernels the activation's quantization launches (vLLM 0.24): per-tensor dynamic FP8 zeroes
#: its scale, reduces the absolute maximum, then casts (the memset is one of the three);
#: NVFP4's block scales come out of one kernel
_QUANT_KERNELS = {"fp8": 3, "nvfp4": 1}
_FAMILY_FROM = {"hopper": "h100-sxm", "blackwell": "b200"}


@dataclass(frozen=True)
class QuantKernelParams:
    """One quantized kernel's fitted constants on one GPU (module docstring).

    Attributes:
        method: ``"fp8"`` or ``"nvfp4"``.
        gemm: the GEMM's constants that replace the GPU's bf16 fit's (:data:`GEMM_FIELDS`);
            ``e_max`` and ``power_eff`` are fractions of the format's datasheet peak.
        quant_launch_s: cost of each quantization kernel (CUDA-graph replay: no host gap).
        quant_bw_eff: fraction of the datasheet bandwidth the quantization streams at.
        quant_row_s: cost per token row of the activation, across the GPU (one block a row).
        gpu: the GPU whose measurements these are.
        source: the script and table that fitted them.
    """

    method: str
    gemm: tuple
    quant_launch_s: float
    quant_bw_eff: float
    quant_row_s: float
    gpu: str
    source: str

    def constants(self, gpu) -> ModelParams:
        """The GEMM's full constant set on ``gpu``: the GPU's bf16 fit with :attr:`gemm`
        in place."""
        return replace(model_params(gpu), **dict(self.gemm))

    @property
    def quant_kernels(self) -> int:
        return _QUANT_KERNELS[self.method]


def _path() -> str:
    return os.environ.get("FXSHAPE_QUANT_PARAMS") or _DEFAULT_PATH


@functools.lru_cache(maxsize=None)
def _load(path: str) -> dict:
    data = read_json(path, "fxshape quantized-kernel parameter file")
    gpus = data.get("gpus") if isinstance(data, dict) else None
    if not isinstance(gpus, dict):
        raise ValueError(f"{path!r}: no 'gpus' section (written by "
                         "bench/fit_quant_aiconfigurator.py)")
    out = {}
    for gpu, methods in gpus.items():
        for method, entry in methods.items():
            if method not in QUANT_KERNEL_METHODS:
                raise ValueError(f"{path!r}: GPU {gpu!r} names method {method!r}; accepted: "
                                 f"{', '.join(QUANT_KERNEL_METHODS)}")
            try:
                out[(gpu, method)] = QuantKernelParams(
                    method, tuple((f, float(entry["gemm"][f])) for f in GEMM_FIELDS),
                    *(float(entry[f]) for f in QUANT_FIELDS), gpu, str(entry.get("source", "")))
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"{path!r}: {gpu} {method} lacks or mangles {exc}; it needs "
                                 f"gemm ({', '.join(GEMM_FIELDS)}) and "
                                 f"{', '.join(QUANT_FIELDS)}") from None
    return out


def quant_kernel_source(gpu, method: str) -> str | None:
    """The GPU whose measurements price ``method`` on ``gpu`` (its own, or its family's:
    module docstring), or None where nothing measured does."""
    spec: GPUSpec = get_gpu(gpu)
    if resolve_params_path(None, spec) in LIBRARY_GENERATIONS.values():
        return None  # an older library generation: not today's kernels
    table = _load(_path())
    if (spec.name, method) in table:
        return spec.name
    if spec.vendor != "nvidia" or spec.arch not in _FAMILY_FROM:
        return None
    if spec.arch == "blackwell" and not spec.tcgen05:
        return None  # sm120 (RTX PRO 6000) runs other kernels
    src = _FAMILY_FROM[spec.arch]
    return src if (src, method) in table else None


def quant_kernel_params(gpu, method: str) -> QuantKernelParams | None:
    """The fitted constants that price ``method`` on ``gpu`` (:func:`quant_kernel_source`),
    or None."""
    src = quant_kernel_source(gpu, method)
    return None if src is None else _load(_path())[(src, method)]


def vllm_fp8_tile(spec: GPUSpec, m: int, n: int, k: int) -> tuple[int, int] | None:
    """The CTA tile ``(rows of M, columns of N)`` vLLM's ``cutlass_scaled_mm`` dispatch
    picks for an FP8 GEMM of ``M x N x K`` on ``spec`` (module docstring), None outside
    Hopper and datacenter Blackwell. The swapped small-M configurations are given in
    fxshape's orientation: sm90's 64x16 tile over (N, M) is 16 rows of M by 64 of N."""
    if spec.arch == "hopper":
        if m <= 16:
            return (16, 64)
        if m <= 64:
            return (16, 64) if n <= 1280 else (64, 64)
        if m <= 128:
            return (64, 128)
        return (256, 128) if m >= 8192 and k >= 6144 else (128, 128)
    if spec.arch == "blackwell" and spec.tcgen05:
        if m <= 16:
            return (32, 128)
        if m <= 64:
            return (64, 64) if m == 64 and k < 4096 else (64, 128)
        return (64, 128) if m <= 256 else (128, 128)
    return None


def activation_quant_bytes(m, k, method: str):
    """Bytes the activation's quantization moves for an ``M x K`` bf16 activation (ints or
    arrays): FP8 per-tensor reads it twice (the maximum, then the cast) and writes a byte an
    element; NVFP4 reads it once and writes half a byte and a scale per 16 elements."""
    if method == "fp8":
        return m * k * (2 + 2 + 1)
    return m * k * 2 + m * k // 2 + m * (k // 16)


def activation_quant_s(m, k, method: str, qp: QuantKernelParams, spec: GPUSpec):
    """Time of the activation's quantization kernels (ints or arrays)."""
    bw = spec.memory_bandwidth_gbs * 1e9 * qp.quant_bw_eff
    return (qp.quant_kernels * qp.quant_launch_s + activation_quant_bytes(m, k, method) / bw
            + m * qp.quant_row_s)
