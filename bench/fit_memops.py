#!/usr/bin/env python
"""Fit the memory-bound kernel model (fxshape/cost/memops.py) and validate it.

    python bench/fit_memops.py [--data PATH] [--out fxshape/data/memops_params.json]
                               [--validate-only] [--format github]

Data: ``neusight/memops_train.csv`` in the calibration folder (11,255 calls of add, mul, div,
pow, their scalar forms, relu, gelu, tanh, LayerNorm and softmax on fp32 (B, H) tensors, on
A100-PCIe-40GB, V100-PCIe, T4, P100 and P4, with the kernel each call ran).

Method:
- Rows are split in two by a hash of (op, B, H), deterministically: the fit half and the
  held-out half.
- Per GPU, the bandwidth efficiency of each kernel family (elementwise, layer_norm,
  softmax_warp, softmax_block) is fitted by robust least squares on log(predicted /
  measured) over the fit half, with one additive host overhead per op kind (the source times
  each Python call with CUDA events, so the dispatch of ``torch.add`` or of an
  ``nn.LayerNorm`` module is in every row; it is the measuring host's, not the kernel's, and
  is kept in ``measurement``, added only when comparing with this data). The kernel launch
  latency cannot be told apart from that overhead and is fixed at 3 us.
- The family of each row is the one fxshape's dispatch rule gives (``memop_family``); the
  script reports how often it is the kernel the row's name says ran.
- Validation: in sample, held out (the other half), and leave-one-GPU-out (each GPU predicted
  with another GPU's efficiencies at its own bandwidth, the way a GPU absent from the data is).
- GPUs in ``SOURCED`` (no data: the MI250X's GCD) take a published streaming bandwidth as
  their elementwise efficiency, and the base GPU's other efficiencies.
Deterministic; a few seconds.
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

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
from scipy.optimize import least_squares  # noqa: E402
from tabulate import tabulate  # noqa: E402

from fxshape.cost.memops import FAMILIES, memop_bytes, memop_family  # noqa: E402
from fxshape.fit.calibration import calibration_dir  # noqa: E402
from fxshape.hardware.gpus import get_gpu, list_gpus  # noqa: E402

DATA_NAME = os.path.join("neusight", "memops_train.csv")
OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fxshape",
                   "data", "memops_params.json")
LAUNCH_S = 3e-6
#: op in the data -> (kind, full-size inputs)
OPS = {"add": ("elementwise", 2), "mul": ("elementwise", 2), "div": ("elementwise", 2),
       "pow": ("elementwise", 2), "addu": ("elementwise", 1), "mulu": ("elementwise", 1),
       "divu": ("elementwise", 1), "powu": ("elementwise", 1), "relu": ("elementwise", 1),
       "gelu": ("elementwise", 1), "tanh": ("elementwise", 1), "ln": ("layer_norm", 1),
       "softmax": ("softmax", 1)}
KINDS = ("elementwise", "layer_norm", "softmax")
#: Architectures without data take these GPUs' efficiencies (AMD: unvalidated).
FAMILY_FROM = {"ampere": "a100-pcie-40gb", "ampere-ga10x": "a100-pcie-40gb",
               "ada": "a100-pcie-40gb", "hopper": "a100-pcie-40gb",
               "blackwell": "a100-pcie-40gb", "volta": "v100-pcie", "turing": "t4",
               "pascal": "p100-pcie", "cdna1": "mi250x-gcd", "cdna2": "mi250x-gcd",
               "cdna3": "a100-pcie-40gb"}
#: GPUs without data whose streaming (elementwise) efficiency is sourced, not fitted: the
#: other families' efficiencies are the base GPU's. MI250X, one GCD: "peak memory is
#: theoretical 1.6 TB/s but achievable 1.3 TB/s per GCD" (AMD's presenter, answering a
#: hip-stream Copy of 1,280 GiB/s on one GCD: LUMI 4-day course, 2023-05-30, "Introduction
#: to the AMD ROCm Ecosystem", Q&A 2; github.com/Lumi-supercomputer/LUMI-training-materials,
#: docs/4day-20230530/extra_2_06_Introduction_to_AMD_ROCm_Ecosystem.md): 1.3 TB/s over the
#: GPU table's datasheet bandwidth of one GCD (GB/s per GCD below).
SOURCED = {"mi250x-gcd": {"base": "a100-pcie-40gb", "achieved_gbs": 1300,
                          "source": "LUMI training 2023-05-30, ROCm ecosystem Q&A 2: "
                                    "achievable 1.3 TB/s per GCD (hip-stream)"}}
#: Kernel-name fragments of each family, to check the dispatch rule against what ran.
KERNEL_OF = {"elementwise": "elementwise_kernel", "layer_norm": "layer_norm_kernel",
             "softmax_warp": "softmax_warp_forward", "softmax_block": "cunn_SoftMaxForward"}


class Rows:
    """One GPU's rows as arrays."""

    def __init__(self, recs, spec):
        self.spec = spec
        self.op = np.array([r["op"] for r in recs])
        self.kind = np.array([OPS[r["op"]][0] for r in recs])
        self.b = np.array([int(r["b"]) for r in recs], dtype=np.int64)
        self.h = np.array([int(r["h"]) for r in recs], dtype=np.int64)
        self.t = np.array([float(r["time_s"]) for r in recs])
        self.family = np.array([memop_family(OPS[r["op"]][0], int(r["h"]), "fp32")
                                for r in recs])
        self.ran = np.array([next((f for f, frag in KERNEL_OF.items() if frag in r["kernel"]),
                                  "?") for r in recs])
        self.bytes = np.array([memop_bytes(OPS[r["op"]][0], int(r["b"]), int(r["h"]), "fp32",
                                           inputs=OPS[r["op"]][1]) for r in recs], dtype=float)
        keys = [f"{r['op']},{r['b']},{r['h']}" for r in recs]
        self.held = np.array([hashlib.sha1(k.encode()).digest()[0] & 1 == 1 for k in keys])

    def take(self, sel):
        out = object.__new__(Rows)
        out.spec = self.spec
        for f in ("op", "kind", "b", "h", "t", "family", "ran", "bytes", "held"):
            setattr(out, f, getattr(self, f)[sel])
        return out

    def predict(self, effs: dict, overhead: dict | None = None):
        bw = self.spec.memory_bandwidth_gbs * 1e9
        eff = np.array([effs[f] for f in self.family])
        t = LAUNCH_S + self.bytes / (eff * bw)
        if overhead:
            t = t + np.array([overhead[k] for k in self.kind])
        return t


