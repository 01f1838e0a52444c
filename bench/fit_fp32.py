#!/usr/bin/env python
"""Fit the fp32 (SIMT sgemm, no TF32) constants per GPU, validate them held out, and compare
the model's kernel choice with the kernel cuBLAS ran.

    python bench/fit_fp32.py [--data PATH] [--out fxshape/data/perf_params.json]
                             [--validate-only] [--format github]

Data: ``neusight/fp32_train.csv`` in the calibration folder (``$FXSHAPE_CALIBRATION_DIR`` or
``../shared/calibration``), 119,847 ``F.linear``/``bmm`` calls on A100-PCIe-40GB, V100-PCIe,
T4, P100 and P4 with the cuBLAS kernel each ran.

Method:
- Rows are split in two by a hash of the shape (deterministic): the *fit* half and the
  *held-out* half. Constants are fitted on at most ``--fit-rows`` rows of each GPU's fit half
  (linear and bmm weighted equally), by robust least squares on log(predicted / measured),
  from two fixed starting points; the lower mean absolute log error wins.
- Timing: the source records CUDA events around each Python call on an idle GPU, so every
  time includes the host's dispatch latency (30-50 us: the smallest GEMMs all take that).
  That is a property of the measuring host, not of the kernel: it is fitted per GPU as an
  additive ``overhead_s`` nuisance term (``fp32.measurement`` in the parameter file), added
  to predictions only when comparing with this data. The kernel launch latency is fixed at
  3 us, because the data cannot separate it from that overhead.
- Validation, printed as tables (docs/model.md quotes them):
  in-sample (the fit half), held-out shapes (the other half), and leave-one-GPU-out: each GPU
  predicted with the constants of every *other* GPU of the data (its own specs and kernel
  menu, the other GPU's fitted constants), the way GPUs absent from the data are predicted.
  The kernel-choice table reports how often the model's tile is the tile in the kernel name,
  and the time error when it is and when it is not.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import math
import os
import sys
from collections import defaultdict

import numpy as np
from scipy.optimize import least_squares

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tabulate import tabulate  # noqa: E402

from fxshape.fit.calibration import calibration_dir  # noqa: E402
from fxshape.fit.fitting import _round, _to_unbounded  # noqa: E402
from fxshape.hardware.gpus import get_gpu, list_gpus  # noqa: E402
from fxshape.cost.gemm import (_DEFAULT_PARAMS_PATH, _SIMT_K_TILE, _SIMT_SPLIT_K,  # noqa: E402
                          ModelParams, _core, _numpy_xp, predict_times_array)
from fxshape.cost.simt import parse_kernel_name, simt_menu  # noqa: E402

FREE = ("l2_bytes_per_clk_per_sm", "dram_eff", "wave_s", "smooth_q", "split_k_s", "power_eff",
        "sm_stream_bytes_per_clk", "throttle_s", "throttle_ratio")
FIXED = dict(launch_s=3e-6, ld_issue_clk=0.0,
             align_mem_eff=1.0, e_max=1.0, tile_overhead=0.0)
MIN_KERNEL_ROWS = 30  # a kernel's efficiency is fitted when the sample has this many calls
START = dict(e_max=0.9, tile_overhead=0.5, l2_bytes_per_clk_per_sm=32.0, dram_eff=0.8,
             wave_s=2e-6, smooth_q=4.0, split_k_s=3e-6, power_eff=0.9,
             sm_stream_bytes_per_clk=16.0, throttle_s=1e-2, throttle_ratio=0.95)
BOUNDS = dict(e_max=(0.3, 1.0), tile_overhead=(0.0, 4.0), l2_bytes_per_clk_per_sm=(4.0, 512.0),
              dram_eff=(0.3, 1.0), wave_s=(1e-8, 5e-5), smooth_q=(1.0, 12.0),
              split_k_s=(1e-8, 1e-4), power_eff=(0.2, 1.0),
              sm_stream_bytes_per_clk=(1.0, 512.0), throttle_s=(1e-5, 1.0),
              throttle_ratio=(0.2, 1.0))
STARTS = (dict(), dict(power_eff=0.7, smooth_q=2.0, l2_bytes_per_clk_per_sm=64.0,
                       eff=0.6))
LOGSCALE = ("l2_bytes_per_clk_per_sm", "wave_s", "split_k_s", "sm_stream_bytes_per_clk",
            "throttle_s")
#: fp32 constants for architectures without fp32 data: the nearest measured GPU's.
FAMILY_FROM = {"ampere": "a100-pcie-40gb", "ampere-ga10x": "a100-pcie-40gb",
               "ada": "a100-pcie-40gb", "hopper": "a100-pcie-40gb",
               "blackwell": "a100-pcie-40gb", "volta": "v100-pcie", "turing": "t4",
               "pascal": "p100-pcie"}
DATA_NAME = os.path.join("neusight", "fp32_train.csv")


def data_path(explicit=None):
    return explicit or os.path.join(calibration_dir(), DATA_NAME)


class Rows:
    """One GPU's rows as numpy arrays."""

    def __init__(self, recs, spec):
        self.spec = spec
        self.b = np.array([int(r["batch"]) for r in recs], dtype=np.int64)
        self.m = np.array([int(r["m"]) for r in recs], dtype=np.int64)
        self.n = np.array([int(r["n"]) for r in recs], dtype=np.int64)
        self.k = np.array([int(r["k"]) for r in recs], dtype=np.int64)
        self.layout = np.array([r["layout"] for r in recs])
        self.op = np.array([r["op"] for r in recs])
        self.t = np.array([float(r["time_s"]) for r in recs])
        tiles = [parse_kernel_name(r["kernel"]) for r in recs]
        self.tile = np.array([(tm, tn) for tm, tn, _ in tiles], dtype=np.int64)
        menu = {(kk.tm, kk.tn, kk.slices): kk.name
                for kk in simt_menu(spec.arch, False) + simt_menu(spec.arch, True)}
        self.kname = np.array([menu.get(t, "?") for t in tiles])
        cnt = defaultdict(int)
        for o in self.op:
            cnt[o] += 1
        w = np.array([1.0 / cnt[o] for o in self.op])
        self.w = w / w.sum()

    def take(self, sel):
        out = object.__new__(Rows)
        out.spec = self.spec
        for f in ("b", "m", "n", "k", "layout", "op", "t", "tile", "w", "kname"):
            setattr(out, f, getattr(self, f)[sel])
        out.w = out.w / out.w.sum()
        return out

    def __len__(self):
        return len(self.t)

    def predict(self, params, *, tiles=False, reference=None):
        return predict_times_array(self.spec, "fp32", self.b, self.m, self.n, self.k,
                                   self.layout, params, return_tile=tiles,
                                   reference=reference)


