#!/usr/bin/env python
"""Fit the collective model to today's NCCL: aiconfigurator's nccl-tests tables.

    python bench/fit_comm_aiconfigurator.py [--calibration-dir DIR]
                                            [--out fxshape/data/comm_params.json]
                                            [--check] [--format github]

``../shared/calibration/aiconfigurator/{h100,b200}_sxm_nccl_perf.csv`` (ai-dynamo/
aiconfigurator, Apache-2.0, commit 095f58a51): nccl-tests' out-of-place times of NCCL 2.29.2
all-gather, reduce-scatter, all-reduce and all-to-all on 2 to 8 GPUs of one DGX H100 and one
DGX B200, 128 elements to 1 GiB, in fp16 and int8 (``message_size`` in elements: the
buffer nccl-tests calls ``size``, which is what ``fxshape.cost.comm.predict_collective``
takes). The packaged collective constants were fitted to Vidur's 2024 measurements of
all-reduce and send/recv (``bench/fit_comm.py``): on these tables they are 2-4x too slow for
small buffers (NCCL's small-message latency fell) and 30-40% too fast for large ones.

Method, per machine (``dgx-h100``, ``dgx-b200``) and ring collective: the rows are split in
halves by a hash of (machine, collective, GPUs, bytes); one half is fitted, the other held
out. The model is ``fxshape.cost.comm``'s with both of NCCL's protocol families: the faster
of the Simple protocol's ``alpha + bus bytes / (efficiency x link)`` and the low-latency
protocols' (LL, LL128) ``ll_alpha + bus bytes / (ll_efficiency x link)``, plus
``alpha_rank (n - 1)``; five constants per link class and collective (NCCL's all-gather,
reduce-scatter and all-reduce reach different bus bandwidths, which one set per class
cannot follow), fitted through ``collective_time`` by soft-L1 least squares on log errors
from fixed starts. One line alone (``bench/fit_comm.py``'s model) is 12.4% / 10.7% off
held out (median, H100 / B200) and 17-18% for buffers of 1 MiB and more: the small buffers
pull the line to the LL protocols' latency and bandwidth. It prints the held-out median and p90 |error| per machine,
collective, GPUs and size, and writes the constants into the machine's entry of
``comm_params.json`` under ``CLASS/KIND:COLLECTIVE`` (the Vidur fit's other entries stay:
send/recv and cross-node collectives). ``--check`` fits and compares with the file instead:
the same constants to 1e-3, or an equally good minimum (``same_fit``: the ring classes'
halves do not tell alpha, alpha_rank and efficiency apart, so two CPUs can end the fit at
two points of the same flat valley, with the same held-out errors). Deterministic on one
machine; a few seconds.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import sys
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

import numpy as np  # noqa: E402
from tabulate import tabulate  # noqa: E402

from scipy.optimize import least_squares  # noqa: E402

from fxshape.cost.comm import collective_time, param_key  # noqa: E402
from fxshape.hardware.topology import get_topology  # noqa: E402

from fit_aiconfigurator import shown_path, table_path, write_json  # noqa: E402
from fit_comm import OUT  # noqa: E402

#: the constants fitted per link class and collective, all positive (fitted as logs)
NAMES = ("alpha_s", "alpha_rank_s", "efficiency", "ll_alpha_s", "ll_efficiency")
#: starting points (the same order); the best soft-L1 cost wins
STARTS = ((20e-6, 1e-6, 0.6, 5e-6, 0.1), (40e-6, 1e-7, 0.8, 8e-6, 0.2),
          (10e-6, 5e-7, 0.5, 3e-6, 0.05))

SOURCE = "ai-dynamo/aiconfigurator@095f58a51"
#: (machine, table prefix in aiconfigurator/)
PLAN = (("dgx-h100", "h100_sxm"), ("dgx-b200", "b200_sxm"))
#: the tables' op names as fxshape's collectives
COLLECTIVE = {"all_reduce": "all_reduce", "all_gather": "all_gather",
              "reduce_scatter": "reduce_scatter", "alltoall": "all_to_all"}
#: bytes per element of the tables' dtypes
ITEMSIZE = {"half": 2, "int8": 1}
#: buffer sizes the issue's target is stated over: small (latency) and large (bandwidth)
SIZES = (("< 1 MiB", 0, (1 << 20) - 1), (">= 1 MiB", 1 << 20, 1 << 62))


def load(prefix: str, machine: str, directory=None) -> list[dict]:
    """The table's rows as ``fit_comm`` rows (one node: every GPU on the machine's
    NVSwitch), each with its half (0: fitted, 1: held out), its link class's key (``cls``)
    and the key its own constants are stored under (``key``: ``CLASS/KIND:COLLECTIVE``)."""
    path = table_path(f"{prefix}_nccl_perf", directory)
    topo = get_topology(machine)
    rows = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            coll, n = COLLECTIVE[r["op_name"]], int(r["num_gpus"])
            if r["nccl_dtype"] not in ITEMSIZE:
                raise ValueError(f"{path}: nccl_dtype {r['nccl_dtype']!r} has no item size "
                                 f"here (known: {', '.join(ITEMSIZE)})")
            b = int(r["message_size"]) * ITEMSIZE[r["nccl_dtype"]]
            cls = param_key(topo.link_class(n, n), coll)
            key = f"{machine}|{coll}|{n}|{b}"
            rows.append(dict(topology=machine, topo=topo, collective=coll, n=n, d=n, bytes=b,
                             time=float(r["time_s"]), cls=cls, key=f"{cls}:{coll}",
                             half=int(hashlib.sha256(key.encode()).hexdigest(), 16) % 2))
    return rows


def predict(p: dict, rows) -> np.ndarray:
    """Each row's time through the shipped model, its class taking the constants ``p``."""
    return np.array([collective_time(lambda key: p, r["collective"], r["bytes"], r["n"],
                                     r["d"], r["topo"])[0] for r in rows])


