#!/usr/bin/env python
"""Fit the performance model's constants to the measured GEMM times.

    python bench/fit_model.py [--calibration-dir DIR] [--out fxshape/data/perf_params.json]

For each GPU in the calibration data it fits the ``ModelParams`` (see fxshape/perf.py)
plus timing-method nuisance terms for every method other than a CUDA-timed kernel
(``mean-wall``, ``worst-iteration-wall``, and LLMCompass's ``reported`` figures, whose smallest
GEMMs take ~30 us): an additive host overhead per call and a slow-iteration factor, by
robust (soft-L1) least squares on log(predicted / measured), every sweep weighted equally,
from a few fixed starting points; the start whose result has the lowest mean absolute log
error wins. Deterministic: the same data give the same numbers.

Bounds keep constants physical (e.g. launch latency 2-10 us, efficiencies <= 1).
Parameters that a GPU's data cannot identify are taken from a related GPU fitted first
(``_PLAN`` below), e.g. H100 and A40 data contain no misaligned shapes, so their
``align_eff`` comes from the A100 fit. Families without any measured GPU inherit a fitted
family (``_FAMILY_FROM``). Everything is written to the JSON file the package reads.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections import defaultdict
from dataclasses import asdict

import numpy as np
from scipy.optimize import least_squares

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fxshape.calibration import calibration_sku, read_dir  # noqa: E402
from fxshape.dtypes import canonical_dtype  # noqa: E402
from fxshape.gpus import get_gpu, list_gpus  # noqa: E402
from fxshape.perf import ModelParams, model_params, predict_times_array  # noqa: E402

# (SKU, params to fit, SKU to take the others from) in fitting order.
_ALL = ModelParams.FIELDS
_NO_ALIGN = tuple(f for f in _ALL if f not in ("align_eff", "align_mem_eff"))
_PLAN = (
    ("a100-sxm4-40gb", _ALL, None),
    ("v100-sxm2", _ALL, None),
    ("mi250x-gcd", _ALL, None),
    ("a100-sxm4-80gb", _NO_ALIGN, "a100-sxm4-40gb"),
    ("h100-sxm", _NO_ALIGN, "a100-sxm4-40gb"),
    ("a40", _NO_ALIGN, "a100-sxm4-40gb"),
    ("mi210", ("e_max", "power_eff", "dram_eff", "launch_s"), "mi250x-gcd"),
)
# Families with no measured GPU take the constants of the nearest measured one.
_FAMILY_FROM = {
    "pascal": "v100-sxm2",  # no tensor cores: only read for DRAM efficiency (fp32 models)
    "volta": "v100-sxm2", "turing": "v100-sxm2", "ampere": "a100-sxm4-80gb",
    "ampere-ga10x": "a40", "ada": "a40", "hopper": "h100-sxm", "blackwell": "h100-sxm",
    "cdna2": "mi250x-gcd", "cdna3": "mi250x-gcd",
}

# Start values and bounds (the fit works in an unbounded transform of these ranges).
_START = dict(e_max=0.8, l2_bytes_per_clk_per_sm=64.0, dram_eff=0.8, launch_s=5e-6,
              wave_s=2e-6, align_eff=0.7, smooth_q=4.0, split_k_s=3e-6, power_eff=0.8,
              align_mem_eff=0.95, sm_stream_bytes_per_clk=32.0)
_BOUNDS = dict(e_max=(0.3, 1.0), l2_bytes_per_clk_per_sm=(8.0, 512.0), dram_eff=(0.3, 1.0),
               launch_s=(2e-6, 1e-5), wave_s=(1e-8, 5e-5), align_eff=(0.2, 1.0),
               smooth_q=(1.0, 12.0), split_k_s=(1e-8, 1e-4), power_eff=(0.3, 1.0),
               align_mem_eff=(0.5, 1.0), sm_stream_bytes_per_clk=(2.0, 512.0))
# Starting points tried for every GPU (the objective has kinks where the best tile changes).
_STARTS = (
    dict(e_max=0.85, power_eff=0.75, l2_bytes_per_clk_per_sm=64.0),
    dict(e_max=0.75, power_eff=0.95, l2_bytes_per_clk_per_sm=32.0),
    dict(e_max=0.95, power_eff=0.65, l2_bytes_per_clk_per_sm=128.0),
    dict(e_max=0.9, power_eff=0.7, dram_eff=0.75, launch_s=3e-6, smooth_q=6.0),
    dict(e_max=0.8, power_eff=0.8, dram_eff=0.85, launch_s=2e-6, smooth_q=3.0, wave_s=1e-6),
)
_LOGSCALE = ("l2_bytes_per_clk_per_sm", "launch_s", "wave_s", "split_k_s",
             "sm_stream_bytes_per_clk")
_KERNEL_TIMINGS = ("median-cuda-timer", "cuda-event-median")


def _to_unbounded(name, v):
    lo, hi = _BOUNDS[name]
    if name in _LOGSCALE:
        lo, hi, v = math.log(lo), math.log(hi), math.log(v)
    x = (v - lo) / (hi - lo)
    x = min(max(x, 1e-6), 1 - 1e-6)
    return math.log(x / (1 - x))


def _from_unbounded(name, u):
    lo, hi = _BOUNDS[name]
    logscale = name in _LOGSCALE
    if logscale:
        lo, hi = math.log(lo), math.log(hi)
    x = 1 / (1 + math.exp(-max(min(u, 50), -50)))
    v = lo + x * (hi - lo)
    return math.exp(v) if logscale else v


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
        return ModelParams(**{f: vals[f] for f in ModelParams.FIELDS}), x[len(names):]

    sw = np.sqrt(prob.w)

    def residuals(x):
        params, nuis = unpack(x)
        return sw * np.log(prob.measured_model(params, nuis) / prob.t)

    def l1(x):
        params, nuis = unpack(x)
        return float(np.sum(prob.w * np.abs(np.log(prob.measured_model(params, nuis) / prob.t))))

    best = None
    for start in starts or _STARTS:
        init = {**_START, **fixed, **start}
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


def fit(calibration_dir=None, only=None):
    rows = read_dir(calibration_dir)
    by_gpu = defaultdict(list)
    for r in rows:
        by_gpu[calibration_sku(r.source, r.gpu)].append(r)
    fitted: dict[str, dict] = {}
    measurement: dict[str, dict] = {}
    planned = {p[0] for p in _PLAN}
    # SKUs measured by the user (bench/measure_gemm.py) that the plan does not name are
    # fitted like H100/A40: alignment constants from their family's measured GPU.
    extra = tuple((sku, _NO_ALIGN, _FAMILY_FROM.get(get_gpu(sku).arch, "a100-sxm4-40gb"))
                  for sku in sorted(by_gpu) if sku not in planned)
    for label, free, base in _PLAN + extra:
        if label not in by_gpu or (only and label not in only):
            continue
        spec = get_gpu(label)
        fixed = dict(_START)
        if base in fitted:
            fixed.update({f: fitted[base][f] for f in ModelParams.FIELDS})
        elif base is not None:  # base not in this data: use its packaged constants
            fixed.update(asdict(model_params(base)))
        prob = _Problem(by_gpu[label], spec)
        params, meas, loss = _fit_one(prob, free, fixed)
        fitted[spec.name] = {f: _round(getattr(params, f)) for f in ModelParams.FIELDS}
        fitted[spec.name]["fitted"] = sorted(free)
        fitted[spec.name]["rows"] = len(by_gpu[label])
        measurement[label] = {t: {k: _round(v) for k, v in d.items()} for t, d in meas.items()}
        print(f"{label:7s} -> {spec.name:16s} rows={len(by_gpu[label]):5d} "
              f"mean|log err|={loss:.4f} " +
              " ".join(f"{f}={fitted[spec.name][f]:.4g}" for f in ModelParams.FIELDS),
              file=sys.stderr)
    families = {}
    for name in list_gpus():
        arch = get_gpu(name).arch
        if arch in families:
            continue
        src = _FAMILY_FROM[arch]
        families[arch] = {"from": src}
    return {
        "comment": "Written by bench/fit_model.py from the calibration CSVs; do not edit.",
        "gpus": fitted,
        "families": dict(sorted(families.items())),
        "measurement": measurement,
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--calibration-dir", default=None,
                    help="folder of calibration CSVs (default: $FXSHAPE_CALIBRATION_DIR "
                         "or ../shared/calibration)")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))), "fxshape", "data", "perf_params.json"))
    ap.add_argument("--only", nargs="*", help="fit only these calibration GPU labels")
    args = ap.parse_args(argv)
    result = fit(args.calibration_dir, args.only)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
