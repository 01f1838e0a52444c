#!/usr/bin/env python
"""Blackwell's block-scaled and FP8 GEMMs against published kernel benchmarks (held out:
nothing here is fitted).

    python bench/validate_block_formats.py [--format github]

Each row of ``bench/block_formats_published.csv`` is one GEMM ``[M, K] x [K, N]`` timed on a
B200 (or, for FP8, an H100) by a serving engine's kernel benchmark, predicted by ``fxshape.cost.quant`` as the
engine runs it:

- ``bf16``: ``torch.nn.functional.linear`` in bf16 (``predict_matmul``, layout ``nt``);
- ``nvfp4``: vLLM's ``scaled_fp4_quant`` of the activation, then ``cutlass_scaled_fp4_mm``
  (``predict_quantized(quantize="nvfp4")``: two kernels);
- ``nvfp4-noquant``: the block-scaled GEMM alone, operands already in FP4
  (``predict_block_gemm``);
- ``fp8``: vLLM's per-token dynamic quantization, then CUTLASS's ``cutlass_scaled_mm`` with a
  scale per weight column (``predict_quantized(quantize="fp8")``);
- ``fp8-noquant``: the FP8 GEMM alone, operands already in FP8: the same kernel without the
  activation's quantization (``predict_quantized`` with ``activations="static"``).

The benchmarks time with CUDA graphs (``triton.testing.do_bench_cudagraph``): no host in the
figures, as in the kernel predictions. Seconds on two cores.
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

DATA = os.path.join(ROOT, "bench", "block_formats_published.csv")


def predict(kernel: str, m: int, n: int, k: int, gpu: str) -> float:
    """Seconds for one row's kernel(s)."""
    from fxshape.cost.gemm import predict_matmul
    from fxshape.cost.quant import (Quantization, predict_block_gemm, predict_quantized,
                                    quantization_of)

    if kernel == "bf16":
        return predict_matmul(m, n, k, gpu=gpu, layout="nt").time_s
    if kernel == "fp8-noquant":
        return predict_quantized(m, n, k, Quantization("fp8", activations="static"),
                                 gpu=gpu).prediction.time_s
    if kernel == "nvfp4-noquant":
        return predict_block_gemm(m, n, k, "nvfp4", gpu=gpu).time_s
    if kernel in ("fp8", "nvfp4"):
        return predict_quantized(m, n, k, quantization_of(kernel), gpu=gpu).prediction.time_s
    raise ValueError(f"unknown kernel {kernel!r} in {DATA}")


def measured_s(r) -> float:
    """A row's measured seconds (its unit: microseconds, or TFLOP/s of ``2 M N K``)."""
    m, n, k = int(r["m"]), int(r["n"]), int(r["k"])
    meas = float(r["measured"])
    return meas * 1e-6 if r["unit"] == "us" else 2 * m * n * k / (meas * 1e12)


def rows():
    with open(DATA, newline="") as f:
        return list(csv.DictReader(f))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--format", default="simple")
    args = ap.parse_args(argv)
    out, errs = [], {}
    for r in rows():
        m, n, k = int(r["m"]), int(r["n"]), int(r["k"])
        flops = 2 * m * n * k
        meas_s = measured_s(r)
        pred_s = predict(r["kernel"], m, n, k, r["gpu"])
        err = (pred_s - meas_s) / meas_s  # + : predicted slower than measured
        group = (r["source"], r["kernel"])
        errs.setdefault(group, []).append(err)
        out.append((r["source"], r["kernel"], m, n, k, f"{meas_s * 1e6:.2f}",
                    f"{pred_s * 1e6:.2f}", f"{flops / meas_s / 1e12:.0f}",
                    f"{flops / pred_s / 1e12:.0f}", f"{100 * err:+.1f}%"))
    print(tabulate(out, headers=("source", "kernel", "M", "N", "K", "measured us",
                                 "predicted us", "measured TFLOP/s", "predicted TFLOP/s",
                                 "time error"), tablefmt=args.format))
    print()
    summary = []
    for (src, kern), e in errs.items():
        small = [x for x, r in zip(e, [r for r in rows() if (r["source"], r["kernel"])
                                       == (src, kern)]) if int(r["m"]) <= 128]
        large = [x for x, r in zip(e, [r for r in rows() if (r["source"], r["kernel"])
                                       == (src, kern)]) if int(r["m"]) > 128]
        summary.append((src, kern, len(e),
                        f"{100 * statistics.median(abs(x) for x in e):.1f}%",
                        f"{100 * statistics.median(small):+.1f}%" if small else "-",
                        f"{100 * statistics.median(large):+.1f}%" if large else "-",
                        sum(abs(x) <= 0.15 for x in e)))
    print(tabulate(summary, headers=("source", "kernel", "rows", "median abs error",
                                     "median error M<=128", "median error M>128",
                                     "within 15%"), tablefmt=args.format))
    return 0


if __name__ == "__main__":
    sys.exit(main())
