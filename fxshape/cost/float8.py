"""FP8 training as torchao's ``Float8Linear`` runs it under ``torch.compile``.

``convert_to_float8_training`` (torchao; torchtitan's ``quantize.linear.float8`` converter)
swaps each ``nn.Linear`` for a ``Float8Linear``: its three GEMMs run as
``torch._scaled_mm`` on FP8 operands with a bf16 output, and before them the bf16 operands
are scaled and cast. Per linear layer ``y[M, N] = x[M, K] @ w[N, K]^T``:

============  ===============================  ======================================
GEMM          operands                         ``recipe="tensorwise"`` casts (compiled)
============  ===============================  ======================================
forward       ``x`` e4m3, ``w`` e4m3           ``x`` and ``w``: an amax reduction, then
                                               one kernel writing FP8 in both layouts
                                               (the transposed copy the backward needs)
dgrad         ``grad_y`` e5m2, ``w`` e4m3      ``grad_y``: amax, then both layouts
wgrad         ``grad_y^T`` e5m2, ``x`` e4m3    none (the forward's and dgrad's copies)
============  ===============================  ======================================

``recipe="rowwise"``: one scale per row of each operand along its reduction dimension, so
each tensor is cast once per axis it is reduced over: ``x`` and ``w`` rowwise for the
forward (the row's amax in the cast kernel: one kernel each), ``grad_y`` rowwise and ``w``
columnwise for dgrad, ``grad_y`` and ``x`` columnwise for wgrad (a column amax needs a
reduction kernel before the cast: two kernels each). Its GEMMs run with per-row scales
(CUTLASS on Hopper), priced here as the tensorwise GEMM: no measurement of their speed
was found, so that part is unvalidated.

Bytes per element: an amax reads bf16 (2); a cast reads bf16 and writes FP8 (2 + 1, or
2 + 2 for both layouts). Each kernel is priced by ``fxshape.cost.memops.kernel_time``
(its launch plus its bytes at the GPU's streaming bandwidth); the GEMMs by
``fxshape.cost.gemm.predict_matmul`` in ``"fp8"`` (its constants are the fp16 fit's:
docs/quantization.md). ``_scaled_mm`` needs every dimension of the GEMM a multiple of 16.

``recipe="mxfp8"`` (Blackwell: torchao's MX training, ``MXLinearConfig`` with cuBLAS's
block-scaled GEMM, torchtitan's ``mx`` converter): every operand in e4m3 with one e8m0
scale per 32 elements along the GEMM's reduction dimension, so each tensor is cast along
each axis it is reduced over, the block's amax inside the cast (one kernel each, writing
1 + 1/32 bytes an element): x and w along K for the forward, grad_y along N and w along
its rows for dgrad, grad_y and x along the tokens for wgrad. Its GEMMs run on Blackwell's
block-scaled tensor cores at the FP8 rate (the datasheet quotes FP8 and MXFP8 alike) and
need every dimension a multiple of 32; weights are gathered in bf16.

FSDP2 with torchao's float8 all-gather (``enable_fsdp_float8_all_gather``, the tensorwise
recipe's default in torchtitan) casts each converted weight on its shard and gathers FP8:
one byte per element instead of two. Pure functions; nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..hardware.gpus import get_gpu, gpus_of_arch
from .gemm import MatmulPrediction, predict_matmul
from .memops import kernel_time

__all__ = ["FLOAT8_RECIPES", "ROLES", "check_float8", "Float8Gemm", "cast_cost",
           "predict_float8", "scaled_mm_eligible"]

#: torchao's float8 training recipes modelled.
FLOAT8_RECIPES = ("tensorwise", "rowwise", "mxfp8")
#: the three GEMMs of a linear layer in training.
ROLES = ("forward", "dgrad", "wgrad")
_ALIGN = 16

# (amax kernels, cast kernels, bytes written per element by the casts) of one tensor's
# casts, per recipe and role: which tensors each GEMM casts (module docstring)
_TENSORWISE_CAST = (1, 1, 2)   # amax; one cast writing both layouts
_ROW_CAST = (0, 1, 1)          # the row's amax inside the cast
_COL_CAST = (1, 1, 1)          # a column amax first, then the cast
_MX_CAST = (0, 1, 1 + 1 / 32)  # the 32-element block's amax inside; an e8m0 scale a block


def check_float8(recipe) -> str:
    if not isinstance(recipe, str) or recipe not in FLOAT8_RECIPES:
        raise ValueError(f"unknown float8 recipe {recipe!r}; accepted: "
                         f"{', '.join(FLOAT8_RECIPES)} (torchao's Float8LinearConfig recipes)")
    return recipe


def scaled_mm_eligible(m: int, n: int, k: int, recipe: str = "tensorwise") -> bool:
    """Can ``torch._scaled_mm`` run ``[M, K] x [K, N]`` (all three multiples of 16; of 32,
    the scale block, for ``"mxfp8"``)?"""
    a = 32 if recipe == "mxfp8" else _ALIGN
    return m % a == 0 and n % a == 0 and k % a == 0


@dataclass(frozen=True)
class Float8Gemm:
    """One GEMM of a float8 linear layer: the FP8 GEMM's prediction with ``time_s`` the
    GEMM's plus its casts', the kernels launched, the casts' bytes and what they are."""

    prediction: MatmulPrediction
    kernels: int
    cast_bytes: int
    cast_s: float
    what: str


