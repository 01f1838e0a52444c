"""Fitting the GEMM model's constants to measured times (used by ``bench/fit_model.py`` and
``fxshape calibrate``).

Robust (soft-L1) least squares on log(predicted / measured), every sweep weighted equally,
in an unbounded transform of physical bounds, from a few fixed starting points; the start
whose result has the lowest mean absolute log error wins. Timing methods other than a
CUDA-timed kernel get nuisance terms (an additive host overhead and a slow-iteration factor).
Deterministic. Needs numpy and scipy (``pip install fxshape[calibrate]``).
"""

from __future__ import annotations

import math
from collections import defaultdict

from ..cost.gemm import ModelParams, predict_times_array, predict_times_as_run
from ..cost.gemm_kernels import parse_gemm_tile
from ..hardware.dtypes import canonical_dtype

try:
    import numpy as np
    from scipy.optimize import least_squares
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "fitting the GEMM model needs numpy and scipy: pip install 'fxshape[calibrate]'"
    ) from exc

# Start values and bounds (the fit works in an unbounded transform of these ranges).
_START = dict(e_max=0.8, l2_bytes_per_clk_per_sm=64.0, dram_eff=0.8, launch_s=5e-6,
              wave_s=2e-6, ld_issue_clk=3.0, smooth_q=4.0, split_k_s=3e-6, power_eff=0.8,
              align_mem_eff=0.95, sm_stream_bytes_per_clk=32.0, batched_eff=1.0)
_BOUNDS = dict(e_max=(0.3, 1.0), l2_bytes_per_clk_per_sm=(8.0, 512.0), dram_eff=(0.3, 1.0),
               launch_s=(2e-6, 1e-5), wave_s=(1e-8, 5e-5),
               ld_issue_clk=(0.0, 32.0),
               smooth_q=(1.0, 12.0), split_k_s=(1e-8, 1e-4), power_eff=(0.3, 1.0),
               align_mem_eff=(0.5, 1.0), sm_stream_bytes_per_clk=(2.0, 512.0),
               batched_eff=(0.3, 1.5))  # 1 (no effect) mid-range: unidentified stays at 1
# Starting points tried for every GPU (the objective has kinks where the best tile changes).
_STARTS = (
    dict(e_max=0.85, power_eff=0.75, l2_bytes_per_clk_per_sm=64.0),
    dict(e_max=0.75, power_eff=0.95, l2_bytes_per_clk_per_sm=32.0),
    dict(e_max=0.95, power_eff=0.65, l2_bytes_per_clk_per_sm=128.0),
    dict(e_max=0.9, power_eff=0.7, dram_eff=0.75, launch_s=3e-6, smooth_q=6.0),
    dict(e_max=0.8, power_eff=0.8, dram_eff=0.85, launch_s=2e-6, smooth_q=3.0, wave_s=1e-6),
    # a loose per-SM stream with a binding shared L2 (where the H100 fit lands)
    dict(e_max=0.95, power_eff=0.77, l2_bytes_per_clk_per_sm=40.0,
         sm_stream_bytes_per_clk=96.0, smooth_q=1.8),
)
_LOGSCALE = ("l2_bytes_per_clk_per_sm", "launch_s", "wave_s", "split_k_s",
             "sm_stream_bytes_per_clk")
#: timings of the kernel alone (no host overhead to fit as a nuisance term): the sweeps'
#: kernel timers, kernel durations read from a profiler trace (``fxshape.traces``), and CUDA
#: events around CUDA-graph replays (aiconfigurator's tables: ``bench/fit_aiconfigurator.py``)
_KERNEL_TIMINGS = ("median-cuda-timer", "cuda-event-median", "profiler-kernel",
                   "cuda-graph-mean")


def _to_unbounded(name, v, bounds=_BOUNDS, logscale=_LOGSCALE):
    """``v`` in ``bounds[name]`` (log-spaced for names in ``logscale``) -> the real line."""
    lo, hi = bounds[name]
    if name in logscale:
        lo, hi, v = math.log(lo), math.log(hi), math.log(v)
    x = (v - lo) / (hi - lo)
    x = min(max(x, 1e-6), 1 - 1e-6)
    return math.log(x / (1 - x))


