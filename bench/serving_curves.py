#!/usr/bin/env python
"""Decode throughput curves for docs/serving.md: tokens/s over batch and context, with the
bandwidth and compute roofs.

    python bench/serving_curves.py [--preset llama-3-8b] [--gpu h100] [--format github]
                                   [--out docs/img/serving_curves.png]

For each point, ``fxshape.analyze(mode="decode")`` (bf16, CUDA graphs, contiguous cache) gives
the step; the roofs are the same step at the GPU's limits:

- bandwidth roof: ``batch / floor``, ``report.step.floor_s`` being every weight but the input
  embedding plus the KV cache over the peak DRAM bandwidth;
- compute roof: ``batch / (model FLOPs / dense peak)``.

The model's positions are raised to 32,768 (as Llama-3.1-8B has) so that the context sweep
reaches 32k; nothing else changes. Batch 1-256 at 4k context, context 1k-32k at batch 1 and
64. Twenty-odd analyses of an 8B model: about two minutes on two cores. The plot needs
matplotlib (the ``plot`` extra); the tables print without it.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys

from tabulate import tabulate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import fxshape  # noqa: E402
from fxshape.presets import build_preset  # noqa: E402

BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
CONTEXTS = (1024, 2048, 4096, 8192, 16384, 32768)


def _model(preset: str):
    """The preset with its positions raised to the sweep's longest context."""
    import torch

    base = build_preset(preset)
    cfg = copy.deepcopy(base.config)
    cfg.max_position_embeddings = max(cfg.max_position_embeddings, CONTEXTS[-1])
    with torch.device("meta"):
        return type(base)(cfg)


def point(model, gpu, b, ctx) -> dict:
    r = fxshape.analyze(model, mode="decode", batch_size=b, context_len=ctx, gpu=gpu)
    s = r.step
    compute = s.model_flops / (s.peak_tflops * 1e12)
    return {"batch": b, "context": ctx, "step_ms": s.time_s * 1e3,
            "tokens_s": b / s.time_s, "bw_roof": b / s.floor_s, "compute_roof": b / compute,
            "of_floor": s.time_s / s.floor_s, "attention": s.by_class["attention"] / s.time_s,
            "fits": r.memory.fits}


def _rows(points):
    return [(p["batch"], p["context"], f"{p['step_ms']:.2f}", f"{p['tokens_s']:,.0f}",
             f"{p['bw_roof']:,.0f}", f"{p['compute_roof']:,.0f}", f"{p['of_floor']:.2f}",
             f"{100 * p['attention']:.0f}%", "yes" if p["fits"] else "no") for p in points]


HEAD = ("batch", "context", "step ms", "tokens/s", "bandwidth roof", "compute roof",
        "x floor", "attention share", "fits")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="llama-3-8b")
    ap.add_argument("--gpu", default="h100")
    ap.add_argument("--out", default=None, help="write the plot (.png or .svg)")
    ap.add_argument("--format", default="simple")
    args = ap.parse_args(argv)
    model = _model(args.preset)
    by_batch = [point(model, args.gpu, b, 4096) for b in BATCHES]
    by_ctx = {b: [point(model, args.gpu, b, c) for c in CONTEXTS] for b in (1, 64)}
    print(f"{args.preset} on {args.gpu}, bf16, CUDA graphs: tokens/s over batch at 4k context")
    print(tabulate(_rows(by_batch), headers=HEAD, tablefmt=args.format, disable_numparse=True))
    for b, pts in by_ctx.items():
        print(f"\n... over context at batch {b}")
        print(tabulate(_rows(pts), headers=HEAD, tablefmt=args.format, disable_numparse=True))
    if args.out:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, (a, c) = plt.subplots(1, 2, figsize=(11, 4))
        xs = [p["batch"] for p in by_batch]
        a.loglog(xs, [p["tokens_s"] for p in by_batch], "o-", label="predicted")
        a.loglog(xs, [p["bw_roof"] for p in by_batch], "--", label="bandwidth roof")
        a.loglog(xs, [p["compute_roof"] for p in by_batch], ":", label="compute roof")
        a.set(xlabel="batch (4k context)", ylabel="decode tokens/s", title=args.preset)
        a.legend()
        for b, pts in by_ctx.items():
            xs = [p["context"] for p in pts]
            c.loglog(xs, [p["tokens_s"] for p in pts], "o-", label=f"batch {b}")
            c.loglog(xs, [p["bw_roof"] for p in pts], "--", label=f"bandwidth roof, batch {b}")
        c.set(xlabel="context (tokens)", ylabel="decode tokens/s", title=f"on {args.gpu}")
        c.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(args.out, dpi=110)
        print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
