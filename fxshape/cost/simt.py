"""fp32 GEMMs without TF32: the SIMT ``sgemm`` kernels cuBLAS runs on the CUDA cores.

``torch.matmul`` on fp32 tensors with TF32 off (PyTorch's default for matmuls) runs none of
the tensor-core kernels: cuBLAS picks one of its SIMT ``sgemm`` kernels, whose names carry
their CTA tile, e.g. ``ampere_sgemm_128x64_tn``. This module holds, per architecture, the
menu of those kernels as the kernel names in NeuSight's fp32 measurements show them
(``../shared/calibration/neusight/fp32_train.csv``; counts in docs/model.md), and the one
per-kernel figure the model needs: FMAs per shared-memory operand load, from the tile and
the block size.

Orientation: cuBLAS is column-major, so PyTorch calls it with the operands swapped
(``C^T = B^T A^T``). A kernel named ``sgemm_AxB`` therefore tiles fxshape's N by A and M by B:
``ampere_sgemm_32x128`` has ``tm = 128`` rows of M and ``tn = 32`` columns of N. The launch
grids in the data confirm it (``grid.x = ceil(N / A)``, ``grid.y = ceil(M / B)``).

Pure data and pure functions; nothing here imports torch.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

__all__ = ["SimtKernel", "simt_menu", "parse_kernel_name", "SIMT_ARCH_MENU",
           "sgemm_issue_efficiency", "sustained_fp32_peak"]


@dataclass(frozen=True)
class SimtKernel:
    """One SIMT sgemm kernel: its CTA tile in fxshape's orientation and its block size.

    Attributes:
        name: the cuBLAS kernel name without the layout suffix, e.g. ``"ampere_sgemm_128x64"``.
        tm: rows of M (tokens) one CTA computes.
        tn: columns of N one CTA computes.
        threads: threads per CTA (the launch's block size).
        slices: K slices inside one CTA (``sliced1x4`` kernels split the K loop over 4 warp
            groups and add their partial tiles in shared memory).
    """

    name: str
    tm: int
    tn: int
    threads: int
    slices: int = 1

    @property
    def outputs_per_thread(self) -> float:
        """Outputs one thread accumulates per K slice: the register tile ``r x c``.

        A thread issues ``r * c`` FMAs per K step for ``r + c`` operand loads from shared
        memory, so the FMA pipe is busier the larger this is (``sqrt`` of it sets the ratio).
        """
        return self.tm * self.tn * self.slices / self.threads


def _k(name: str, a: int, b: int, threads: int, slices: int = 1) -> SimtKernel:
    # name "..._AxB": A along N, B along M (see the module docstring)
    return SimtKernel(name, tm=b, tn=a, threads=threads, slices=slices)


# cuBLAS 12.1 (PyTorch 2.1) kernels seen in the data, with their block sizes.
_AMPERE = (
    _k("ampere_sgemm_128x128", 128, 128, 256),
    _k("ampere_sgemm_128x64", 128, 64, 128),
    _k("ampere_sgemm_128x32", 128, 32, 256),
    _k("ampere_sgemm_32x128", 32, 128, 256),
    _k("ampere_sgemm_64x64", 64, 64, 64),
    _k("ampere_sgemm_32x32_sliced1x4", 32, 32, 128, 4),
    _k("ampere_sgemm_64x32_sliced1x4", 64, 32, 256, 4),
    _k("ampere_sgemm_128x32_sliced1x4", 128, 32, 256, 4),
)
_VOLTA = tuple(SimtKernel(k.name.replace("ampere", "volta"), k.tm, k.tn, k.threads, k.slices)
               for k in _AMPERE)
_MAXWELL = (  # the sm50 kernels cuBLAS still runs on Pascal
    _k("maxwell_sgemm_128x64", 128, 64, 128),
    _k("maxwell_sgemm_32x128", 32, 128, 256),
    _k("maxwell_sgemm_64x64", 64, 64, 64),
    _k("maxwell_sgemm_128x32", 128, 32, 256),
    _k("sgemm_32x32x32", 32, 32, 128),
    _k("sgemm_128x128x8", 128, 128, 256),
)


def _pick(menu, *names):
    by = {k.name.split("_sgemm_")[-1] if "_sgemm_" in k.name else k.name: k for k in menu}
    return tuple(by[n] for n in names)


def _drop(menu, *names):
    gone = set(_pick(menu, *names))
    return tuple(kk for kk in menu if kk not in gone)


#: Per architecture: (kernels for a single GEMM, kernels for a strided-batched GEMM).
#: Batched calls in the data run a much smaller set: on A100 every one of 16,588 batched
#: calls ran ``128x128``; on P100/P4 ``128x64``; V100 and T4 three or four tiles. Kernels the
#: library ran for under 1% of the single GEMMs are left out (``64x64``: 19 of 6,533 calls on
#: A100, 1 of 6,460 on V100), so the model does not pick a tile cuBLAS avoids.
SIMT_ARCH_MENU = {
    "ampere": (_drop(_AMPERE, "64x64"), _pick(_AMPERE, "128x128")),
    "volta": (_drop(_VOLTA, "64x64"), _pick(_VOLTA, "64x64", "32x128", "128x32")),
    "turing": (_VOLTA, _pick(_VOLTA, "64x64", "128x64", "128x32", "32x128")),
    # P100/P4 single GEMMs: 128x64 and sgemm_128x128x8 ran 5 and 2 of ~6,400 calls
    "pascal": (_drop(_MAXWELL, "128x64", "sgemm_128x128x8"), _pick(_MAXWELL, "128x64")),
}
#: Architectures with no fp32 measurements run the menu of the nearest one that has them:
#: GA10x and Ada ship the sm80 ``ampere_sgemm`` kernels; Hopper and Blackwell are assumed to.
_MENU_FROM = {"ampere-ga10x": "ampere", "ada": "ampere", "hopper": "ampere",
              "blackwell": "ampere"}


def simt_menu(arch: str, batched: bool) -> tuple[SimtKernel, ...]:
    """The sgemm kernels cuBLAS chooses among on ``arch`` for a single or batched GEMM.

    Raises:
        ValueError: an architecture with no SIMT sgemm menu (AMD's run fp32 on matrix cores).
    """
    key = _MENU_FROM.get(arch, arch)
    if key not in SIMT_ARCH_MENU:
        raise ValueError(f"no SIMT sgemm kernel menu for architecture {arch!r}; "
                         f"known: {', '.join(sorted(set(SIMT_ARCH_MENU) | set(_MENU_FROM)))}")
    return SIMT_ARCH_MENU[key][1 if batched else 0]


_NAME = re.compile(r"(?:^|_)sgemm_(\d+)x(\d+)(?:x\d+)?(?:_sliced1x(\d+))?", re.IGNORECASE)


def parse_kernel_name(name: str) -> tuple[int, int, int]:
    """``(tm, tn, slices)`` of a cuBLAS sgemm kernel name, in fxshape's orientation.

    >>> parse_kernel_name("ampere_sgemm_32x128_tn")
    (128, 32, 1)
    >>> parse_kernel_name("volta_sgemm_64x32_sliced1x4_nn")
    (32, 64, 4)

    Raises:
        ValueError: a name without an ``sgemm_AxB`` tile.
    """
    mt = _NAME.search(name)
    if not mt:
        raise ValueError(f"not a cuBLAS sgemm kernel name (no sgemm_AxB tile): {name!r}")
    a, b = int(mt.group(1)), int(mt.group(2))
    return b, a, int(mt.group(3) or 1)


def tile_fma_efficiency(kernel: SimtKernel, overhead: float) -> float:
    """Fraction of the FMA pipe a kernel's inner loop keeps busy.

    Per K step a thread with an ``r x c`` register tile issues ``r * c`` FMAs and ``r + c``
    shared-memory loads (``2 sqrt(rc)`` for a square tile), so the loads cost
    ``overhead / sqrt(r * c)`` of the FMA time; ``overhead`` is fitted per architecture.
    """
    return 1.0 / (1.0 + overhead / math.sqrt(kernel.outputs_per_thread))


# ---------------------------------------------------------------------------------------
# The sustained sgemm peak of a GPU without fp32 measurements of its own
# ---------------------------------------------------------------------------------------

#: Architectures whose SM partitions dispatch two instructions per clock (Maxwell and Pascal
#: GP104: two dispatch units per warp scheduler), so an FFMA and a load issue together.
DUAL_ISSUE_ARCHS = frozenset({"pascal"})
#: Instructions per k step of an unrolled sgemm mainloop besides the FFMAs and the operand
#: fragment loads: per 8-deep K tile of a 128 x 128 CTA of 256 threads, 2 LDG.128 and 2
#: STS.128 of the next tile, 2 barriers and ~4 address, compare and branch instructions.
_LOOP_INSTRUCTIONS = 10 / 8
#: Board power (W) up to which a card is power-capped by design (a PCIe slot delivers 75 W).
LOW_POWER_W = 75.0


def sgemm_issue_efficiency(spec, kernel: SimtKernel) -> float:
    """Fraction of the FP32 peak an sgemm kernel's instruction issue allows.

    An SM partition issues one warp instruction per clock (Volta on). With 16 FP32 lanes per
    partition (V100, T4, A100) an FFMA occupies its datapath for two clocks, leaving every
    other issue slot to the loads; with 32 (Hopper, Blackwell, and GA10x/Ada, whose datasheet
    counts a second datapath shared with INT32) the FFMAs alone would need every issue slot,
    so the kernel's other instructions cost FFMA time: per k step a thread issues ``o`` FFMAs
    (``o`` = :attr:`SimtKernel.outputs_per_thread`), ``sqrt(o) / 2`` LDS.128 of its A and B
    fragments and :data:`_LOOP_INSTRUCTIONS` more, so the FFMAs get ``o / (o + other)`` of the
    slots. 1 where the datapath, not the issue, is the limit (16 lanes per partition, or a
    dual-issue partition). This is the GA10x/Ada "doubled FP32" that sgemm cannot fill.
    """
    if spec.vendor != "nvidia" or spec.arch in DUAL_ISSUE_ARCHS:
        return 1.0
    if spec.fp32_lanes_per_sm / 4 < 31.5:  # 16 lanes per partition: datapath-bound
        return 1.0
    o = kernel.outputs_per_thread
    other = math.sqrt(o) / 2 + _LOOP_INSTRUCTIONS
    return o / (o + other)


def sustained_fp32_peak(spec, reference=None) -> float:
    """FP32 FLOP/s the sgemm model treats as the peak of ``spec``: the datasheet figure at
    the clock the card sustains under its power limit.

    Applied only to cards of at most :data:`LOW_POWER_W` (the PCIe slot's 75 W: L4, T4, P4)
    that take the fitted constants of another GPU (``reference``, a ``GPUSpec``): with ``w``
    watts per SM where the reference has ``w_ref``, the clock is ``w / w_ref`` of the
    reference's clock fraction, at most 1. Linear, because a power-capped card runs at the
    bottom of its voltage-frequency curve, where the voltage no longer drops with the clock
    and dynamic power is proportional to it; checked where the process is the same: the T4
    (70 W, 40 SMs) against the V100 PCIe (250 W, 80 SMs), both 12 nm: 0.56 predicted, the
    fits' sustained fractions give 0.45 / 0.87 = 0.52. Between cards of ordinary power the
    process node decides more than the watts (the A100 PCIe has half the P100's watts per
    SM and runs at boost), so the rule is not applied there. Constants fitted on ``spec``'s
    own data already hold its clock behaviour; without a board power on either side, no
    power factor.
    """
    peak = spec.peaks.fp32 * 1e12
    if (reference is not None and reference.name != spec.name and spec.tdp_w
            and reference.tdp_w and spec.tdp_w <= LOW_POWER_W):
        ratio = (spec.tdp_w / spec.sm_count) / (reference.tdp_w / reference.sm_count)
        peak *= min(1.0, ratio)
    return peak