def _from_unbounded(name, u, bounds=_BOUNDS, logscale=_LOGSCALE):
    """The inverse of :func:`_to_unbounded`."""
    lo, hi = bounds[name]
    log = name in logscale
    if log:
        lo, hi = math.log(lo), math.log(hi)
    x = 1 / (1 + math.exp(-max(min(u, 50), -50)))
    v = lo + x * (hi - lo)
    return math.exp(v) if log else v


class _Problem:
    """All rows of one GPU as numpy arrays, with group weights and timing-method indices."""

    def __init__(self, rows, spec):
        self.spec = spec
        self.dkey = canonical_dtype(rows[0].dtype)
        self.b = np.array([r.batch for r in rows], dtype=np.int64)
        self.m = np.array([r.m for r in rows], dtype=np.int64)
        self.n = np.array([r.n for r in rows], dtype=np.int64)
        self.k = np.array([r.k for r in rows], dtype=np.int64)
        self.layout = np.array([r.layout for r in rows])
        self.t = np.array([r.time_s for r in rows])
        # rows that name the kernel that ran (a trace's: fxshape.traces.calibrate.TraceRow)
        # are priced as that kernel
        self.tiles = [parse_gemm_tile(r.kernel) if getattr(r, "kernel", "") else None
                      for r in rows]
        self.splits = [getattr(r, "split_k", 0) for r in rows]
        self.as_run = any(t is not None for t in self.tiles) or any(self.splits)
        groups = [(r.source, r.sweep) for r in rows]
        count = defaultdict(int)
        for g in groups:
            count[g] += 1
        w = np.array([1.0 / count[g] for g in groups])
        self.w = w / w.sum()
        # timing-method nuisance terms: wall-clock methods get an additive host overhead,
        # the worst-of-N method also a multiplicative slow-iteration factor.
        self.timings = sorted({r.timing for r in rows if r.timing not in _KERNEL_TIMINGS})
        self.timing_idx = np.array([self.timings.index(r.timing) if r.timing in self.timings
                                    else -1 for r in rows])

    def n_nuisance(self):
        return 2 * len(self.timings)

    def measured_model(self, params: ModelParams, nuis):
        if self.as_run:
            pred = predict_times_as_run(self.spec, self.dkey, self.b, self.m, self.n, self.k,
                                        self.layout, params, self.tiles, self.splits)
        else:
            pred = predict_times_array(self.spec, self.dkey, self.b, self.m, self.n, self.k,
                                       self.layout, params)
        for i, _ in enumerate(self.timings):
            sel = self.timing_idx == i
            overhead = math.exp(nuis[2 * i])
            factor = 1.0 + math.exp(nuis[2 * i + 1])
            pred[sel] = pred[sel] * factor + overhead
        return pred


def _fit_one(prob: _Problem, free, fixed: dict, starts=None):
    """Robust least squares on log errors from a few fixed starting points; best L1 wins."""
    names = list(free)

    def unpack(x):
        vals = dict(fixed)
        for i, nme in enumerate(names):
            vals[nme] = _from_unbounded(nme, x[i])
        return (ModelParams(**{f: vals[f] for f in ModelParams.STORED if f in vals}),
                x[len(names):])

    sw = np.sqrt(prob.w)

    def residuals(x):
        params, nuis = unpack(x)
        return sw * np.log(prob.measured_model(params, nuis) / prob.t)

    def l1(x):
        params, nuis = unpack(x)
        return float(np.sum(prob.w * np.abs(np.log(prob.measured_model(params, nuis) / prob.t))))

    best = None
    for start in starts or _STARTS:
        # free constants start from the shared start values, not from whatever GPU the fixed
        # ones were taken from: a refit of one GPU must not move another GPU's optimum
        init = {**_START, **start}
        x0 = [_to_unbounded(nme, init[nme]) for nme in names]
        x0 += [math.log(5e-6), math.log(0.05)] * len(prob.timings)
        res = least_squares(residuals, np.array(x0), loss="soft_l1", f_scale=0.03,
                            x_scale=1.0, diff_step=1e-3, max_nfev=2000)
        score = l1(res.x)
        if best is None or score < best[0]:
            best = (score, res.x)
    params, nuis = unpack(best[1])
    meas = {t: dict(overhead_s=math.exp(nuis[2 * i]), slow_factor=1.0 + math.exp(nuis[2 * i + 1]))
            for i, t in enumerate(prob.timings)}
    return params, meas, best[0]


def _round(v):
    return float(f"{v:.5g}")