def read(path):
    if not os.path.exists(path):
        raise SystemExit(f"no memory-op data at {path!r}; pass --data or set "
                         "FXSHAPE_CALIBRATION_DIR to the folder holding neusight/")
    by = defaultdict(list)
    with open(path, newline="") as f:
        for rec in csv.DictReader(f):
            if rec["dtype"] != "float32" or rec["op"] not in OPS:
                raise SystemExit(f"{path}: unexpected row {rec['op']!r} {rec['dtype']!r}")
            by[get_gpu(rec["gpu"]).name].append(rec)
    return {name: Rows(recs, get_gpu(name)) for name, recs in sorted(by.items())}


def fit_gpu(rows: Rows):
    """``({family: efficiency}, {kind: overhead_s}, mean |log err|)`` on ``rows``."""
    fams = [f for f in FAMILIES if (rows.family == f).any()]
    kinds = [k for k in KINDS if (rows.kind == k).any()]

    def unpack(x):
        effs = {f: 1.0 / (1.0 + math.exp(-x[i])) for i, f in enumerate(fams)}
        over = {k: math.exp(x[len(fams) + i]) for i, k in enumerate(kinds)}
        return effs, over

    def res(x):
        effs, over = unpack(x)
        return np.log(rows.predict(effs, over) / rows.t)

    x0 = np.array([0.5] * len(fams) + [math.log(1e-5)] * len(kinds))
    sol = least_squares(res, x0, loss="soft_l1", f_scale=0.03, max_nfev=2000)
    effs, over = unpack(sol.x)
    return effs, over, float(np.mean(np.abs(res(sol.x))))


def _r(v):
    return float(f"{v:.5g}")


