"""FP8 training as torchao's ``Float8Linear`` runs it under ``torch.compile``, and as
NVIDIA Transformer Engine's ``te.Linear`` runs it (eager or compiled).

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

Transformer Engine (``te.Linear`` under ``te.fp8_autocast(fp8_recipe=...)``; Megatron-LM's
``--fp8-format``, Composer's ``precision="amp_fp8"``, Accelerate's ``TERecipeKwargs``): its
own fused CUDA kernels whether the model is compiled or not (``te.Linear`` is an opaque
module to Inductor), each operand of the forward and dgrad GEMMs cast once into both
layouts, the wgrad GEMM reusing the transposed copies (TE's ``cast_transpose``,
``transformer_engine/common/transpose/cast_transpose.cu``):

- ``"te-delayed"`` (``DelayedScaling``, TE's default): the scale from the amax history of
  earlier steps, so one ``cast_transpose`` kernel a tensor that records this step's amax as
  it casts (reads 2 bytes an element, writes 1 + 1); FP8 GEMMs.
- ``"te-current"`` (``Float8CurrentScaling``, TE 2.2+): an amax kernel first (reads 2), then
  the ``cast_transpose``, as ``"tensorwise"``; FP8 GEMMs.
- ``"te-mxfp8"`` (``MXFP8BlockScaling``, Blackwell): one quantize kernel a tensor writing its
  row- and column-wise MXFP8 copies, an e8m0 scale per 32 elements (reads 2, writes
  2 x (1 + 1/32)); block-scaled GEMMs at the FP8 rate.

TE needs a GEMM's tokens a multiple of 8 and its features multiples of 16 (``te.Linear``
raises otherwise: ``check_dim_for_fp8_exec``), 32 for MXFP8. Not modelled: the
delayed-scaling amax-history update after each forward and backward (one fused kernel and,
distributed, one all-reduce of a few kilobytes: microseconds a micro-batch), TE's weight
FP8 cache across micro-batches (``is_first_microbatch``: Megatron passes it, Composer and
Accelerate do not; the weight is cast every forward here), the LayerNorm fused with the
cast (``te.LayerNormLinear``), ``Float8BlockScaling`` (Hopper's 1x128/128x128 blocks).

FSDP2 with torchao's float8 all-gather (``enable_fsdp_float8_all_gather``, the tensorwise
recipe's default in torchtitan) casts each converted weight on its shard and gathers FP8:
one byte per element instead of two. Pure functions; nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..hardware.gpus import get_gpu, gpus_of_arch
from .gemm import MatmulPrediction, predict_matmul
from .memops import kernel_time

__all__ = ["FLOAT8_RECIPES", "ROLES", "TE_RECIPES", "check_float8", "Float8Gemm",
           "cast_cost", "predict_float8", "recipe_label", "scaled_mm_eligible",
           "alignment_rule"]

#: torchao's float8 training recipes modelled (under torch.compile).
TORCHAO_RECIPES = ("tensorwise", "rowwise", "mxfp8")
#: Transformer Engine's recipes modelled (eager or compiled: its own kernels).
TE_RECIPES = ("te-delayed", "te-current", "te-mxfp8")
#: every float8 training recipe modelled.
FLOAT8_RECIPES = TORCHAO_RECIPES + TE_RECIPES
#: the recipes that run on Blackwell's block-scaled tensor cores only
BLOCK_RECIPES = ("mxfp8", "te-mxfp8")
_LABELS = {"tensorwise": "torchao tensorwise", "rowwise": "torchao rowwise",
           "mxfp8": "torchao mxfp8",
           "te-delayed": "Transformer Engine, delayed scaling",
           "te-current": "Transformer Engine, current scaling",
           "te-mxfp8": "Transformer Engine, MXFP8 block scaling"}
#: the three GEMMs of a linear layer in training.
ROLES = ("forward", "dgrad", "wgrad")
_ALIGN = 16

# (amax kernels, cast kernels, bytes written per element by the casts) of one tensor's
# casts, per recipe and role: which tensors each GEMM casts (module docstring)
_TENSORWISE_CAST = (1, 1, 2)   # amax; one cast writing both layouts
_ROW_CAST = (0, 1, 1)          # the row's amax inside the cast
_COL_CAST = (1, 1, 1)          # a column amax first, then the cast
_MX_CAST = (0, 1, 1 + 1 / 32)  # the 32-element block's amax inside; an e8m0 scale a block
_TE_DELAYED_CAST = (0, 1, 2)   # cast_transpose: the amax recorded inside, both layouts
_TE_MX_CAST = (0, 1, 2 * (1 + 1 / 32))  # row- and column-wise MXFP8 in one kernel
_TE_CASTS = {"te-delayed": _TE_DELAYED_CAST, "te-current": _TENSORWISE_CAST,
             "te-mxfp8": _TE_MX_CAST}


def check_float8(recipe) -> str:
    if not isinstance(recipe, str) or recipe not in FLOAT8_RECIPES:
        raise ValueError(f"unknown float8 recipe {recipe!r}; accepted: "
                         f"{', '.join(TORCHAO_RECIPES)} (torchao's Float8LinearConfig "
                         f"recipes), {', '.join(TE_RECIPES)} (Transformer Engine's)")
    return recipe


def recipe_label(recipe: str) -> str:
    """Who runs ``recipe`` and how, in words (``"Transformer Engine, delayed scaling"``)."""
    return _LABELS[check_float8(recipe)]


def _alignment(recipe: str) -> tuple:
    """(M, N, K) multiples a recipe's GEMM ``[M, K] x [K, N]`` needs."""
    if recipe in BLOCK_RECIPES:
        return 32, 32, 32  # the scale block
    if recipe in TE_RECIPES:
        # check_dim_for_fp8_exec: every FP8 operand's rows a multiple of 8, its width of
        # 16: x [M, K] and w [N, K] in the forward, grad_y [M, N] in dgrad
        return 8, 16, 16
    return _ALIGN, _ALIGN, _ALIGN  # torch._scaled_mm


