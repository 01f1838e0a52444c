#!/usr/bin/env python
"""How long ``fxshape.analyze`` takes next to a bare ``torch.export``, and its peak memory.

    python bench/analyze_speed.py [--models llama-3-8b llama-2-70b] [--seq-len 4096]

For each preset (built on the meta device): the time of ``torch.export.export`` alone, then of
``fxshape.analyze`` (capture + annotation + report), in the same process, alternating, best of
``--repeats``; then the process's peak RSS. Targets (issue 3): Llama-3-8B within 1.3x of the
bare export; Llama-2-70B under 20 s on a 2-core machine; peak RSS <= 2 GB.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import fxshape  # noqa: E402
from fxshape.capture import example_inputs_for  # noqa: E402
from fxshape.presets import build_preset  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--models", nargs="*", default=["llama-3-8b", "llama-2-70b"])
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args(argv)
    for name in args.models:
        model = build_preset(name)
        kwargs = example_inputs_for(model, seq_len=args.seq_len)
        t_export, t_analyze = [], []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            torch.export.export(model, (), kwargs, strict=False)
            t_export.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            report = fxshape.analyze(model, seq_len=args.seq_len)
            t_analyze.append(time.perf_counter() - t0)
        e, a = min(t_export), min(t_analyze)
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"{name} (batch 1, seq {args.seq_len}): bare torch.export {e:.2f} s, "
              f"fxshape.analyze {a:.2f} s ({a / e:.2f}x), {len(report.rows)} GEMMs, "
              f"peak RSS so far {rss:.0f} MB")


if __name__ == "__main__":
    main()