def read(path):
    """Rows per fxshape GPU name, in file order."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"no fp32 data at {path!r}; pass --data or set "
                                "FXSHAPE_CALIBRATION_DIR to the folder holding neusight/")
    by = defaultdict(list)
    with open(path, newline="") as f:
        for rec in csv.DictReader(f):
            if rec["dtype"] != "float32":
                raise ValueError(f"{path}: expected float32 rows, got {rec['dtype']!r}")
            by[get_gpu(rec["gpu"]).name].append(rec)
    return {name: Rows(recs, get_gpu(name)) for name, recs in sorted(by.items())}


def held_out_mask(rows: Rows):
    """True for the held-out half: a hash of (op, b, m, n, k), the same on every run."""
    keys = [f"{o},{b},{m},{n},{k}" for o, b, m, n, k in
            zip(rows.op, rows.b, rows.m, rows.n, rows.k)]
    return np.array([hashlib.sha1(s.encode()).digest()[0] & 1 == 1 for s in keys])


def gpu_bounds(spec):
    """``BOUNDS`` for one GPU: its clock under sustained load may fall to the base clock (the
    clock its datasheet guarantees within the board power) but not below. Slower than that is
    thermal throttling of the measuring host's cooling, which another host need not repeat:
    the P4's training rows slow to 42% of boost on long runs (below its 76% base clock),
    where its short runs, and its long bmm runs, do not."""
    lo = spec.base_clock_mhz / spec.boost_clock_mhz if spec.base_clock_mhz else 0.0
    return {**BOUNDS, "throttle_ratio": (max(BOUNDS["throttle_ratio"][0], lo), 1.0)}


def _floor_sustained(vals, bounds):
    """The throttled rate is ``power_eff * throttle_ratio`` of peak: keep it at or above the
    base-clock floor of :func:`gpu_bounds` (``throttle_ratio`` rescaled into what is left
    above ``floor / power_eff``)."""
    floor = bounds["throttle_ratio"][0]  # the fitted ratio lies in [floor, 1]
    lo = min(1.0, floor / vals["power_eff"])  # >= floor: power_eff is at most 1
    frac = (vals["throttle_ratio"] - floor) / (1.0 - floor) if floor < 1.0 else 1.0
    vals["throttle_ratio"] = lo + (1.0 - lo) * frac
    return vals


def _to_u(name, v, bounds=BOUNDS):
    return _to_unbounded(name, v, bounds, LOGSCALE)


def _from_u(name, u, bounds=BOUNDS):
    # not fxshape.fit.fitting._from_unbounded: that one rounds differently in the last bits,
    # which moves this fit's optimizer path and the packaged constants in the 4th digit
    lo, hi = bounds[name]
    log = name in LOGSCALE
    if log:
        lo, hi = math.log(lo), math.log(hi)
    v = lo + (hi - lo) / (1 + math.exp(-max(min(u, 50), -50)))
    return math.exp(v) if log else v


EXTRA = ("tile_overhead", "throttle_s", "throttle_ratio")


def make_params(vals, kernel_eff=()) -> ModelParams:
    return ModelParams(**{f: vals[f] for f in ModelParams.FIELDS + EXTRA},
                       kernel_eff=tuple(kernel_eff))


def oracle_times(rows: Rows, p: ModelParams, effs: dict):
    """Predicted kernel times with each row's measured kernel (its tile and efficiency)."""
    xp = _numpy_xp()
    spec = rows.spec
    peak = spec.peak_tflops("fp32") * 1e12
    menu = {kk.name: kk for kk in simt_menu(spec.arch, False) + simt_menu(spec.arch, True)}
    out = np.empty(len(rows))
    for name in sorted(set(rows.kname.tolist())):
        kk = menu[name]
        for batched, lay in ((False, "nn"), (False, "nt"), (True, "nn"), (True, "nt")):
            sel = ((rows.kname == name) & ((rows.b > 1) if batched else (rows.b == 1))
                   & (rows.layout == lay))
            if not sel.any():
                continue
            res = _core(xp, rows.b[sel], rows.m[sel], rows.n[sel], rows.k[sel],
                        np.zeros(int(sel.sum()), dtype=np.int64), spec=spec, p=p,
                        peak_flops=peak, e=4, eo=4, kernels=((kk.tm, kk.tn, effs[name]),),
                        splits=(1,) if batched else _SIMT_SPLIT_K, k_tile=_SIMT_K_TILE,
                        layout=lay)
            out[sel] = res[0]
    return out


