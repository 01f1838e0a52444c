#!/usr/bin/env python
"""Validate the performance model against every measured GEMM in the calibration folder.

    python bench/validate_model.py [--calibration-dir DIR] [--format simple|github]

For every (source, GPU, sweep) it prints the number of rows, the median and 90th-percentile
absolute percentage error of predicted vs measured time, and the Spearman rank correlation.
Predictions come from the public ``fxshape.predict_matmul`` on the SKU the row is taken for
(``fxshape.fit.calibration.calibration_sku``). Rows not timed as kernels (``mean-wall``,
``worst-iteration-wall``, ``reported``) include per-call host overhead that a kernel model does
not predict; the fitted overhead of that timing method (``measurement`` in perf_params.json)
is added to the prediction before comparing, and the ``raw med`` column shows the error
without it. Targets: median <= 5%, p90 <= 15%, Spearman >= 0.98 for every
group with at least 50 rows.

Every table in the calibration folder's GEMM sweeps was measured with 2022-2024 libraries
(PyTorch 1.13-2.1, CUDA 11-12.1), so by default the rows are predicted with that library
generation's constants (``params="2024"``, ``fxshape.cost.gemm.LIBRARY_GENERATIONS``): the
packaged ones for every GPU except those refitted to today's libraries
(``bench/fit_aiconfigurator.py``: H100 SXM, B200), whose 2024 fits it keeps. ``--params``
prices them with another file (``--params default``: the packaged current constants).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tabulate import tabulate  # noqa: E402

from fxshape.cost.gemm import _load_params, predict_matmul, resolve_params_path  # noqa: E402
from fxshape.fit.calibration import (GEMM_SUBDIRS, calibration_dir, calibration_sku,  # noqa: E402
                                     read_dir)

MIN_ROWS = 50
#: the library generation the calibration folder's GEMM sweeps were measured with
GENERATION = "2024"
TARGET_MEDIAN, TARGET_P90, TARGET_SPEARMAN = 0.05, 0.15, 0.98


def percentile(values, q):
    """Linear-interpolated percentile (numpy's default method), q in [0, 100]."""
    xs = sorted(values)
    if not xs:
        raise ValueError("percentile of an empty list")
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _ranks(xs):
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    ranks = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for t in range(i, j + 1):
            ranks[order[t]] = (i + j) / 2.0 + 1.0  # average rank for ties
        i = j + 1
    return ranks


def spearman(a, b):
    """Spearman rank correlation (Pearson on average ranks); nan if either side is constant."""
    ra, rb = _ranks(a), _ranks(b)
    n = len(a)
    ma, mb = sum(ra) / n, sum(rb) / n
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    va = sum((x - ma) ** 2 for x in ra)
    vb = sum((y - mb) ** 2 for y in rb)
    if va == 0 or vb == 0:
        return float("nan")
    return cov / math.sqrt(va * vb)


def validate(directory=None, params_path=None):
    """Return one dict per (source, gpu, sweep) group, in a stable order; each row priced
    with ``params_path`` (default: the 2022-2024 generation the rows were measured with;
    ``"default"``: the packaged current constants)."""
    params_path = GENERATION if params_path is None else params_path
    params_path = None if params_path == "default" else params_path
    measurement = _load_params(resolve_params_path(params_path)).get("measurement", {})
    groups = defaultdict(list)
    for r in read_dir(directory, GEMM_SUBDIRS):
        sku = calibration_sku(r.source, r.gpu)
        p = predict_matmul(r.m, r.n, r.k, batch=r.batch, dtype=r.dtype, gpu=sku,
                           layout=r.layout, params_path=params_path)
        corr = measurement.get(sku, {}).get(r.timing)
        pred = p.time_s * corr["slow_factor"] + corr["overhead_s"] if corr else p.time_s
        groups[(r.source, r.gpu, r.sweep)].append((pred, p.time_s, r.time_s))
    out = []
    for (source, gpu, sweep), vals in sorted(groups.items()):
        err = [abs(p / t - 1) for p, _, t in vals]
        raw = [abs(p / t - 1) for _, p, t in vals]
        out.append(dict(source=source, gpu=gpu, sweep=sweep, rows=len(vals),
                        median=percentile(err, 50), p90=percentile(err, 90),
                        raw_median=percentile(raw, 50),
                        spearman=spearman([v[0] for v in vals], [v[2] for v in vals])))
    return out


def meets(g):
    return (g["median"] <= TARGET_MEDIAN and g["p90"] <= TARGET_P90
            and g["spearman"] >= TARGET_SPEARMAN)


def main(argv=None):
    ap = argparse.ArgumentParser(description="Validate fxshape's GEMM model on measured data.")
    ap.add_argument("--calibration-dir", default=None,
                    help="folder of calibration CSVs (default: $FXSHAPE_CALIBRATION_DIR or "
                         "../shared/calibration)")
    ap.add_argument("--params", default=None,
                    help="fitted constants: a parameter file, a library generation, or "
                         "'default' for the packaged current ones (default: 2024, the "
                         "generation these sweeps were measured with)")
    ap.add_argument("--format", default="simple", help="tabulate format, e.g. github")
    args = ap.parse_args(argv)
    try:
        groups = validate(args.calibration_dir, args.params)
    except FileNotFoundError as exc:
        print(f"validate_model: {exc}", file=sys.stderr)
        return 2
    rows = []
    for g in groups:
        flag = ("ok" if meets(g) else "MISS") if g["rows"] >= MIN_ROWS else "(<50 rows)"
        rows.append((g["source"], g["gpu"], g["sweep"], g["rows"], f"{100 * g['median']:.1f}",
                     f"{100 * g['p90']:.1f}", f"{g['spearman']:.3f}",
                     f"{100 * g['raw_median']:.1f}", flag))
    print(f"calibration data: {calibration_dir(args.calibration_dir)}")
    print(tabulate(rows, headers=("source", "gpu", "sweep", "rows", "med %", "p90 %",
                                  "spearman", "raw med %", "target"),
                   tablefmt=args.format, disable_numparse=True))
    big = [g for g in groups if g["rows"] >= MIN_ROWS]
    ok = sum(meets(g) for g in big)
    allerr = []
    for g in big:
        allerr.append(g["median"])
    print(f"\ngroups with >= {MIN_ROWS} rows meeting all targets (median <= 5%, p90 <= 15%, "
          f"Spearman >= 0.98): {ok} of {len(big)}")
    if big:
        print(f"median of group medians: {100 * percentile(allerr, 50):.1f}%; "
              f"worst group median: {100 * max(allerr):.1f}%; "
              f"worst group p90: {100 * max(g['p90'] for g in big):.1f}%; "
              f"lowest Spearman: {min(g['spearman'] for g in big):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
