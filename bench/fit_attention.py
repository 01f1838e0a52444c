#!/usr/bin/env python
"""Fit the attention model's constants to the published attention throughputs.

    python bench/fit_attention.py [--calibration-dir DIR] [--out fxshape/data/attention_params.json]
                                  [--markdown]

Reads every CSV in ``<calibration dir>/attention/`` (default ``../shared/calibration``, or
``$FXSHAPE_CALIBRATION_DIR``; schema in that folder's README: source, gpu, kernel, direction,
causal, dtype, batch, heads, seq_len, head_dim, tflops). The fused-kernel constants
(``sync_mma_frac``, ``block_cycles``, ``cta_cycles``; ``fp32_ops_per_score`` is counted from the
kernel's instructions, see below) are fitted on the
``fa2`` rows, the unfused path's (``math_bytes_per_score``, ``math_copy_passes``) on the
``standard`` rows, by least squares on log(predicted / measured) from a few fixed starting
points, through ``fxshape.cost.attention.predict_with``: the model that is fitted is the model that
ships. GEMM constants (e_max, power limit, L2 and DRAM rates, launch latency) are the GEMM
fit's (``bench/fit_model.py``) for the same GPU and are not refitted here.

It prints three tables: the residuals of the full fit; a leave-one-sequence-length-out
cross-validation (each length predicted by constants fitted without it); and predictions for
GPUs and kernels without measurements, beside the published figures they can be compared to
(not fitted to). Deterministic: the same data give the same numbers.
"""

from __future__ import annotations

import argparse
import csv
import glob
import json
import math
import os
import statistics
import sys

import numpy as np
from scipy.optimize import least_squares

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fxshape.cost.attention import (AttentionParams, AttentionShape, attention_params,  # noqa: E402
                               predict_with)
from fxshape.fit.calibration import calibration_dir  # noqa: E402
from fxshape.hardware.gpus import get_gpu  # noqa: E402

# kernel names in the CSVs -> attention= choices ("sdpa": PyTorch's SDPA as
# bench/measure_attention.py times it)
_KERNEL = {"fa2": "fa2", "standard": "math", "fa3": "fa3", "sdpa": "flash"}
# fp32_ops_per_score is set, not fitted: FA2's softmax issues per score one FFMA (scale and
# subtract the row max), one FMNMX (row max), one FADD (row sum) and half an F2FP (two scores
# packed to 16 bits) beside the exp2 on the SFU: 3.5, rounded up to 4 for the masking checks.
# The H100 data cannot identify it: there the exponentials bound the softmax for any count up
# to 8 (128 FP32 lanes vs 16 SFUs per SM), while on the A100 (64 lanes) it matters.
_FP32_OPS_PER_SCORE = 4.0
# (kernel, direction) -> the constants fitted on those rows, in fitting order
_GROUPS = {("fa2", "forward"): ("sync_mma_frac", "block_cycles", "cta_cycles"),
           ("fa2", "backward"): ("bwd_mma_frac", "bwd_cta_cycles"),
           ("fa3", "forward"): ("fa3_mma_frac",),
           ("fa3", "backward"): ("fa3_bwd_mma_frac",),
           ("math", "forward"): ("math_bytes_per_score", "math_copy_passes"),
           ("math", "backward"): ("math_bwd_bytes_per_score",)}
_BOUNDS = dict(sync_mma_frac=(0.3, 1.0), block_cycles=(0.0, 4000.0),
               cta_cycles=(0.0, 40000.0), bwd_mma_frac=(0.2, 1.0),
               bwd_cta_cycles=(0.0, 80000.0), fa3_mma_frac=(0.3, 1.0),
               fa3_bwd_mma_frac=(0.2, 1.0),
               math_bytes_per_score=(2.0, 40.0), math_copy_passes=(0.0, 12.0),
               math_bwd_bytes_per_score=(2.0, 60.0))
_BASE = dict(sync_mma_frac=0.6, fp32_ops_per_score=_FP32_OPS_PER_SCORE, block_cycles=200.0,
             cta_cycles=2000.0, bwd_mma_frac=0.7, bwd_cta_cycles=4000.0, fa3_mma_frac=0.8,
             fa3_bwd_mma_frac=0.7,
             math_bytes_per_score=8.0, math_copy_passes=4.0, math_bwd_bytes_per_score=12.0)
# starting points: the base, then each fitted constant at 30% and 70% of its range
_STARTS = (
    {},
    {k: lo + 0.3 * (hi - lo) for k, (lo, hi) in _BOUNDS.items()},
    {k: lo + 0.7 * (hi - lo) for k, (lo, hi) in _BOUNDS.items()},
)
_HERE = os.path.dirname(os.path.abspath(__file__))
_PUBLISHED = os.path.join(_HERE, "attention_published.csv")
# the FA3 paper's causal forward panels: never fitted, a check of the causal modelling
_CAUSAL = os.path.join(_HERE, "attention_published_causal.csv")
_PACKAGED = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                         "fxshape", "data", "attention_params.json")