def sqrt_law_overhead(effs: dict, menu) -> float:
    """The ``tile_overhead`` whose sqrt law best matches the fitted kernel efficiencies (used
    for kernels the data has too few calls of)."""
    by = {kk.name: kk for kk in menu}
    pts = [(math.sqrt(by[n].outputs_per_thread), e) for n, e in effs.items()]
    if not pts:
        return 1.0
    # 1/eff - 1 = overhead / sqrt(o): least squares through the origin in 1/sqrt(o)
    num = sum((1 / e - 1) / r for r, e in pts)
    den = sum(1 / r ** 2 for r, _ in pts)
    return max(0.0, num / den)


def fit_gpu(rows: Rows, max_nfev=300):
    """Fitted ``(ModelParams, {op: overhead_s}, mean |log err|)`` for one GPU's rows.

    Every row is predicted with the kernel it ran (the data names it), so each kernel's FMA
    efficiency is fitted from its own calls; kernels with fewer than ``MIN_KERNEL_ROWS``
    calls take the sqrt law of ``fxshape.cost.simt.tile_fma_efficiency`` fitted to the others.
    The host overhead is fitted per op: an ``nn.Linear`` call (module, bias, addmm) costs the
    host more than a bare ``torch.bmm`` (the smallest linears take ~52 us on the A100 host,
    the smallest bmms ~30 us).
    """
    sw = np.sqrt(rows.w)
    ops = sorted(set(rows.op.tolist()))
    op_idx = np.array([ops.index(o) for o in rows.op])
    counts = defaultdict(int)
    for nme in rows.kname:
        counts[nme] += 1
    kfree = sorted(nme for nme, c in counts.items() if c >= MIN_KERNEL_ROWS and nme != "?")
    keep = np.isin(rows.kname, kfree)
    sub = rows.take(keep)
    sw, op_idx = np.sqrt(sub.w), op_idx[keep]
    nf, nk = len(FREE), len(kfree)
    bounds = gpu_bounds(rows.spec)

    def unpack(x):
        vals = dict(FIXED)
        vals.update({nme: _from_u(nme, x[i], bounds) for i, nme in enumerate(FREE)})
        vals = _floor_sustained(vals, bounds)
        effs = {nme: 0.05 + 0.95 / (1 + math.exp(-x[nf + i])) for i, nme in enumerate(kfree)}
        over = {o: math.exp(x[nf + nk + i]) for i, o in enumerate(ops)}
        return make_params(vals), effs, over

    def model(x):
        p, effs, _ = unpack(x)
        return oracle_times(sub, p, effs) + np.exp(x[nf + nk:])[op_idx]

    best = None
    for start in STARTS:
        init = {**START, **start}
        e0 = init.get("eff", 0.85)
        x0 = np.array([_to_u(nme, init[nme], bounds) for nme in FREE]
                      + [math.log((e0 - 0.05) / (1 - e0))] * nk + [math.log(3e-5)] * len(ops))
        res = least_squares(lambda x: sw * np.log(model(x) / sub.t), x0, loss="soft_l1",
                            f_scale=0.05, diff_step=1e-3, max_nfev=max_nfev)
        score = float(np.sum(sub.w * np.abs(np.log(model(res.x) / sub.t))))
        if best is None or score < best[0]:
            best = (score, res.x)
    p, effs, over = unpack(best[1])
    menu = simt_menu(rows.spec.arch, False) + simt_menu(rows.spec.arch, True)
    vals = {f: getattr(p, f) for f in ModelParams.FIELDS + EXTRA}
    vals["tile_overhead"] = sqrt_law_overhead(effs, menu)
    return make_params(vals, sorted(effs.items())), over, best[0]