def alignment_rule(recipe: str) -> str:
    """The dimensions ``recipe``'s GEMMs need, in words."""
    am, an, ak = _alignment(recipe)
    who = ("te.Linear" if recipe in TE_RECIPES else "torch._scaled_mm")
    if am == an == ak:
        return f"{who} needs M, N and K multiples of {am}"
    return (f"{who} needs the tokens (M) a multiple of {am} and the features (N, K) "
            f"multiples of {an}")


def scaled_mm_eligible(m: int, n: int, k: int, recipe: str = "tensorwise") -> bool:
    """Can ``recipe``'s FP8 GEMM run ``[M, K] x [K, N]`` (``torch._scaled_mm``: all three
    multiples of 16; 32, the scale block, for the MXFP8 recipes; Transformer Engine: M a
    multiple of 8, N and K of 16)?"""
    am, an, ak = _alignment(recipe)
    return m % am == 0 and n % an == 0 and k % ak == 0


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
    if recipe in TE_RECIPES:  # x and w cast in the forward, grad_y in dgrad, both layouts
        kind = _TE_CASTS[recipe]
        if role == "forward":
            return [("x", m * k, kind), ("w", n * k, kind)]
        if role == "dgrad":
            return [("grad_y", m * k, kind)]
        return []
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
    if recipe in BLOCK_RECIPES and spec.arch != "blackwell":
        raise ValueError(f"{recipe} needs Blackwell's block-scaled tensor cores; {spec.name} "
                         f"has none (accepted: {gpus_of_arch('blackwell')}; elsewhere "
                         "tensorwise, rowwise, te-delayed or te-current)")
    if not scaled_mm_eligible(m, n, k, recipe):
        raise ValueError(f"{alignment_rule(recipe)}; got M={m}, N={n}, K={k}")
    gemm = predict_matmul(m, n, k, dtype="fp8", gpu=spec, layout=layout)
    t, kernels, nbytes, names = 0.0, 1, 0, []
    for name, elements, kind in _casts(role, recipe, m, n, k):
        ct, ck, cb = cast_cost(elements, kind, gpu=spec)
        t, kernels, nbytes = t + ct, kernels + ck, nbytes + cb
        names.append(name)
    gemm_name = "te.Linear's FP8 GEMM" if recipe in TE_RECIPES else "_scaled_mm"
    what = f"float8 {recipe} {role}: {gemm_name}" + (
        f" + scale and cast of {', '.join(names)}" if names else "")
    total = gemm.time_s + t
    tflops = gemm.flops / total / 1e12
    pred = _replace(gemm, total, tflops, what)
    return Float8Gemm(pred, kernels, nbytes, t, what)


def _replace(gemm, total, tflops, what):
    import dataclasses

    return dataclasses.replace(gemm, time_s=total, tflops=tflops,
                               efficiency=tflops / gemm.peak_tflops, kernel=what)
