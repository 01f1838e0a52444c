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

from fxshape.cost.comm import bus_bytes, collective_time, param_key  # noqa: E402
from fxshape.fit.calibration import calibration_dir  # noqa: E402
from fxshape.hardware.topology import get_topology  # noqa: E402

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
            rows.append(dict(topology=r["topology"], topo=topo, gpu=r["gpu"],
                             collective=r["collective"],
                             n=n, d=d, bytes=b, time=float(r["time_s"]),
                             cls=param_key(topo.link_class(n, d), r["collective"]),
                             half=int(hashlib.sha256(key.encode()).hexdigest(), 16) % 2))
    return rows


def predict(p, rows, fixed=None):
    """Each row's time through the shipped model (``collective_time``): the row's own class
    takes ``p`` (efficiency, alpha, alpha per rank), the classes a cross-node row composes
    with (its node's NVLink phase) take ``fixed``."""
    eff, a0, a1 = p
    out = []
    for r in rows:
        def constants(key, r=r):
            if key == r["cls"]:
                return dict(efficiency=eff, alpha_s=a0, alpha_rank_s=a1)
            return fixed[key]
        out.append(collective_time(constants, r["collective"], r["bytes"], r["n"], r["d"],
                                   r["topo"])[0])
    return np.array(out)


def fit(rows, fixed=None):
    """(efficiency, alpha, alpha per rank) minimising the squared log error over ``rows``
    (``fixed``: the constants of the classes their cross-node rows compose with)."""
    t = np.array([r["time"] for r in rows])

    def res(x):
        eff, a0, a1 = math.exp(x[0]), math.exp(x[1]), math.exp(x[2])
        return np.log(predict((eff, a0, a1), rows, fixed) / t)

    best = None
    for start in ((0.7, 1e-5, 1e-6), (0.3, 3e-5, 1e-7), (1.2, 5e-6, 5e-6)):
        sol = least_squares(res, np.log(start), loss="soft_l1", f_scale=0.05)
        if best is None or sol.cost < best.cost:
            best = sol
    eff, a0, a1 = (float(math.exp(v)) for v in best.x)
    return dict(efficiency=round(eff, 5), alpha_s=round(a0, 9), alpha_rank_s=round(a1, 10))


def fit_classes(rows, shared=None):
    """Constants per class: the classes inside a node first, then the network's, whose
    cross-node rows compose with the node's NVLink phase just fitted (``shared``: the
    classes a machine without rows of its own in a class falls back to)."""
    by = _by(rows, "cls")
    out = {c: fit(rs) for c, rs in sorted(by.items()) if not c.startswith("network/")}
    fixed = {**(shared or {}), **out}
    if "network/p2p" in by:
        out["network/p2p"] = fit(by["network/p2p"], fixed)
    if "network/ring" in by:
        # a machine's own ring constants are fitted on its rows; the shared ones are the
        # adapter's, as one GPU's point-to-point copy reaches it (the hardware): the one
        # measured cross-node machine reaches a fifth of its rails' bandwidth in all-reduce
        # (see the module docstring), which no rail-optimized cluster should inherit
        p2p = out.get("network/p2p") if shared is None else None
        out["network/ring"] = dict(p2p) if p2p else fit(by["network/ring"], fixed)
    return out


def errors(params, rows, machines=None):
    """|predicted / measured - 1| by row: with each machine's own constants when given, else
    the shared per-class ones."""
    out = {}
    for r in rows:
        own = (machines or {}).get(TOPOLOGY[r["topology"]], {}).get(r["cls"])
        p = own or params[r["cls"]]
        fixed = {**params, **(machines or {}).get(TOPOLOGY[r["topology"]], {})}
        t = predict((p["efficiency"], p["alpha_s"], p["alpha_rank_s"]), [r], fixed)[0]
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


def keep_today(doc: dict, path: str) -> None:
    """Carry over into ``doc`` what ``bench/fit_comm_aiconfigurator.py`` wrote to ``path``:
    the per-collective entries (``CLASS/KIND:COLLECTIVE``) of today's NCCL and their note."""
    if not os.path.exists(path):
        return
    with open(path) as f:
        old = json.load(f)
    for machine, entries in old.get("topologies", {}).items():
        today = {k: v for k, v in entries.items() if ":" in k}
        if today:
            doc["topologies"].setdefault(machine, {}).update(today)
    if "nccl_2_29" in old:
        doc["nccl_2_29"] = old["nccl_2_29"]


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
    params = fit_classes(train)
    machines = {TOPOLOGY[topo]: fit_classes(rs, params)
                for topo, rs in sorted(_by(train, "topology").items())}
    # what ships: a machine's own constants inside its nodes; its cross-node ones are its
    # cluster's network (printed, validated below), not every cluster of those nodes'
    shipped = {m: {c: p for c, p in cs.items() if not c.startswith("network/")}
               for m, cs in machines.items()}
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
            p = fit(fit_rows, params)
            pred = predict((p["efficiency"], p["alpha_s"], p["alpha_rank_s"]), test, params)
            e = sorted(abs(t / r["time"] - 1) for r, t in zip(test, pred))
            big = [abs(t / r["time"] - 1) for r, t in zip(test, pred) if r["bytes"] >= 1 << 24]
            big.sort()
            lo.append((cls, gpu, len(test), f"{100 * e[len(e) // 2]:.1f}",
                       f"{100 * big[len(big) // 2]:.1f}" if big else "-"))
    print("\nLeave one GPU out (each GPU's held-out rows predicted with the other GPU's fit)")
    print(tabulate(lo, headers=("class", "GPU predicted", "rows", "median %", "median % >= 16M"),
                   tablefmt=args.format, disable_numparse=True))
    print("\nPublished cross-node bus bandwidths (bench/comm_published.csv; held out, never "
          "fitted), predicted with the shared constants")
    pub = []
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)),
                           "comm_published.csv")) as f:
        for r in csv.DictReader(f):
            n, d, b = int(r["gpus"]), int(r["per_node"]), int(r["bytes"])
            topo = get_topology(r["topology"])
            t = collective_time(lambda k: params[k], r["collective"], b, n, d, topo)[0]
            bw = bus_bytes(r["collective"], b, n) / t / 1e9
            lo, hi = float(r["busbw_gbs_low"]), float(r["busbw_gbs_high"])
            err = 0.0 if lo <= bw <= hi else (bw / (lo if bw < lo else hi) - 1)
            pub.append((r["topology"], n, d, r["collective"], f"{b / 2**30:.0f} GiB",
                        f"{lo:.0f}-{hi:.0f}", f"{bw:.0f}", f"{100 * err:+.1f}", r["source"]))
    print(tabulate(pub, headers=("topology", "GPUs", "per node", "collective", "bytes",
                                 "published GB/s", "predicted GB/s", "outside range %",
                                 "source"), tablefmt=args.format, disable_numparse=True))
    if not args.validate_only:
        doc = {"comment": "Written by bench/fit_comm.py from comm/vidur_collectives.csv; do not "
                          "edit.", "classes": params, "topologies": shipped}
        keep_today(doc, args.out)
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1, sort_keys=True)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
