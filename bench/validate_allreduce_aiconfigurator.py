#!/usr/bin/env python
"""vLLM's custom all-reduce on an H100 and a B200 node, predicted and measured (held out).

    python bench/validate_allreduce_aiconfigurator.py [--calibration-dir DIR] [--format github]

``../shared/calibration/aiconfigurator/{h100,b200}_sxm_custom_allreduce_perf.csv``
(ai-dynamo/aiconfigurator@095f58a51, vLLM 0.24): vLLM's custom all-reduce kernel on 2, 4 and
8 GPUs of a DGX H100 and a DGX B200, bf16, timed as CUDA-graph replays (``vllm_graph``; the
``vllm_eager`` rows add the host's ~20 us per call and are not compared). Each row is
predicted with the kernel vLLM runs for its size (``fxshape.cost.allreduce``: one-shot for
two GPUs and for small buffers, two-shot above ``VLLM_ONE_STAGE_BELOW``) on the node's
NVLink; buffers up to 8 MiB, vLLM's custom kernel's limit. Nothing is fitted to these rows:
the kernel's two constants were fitted to sglang's H100 benchmark
(``bench/fit_allreduce.py``). Prints the median and p90 |error| and the median signed error
per GPU, GPU count and size.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
from tabulate import tabulate  # noqa: E402

from fxshape.cost.allreduce import (VLLM_MAX_BYTES, VLLM_ONE_STAGE_BELOW,  # noqa: E402
                                    predict_allreduce)
from fxshape.fit.calibration import calibration_dir  # noqa: E402

PLAN = (("dgx-h100", "h100_sxm"), ("dgx-b200", "b200_sxm"))


def vllm_kernel(nbytes: int, n: int) -> str:
    """The custom kernel vLLM runs for ``nbytes`` over ``n`` GPUs."""
    if n == 2:
        return "one-shot"
    below = next(b for most, b in VLLM_ONE_STAGE_BELOW if n <= most)
    return "one-shot" if nbytes < below else "two-shot"


def rows(directory=None):
    """``(machine, GPUs, bytes, kernel, measured s, predicted s)`` per graph-replayed row."""
    out = []
    for machine, prefix in PLAN:
        path = os.path.join(calibration_dir(directory), "aiconfigurator",
                            f"{prefix}_custom_allreduce_perf.csv")
        with open(path, newline="") as f:
            for r in csv.DictReader(f):
                if r["backend"] != "vllm_graph" or r["allreduce_dtype"] != "bfloat16":
                    continue
                n, b = int(r["num_gpus"]), int(r["message_size"]) * 2
                if b > VLLM_MAX_BYTES:
                    continue
                kernel = vllm_kernel(b, n)
                t = predict_allreduce(b, n, algorithm=kernel, topology=machine).time_s
                out.append((machine, n, b, kernel, float(r["time_s"]), t))
    return out


def table(data) -> list:
    groups = defaultdict(list)
    for machine, n, b, _, meas, pred in data:
        size = "< 256 KiB" if b < 1 << 18 else ">= 256 KiB"
        groups[(machine, n, size)].append(pred / meas - 1)
        groups[(machine, "all", "")].append(pred / meas - 1)
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
    ap.add_argument("--format", default="simple")
    args = ap.parse_args(argv)
    print(tabulate(table(rows(args.calibration_dir)),
                   headers=("machine", "GPUs", "bytes", "rows", "median |error|", "p90",
                            "median signed"), tablefmt=args.format, disable_numparse=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