class Row:
    def __init__(self, d: dict):
        self.source, self.gpu, self.kernel = d["source"], d["gpu"], _KERNEL[d["kernel"]]
        self.direction, self.dtype = d["direction"], d["dtype"]
        s, hd, h = int(d["seq_len"]), int(d["head_dim"]), int(d["heads"])
        self.shape = AttentionShape(int(d["batch"]), h, h, s, s, hd, hd,
                                    d["causal"].strip().lower() == "true")
        self.tflops = float(d["tflops"])
        self.spec = get_gpu(self.gpu)

    def predicted(self, params: AttentionParams) -> float:
        """Predicted TFLOP/s in the papers' convention (causal: half the FLOPs, whatever
        the kernel computes)."""
        # the shared constants (kernels={}): today's FA3 forward has its own, fitted on
        # vLLM's FA3 by bench/fit_attention_aiconfigurator.py; these 2024 figures fit (and
        # check) the constants FA3's backward and the 2024 kernels build on
        p = predict_with(params, self.shape, self.direction, self.kernel, self.dtype,
                         self.spec, kernels={})
        return self.shape.flops(self.direction) / p.time_s / 1e12


def read_rows(directory=None, published: bool = True) -> list[Row]:
    """The rows of ``<calibration dir>/attention/*.csv`` and, with ``published``, of
    ``bench/attention_published.csv``."""
    base = calibration_dir(directory)
    paths = sorted(glob.glob(os.path.join(base, "attention", "*.csv")))
    if not paths:
        raise SystemExit(f"no attention CSVs under {os.path.join(base, 'attention')}")
    if published:
        paths.append(_PUBLISHED)
    rows = []
    for p in paths:
        with open(p, newline="") as f:
            rows += [Row(d) for d in csv.DictReader(f)]
    return rows


def _to_u(name, v):
    lo, hi = _BOUNDS[name]
    x = min(max((v - lo) / (hi - lo), 1e-6), 1 - 1e-6)
    return math.log(x / (1 - x))


def _from_u(name, u):
    lo, hi = _BOUNDS[name]
    return lo + (hi - lo) / (1 + math.exp(-max(min(u, 50), -50)))


def fit_group(rows, names, base: dict) -> dict:
    """Fit ``names`` on ``rows``; the other constants from ``base``. Returns all constants."""
    def params(x):
        vals = dict(base)
        vals.update({n: _from_u(n, u) for n, u in zip(names, x)})
        return AttentionParams(**vals)

    def residuals(x):
        p = params(x)
        return np.array([math.log(r.predicted(p) / r.tflops) for r in rows])

    best = None
    for start in _STARTS:
        x0 = np.array([_to_u(n, start.get(n, base[n])) for n in names])
        res = least_squares(residuals, x0, diff_step=1e-4, max_nfev=400)
        score = float(np.mean(np.abs(residuals(res.x))))
        if best is None or score < best[0] - 1e-12:
            best = (score, res.x)
    vals = dict(base)
    vals.update({n: float(f"{_from_u(n, u):.5g}") for n, u in zip(names, best[1])})
    return vals


def fit(rows) -> dict:
    """Every group of constants whose (kernel, direction) has rows is fitted from fixed
    starts (the result does not depend on the packaged file); a group without rows keeps
    the packaged values."""
    vals = dict(_BASE)
    for (kernel, direction), names in _GROUPS.items():
        sel = [r for r in rows if (r.kernel, r.direction) == (kernel, direction)]
        if sel:
            vals = fit_group(sel, names, vals)
        else:
            packaged = attention_params(_PACKAGED)
            vals.update({n: getattr(packaged, n) for n in names})
    return vals


def _err(pred, meas):
    return 100.0 * (pred / meas - 1.0)


def residual_table(rows, params: AttentionParams, markdown=False) -> str:
    head = ["gpu", "kernel", "dir", "causal", "batch", "heads", "seq", "d", "measured",
            "predicted", "error %"]
    body = []
    for r in rows:
        p = r.predicted(params)
        s = r.shape
        body.append([r.gpu, r.kernel, r.direction, str(s.causal).lower(), s.batch, s.heads,
                     s.seq_q, s.head_dim, f"{r.tflops:.0f}", f"{p:.0f}",
                     f"{_err(p, r.tflops):+.1f}"])
    return _fmt(head, body, markdown)


def _fmt(head, body, markdown):
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in body]
        return "\n".join(lines)
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body)]
    out = ["  ".join(str(h).rjust(w) for h, w in zip(head, widths))]
    out += ["  ".join(str(c).rjust(w) for c, w in zip(row, widths)) for row in body]
    return "\n".join(out)


