#!/usr/bin/env python
"""How long ``fxshape.simulate_serving`` takes for 10,000 requests (issue 31's target: a few
seconds on two cores).

    python bench/batching_speed.py [--requests 10000]

Llama-3-8B on one H100, Poisson arrivals at 25 requests per second (near the predicted
capacity, so the batch runs full), prompts of 128-1,024 tokens and outputs of 64-512,
vLLM's defaults. Prints the wall time of the whole call (the one decode capture, then the
scheduler's steps) and of the scheduler alone.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=10_000)
    args = ap.parse_args(argv)
    from fxshape.presets import build_preset
    from fxshape.serving import run_engine, simulate_serving

    model = build_preset("llama-3-8b")
    t0 = time.perf_counter()
    sim = simulate_serving(model, gpu="h100", num_requests=args.requests, rate=25.0,
                           prompt_len="128:1024", output_len="64:512")
    whole = time.perf_counter() - t0
    from fxshape.serving.batch import BatchStep
    from fxshape.serving.traffic import poisson_requests

    reqs = poisson_requests(args.requests, rate=25.0, prompt_len=(128, 1024),
                            output_len=(64, 512))
    step = BatchStep(sim.decode)
    t0 = time.perf_counter()
    run_engine(step, reqs, sim.config)
    loop = time.perf_counter() - t0
    print(sim.describe())
    print(f"\n{args.requests:,} requests, {sim.steps:,} steps: {whole:.2f} s in all "
          f"(capture and scheduler), {loop:.2f} s for the scheduler with a fresh step "
          "model (every step size priced anew)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
