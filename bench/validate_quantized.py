#!/usr/bin/env python
"""Quantized inference against published measurements (held out: nothing here is fitted).

    python bench/validate_quantized.py [--format github]

Each row of ``bench/quantized_published.csv`` is predicted with ``fxshape.serve`` and the
quantization the engine ran (``fxshape.cost.quant``): gpt-fast's batch-1 decode with int8
and int4 (group 32) weight-only layers on A100s (tp 1 and 8) and one MI250X GCD, and
TensorRT-LLM v0.5's FP8 time to the first token on H100s (static per-tensor activation
scales, the casts fused into the producing kernels), beside the same engine's unquantized
FP16 rows on A100s (the engine's own bias, apart from FP8). Each row is also predicted unquantized
(bf16), to show what quantizing changed; the published bf16 rows of the same engines are in
``bench/serving_published.csv``. About a minute on two cores.
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

DATA = os.path.join(ROOT, "bench", "quantized_published.csv")


def quantization(r):
    from fxshape.cost.quant import quantization_of

    if not r["quantize"]:
        return None
    return quantization_of(r["quantize"], int(r["group_size"]) if r["group_size"] else None,
                           r["activations"] or None)


def serve_kwargs(r) -> dict:
    """``fxshape.serve``'s arguments for a row, but the quantization."""
    kw = dict(gpu=r["gpu"], topology=r["topology"], tp=int(r["tp"]),
              batch_size=int(r["batch_size"]), prompt_len=int(r["prompt_len"]),
              output_len=int(r["output_len"]), allreduce=r["allreduce"], fuse=r["fuse"],
              gemv=r["gemv"])
    if r["source"].startswith("trtllm"):
        kw["dtype"] = "fp16"  # TensorRT-LLM's engines: --dtype float16
    return kw


def main(argv=None) -> int:
    import fxshape
    from fxshape.presets import build_preset

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--format", default="simple")
    args = ap.parse_args(argv)
    with open(DATA, newline="") as f:
        rows = list(csv.DictReader(f))
    models, out, errs = {}, [], {}
    for r in rows:
        m = models.setdefault(r["model"], build_preset(r["model"]))
        q = quantization(r)
        kw = serve_kwargs(r)
        got = fxshape.serve(m, quantize=q, **kw)
        try:
            plain = getattr(fxshape.serve(m, **kw), r["metric"])
        except ValueError:  # bf16 does not fit (70B on one GPU)
            plain = None
        metric, meas = r["metric"], float(r["measured"])
        pred = getattr(got, metric)
        err = (pred - meas) / meas
        group = r["source"] + (" (unquantized)" if q is None else "")
        errs.setdefault(group, []).append(abs(err))
        scale, unit = (1e3, "ms") if metric.startswith("time") else (1.0, "tok/s")
        out.append((r["source"], r["model"], r["gpu"], r["tp"],
                    q.label if q else "none (fp16)",
                    f"{r['prompt_len']}/{r['output_len']}", unit,
                    f"{meas * scale:.4g}", f"{pred * scale:.4g}", f"{100 * err:+.1f}%",
                    "-" if plain is None else f"{plain * scale:.4g}"))
    print(tabulate(out, headers=("source", "model", "gpu", "tp", "quantized", "in/out",
                                 "unit", "measured", "predicted", "error",
                                 "predicted unquantized"), tablefmt=args.format))
    print()
    for src, e in errs.items():
        print(f"{src}: median |error| {100 * statistics.median(e):.1f}% over {len(e)} rows, "
              f"worst {100 * max(e):.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