def cross_validation(rows, key="seq", markdown=False):
    """Leave one sequence length (``key="seq"``) or head dimension (``"head_dim"``) out:
    every row predicted by constants fitted without its value. Returns (table, held-out
    results as ``(row, error %)`` pairs)."""
    get = (lambda r: r.shape.seq_q) if key == "seq" else (lambda r: r.shape.head_dim)
    head = ["kernel", "dir", "d", "seq", "measured", "held-out prediction", "error %"]
    body, results = [], []
    for value in sorted({get(r) for r in rows}):
        params = AttentionParams(**fit([r for r in rows if get(r) != value]))
        for r in rows:
            if get(r) == value:
                p = r.predicted(params)
                results.append((r, _err(p, r.tflops)))
                body.append([r.kernel, r.direction, r.shape.head_dim, r.shape.seq_q,
                             f"{r.tflops:.0f}", f"{p:.0f}", f"{_err(p, r.tflops):+.1f}"])
    return _fmt(head, body, markdown), results


def summary(results) -> str:
    """Median and max |error| per (kernel, direction) of ``(row, error %)`` pairs."""
    out = []
    for kd in sorted({(r.kernel, r.direction) for r, _ in results}):
        errs = [abs(e) for r, e in results if (r.kernel, r.direction) == kd]
        out.append(f"{kd[0]} {kd[1]}: median |error| {statistics.median(errs):.1f}%, "
                   f"max {max(errs):.1f}% ({len(errs)} rows)")
    return "\n".join(out)


# Published figures without measurements here (calibration/attention/README.md, "orientation").
_ORIENTATION = (
    ("a100", "fa2", "forward", 64, "FA2 paper: forward 50-73% of A100 peak (156-228 TFLOP/s)"),
    ("a100", "fa2", "forward", 128, "FA2 paper: forward 50-73% of A100 peak (156-228 TFLOP/s)"),
    ("a100", "fa2", "backward", 128, "none here"),
    ("h200", "fa2", "forward", 128, "none here (H100 compute, 4.8 TB/s)"),
    ("a40", "fa2", "forward", 128, "none here"),
)


def orientation(params: AttentionParams, markdown=False) -> str:
    head = ["gpu", "kernel", "dir", "d", "seq 512", "seq 2k", "seq 16k", "published"]
    body = []
    for gpu, kernel, direction, d, text in _ORIENTATION:
        cells = []
        for seq in (512, 2048, 16384):
            h = 2048 // d
            s = AttentionShape(16384 // seq, h, h, seq, seq, d, d)
            p = predict_with(params, s, direction, kernel, "bf16", get_gpu(gpu))
            cells.append(f"{p.tflops:.0f}")
        body.append([gpu, kernel, direction, d, *cells, text])
    return _fmt(head, body, markdown)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--calibration-dir", default=None)
    ap.add_argument("--out", default=_PACKAGED)
    ap.add_argument("--markdown", action="store_true", help="tables as Markdown (docs/)")
    ap.add_argument("--no-cv", action="store_true", help="skip the cross-validations")
    ap.add_argument("--no-published", action="store_true",
                    help="fit on the calibration folder only (not bench/attention_published.csv)")
    args = ap.parse_args(argv)
    rows = read_rows(args.calibration_dir, published=not args.no_published)
    vals = fit(rows)
    params = AttentionParams(**vals)
    result = {
        "comment": "Written by bench/fit_attention.py from the calibration attention CSVs and "
                   "bench/attention_published.csv; the kernels section by "
                   "bench/fit_attention_aiconfigurator.py; do not edit.",
        "params": vals,
        "fitted_on": sorted({f"{r.source}: {r.gpu} {r.kernel} {r.direction}" for r in rows}),
        "rows": len(rows),
    }
    # today's kernels' own constants (bench/fit_attention_aiconfigurator.py) stay
    if os.path.exists(args.out):
        with open(args.out) as f:
            kept = json.load(f).get("kernels")
        if kept:
            result["kernels"] = kept
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)
        f.write("\n")
    print("constants: " + ", ".join(f"{k}={v:.4g}" for k, v in vals.items()))
    print("\nresiduals of the fit (TFLOP/s, papers' FLOP convention):")
    print(residual_table(rows, params, args.markdown))
    print("\nfit: " + summary([(r, _err(r.predicted(params), r.tflops)) for r in rows]))
    if not args.no_cv:
        for key, what in (("seq", "sequence length"), ("head_dim", "head dimension")):
            table, results = cross_validation(rows, key, args.markdown)
            print(f"\nleave-one-{what.replace(' ', '-')}-out (each row predicted by constants "
                  f"fitted without its {what}):")
            print(table)
            print(f"\nheld out by {what}:\n" + summary(results))
    with open(_CAUSAL, newline="") as f:
        causal = [Row(d) for d in csv.DictReader(f)]
    print("\nheld out, never fitted: causal forward (FA3 paper, H100; "
          "bench/attention_published_causal.csv):")
    print(residual_table(causal, params, args.markdown))
    print(summary([(r, _err(r.predicted(params), r.tflops)) for r in causal]))
    print("\npredictions without measurements (bf16, 16k tokens, hidden 2048):")
    print(orientation(params, args.markdown))
    print(f"\nwrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
