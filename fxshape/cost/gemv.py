"""Matrix-vector products as ``torch.compile`` runs them when told to tune reductions.

With ``torch._inductor.config.coordinate_descent_tuning = True`` (gpt-fast's
``generate.py`` sets it), Inductor decomposes an ``mm`` whose left operand has one row or
whose right operand has one column, and a ``bmm`` of one row or column per batch, into a
multiply and a sum (``torch/_inductor/decomposition.py``, ``mm`` and ``bmm``: "our matrix
vector multiplies only achieve peak bandwidth with coordinate descent tuning"): the GEMV
runs as one Triton reduction that streams the weight once, not as the BLAS library's GEMM
kernel. Batch-1 decode is that case: every projection is an ``M = 1`` GEMM.

``gemv="library"`` (the default) keeps every GEMM on the library's kernels (``gemm``);
``gemv="inductor"`` prices the decomposed GEMMs as a memory-bound kernel of the
``reduction`` family (``fxshape.cost.memops.kernel_time``: its launch plus the operands'
bytes at the streaming bandwidth the GPU reaches):

    time = launch_s + (M K + K N + M N) × batch × itemsize / (efficiency × DRAM bandwidth)

Which ops decompose: ``mm``, ``bmm``, ``matmul`` and ``linear`` (Inductor lowers a linear
over 3-D activations, and one without a bias, to ``mm``); not ``addmm`` (a 2-D linear with
a bias: Inductor decomposes it only for tiny operands) and not the GEMMs of a fused
attention kernel. The choice is a context (:func:`use_gemv`), as ``use_params`` is for the
GEMM constants, or an argument of :func:`price_matmul`. Pure functions; nothing here
imports torch.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses

from ..hardware.gpus import get_gpu
from .gemm import MatmulPrediction, predict_matmul
from .memops import kernel_time, memops_params

__all__ = ["GEMV_CHOICES", "GEMV_KERNEL", "DECOMPOSED_OPS", "check_gemv", "use_gemv",
           "gemv_choice", "decomposes", "predict_gemv", "price_matmul"]

#: ``"library"``: the BLAS GEMM kernel; ``"inductor"``: Inductor's decomposed reduction.
GEMV_CHOICES = ("library", "inductor")
#: The ``kernel`` a decomposed GEMV's prediction names.
GEMV_KERNEL = "inductor reduction (mm decomposed: coordinate_descent_tuning)"
#: The GEMM rows' ops Inductor decomposes when one side is a vector.
DECOMPOSED_OPS = ("mm", "bmm", "matmul", "linear")

_CHOICE: contextvars.ContextVar[str] = contextvars.ContextVar("fxshape_gemv",
                                                              default="library")


def check_gemv(gemv) -> str:
    """``gemv`` if it is one of :data:`GEMV_CHOICES`, else a one-line ValueError."""
    if not isinstance(gemv, str) or gemv not in GEMV_CHOICES:
        raise ValueError(f"unknown gemv {gemv!r}; accepted: {', '.join(GEMV_CHOICES)} "
                         "('inductor': torch.compile with coordinate_descent_tuning, as "
                         "gpt-fast runs)")
    return gemv


@contextlib.contextmanager
def use_gemv(gemv: str):
    """Within the block, :func:`price_matmul` prices matrix-vector products as ``gemv``
    says."""
    token = _CHOICE.set(check_gemv(gemv))
    try:
        yield
    finally:
        _CHOICE.reset(token)


def gemv_choice() -> str:
    """The choice in force (``"library"`` outside any :func:`use_gemv`)."""
    return _CHOICE.get()


def decomposes(op: str, m: int, n: int) -> bool:
    """Does Inductor (with coordinate-descent tuning) run this GEMM as a reduction?"""
    return op in DECOMPOSED_OPS and (m == 1 or n == 1)


def predict_gemv(m, n, k, *, batch=1, dtype="bf16", gpu="h100",
                 layout="nn") -> MatmulPrediction:
    """A matrix-vector product as Inductor's reduction kernel (module docstring). The
    prediction keeps the GEMM's shape, FLOPs, bytes and alignment (the shape's own); its
    time is the reduction's, its ``kernel`` :data:`GEMV_KERNEL`, and its tile fields
    describe no tile (1 x 1, one wave).

    Raises:
        ValueError: as :func:`fxshape.cost.gemm.predict_matmul` for the sizes, dtype,
            layout and GPU; ``m`` and ``n`` both above 1 (not a matrix-vector product).
    """
    base = predict_matmul(m, n, k, batch=batch, dtype=dtype, gpu=gpu, layout=layout)
    if base.m != 1 and base.n != 1:
        raise ValueError(f"predict_gemv needs m == 1 or n == 1 (a matrix-vector product), "
                         f"got m={m}, n={n}")
    spec = get_gpu(gpu)
    kt = kernel_time("reduction", base.bytes, gpu=spec)
    launch = float(memops_params(spec)[1]["launch_s"])
    tflops = base.flops / kt.time_s / 1e12
    return dataclasses.replace(
        base, time_s=kt.time_s, tflops=tflops, efficiency=tflops / base.peak_tflops,
        tile=(1, 1), tile_efficiency=1.0, split_k=1, ctas=0, waves=1, wave_efficiency=1.0,
        compute_time_s=0.0, memory_time_s=kt.time_s - launch, launch_s=launch,
        bound=kt.bound, kernel=GEMV_KERNEL)


def price_matmul(op: str, m, n, k, *, batch=1, dtype="bf16", gpu="h100", layout="nn",
                 gemv: str | None = None) -> MatmulPrediction:
    """One GEMM row's prediction: :func:`predict_gemv` when ``gemv`` (default: the
    :func:`use_gemv` context) is ``"inductor"`` and the op decomposes, else
    :func:`fxshape.cost.gemm.predict_matmul`."""
    choice = gemv_choice() if gemv is None else check_gemv(gemv)
    if choice == "inductor" and decomposes(op, m, n):
        return predict_gemv(m, n, k, batch=batch, dtype=dtype, gpu=gpu, layout=layout)
    return predict_matmul(m, n, k, batch=batch, dtype=dtype, gpu=gpu, layout=layout)
