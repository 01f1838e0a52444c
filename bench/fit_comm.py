#!/usr/bin/env python
"""Fit the NCCL collective model (fxshape/cost/comm.py) and validate it.

    python bench/fit_comm.py [--data PATH] [--out fxshape/data/comm_params.json]
                             [--validate-only] [--format github]

Data: ``comm/vidur_collectives.csv`` in the calibration folder (24,376 measured NCCL
all_reduce and send_recv calls of fp16 buffers, 4 KiB to 1 GiB, on DGX A100 (up to 2 nodes)
and DGX H100 machines and on GPUs linked in NVLink pairs; median of CUDA-timed runs).

Method:
- Each row's topology (``fxshape.hardware.topology``): ``h100_dgx`` -> dgx-h100,
  ``a100_dgx`` -> dgx-a100, ``*_pairwise_nvlink`` -> pairwise-a100 / pairwise-h100. Its link
  class follows from the GPUs and GPUs per node: nvswitch, nvlink_pair, pcie or network.
- Rows are split in halves by a hash of (topology, collective, GPUs, per node, bytes): the
  fit half and the held-out half.
- Per link class, ``efficiency``, ``alpha_s`` and ``alpha_rank_s`` minimise the squared log
  error of ``alpha + alpha_rank (n - 1) + bus_bytes / (efficiency * nominal)`` over the fit
  half: once shared by every machine, once per measured machine.
- Validation: median |error| per topology, collective, GPUs and size decade, held out; and
  leave one GPU out: the classes the A100 and H100 machines share (nvswitch, nvlink_pair)
  fitted on one GPU's rows, predicting the other's.
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

from fxshape.cost.comm import bus_bytes, param_key  # noqa: E402
from fxshape.fit.calibration import calibration_dir  # noqa: E402
from fxshape.hardware.topology import LINKS, get_topology  # noqa: E402

DATA_NAME = os.path.join("comm", "vidur_collectives.csv")
OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fxshape",
                   "data", "comm_params.json")
TOPOLOGY = {"h100_dgx": "dgx-h100", "a100_dgx": "dgx-a100",
            "a100_pairwise_nvlink": "pairwise-a100", "h100_pairwise_nvlink": "pairwise-h100"}


def load(path):
    rows = []
    with open(path) as f:
        for r in csv.DictReader(f):
            topo = get_topology(TOPOLOGY[r["topology"]])
            n, d = int(r["num_workers"]), int(r["devices_per_node"])
            b = int(r["bytes"])
            key = f"{r['topology']}|{r['collective']}|{n}|{d}|{b}"
            rows.append(dict(topology=r["topology"], gpu=r["gpu"], collective=r["collective"],
                             n=n, d=d, bytes=b, time=float(r["time_s"]),
                             link=topo.link_for(n, d),
                             cls=param_key(topo.link_class(n, d), r["collective"]),
                             half=int(hashlib.sha256(key.encode()).hexdigest(), 16) % 2))
    return rows


def predict(p, rows):
    eff, a0, a1 = p
    return np.array([a0 + a1 * (r["n"] - 1) + bus_bytes(r["collective"], r["bytes"], r["n"])
                     / (eff * LINKS[r["link"]] * 1e9) for r in rows])


def fit(rows):
    t = np.array([r["time"] for r in rows])

    def res(x):
        eff, a0, a1 = math.exp(x[0]), math.exp(x[1]), math.exp(x[2])
        return np.log(predict((eff, a0, a1), rows) / t)

    best = None
    for start in ((0.7, 1e-5, 1e-6), (0.3, 3e-5, 1e-7), (1.2, 5e-6, 5e-6)):
        sol = least_squares(res, np.log(start), loss="soft_l1", f_scale=0.05)
        if best is None or sol.cost < best.cost:
            best = sol
    eff, a0, a1 = (float(math.exp(v)) for v in best.x)
    return dict(efficiency=round(eff, 5), alpha_s=round(a0, 9), alpha_rank_s=round(a1, 10))


def errors(params, rows, machines=None):
    """|predicted / measured - 1| by row: with each machine's own constants when given, else
    the shared per-class ones."""
    out = {}
    for r in rows:
        own = (machines or {}).get(TOPOLOGY[r["topology"]], {}).get(r["cls"])
        p = own or params[r["cls"]]
        t = predict((p["efficiency"], p["alpha_s"], p["alpha_rank_s"]), [r])[0]
        out[id(r)] = abs(t / r["time"] - 1)
    return out


def _by(rows, key):
    out = defaultdict(list)
    for r in rows:
        out[r[key]].append(r)
    return out


def decade(b):
    return ("4K-64K" if b < 65536 else "64K-1M" if b < 1 << 20 else "1M-16M" if b < 1 << 24
            else "16M-1G")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=None)
    ap.add_argument("--out", default=OUT)
    ap.add_argument("--validate-only", action="store_true")
    ap.add_argument("--format", default="simple")
    args = ap.parse_args(argv)
    rows = load(args.data or os.path.join(calibration_dir(), DATA_NAME))
    train = [r for r in rows if r["half"] == 0]
    held = [r for r in rows if r["half"] == 1]
    params = {cls: fit(rs) for cls, rs in sorted(_by(train, "cls").items())}
    machines = {}
    for topo, rs in sorted(_by(train, "topology").items()):
        machines[TOPOLOGY[topo]] = {cls: fit(r2) for cls, r2 in sorted(_by(rs, "cls").items())}
    print("Fitted per link class (fit half):")
    print(tabulate([(c, len(_by(train, "cls")[c]), p["efficiency"], f"{p['alpha_s'] * 1e6:.1f}",
                     f"{p['alpha_rank_s'] * 1e6:.2f}") for c, p in params.items()],
                   headers=("class", "rows", "efficiency", "alpha us", "alpha/rank us"),
                   tablefmt=args.format, disable_numparse=True))
    err = errors(params, held, machines)
    shared = errors(params, held)
    body = []
    groups = defaultdict(list)
    sgroups = defaultdict(list)
    for r in held:
        k = (r["topology"], r["collective"], r["n"], r["d"], decade(r["bytes"]))
        groups[k].append(err[id(r)])
        sgroups[k].append(shared[id(r)])
    for k in sorted(groups, key=lambda k: (k[0], k[1], k[2], k[3], ["4K-64K", "64K-1M",
                                                                      "1M-16M", "16M-1G"]
                                           .index(k[4]))):
        e, e2 = sorted(groups[k]), sorted(sgroups[k])
        body.append(k + (len(e), f"{100 * e[len(e) // 2]:.1f}", f"{100 * e2[len(e2) // 2]:.1f}"))
    print("\nHeld out: median |predicted / measured - 1| (%) per topology, collective, GPUs, "
          "per node and buffer size, with the machine's own constants and with the shared ones")
    print(tabulate(body, headers=("topology", "collective", "GPUs", "per node", "bytes",
                                  "rows", "own %", "shared %"), tablefmt=args.format,
                   disable_numparse=True))
    for col, name in ((-2, "own"), (-1, "shared")):
        meds = [float(b[col]) for b in body]
        big = [float(b[col]) for b in body if b[4] == "16M-1G"]
        print(f"\n{name} constants: {sum(m <= 10 for m in meds)} of {len(meds)} groups within "
              f"10%; buffers of 16 MiB and more: {sum(m <= 10 for m in big)} of {len(big)}")
    lo = []
    for cls in ("nvswitch/ring", "nvswitch/p2p", "nvlink_pair/ring", "nvlink_pair/p2p",
                "network/p2p"):
        for gpu in ("a100", "h100"):
            fit_rows = [r for r in train if r["cls"] == cls and r["gpu"] != gpu]
            test = [r for r in held if r["cls"] == cls and r["gpu"] == gpu]
            if not fit_rows or not test:
                continue
            p = fit(fit_rows)
            pred = predict((p["efficiency"], p["alpha_s"], p["alpha_rank_s"]), test)
            e = sorted(abs(t / r["time"] - 1) for r, t in zip(test, pred))
            big = [abs(t / r["time"] - 1) for r, t in zip(test, pred) if r["bytes"] >= 1 << 24]
            big.sort()
            lo.append((cls, gpu, len(test), f"{100 * e[len(e) // 2]:.1f}",
                       f"{100 * big[len(big) // 2]:.1f}" if big else "-"))
    print("\nLeave one GPU out (each GPU's held-out rows predicted with the other GPU's fit)")
    print(tabulate(lo, headers=("class", "GPU predicted", "rows", "median %", "median % >= 16M"),
                   tablefmt=args.format, disable_numparse=True))
    if not args.validate_only:
        with open(args.out, "w") as f:
            json.dump({"comment": "Written by bench/fit_comm.py from comm/vidur_collectives.csv"
                                  "; do not edit.", "classes": params,
                       "topologies": machines}, f, indent=1,
                      sort_keys=True)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
