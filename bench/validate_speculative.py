#!/usr/bin/env python
"""Speculative decoding against published measurements (held out: nothing here is fitted).

    python bench/validate_speculative.py [--format github]

Each row of ``bench/speculative_published.csv`` is a batch-1 decode's time per output token
measured with vLLM V1: plain, and with EAGLE-1 and EAGLE-3 drafts at k = 2..7, each with its
measured mean acceptance length. ``fxshape.speculate`` is given that length (the acceptance
is the user's input, not the model's) and predicts the time per output token; the plain row
is ``fxshape.speculate``'s plain decode step. MT-bench's prompts and answers are priced as
128 prompt and 256 output tokens (the steps are priced at mid-request context; at these
lengths the context moves a Llama-3-8B step by well under 1%). About twenty seconds.
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

DATA = os.path.join(ROOT, "bench", "speculative_published.csv")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--format", default="simple", help="tabulate format (github for docs)")
    args = ap.parse_args(argv)
    from fxshape.presets import build_preset
    from fxshape.serving import speculate

    with open(DATA, newline="") as f:
        rows = list(csv.DictReader(f))
    models: dict = {}
    out, errors = [], {}
    for row in rows:
        name = row["model"]
        models.setdefault(name, build_preset(name))
        kw = dict(prompt_len=int(row["prompt_len"]), output_len=int(row["output_len"]),
                  gpu=row["gpu"])
        if row["draft"] == "none":
            got = speculate(models[name], k=1, acceptance=0.0, **kw).plain_tpot_s
            label = "plain decode"
        else:
            r = speculate(models[name], draft=row["draft"], k=int(row["k"]),
                          acceptance_length=float(row["acceptance_length"]), **kw)
            got = r.tpot_s
            label = row["note"].split(" (")[0] + f", k {row['k']}, AL {row['acceptance_length']}"
        if row["metric"] != "tpot_ms":
            raise ValueError(f"unknown metric {row['metric']!r} in {DATA}")
        measured = float(row["measured"])
        err = got * 1e3 / measured - 1
        errors.setdefault(label.split(",")[0], []).append(abs(err))
        out.append((label, f"{measured:g}", f"{got * 1e3:.2f}", f"{err:+.1%}"))
    print(tabulate(out, headers=("run (Llama-3.1-8B, batch 1, H100)", "measured TPOT ms",
                                 "predicted", "error"), tablefmt=args.format))
    print()
    for k, v in errors.items():
        print(f"{k}: median |error| {statistics.median(v):.1%} over {len(v)} rows (held out)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
