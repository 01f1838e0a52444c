"""The CTA tile of a tensor-core GEMM kernel, read from the name a profiler trace shows.

cuBLAS and CUTLASS name their kernels with the tile they compute, in cuBLAS's column-major
view, in which PyTorch's ``C = A @ B`` is ``C^T = B^T A^T``: the first tile size runs along
fxshape's N and the second along M (as for the SIMT ``sgemm_AxB`` kernels,
``fxshape.cost.simt``). The launch grids of the kernels in ``../shared/calibration/traces``
confirm it: ``cutlass_80_tensorop_s1688gemm_256x128_32x3_nn_align1`` for M=2048, N=38313
launches ``ceil(38313/256) * ceil(2048/128) = 150 * 16`` CTAs (grid 128 x 19 under a
swizzle of 8), and ``grid.z`` is the split-K factor (3, 21, 216 ... in those traces).

Names handled (the tile is the first ``AxB`` after the math-instruction part):

- CUTLASS 2 (cuBLAS on sm80): ``cutlass_80_tensorop_s1688gemm_128x128_32x5_tn_align4``,
  ``cutlass_80_wmma_tensorop_h161616gemm_32x32_64x1_nn_align8``;
- cuBLAS's own: ``ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_tn``,
  ``ampere_h16816gemm_256x128_ldg8_stages_32x3_nn``, ``volta_h884gemm_128x128_ldg8_nn``,
  ``turing_fp16_s1688gemm_fp16_256x128_ldg8_f2f_tn``;
- xmma (cuBLASLt): ``sm80_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize128x128x32_stage4...``,
  ``sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_cgasize1x2x1...``;
- CUTLASS 3: ``cutlass3x_sm90_tensorop_gemm_bf16_bf16_f32_bf16_bf16_128x256x64_1x2x1_0_tnn``.

Pure functions; nothing here imports torch.
"""

from __future__ import annotations

import re

__all__ = ["parse_gemm_tile", "gemm_kernel_role", "AUXILIARY_ROLES", "vector_kernel_family"]

_XMMA = re.compile(r"tilesize(\d+)x(\d+)x\d+")
_CUTLASS3 = re.compile(r"cutlass3x_sm\d+_\w*?gemm\w*?_(\d+)x(\d+)x\d+_\d+x\d+x\d+")
# a math-instruction gemm (s1688gemm, h16816gemm, h884gemm, i8816gemm ...) then the tile
_TENSOROP = re.compile(r"(?:^|_)[a-z]?\d{3,6}gemm(?:_[a-z0-9]+)*?_(\d+)x(\d+)(?:_|$)")


def parse_gemm_tile(name: str) -> tuple[int, int] | None:
    """``(tm, tn)`` in fxshape's orientation (rows of M, columns of N per CTA) of a
    tensor-core GEMM kernel's name, or None for a name without one (a SIMT ``sgemm``, a
    GEMV, a reduce or epilogue kernel, an unknown library).

    >>> parse_gemm_tile("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_256x64_16x4_nn_align1>")
    (64, 256)
    >>> parse_gemm_tile("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_cgasize1x2x1")
    (256, 128)
    >>> parse_gemm_tile("ampere_sgemm_128x64_tn") is None
    True
    """
    for pattern in (_XMMA, _CUTLASS3, _TENSOROP):
        m = pattern.search(name)
        if m:
            a, b = int(m.group(1)), int(m.group(2))
            return (b, a) if a > 0 and b > 0 else None
    return None


#: The kernels a BLAS library launches beside a GEMM's main kernel, by role: the reduce of a
#: split-K GEMM's partial sums (cuBLAS ``splitKreduce_kernel``, CUTLASS's
#: ``ReduceSplitK``), cuBLASLt's stand-alone epilogue (``epilogue::impl::globalKernel``:
#: the bias of an ``addmm`` added by a second pass over the output where the main kernel
#: cannot fuse it), and the scaling of the output by beta before a kernel that accumulates
#: into it (``scal_kernel`` before ``sgemm_largek``).
AUXILIARY_ROLES = ("reduce", "epilogue", "scale")
_ROLES = (("reduce", re.compile(r"splitKreduce|ReduceSplitK|reduce_1Block_kernel")),
          ("epilogue", re.compile(r"epilogue::impl::globalKernel")),
          ("scale", re.compile(r"(?:^|\s)scal_kernel")))


def gemm_kernel_role(name: str) -> str:
    """What a kernel launched by a GEMM operator does: one of :data:`AUXILIARY_ROLES`, or
    ``"main"`` (the kernel that computes the product: a tensor-core or SIMT GEMM, a GEMV,
    cuBLAS's ``gemmk1`` for K = 1, an unknown library's).

    >>> gemm_kernel_role("void splitKreduce_kernel<float, float, float, float, true>(...)")
    'reduce'
    >>> gemm_kernel_role("void epilogue::impl::globalKernel<float, float, float, true, true>")
    'epilogue'
    >>> gemm_kernel_role("ampere_sgemm_32x128_tn")
    'main'
    """
    for role, pattern in _ROLES:
        if pattern.search(name):
            return role
    return "main"


#: cuBLAS's kernels for a GEMM with a vector side, by the memory-bound kernel family that
#: prices them (``fxshape.cost.memops``): the matrix-vector kernels (``gemv2N_kernel``,
#: ``gemv2T_kernel_val``, ``gemvNSP_kernel``, ``internal::gemvx::kernel``) stream the matrix
#: once and reduce along it; ``gemmk1_kernel`` (K = 1) writes the outer product, an
#: elementwise pass. (``cublasGemvTensor...`` in another kernel's template arguments is not
#: one: the pattern wants ``gemv`` in lower case at a word's start.)
_VECTOR_KERNELS = (("reduction", re.compile(r"\bgemv|\bdot_kernel")),
                   ("elementwise", re.compile(r"\bgemmk1_kernel")))


def vector_kernel_family(name: str) -> str | None:
    """The memory-bound family (``"reduction"``, ``"elementwise"``) of one of cuBLAS's GEMV
    or K = 1 kernels, or None for any other kernel.

    >>> vector_kernel_family("void gemvNSP_kernel<float, float, float, float, 1, 32, 4>")
    'reduction'
    >>> vector_kernel_family("void gemmk1_kernel<float, 256, 5, false, false>")
    'elementwise'
    >>> vector_kernel_family("ampere_sgemm_32x128_tn") is None
    True
    """
    for family, pattern in _VECTOR_KERNELS:
        if pattern.search(name):
            return family
    return None
