"""The clock tensor-core work sustains under the board power limit (DVFS).

A GPU runs at the highest clock its power limit allows. A microbenchmark's short burst of
GEMMs runs at boost (the "maximum achievable matmul FLOPS", MAMF); a long job's back-to-back
dense GEMMs pin the board at its limit and the clock settles lower (the "maximum
sustainable matmul FLOPS", MSMF: Bekman's ``mamf-finder.py``, stas00/ml-engineering,
measures both: H200 SXM 834 and 755 TFLOP/s bf16, B200 1745 and 1429, at the default 700
and 1000 W). Memory-bound and small kernels draw less and stay near boost.

The model (one rule, :func:`sustained_ratio`): a kernel's power is a part that does not
follow the SM clock (``fixed_w``: leakage, HBM, I/O) plus a dynamic part proportional to
its tensor-core activity (its FLOP rate at boost over the dense peak, ``u``) and to
``f·V²``, with the voltage following the clock in the DVFS range, so ``∝ f³``:

    P(f) = fixed_w + D · (u / u_ref) · (f / f_boost)³

``D`` is the dynamic power at boost of the reference GPU's fattest GEMM (its MAMF rate,
``u_ref``), known from the reference measurement: that GEMM sustains ``s = MSMF / MAMF`` of
its boost rate at the reference limit, so ``D = (limit_ref - fixed_w) / s³``. Another
board of the same die scales ``D`` by its SM count and the cube of the clock its datasheet
peak is quoted at (its dense bf16 peak per SM). A kernel
then runs at ``r = min(1, ((limit - fixed_w) / (D u / u_ref))^(1/3))`` of its boost-clock
rate. ``fixed_w`` is derived by ``bench/fit_power.py`` from the H100 PCIe's published MAMF
(a 350 W board, throttled within one GEMM) and the Hopper reference; the exponent is the
physics above, not fitted. Constants: ``fxshape/data/power_params.json``.

GPUs of a family without a reference measurement (Ampere, Ada, AMD) keep their kernels'
burst-clock times: the step says so. Nothing here imports torch.
"""

from __future__ import annotations

import functools
import json
import math
import os
from dataclasses import dataclass

__all__ = ["ClockCurve", "clock_curve", "sustained_ratio", "power_limit_range",
           "check_power_limit", "PARAMS_PATH"]

PARAMS_PATH = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data",
                           "power_params.json")


@dataclass(frozen=True)
class ClockCurve:
    """A family's reference measurement and the power that does not follow the clock.

    ``reference``: the GPU measured; ``limit_w``: the limit it ran under; ``burst_tflops``
    and ``sustained_tflops``: its MAMF and MSMF (dense bf16); ``peak_tflops``: its dense bf16
    peak; ``sms``: its SM count; ``fixed_w``: the power that does not follow the SM clock;
    ``exponent``: of the clock in the dynamic power."""

    family: str
    reference: str
    limit_w: float
    burst_tflops: float
    sustained_tflops: float
    peak_tflops: float
    sms: int
    fixed_w: float
    exponent: float
    source: str

    @property
    def burst_fraction(self) -> float:
        """The reference GEMM's activity: its boost-clock rate over the dense peak."""
        return self.burst_tflops / self.peak_tflops

    @property
    def sustained_fraction(self) -> float:
        """MSMF / MAMF: the clock the reference GEMM keeps at the reference limit."""
        return self.sustained_tflops / self.burst_tflops

    def dynamic_w(self, spec) -> float:
        """The dynamic power at boost of the reference GEMM run on ``spec`` (same die: by
        SM count, and by the cube of the clock of its datasheet peak, its bf16 peak per
        SM)."""
        d_ref = (self.limit_w - self.fixed_w) / self.sustained_fraction ** self.exponent
        clock = (spec.peak_tflops("bf16") / spec.sm_count) / (self.peak_tflops / self.sms)
        return d_ref * (spec.sm_count / self.sms) * clock ** self.exponent


@functools.lru_cache(maxsize=None)
def _params(path: str = PARAMS_PATH) -> dict:
    with open(path) as f:
        return json.load(f)


def _family(spec) -> str | None:
    """The curve family of ``spec``: ``"hopper"``, ``"blackwell"`` (tcgen05 parts), or None."""
    if spec.vendor != "nvidia":
        return None
    if spec.arch == "hopper":
        return "hopper"
    if spec.arch == "blackwell" and spec.tcgen05:
        return "blackwell"
    return None


def clock_curve(spec) -> ClockCurve | None:
    """The sustained-clock curve ``spec`` is priced with, or None (no reference measurement
    for its family, or no board power recorded)."""
    family = _family(spec)
    if family is None or spec.power_w is None:
        return None
    p = _params()
    fam = p["families"].get(family)
    if fam is None:
        return None
    return ClockCurve(family=family, reference=fam["reference"], limit_w=fam["limit_w"],
                      burst_tflops=fam["burst_tflops"], sustained_tflops=fam["sustained_tflops"],
                      peak_tflops=fam["peak_tflops"], sms=fam["sms"], fixed_w=fam["fixed_w"], exponent=p["exponent"], source=fam["source"])


def sustained_ratio(spec, utilization: float, curve: ClockCurve | None = None) -> float:
    """The fraction of its boost-clock rate a kernel keeps in a long job on ``spec`` under
    its power limit (``spec.power_w``): 1 where it draws less than the limit at boost.

    ``utilization``: the kernel's FLOP rate at boost over the dense peak of the format it
    runs in (0 or less: no tensor work, 1). ``curve``: :func:`clock_curve` (looked up if
    None); a GPU without one keeps 1."""
    curve = clock_curve(spec) if curve is None else curve
    if curve is None or not utilization > 0:
        return 1.0
    demand = curve.dynamic_w(spec) * utilization / curve.burst_fraction
    budget = spec.power_w - curve.fixed_w
    if budget <= 0:
        raise ValueError(f"{spec.label}: a {spec.power_w:g} W limit is below the "
                         f"{curve.fixed_w:.0f} W the GPU draws at any clock")
    return min(1.0, (budget / demand) ** (1.0 / curve.exponent))


#: The lowest limits NVIDIA's drivers accept, where a measurement shows them: Ujeniya et
#: al., "Architectural Trade-offs in the Energy-Efficient Era: A Comparative Study of
#: power-capping NVIDIA H100 and H200" (arXiv 2604.11391, 2026) cap both from 200 W to
#: 700 W. Elsewhere the range is 30% to 100% of the board power.
_MIN_POWER_W = {"h100-sxm": 200.0, "h200-sxm": 200.0, "h800-sxm": 200.0,
                "h100-sxm-hbm2e": 200.0}
_MIN_FRACTION = 0.3


def power_limit_range(spec) -> tuple[float, float]:
    """``(lowest, highest)`` power limit in watts ``spec`` accepts; ValueError where the
    table records no board power for it."""
    if spec.tdp_w is None:
        raise ValueError(f"{spec.name}: no board power is recorded, so no power limit can be "
                         "set (GPUs with one: see fxshape gpus)")
    low = _MIN_POWER_W.get(spec.name, math.ceil(_MIN_FRACTION * spec.tdp_w))
    return float(low), float(spec.tdp_w)


def check_power_limit(spec, watts) -> None:
    """ValueError, in one line, for a limit outside :func:`power_limit_range`."""
    low, high = power_limit_range(spec)
    if not (isinstance(watts, (int, float)) and low <= watts <= high):
        raise ValueError(f"{spec.name}: power limit {watts!r} W is outside the range it "
                         f"accepts, {low:g} to {high:g} W")
