#!/usr/bin/env python
"""How fast the plan search costs plans: Llama-2-70B on 512 H100s (64 DGX nodes), a global
batch of 1,024 sequences of 4,096 tokens (issue 30's target: >= 1,000 plans in <= 60 s on
two cores).

    python bench/plan_search_speed.py [--workers N] [--slice]

Searches the whole default space (every tp, cp, pp, virtual stages, dp, ZeRO stage,
micro-batch size and recomputation that divides; ``--slice``: ZeRO-1, micro-batch 1, no or
full recomputation only) with ``--workers`` processes (default: one per core). Prints the
plans enumerated, left out before any capture, costed, the captures, the seconds, the plans
per second and the best plan.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fxshape.planning import candidates, model_shape, plan  # noqa: E402
from fxshape.presets import build_preset  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slice", action="store_true")
    ap.add_argument("--workers", type=int, default=None)
    args = ap.parse_args(argv)
    model = build_preset("llama-2-70b")
    kw = dict(gpus=512, global_batch=1024, seq_len=4096)
    everything, _ = candidates(model_shape(model), gpus=512, global_batch=1024, seq_len=4096,
                               gpus_per_node=8)
    space = dict(zero=(1,), micro_batches=(1,), recompute=(None, "full")) if args.slice else {}
    t = time.perf_counter()
    found = plan(model, gpu="h100", topology="dgx-h100:64", progress=False,
                 workers=args.workers, **kw, **space)
    secs = time.perf_counter() - t
    rate = found.costed / secs
    print(f"default space: {len(everything)} plans enumerated")
    print(f"searched: {found.enumerated} enumerated, "
          f"{found.enumerated - found.costed} left out before capture, {found.costed} costed "
          f"from {found.captures} captures in {secs:.1f} s ({found.workers} process(es) on "
          f"{os.cpu_count()} cores): {rate:.2f} plans/s "
          f"(1,000 plans: {1000 / rate:.0f} s; target 60 s)")
    best = found.best
    if best is not None:
        print(f"best: {best.candidate.label()}: {best.step_s:.2f} s per step, "
              f"{best.tokens_per_s_per_gpu:,.0f} tokens/s/GPU, MFU {100 * best.mfu:.1f}%, "
              f"{best.peak_bytes / 2**30:.1f} GiB")


if __name__ == "__main__":
    main()
