#!/usr/bin/env python
"""FP8 training (torchao's float8 under torch.compile) against published runs (held out).

    python bench/validate_float8.py [--format github]

Each row of ``bench/float8_published.csv`` is a torchtitan Llama-3-8B training run on 8 or
128 GPUs (FSDP2, torch.compile, sequence 8192), in bf16 or with torchao's float8 recipe
(``tensorwise`` with the float8 all-gather, ``rowwise`` with a bf16 one, as published;
``mxfp8`` on the B200, torchao's MX training with cuBLAS's block-scaled GEMM). Each
is predicted with ``fxshape.analyze(mode="train", execution="compiled",
parallel=Parallel(dp=gpus, zero=3), float8=recipe)`` and compared twice: the tokens per
second per GPU as published, and the float8 run's speedup over the bf16 run of the same
table (what float8 itself changes, apart from how well the bf16 step is predicted).

The runs used torchtitan's per-op selective activation checkpointing (every second matmul
and the pointwise ops recomputed); fxshape does not model that policy and predicts them
without recomputation, which makes both runs' absolute figures faster than measured; torchtitan's
H100s are 96 GB HBM2e parts at 500 W, given as ``h100-sxm@500w`` (the power limit sets the
clock its GEMMs sustain, ``fxshape.hardware.power``; the HBM2e's bandwidth is not in the
GPU table), and torchao's B200s are power-limited to a figure the README does not give
(priced at the default 1000 W). Nothing is fitted. Under a minute on two cores.
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

DATA = os.path.join(ROOT, "bench", "float8_published.csv")


def predict(model, r):
    import fxshape
    from fxshape import Parallel

    gpus = int(r["gpus"])
    topo = None
    if gpus > 8:
        topo = {"h100": "dgx-h100"}.get(r["gpu"].partition("@")[0].removesuffix("-sxm"))
    rep = fxshape.analyze(model, mode="train", gpu=r["gpu"], seq_len=int(r["seq_len"]),
                          batch_size=int(r["batch_size"]), execution="compiled",
                          provenance=None, parallel=Parallel(dp=gpus, zero=3),
                          topology=topo, float8=r["recipe"] or None)
    return rep.step.tokens / rep.step.time_s


def main(argv=None) -> int:
    from fxshape.presets import build_preset

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--format", default="simple")
    args = ap.parse_args(argv)
    with open(DATA, newline="") as f:
        rows = list(csv.DictReader(f))
    models, base, out = {}, {}, []
    abs_err, ratio_err = [], []
    for r in rows:
        m = models.setdefault(r["model"], build_preset(r["model"]))
        key = (r["source"], r["gpu"], r["gpus"], r["batch_size"])
        pred, meas = predict(m, r), float(r["measured"])
        err = pred / meas - 1
        abs_err.append(abs(err))
        speed = ""
        if not r["recipe"]:
            base[key] = (meas, pred)
        elif key in base:
            mb, pb = base[key]
            sm, sp = meas / mb - 1, pred / pb - 1
            ratio_err.append((r, sm, sp))
            speed = f"{100 * sm:+.1f}% / {100 * sp:+.1f}%"
        out.append((r["source"], r["gpu"], r["gpus"], r["batch_size"], r["recipe"] or "bf16",
                    f"{meas:,.0f}", f"{pred:,.0f}", f"{100 * err:+.1f}%", speed))
    print(tabulate(out, headers=("source", "gpu", "gpus", "batch", "recipe",
                                 "measured tok/s/GPU", "predicted", "error",
                                 "float8 speedup measured / predicted"),
                   tablefmt=args.format))
    print()
    print(f"tokens/s per GPU: median |error| {100 * statistics.median(abs_err):.1f}% over "
          f"{len(abs_err)} runs")
    for recipe in ("tensorwise", "rowwise", "mxfp8"):
        got = [abs(sp - sm) for r, sm, sp in ratio_err if r["recipe"] == recipe]
        if got:
            print(f"{recipe} speedup over bf16: median |predicted - measured| "
                  f"{100 * statistics.median(got):.1f} points over {len(got)} runs, worst "
                  f"{100 * max(got):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