def cast_cost(elements: int, kind: tuple, *, gpu="h100") -> tuple:
    """``(seconds, kernels, bytes)`` of one tensor's scale and cast (``kind``: amax kernels,
    cast kernels, bytes written per element)."""
    amax, casts, written = kind
    spec = get_gpu(gpu)
    t, nbytes = 0.0, 0
    for _ in range(amax):
        t += kernel_time("reduction", 2 * elements, gpu=spec).time_s
        nbytes += 2 * elements
    for _ in range(casts):
        moved = int(round((2 + written) * elements))
        t += kernel_time("elementwise", moved, gpu=spec).time_s
        nbytes += moved
    return t, amax + casts, nbytes


def _casts(role: str, recipe: str, m: int, n: int, k: int) -> list:
    """``[(tensor, elements, kind)]`` cast for ``role``'s GEMM ``[M, K] x [K, N]``."""
    if recipe == "tensorwise":
        if role == "forward":  # x [M, K], w [N, K]
            return [("x", m * k, _TENSORWISE_CAST), ("w", n * k, _TENSORWISE_CAST)]
        if role == "dgrad":  # grad_y [M, K]
            return [("grad_y", m * k, _TENSORWISE_CAST)]
        return []
    if recipe == "mxfp8":  # each operand along its reduction dimension
        if role == "forward":
            return [("x", m * k, _MX_CAST), ("w", n * k, _MX_CAST)]
        if role == "dgrad":
            return [("grad_y", m * k, _MX_CAST), ("w", n * k, _MX_CAST)]
        return [("grad_y", m * k, _MX_CAST), ("x", n * k, _MX_CAST)]
    if role == "forward":
        return [("x", m * k, _ROW_CAST), ("w", n * k, _ROW_CAST)]
    if role == "dgrad":  # grad_y [M, K] rowwise, w [K, N] columnwise
        return [("grad_y", m * k, _ROW_CAST), ("w", n * k, _COL_CAST)]
    # wgrad [N_out, M] x [M, K_in]: grad_y and x columnwise
    return [("grad_y", m * k, _COL_CAST), ("x", n * k, _COL_CAST)]


def predict_float8(role: str, m: int, n: int, k: int, recipe: str, *, gpu="h100",
                   layout: str = "nn") -> Float8Gemm:
    """The FP8 GEMM of ``role`` (:data:`ROLES`) ``[M, K] x [K, N]`` and the casts it needs
    under ``recipe``, on ``gpu``.

    Raises:
        ValueError: an unknown role or recipe; a GPU without FP8 tensor cores; dimensions
            ``_scaled_mm`` cannot take (check :func:`scaled_mm_eligible` first).
    """
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; accepted: {', '.join(ROLES)}")
    check_float8(recipe)
    spec = get_gpu(gpu)
    if spec.peaks.fp8 is None:
        raise ValueError(f"{spec.name} has no FP8 tensor cores; float8 training needs "
                         "Hopper, Ada, Blackwell or MI300X")
    if recipe == "mxfp8" and spec.arch != "blackwell":
        raise ValueError(f"mxfp8 needs Blackwell's block-scaled tensor cores; {spec.name} "
                         f"has none (accepted: {gpus_of_arch('blackwell')}; elsewhere "
                         "tensorwise or rowwise)")
    if not scaled_mm_eligible(m, n, k, recipe):
        a = 32 if recipe == "mxfp8" else _ALIGN
        raise ValueError(f"_scaled_mm needs M, N and K multiples of {a}; got M={m}, N={n}, "
                         f"K={k}")
    gemm = predict_matmul(m, n, k, dtype="fp8", gpu=spec, layout=layout)
    t, kernels, nbytes, names = 0.0, 1, 0, []
    for name, elements, kind in _casts(role, recipe, m, n, k):
        ct, ck, cb = cast_cost(elements, kind, gpu=spec)
        t, kernels, nbytes = t + ct, kernels + ck, nbytes + cb
        names.append(name)
    what = f"float8 {recipe} {role}: _scaled_mm" + (
        f" + scale and cast of {', '.join(names)}" if names else "")
    total = gemm.time_s + t
    tflops = gemm.flops / total / 1e12
    pred = _replace(gemm, total, tflops, what)
    return Float8Gemm(pred, kernels, nbytes, t, what)


def _replace(gemm, total, tflops, what):
    import dataclasses

    return dataclasses.replace(gemm, time_s=total, tflops=tflops,
                               efficiency=tflops / gemm.peak_tflops, kernel=what)
