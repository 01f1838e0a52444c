#!/usr/bin/env python
"""Held-out validation of the tensor-core GEMM model, and where its error sits.

    python bench/validate_heldout.py [--calibration-dir DIR] [--format github] [--quick]

``bench/validate_model.py`` scores the packaged constants on the rows they were fitted to.
This script refits with groups left out, the way ``bench/fit_model.py`` fits (same free
constants, same starting points, alignment constants from the A100 fit):

- **leave one TP degree out** for the Vidur GPUs (A100 80 GB, H100, A40): fit on the layers
  of three tensor-parallel degrees, predict the fourth (its N or K never seen);
- **leave one sweep out** for the cookbook GPUs (A100 40 GB, V100, MI250X): fit on three
  sweeps, predict the fourth;
- **leave the GPU out**: each measured GPU predicted with the packaged constants of another
  GPU (``TRANSFER``: the one whose constants a GPU without data borrows — A40 from the A100,
  as Ada and GA10x do; V100 from the A100, the nearest older tensor-core fit; H100 from the
  A100, the case of a new architecture) and the target's own GPUSpec (SMs, clocks, peaks,
  bandwidth). Only the timing method's two nuisance constants (overhead, slow factor of
  wall-clock rows) are the target's own: they describe the measurement, not the GPU.

It prints, per group, the in-sample and the held-out median / p90 absolute error, then the
Vidur error by token count M (the regime split of issue 11), and an *isotonic floor*: the
error of the best curve that only assumes time does not decrease with the FLOP count within a
group (with M, for a Vidur layer) (a pool-adjacent-violators fit of log time), then the
leave-the-GPU-out table. What the floor leaves is non-monotonic measurement
(library kernel switches, noise) that no model monotone in M can follow.
Deterministic; about four minutes on two cores (``--quick``: H100 only, about one).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
from tabulate import tabulate  # noqa: E402

from fxshape.fit.calibration import GEMM_SUBDIRS, calibration_sku, read_dir  # noqa: E402
from fxshape.fit.fitting import _START, _Problem, _fit_one  # noqa: E402
from fxshape.hardware.gpus import get_gpu  # noqa: E402
from fxshape.cost.gemm import ModelParams, model_params, predict_times_array  # noqa: E402

from fit_model import _ALL, _NO_ALIGN  # noqa: E402  (bench/: the free constants it fits)

# (SKU, free constants, what is left out): as bench/fit_model.py fits them
PLAN = (
    ("a100-sxm4-80gb", _NO_ALIGN, "tp"),
    ("h100-sxm", _NO_ALIGN, "tp"),
    ("a40", _NO_ALIGN, "tp"),
    ("a100-sxm4-40gb", _ALL, "sweep"),
    ("v100-sxm2", _ALL, "sweep"),
    ("mi250x-gcd", _ALL, "sweep"),
)
M_BINS = ((1, 128), (129, 1024), (1025, 4096))
#: the library generation these sweeps were measured with (bench/validate_model.py)
GENERATION = "2024"
#: (target, constants from): a GPU predicted with another GPU's fitted constants
TRANSFER = (
    ("a100-sxm4-40gb", "a100-sxm4-80gb"),
    ("a100-sxm4-80gb", "a100-sxm4-40gb"),
    ("a40", "a100-sxm4-80gb"),
    ("v100-sxm2", "a100-sxm4-40gb"),
    ("h100-sxm", "a100-sxm4-80gb"),
    ("mi250x-gcd", "mi210"),
)


def _fold(row, by):
    if by == "tp":
        m = re.search(r"/tp(\d+)/", row.sweep)
        return f"tp{m.group(1)}" if m else row.sweep
    return row.sweep


def _group(row):
    return f"{row.source}:{row.sweep}"


def _fit(rows, sku, free):
    fixed = dict(_START)
    if sku != "a100-sxm4-40gb" and "ld_issue_clk" not in free:
        base = model_params("a100-sxm4-40gb")
        fixed.update({f: getattr(base, f) for f in ModelParams.STORED})
    params, meas, _ = _fit_one(_Problem(rows, get_gpu(sku)), free, fixed)
    return params, meas


def _predict(rows, sku, params, meas):
    prob = _Problem(rows, get_gpu(sku))
    pred = predict_times_array(prob.spec, prob.dkey, prob.b, prob.m, prob.n, prob.k,
                               prob.layout, params)
    for r_i, r in enumerate(rows):  # wall-clock rows: the timing method's fitted overhead
        c = meas.get(r.timing)
        if c:
            pred[r_i] = pred[r_i] * c["slow_factor"] + c["overhead_s"]
    return pred


def _stats(err):
    err = np.asarray(err)
    return float(np.median(err)), float(np.percentile(err, 90))


def isotonic_floor(ms, times):
    """|fit/measured - 1| of the best non-decreasing (in M) fit of log time (PAV)."""
    order = np.argsort(ms, kind="stable")
    y = np.log(np.asarray(times, dtype=float)[order])
    blocks = []  # [mean, count]
    for v in y:
        blocks.append([v, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            b2, b1 = blocks.pop(), blocks.pop()
            n = b1[1] + b2[1]
            blocks.append([(b1[0] * b1[1] + b2[0] * b2[1]) / n, n])
    fit = np.concatenate([[v] * n for v, n in blocks])
    return np.abs(np.exp(fit - y) - 1)


def heldout(directory=None, only=None):
    """Per GPU of ``PLAN``: ``(rows, in-sample |error|, held-out |error|, what was left out)``,
    each row predicted by a fit that did not see its group."""
    rows = read_dir(directory, GEMM_SUBDIRS)
    by_sku = defaultdict(list)
    for r in rows:
        by_sku[calibration_sku(r.source, r.gpu)].append(r)
    out = {}
    for sku, free, by in PLAN:
        if only and sku not in only or sku not in by_sku:
            continue
        data = [r for r in by_sku[sku] if r.source != "llmcompass"]
        params, meas = _fit(data, sku, free)
        ins = np.abs(_predict(data, sku, params, meas) / np.array([r.time_s for r in data]) - 1)
        held = np.empty(len(data))
        folds = sorted({_fold(r, by) for r in data})
        for fold in folds:
            test = [i for i, r in enumerate(data) if _fold(r, by) == fold]
            train = [r for r in data if _fold(r, by) != fold]
            p, mm = _fit(train, sku, free)
            sub = [data[i] for i in test]
            held[test] = np.abs(_predict(sub, sku, p, mm) / np.array([r.time_s for r in sub]) - 1)
        out[sku] = (data, ins, held, by)
    return out


def run(directory=None, only=None):
    table, regimes = [], []
    for sku, (data, ins, held, by) in heldout(directory, only).items():
        groups = defaultdict(list)
        for i, r in enumerate(data):
            groups[_group(r)].append(i)
        for g, idx in sorted(groups.items()):
            sub = [data[i] for i in idx]
            floor = isotonic_floor([r.batch * r.m * r.n * r.k for r in sub],
                                   [r.time_s for r in sub])
            (im, ip), (hm, hp), (fm, fp) = _stats(ins[idx]), _stats(held[idx]), _stats(floor)
            table.append((sku, g.split(":", 1)[1].replace("meta-llama/Llama-2-7b-hf/", ""),
                          len(idx), f"{100 * im:.1f}", f"{100 * ip:.1f}", f"{100 * hm:.1f}",
                          f"{100 * hp:.1f}", f"{100 * fm:.1f}", f"{100 * fp:.1f}"))
        if by == "tp":
            m = np.array([r.m for r in data])
            for lo, hi in M_BINS:
                sel = (m >= lo) & (m <= hi)
                (im, ip), (hm, hp) = _stats(ins[sel]), _stats(held[sel])
                regimes.append((sku, f"{lo}-{hi}", int(sel.sum()), f"{100 * im:.1f}",
                                f"{100 * ip:.1f}", f"{100 * hm:.1f}", f"{100 * hp:.1f}"))
    return table, regimes


def transfer(directory=None, only=None):
    """Rows (target, from, source, rows, own median/p90 %, borrowed median/p90 %)."""
    from fxshape.cost.gemm import _load_params, resolve_params_path

    rows = read_dir(directory, GEMM_SUBDIRS)
    by_sku = defaultdict(list)
    for r in rows:
        by_sku[calibration_sku(r.source, r.gpu)].append(r)
    # the sweeps were measured with 2022-2024 libraries: their generation's constants
    packaged = _load_params(resolve_params_path(GENERATION))
    out = []
    for target, donor in TRANSFER:
        if only and target not in only or target not in by_sku:
            continue
        if donor not in packaged["gpus"]:
            continue  # no fitted constants of its own to lend
        meas = packaged["measurement"].get(target, {})
        for source in sorted({r.source for r in by_sku[target]}):
            data = [r for r in by_sku[target] if r.source == source]
            t = np.array([r.time_s for r in data])
            own = np.abs(_predict(data, target, model_params(target, GENERATION), meas) / t - 1)
            lent = np.abs(_predict(data, target, model_params(donor, GENERATION), meas) / t - 1)
            (om, op), (lm, lp) = _stats(own), _stats(lent)
            out.append((target, donor, source, len(data), f"{100 * om:.1f}", f"{100 * op:.1f}",
                        f"{100 * lm:.1f}", f"{100 * lp:.1f}"))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calibration-dir", default=None)
    ap.add_argument("--format", default="simple")
    ap.add_argument("--quick", action="store_true", help="H100 only")
    args = ap.parse_args(argv)
    table, regimes = run(args.calibration_dir, ("h100-sxm",) if args.quick else None)
    print(tabulate(table, headers=("GPU", "group", "rows", "in med %", "in p90 %",
                                   "held med %", "held p90 %", "floor med %", "floor p90 %"),
                   tablefmt=args.format, disable_numparse=True))
    print()
    print(tabulate(regimes, headers=("GPU", "M (tokens)", "rows", "in med %", "in p90 %",
                                     "held med %", "held p90 %"),
                   tablefmt=args.format, disable_numparse=True))
    print()
    print(tabulate(transfer(args.calibration_dir, ("h100-sxm",) if args.quick else None),
                   headers=("GPU", "constants from", "source", "rows", "own med %",
                            "own p90 %", "borrowed med %", "borrowed p90 %"),
                   tablefmt=args.format, disable_numparse=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