def fit(data, fit_rows=3000):
    """Fit every GPU on a deterministic subsample of its fit half."""
    out, meas = {}, {}
    for name, rows in data.items():
        fit_half = rows.take(~held_out_mask(rows))
        idx = np.linspace(0, len(fit_half) - 1, min(fit_rows, len(fit_half))).astype(int)
        p, over, loss = fit_gpu(fit_half.take(idx))
        entry = {f: _round(getattr(p, f)) for f in ModelParams.FIELDS}
        for f in EXTRA:
            entry[f] = _round(getattr(p, f))
        entry["kernel_eff"] = {k: _round(v) for k, v in p.kernel_eff}
        entry["fitted"] = sorted(FREE)
        entry["rows"] = int(len(idx))
        out[name] = entry
        meas[name] = {"timing": "mean-fastest-5-of-25-cuda-events",
                      "overhead_s": {o: _round(v) for o, v in over.items()}}
        print(f"{name:16s} rows={len(idx)} mean|log err|={loss:.4f} " +
              " ".join(f"{f}={entry[f]:.4g}" for f in FREE), file=sys.stderr)
    archs = sorted({get_gpu(g).arch for g in list_gpus() if get_gpu(g).vendor == "nvidia"})
    families = {a: {"from": FAMILY_FROM[a]} for a in archs}
    return {"gpus": out, "families": families, "measurement": meas,
            "comment": "Written by bench/fit_fp32.py from neusight/fp32_train.csv; "
                       "do not edit."}


def params_of(section, name) -> ModelParams:
    e = section["gpus"][name]
    return make_params({f: float(e[f]) for f in ModelParams.FIELDS + EXTRA},
                       sorted(e.get("kernel_eff", {}).items()))


def stats(pred, t):
    err = np.abs(pred / t - 1)
    return (float(np.median(err)), float(np.percentile(err, 90)))


