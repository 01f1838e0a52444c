#!/usr/bin/env python
"""vLLM's custom all-reduce on a DGX H100 and a DGX B200: the B200's constants fitted, both
machines validated on rows nothing was fitted to.

    python bench/fit_allreduce_aiconfigurator.py [--calibration-dir DIR] [--check]
                                                 [--format github]

``../shared/calibration/aiconfigurator/{h100,b200}_sxm_custom_allreduce_perf.csv``
(ai-dynamo/aiconfigurator@095f58a51, vLLM 0.24): vLLM's custom all-reduce kernel on 2, 4 and
8 GPUs, bf16, timed as CUDA-graph replays (``vllm_graph``; the ``vllm_eager`` rows add the
host's ~20 us a call and are not used). Each row is priced as the kernel vLLM runs for its
size (``fxshape.cost.allreduce``: one-shot for two GPUs and for small buffers, two-shot above
``VLLM_ONE_STAGE_BELOW``) over the node's NVLink, for buffers up to the kernel's 8 MiB.

- H100 (NVLink 4): every row held out. The kernel's two constants (``stage_s``,
  ``peer_efficiency``) were fitted to sglang's H100 benchmark (``bench/fit_allreduce.py``).
- B200 (NVLink 5): with the H100's constants its kernel is predicted 39% too fast (it takes
  6.6-7.4 us where the H100's takes 4.2-4.7, and moves less than NVLink 5's doubled
  bandwidth would give). Its own two constants are fitted (least squares on log errors) on
  half of its rows, chosen by a hash of (GPUs, bytes), and written under ``links`` /
  ``nvlink5`` of ``allreduce_params.json``; the other half is held out.

Prints the median, p90 and median signed error of the rows nothing was fitted to, per
machine, GPU count and size. ``--check`` fits and compares with the file instead of writing.
Deterministic; a second.
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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

import numpy as np  # noqa: E402
from scipy.optimize import least_squares  # noqa: E402
from tabulate import tabulate  # noqa: E402

from fxshape.cost.allreduce import (VLLM_MAX_BYTES, VLLM_ONE_STAGE_BELOW,  # noqa: E402
                                    AllReduceParams, one_shot_s, predict_allreduce,
                                    two_shot_s)
from fxshape.hardware.topology import LINKS  # noqa: E402

from fit_aiconfigurator import shown_path, table_path, write_json  # noqa: E402

SOURCE = "ai-dynamo/aiconfigurator@095f58a51"
#: (machine, table prefix, its NVLink, fitted here)
PLAN = (("dgx-h100", "h100_sxm", "nvlink4", False), ("dgx-b200", "b200_sxm", "nvlink5", True))
OUT = os.path.join(ROOT, "fxshape", "data", "allreduce_params.json")


def vllm_kernel(nbytes: int, n: int) -> str:
    """The custom kernel vLLM runs for ``nbytes`` over ``n`` GPUs."""
    if n == 2:
        return "one-shot"
    below = next(b for most, b in VLLM_ONE_STAGE_BELOW if n <= most)
    return "one-shot" if nbytes < below else "two-shot"


def load(directory=None) -> list[dict]:
    """The graph-replayed bf16 rows up to 8 MiB, each with its machine, link, kernel and
    half (0: fitted where the machine is fitted, 1: held out)."""
    out = []
    for machine, prefix, link, fitted in PLAN:
        with open(table_path(f"{prefix}_custom_allreduce_perf", directory), newline="") as f:
            for r in csv.DictReader(f):
                if r["backend"] != "vllm_graph" or r["allreduce_dtype"] != "bfloat16":
                    continue
                n, b = int(r["num_gpus"]), int(r["message_size"]) * 2
                if b > VLLM_MAX_BYTES:
                    continue
                half = int(hashlib.sha256(f"{machine}|{n}|{b}".encode()).hexdigest(), 16) % 2
                out.append(dict(machine=machine, link=link, n=n, bytes=b,
                                kernel=vllm_kernel(b, n), time=float(r["time_s"]),
                                half=half if fitted else 1))
    return out


def kernel_time(p: AllReduceParams, r) -> float:
    fn = one_shot_s if r["kernel"] == "one-shot" else two_shot_s
    return fn(p, r["bytes"], r["n"], LINKS[r["link"]])


def fit(rows) -> AllReduceParams:
    """``stage_s`` and ``peer_efficiency`` minimising the squared log error over ``rows``."""
    def resid(x):
        p = AllReduceParams(*np.exp(x))
        return [math.log(kernel_time(p, r) / r["time"]) for r in rows]

    sol = least_squares(resid, np.log([4e-6, 0.5]), method="trf", x_scale="jac",
                        max_nfev=2000)
    return AllReduceParams(*[float(f"{v:.5g}") for v in np.exp(sol.x)])


def fit_links(rows) -> dict:
    """``{link: its fitted constants}`` for the machines fitted here."""
    return {link: fit([r for r in rows if r["link"] == link and r["half"] == 0])
            for _, _, link, fitted in PLAN if fitted}


def held_out(rows, params_path=None) -> list[tuple]:
    """``(row, signed error)`` of every row nothing was fitted to, priced by
    ``predict_allreduce`` with the parameter file ``params_path`` (default: packaged)."""
    out = []
    for r in rows:
        if r["half"] != 1:
            continue
        t = predict_allreduce(r["bytes"], r["n"], algorithm=r["kernel"], topology=r["machine"],
                              params_path=params_path).time_s
        out.append((r, t / r["time"] - 1))
    return out


def table(held) -> list:
    groups = defaultdict(list)
    for r, e in held:
        size = "< 256 KiB" if r["bytes"] < 1 << 18 else ">= 256 KiB"
        groups[(r["machine"], r["n"], size)].append(e)
        groups[(r["machine"], "all", "")].append(e)
    out = []
    for key in sorted(groups, key=lambda k: (k[0], str(k[1]), k[2])):
        e = np.array(groups[key])
        out.append(key + (len(e), f"{100 * np.median(abs(e)):.1f}%",
                          f"{100 * np.percentile(abs(e), 90):.1f}%",
                          f"{100 * np.median(e):+.1f}%"))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calibration-dir", default=None)
    ap.add_argument("--out", default=OUT)
    ap.add_argument("--check", action="store_true",
                    help="fit and compare with --out instead of writing it")
    ap.add_argument("--format", default="simple")
    args = ap.parse_args(argv)
    rows = load(args.calibration_dir)
    links = fit_links(rows)
    with open(args.out) as f:
        data = json.load(f)
    have = data.get("links") or {}
    entries = {link: {"stage_s": p.stage_s, "peer_efficiency": p.peer_efficiency,
                      "source": f"bench/fit_allreduce_aiconfigurator.py on {SOURCE}'s "
                                f"custom all-reduce table ({link}: DGX B200, vLLM 0.24)"}
               for link, p in links.items()}
    if not args.check:
        data["links"] = {**have, **entries}
        write_json(args.out, data)
        print(f"wrote {args.out}", file=sys.stderr)
    for link, p in links.items():
        print(f"{link}: stage_s {p.stage_s * 1e6:.2f} us, peer_efficiency {p.peer_efficiency:.3g}")
    print(tabulate(table(held_out(rows, args.out)),
                   headers=("machine", "GPUs", "bytes", "held-out rows", "median |error|",
                            "p90", "median signed"), tablefmt=args.format,
                   disable_numparse=True))
    if args.check:
        bad = [link for link, e in entries.items() if have.get(link) != e]
        print("matches " + shown_path(args.out) if not bad else "differs for " + ", ".join(bad))
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