#: the soft-L1 loss's scale: log errors beyond ~5% count linearly, not squared
F_SCALE = 0.05


def fit(rows) -> dict:
    """The five constants (:data:`NAMES`) minimising the soft-L1 log error over ``rows``."""
    t = np.array([r["time"] for r in rows])

    def res(x):
        return np.log(predict(dict(zip(NAMES, np.exp(x))), rows) / t)

    best = None
    for start in STARTS:
        sol = least_squares(res, np.log(start), loss="soft_l1", f_scale=F_SCALE)
        if best is None or sol.cost < best.cost:
            best = sol
    return {k: float(f"{v:.5g}") for k, v in zip(NAMES, np.exp(best.x))}


def cost(p: dict, rows) -> float:
    """The soft-L1 cost ``least_squares`` minimises (its ``cost``) of constants ``p``."""
    z = (np.log(predict(p, rows) / np.array([r["time"] for r in rows])) / F_SCALE) ** 2
    return float(0.5 * F_SCALE ** 2 * np.sum(2 * (np.sqrt(1 + z) - 1)))


def same_fit(have: dict | None, new: dict, rows) -> bool:
    """Whether the file's constants ``have`` are the refit ``new``: equal to 1e-3 (another
    CPU's BLAS sums in another order and moves a 5th digit), or as good a minimum of the
    fit (cost equal to 1e-5): where the fitted half cannot tell the constants apart (the
    cost's valley is flat along alpha, alpha_rank and efficiency for the ring classes),
    the start the minimiser ends nearest to decides them, and a last-bit difference in a
    step can end it at another point of the same valley."""
    if have is None or set(have) != set(new):
        return False
    if all(abs(have[k] - new[k]) <= 1e-3 * abs(new[k]) for k in new):
        return True
    return abs(cost(have, rows) - cost(new, rows)) <= 1e-5 * cost(new, rows)


def _groups(machine: str, prefix: str, directory=None) -> dict:
    """``{key: rows}`` of one machine's table, by the key its constants are stored under."""
    groups = defaultdict(list)
    for r in load(prefix, machine, directory):
        groups[r["key"]].append(r)
    return dict(sorted(groups.items()))


def fit_machine(machine: str, prefix: str, directory=None):
    """``({key: constants}, held-out rows with their signed errors)`` of one machine."""
    out = {key: fit([r for r in rs if r["half"] == 0])
           for key, rs in _groups(machine, prefix, directory).items()}
    return out, held_out(machine, prefix, out, directory)


def held_out(machine: str, prefix: str, constants: dict, directory=None) -> list:
    """The held-out rows of one machine with their signed errors under ``constants``
    (``{key: constants}``: a refit's, or the file's entries of ``machine``)."""
    held = []
    for key, rs in _groups(machine, prefix, directory).items():
        test = [r for r in rs if r["half"] == 1]
        held += [(r, t / r["time"] - 1) for r, t in zip(test, predict(constants[key], test))]
    return held


def packaged(path: str = OUT) -> dict:
    """``{machine: {key: constants}}``: the entries of :data:`PLAN`'s machines that this
    script writes, as ``path`` holds them."""
    with open(path) as f:
        have = json.load(f).get("topologies", {})
    return {m: {k: p for k, p in have.get(m, {}).items() if ":" in k and "/" in k}
            for m, _ in PLAN}