def fit(data):
    gpus, meas = {}, {}
    for name, rows in data.items():
        effs, over, loss = fit_gpu(rows.take(~rows.held))
        gpus[name] = {**{f: _r(v) for f, v in effs.items()}, "launch_s": LAUNCH_S,
                      "rows": int((~rows.held).sum())}
        meas[name] = {"timing": "mean-fastest-5-of-25-cuda-events",
                      "overhead_s": {k: _r(v) for k, v in over.items()}}
        print(f"{name:16s} mean|log err|={loss:.4f} " +
              " ".join(f"{f}={v:.3f}" for f, v in effs.items()) + " overhead " +
              " ".join(f"{k}={v * 1e6:.1f}us" for k, v in over.items()), file=sys.stderr)
    for name, src in SOURCED.items():
        eff = src["achieved_gbs"] / get_gpu(name).memory_bandwidth_gbs
        gpus[name] = {**gpus[src["base"]], "elementwise": _r(eff), "rows": 0,
                      "source": f"{src['source']}; other families: {src['base']}'s fit"}
    archs = sorted({get_gpu(g).arch for g in list_gpus()})
    return {"comment": "Written by bench/fit_memops.py from neusight/memops_train.csv; do "
                       "not edit.",
            "gpus": gpus, "families": {a: {"from": FAMILY_FROM[a]} for a in archs},
            "measurement": meas}


def _stats(err):
    return f"{100 * np.median(err):.1f}", f"{100 * np.percentile(err, 90):.1f}"


def validate(data, params, fmt):
    table = []
    for name, rows in data.items():
        entry = params["gpus"][name]
        over = params["measurement"][name]["overhead_s"]
        for fam in FAMILIES:
            sel = rows.family == fam
            if not sel.any():
                continue
            sub = rows.take(sel)
            err = np.abs(sub.predict(entry, over) / sub.t - 1)
            table.append([name, fam, int(sel.sum()), f"{entry[fam]:.3f}",
                          *_stats(err[~sub.held]), *_stats(err[sub.held])])
    print("Time error, |predicted / measured - 1| (%), predictions plus the fitted host "
          "overhead:")
    print(tabulate(table, ["GPU", "family", "rows", "efficiency", "fit med", "fit p90",
                           "held-out med", "held-out p90"], tablefmt=fmt,
                   disable_numparse=True))
    names = list(data)
    logo = []
    for name in names:
        rows = data[name]
        ho = rows.take(rows.held)
        over = params["measurement"][name]["overhead_s"]
        line = [name]
        for other in names:
            if other == name:
                line.append("-")
                continue
            err = np.abs(ho.predict(params["gpus"][other], over) / ho.t - 1)
            line.append("{} / {}".format(*_stats(err)))
        logo.append(line)
    print("\nLeave-one-GPU-out, held-out half: each row's GPU with each column's "
          "efficiencies at its own bandwidth (median / p90 %):")
    print(tabulate(logo, ["GPU \\ efficiencies of"] + names, tablefmt=fmt,
                   disable_numparse=True))
    agree = []
    for name, rows in data.items():
        for fam in FAMILIES:
            sel = rows.family == fam
            if sel.any():
                agree.append([name, fam, int(sel.sum()),
                              f"{100 * np.mean(rows.ran[sel] == fam):.1f}"])
    print("\nDispatch rule: the family fxshape predicts vs the kernel that ran (% agree):")
    print(tabulate(agree, ["GPU", "family", "rows", "agree %"], tablefmt=fmt,
                   disable_numparse=True))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--data", default=None)
    ap.add_argument("--out", default=OUT)
    ap.add_argument("--validate-only", action="store_true")
    ap.add_argument("--format", default="simple")
    args = ap.parse_args(argv)
    data = read(args.data or os.path.join(calibration_dir(), DATA_NAME))
    if args.validate_only:
        with open(args.out) as f:
            params = json.load(f)
    else:
        params = fit(data)
        with open(args.out, "w") as f:
            json.dump(params, f, indent=1, sort_keys=True)
            f.write("\n")
        print(f"wrote {args.out}", file=sys.stderr)
    validate(data, params, args.format)


if __name__ == "__main__":
    main()
