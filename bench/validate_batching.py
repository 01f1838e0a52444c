#!/usr/bin/env python
"""Continuous batching against published serving sweeps (held out: nothing here is fitted).

    python bench/validate_batching.py [--format github]

Each row of ``bench/batching_published.csv`` is a ``vllm bench serve`` run: fixed prompt and
output lengths, ``--request-rate inf`` and a ``--max-concurrency`` cap. It is replayed with
``fxshape.simulate_serving`` (vLLM's scheduler and defaults for the GPU, bf16) and the
published metric compared:

- ``decode_tokens_per_s_per_request``: 1 / the mean time per output token;
- ``throughput_gain_over_concurrency_1``: output tokens per second at the row's concurrency
  over the same run at concurrency 1.

About twenty seconds on two cores.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tabulate import tabulate  # noqa: E402

DATA = os.path.join(ROOT, "bench", "batching_published.csv")


def run(row, concurrency, model_cache):
    from fxshape.presets import build_preset
    from fxshape.serving import simulate_serving

    name = row["model"]
    if name not in model_cache:
        model_cache[name] = build_preset(name)
    n = int(row["num_requests"]) * concurrency // int(row["max_concurrency"])
    return simulate_serving(model_cache[name], gpu=row["gpu"], tp=int(row["tp"]),
                            num_requests=max(n, 1), prompt_len=int(row["prompt_len"]),
                            output_len=int(row["output_len"]), max_concurrency=concurrency)


def predict(row, model_cache):
    metric = row["metric"]
    c = int(row["max_concurrency"])
    sim = run(row, c, model_cache)
    if metric == "decode_tokens_per_s_per_request":
        return 1.0 / sim.tpot_s.mean
    if metric == "throughput_gain_over_concurrency_1":
        return sim.output_tokens_per_s / run(row, 1, model_cache).output_tokens_per_s
    raise ValueError(f"unknown metric {metric!r} in {DATA}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--format", default="simple", help="tabulate format (github for docs)")
    args = ap.parse_args(argv)
    with open(DATA, newline="") as f:
        rows = list(csv.DictReader(f))
    cache: dict = {}
    out, errors = [], []
    for row in rows:
        measured = float(row["measured"])
        got = predict(row, cache)
        err = got / measured - 1
        errors.append(abs(err))
        out.append((row["source"], row["model"], row["gpu"], row["max_concurrency"],
                    row["metric"], f"{measured:g}", f"{got:.2f}", f"{err:+.1%}"))
    print(tabulate(out, headers=("source", "model", "gpu", "concurrency", "metric",
                                 "measured", "predicted", "error"), tablefmt=args.format))
    print(f"\nmedian |error| {statistics.median(errors):.1%} over {len(errors)} rows "
          "(held out)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