def differs(machine: str, prefix: str, fitted: dict, have: dict, directory=None) -> list:
    """The keys of ``fitted`` (:func:`fit_machine`'s) whose constants in ``have`` (the
    file's entries of ``machine``) are not the same fit (:func:`same_fit`)."""
    groups = _groups(machine, prefix, directory)
    return [k for k, p in fitted.items()
            if not same_fit(have.get(k), p, [r for r in groups[k] if r["half"] == 0])]


def report(held) -> list:
    """Rows of the held-out table: per machine, collective, GPUs and size class."""
    groups = defaultdict(list)
    for r, e in held:
        size = next(name for name, lo, hi in SIZES if lo <= r["bytes"] <= hi)
        groups[(r["topology"], r["collective"], r["n"], size)].append(e)
    body = []
    for k in sorted(groups):
        e = np.abs(np.array(groups[k]))
        body.append(k + (len(e), f"{100 * np.median(e):.1f}%",
                         f"{100 * np.percentile(e, 90):.1f}%"))
    return body


def before(data: dict, held) -> dict:
    """``{id(row): signed error}`` of the held-out rows with the constants the machines had
    before this fit: their class's (``bench/fit_comm.py``: Vidur's 2024 measurements)."""
    out = {}
    for r, _ in held:
        own = {k: v for k, v in data.get("topologies", {}).get(r["topology"], {}).items()
               if ":" not in k}
        p = own.get(r["cls"]) or data["classes"][r["cls"]]
        out[id(r)] = predict(p, [r])[0] / r["time"] - 1
    return out


def summary(held, old: dict) -> list:
    """Per machine and size class: held-out rows, median and p90 |error| with the fitted
    constants, and the median with the constants of before (:func:`before`)."""
    out = []
    for machine, _ in PLAN:
        for name, lo, hi in SIZES + (("all", 0, 1 << 62),):
            sel = [(r, e) for r, e in held if r["topology"] == machine and lo <= r["bytes"] <= hi]
            e = np.abs(np.array([e for _, e in sel]))
            b = np.abs(np.array([old[id(r)] for r, _ in sel]))
            out.append((machine, name, len(e), f"{100 * np.median(b):.1f}%",
                        f"{100 * np.median(e):.1f}%", f"{100 * np.percentile(e, 90):.1f}%"))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calibration-dir", default=None)
    ap.add_argument("--out", default=OUT)
    ap.add_argument("--check", action="store_true",
                    help="fit and compare with --out instead of writing it")
    ap.add_argument("--format", default="simple")
    ap.add_argument("--groups", action="store_true",
                    help="also print every machine, collective, GPU count and size class")
    args = ap.parse_args(argv)
    fitted = {m: fit_machine(m, prefix, args.calibration_dir)[0] for m, prefix in PLAN}
    with open(args.out) as f:
        data = json.load(f)
    have = data.get("topologies", {})
    bad = [f"{m} {k}" for m, prefix in PLAN
           for k in differs(m, prefix, fitted[m], have.get(m, {}), args.calibration_dir)] \
        if args.check else []
    # the held-out errors of the constants the file holds after this run: the refit's when
    # writing, the file's own when checking (the same fit, or the check fails): where the
    # fitted half leaves the constants a flat valley, two equally good minima can differ
    # on the held-out half
    shown = {m: {k: have.get(m, {}).get(k, p) for k, p in fitted[m].items()}
             if args.check else fitted[m] for m, _ in PLAN}
    held = [e for m, prefix in PLAN
            for e in held_out(m, prefix, shown[m], args.calibration_dir)]
    if args.groups:
        print(tabulate(report(held), headers=("machine", "collective", "GPUs", "bytes", "rows",
                                              "median", "p90"), tablefmt=args.format,
                       disable_numparse=True))
        print()
    print(tabulate(summary(held, before(data, held)),
                   headers=("machine", "bytes", "held-out rows", "before: median",
                            "median |error|", "p90"),
                   tablefmt=args.format, disable_numparse=True))
    if args.check:
        print("matches " + shown_path(args.out) if not bad else "differs: " + ", ".join(bad))
        return 1 if bad else 0
    for machine, entries in fitted.items():
        data.setdefault("topologies", {}).setdefault(machine, {}).update(entries)
    data["nccl_2_29"] = (f"The CLASS/KIND:COLLECTIVE entries of dgx-h100 and dgx-b200: written "
                         f"by bench/fit_comm_aiconfigurator.py from {SOURCE}'s nccl-tests "
                         f"tables (NCCL 2.29.2); do not edit.")
    write_json(args.out, data)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