def validate(data, section):
    """Tables: in-sample / held-out / leave-one-GPU-out errors, and kernel-choice agreement."""
    acc, choice, logo = [], [], []
    names = list(data)
    for name, rows in data.items():
        p = params_of(section, name)
        ov = section["measurement"][name]["overhead_s"]
        over = np.array([ov[o] for o in rows.op])
        kern, tile = rows.predict(p, tiles=True)
        pred = kern + over
        ho = held_out_mask(rows)
        row = [name, len(rows)]
        for sel in (~ho, ho):
            row += [100 * x for x in stats(pred[sel], rows.t[sel])]
        # kernel only (no host overhead), on rows where the overhead is < 10% of the time
        big = ho & (rows.t > 10 * over)
        row += [100 * x for x in stats(kern[big], rows.t[big] - over[big])]
        acc.append(row)
        agree = np.all(tile == rows.tile, axis=1)
        err = np.abs(pred / rows.t - 1)
        choice.append([name, 100 * agree.mean(), 100 * np.median(err[agree]),
                       100 * np.median(err[~agree]) if (~agree).any() else float("nan"),
                       100 * agree[rows.b == 1].mean(), 100 * agree[rows.b > 1].mean()])
        lrow = [name]
        for other in names:
            if other == name:
                lrow.append("-")
                continue
            po = params_of(section, other)
            # as a GPU absent from the data is predicted: the other GPU's constants, this
            # GPU's specs, and the clock its board power sustains relative to the other's
            pr = rows.predict(po, reference=get_gpu(other))[ho] + over[ho]
            med, p90 = stats(pr, rows.t[ho])
            lrow.append(f"{100 * med:.1f} / {100 * p90:.1f}")
        logo.append(lrow)
    return acc, choice, logo, names


def print_tables(data, section, fmt="simple"):
    acc, choice, logo, names = validate(data, section)
    print("Time error, |predicted / measured - 1| (%), predictions plus the fitted host "
          "overhead:")
    print(tabulate([[r[0], r[1]] + [f"{x:.1f}" for x in r[2:]] for r in acc],
                   headers=("GPU", "rows", "fit med", "fit p90", "held-out med",
                            "held-out p90", "kernel-only med", "kernel-only p90"),
                   tablefmt=fmt, disable_numparse=True))
    print("\n(kernel-only: held-out rows slower than 10x the overhead, overhead subtracted "
          "from the measurement)\n")
    print("Leave-one-GPU-out, held-out half: each row's GPU predicted with each column's "
          "constants (median / p90 %):")
    print(tabulate(logo, headers=["GPU \\ constants of"] + names, tablefmt=fmt,
                   disable_numparse=True))
    print("\nKernel choice: model's tile vs the tile in the cuBLAS kernel name:")
    print(tabulate([[r[0]] + [f"{x:.1f}" for x in r[1:]] for r in choice],
                   headers=("GPU", "tile agrees %", "err med % (agree)",
                            "err med % (differs)", "agree % single", "agree % batched"),
                   tablefmt=fmt, disable_numparse=True))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=None, help="fp32 CSV (default: calibration folder's "
                                                  + DATA_NAME + ")")
    ap.add_argument("--out", default=_DEFAULT_PARAMS_PATH,
                    help="parameter file whose fp32 section is (re)written; other sections "
                         "are kept")
    ap.add_argument("--validate-only", action="store_true",
                    help="print the tables for the fp32 section already in --out")
    ap.add_argument("--fit-rows", type=int, default=3000)
    ap.add_argument("--format", default="simple")
    args = ap.parse_args(argv)
    try:
        data = read(data_path(args.data))
    except FileNotFoundError as exc:
        print(f"fit_fp32: {exc}", file=sys.stderr)
        return 2
    with open(args.out) as f:
        full = json.load(f)
    if not args.validate_only:
        full["fp32"] = fit(data, args.fit_rows)
        with open(args.out, "w") as f:
            json.dump(full, f, indent=1, sort_keys=True)
            f.write("\n")
        print(f"wrote the fp32 section of {args.out}", file=sys.stderr)
    if "fp32" not in full:
        print(f"fit_fp32: {args.out} has no fp32 section", file=sys.stderr)
        return 2
    print_tables(data, full["fp32"], args.format)
    return 0


if __name__ == "__main__":
    sys.exit(main())
