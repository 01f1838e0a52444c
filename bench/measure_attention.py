#!/usr/bin/env python
"""Measure PyTorch's scaled_dot_product_attention on your GPU, beside fxshape's predictions.

    python bench/measure_attention.py --gpu-label h100 --out attn_h100.csv
                                      [--dtype bf16] [--sweep default|quick]
                                      [--repeats 30] [--warmup 5]

For each shape (batch x heads x seq_len x head_dim at 16k tokens and hidden 2048, as in the
FlashAttention papers' figures; plus GQA, causal and decode-like shapes) it times the forward
pass and the backward pass of ``F.scaled_dot_product_attention`` (whatever backend PyTorch
picks: the flash backend on sm80+) with CUDA events after warm-up, the median of
``--repeats`` calls, and prints measured TFLOP/s (the papers' convention: forward
4·b·h·s²·d, halved when causal; backward 2.5x) next to ``fxshape.predict_attention``'s.
Rows are written in the schema of ``../shared/calibration/attention/`` (kernel ``sdpa``), so
``bench/fit_attention.py --calibration-dir`` can read them. Without CUDA the script says so
and exits with status 2.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fxshape.cost.attention import AttentionShape, predict_attention  # noqa: E402
from fxshape.hardware.dtypes import canonical_dtype  # noqa: E402
from fxshape.fit.measure import cuda_event_median  # noqa: E402

SOURCE = "fxshape-measure"
COLUMNS = ("source", "gpu", "kernel", "direction", "causal", "dtype", "batch", "heads",
           "seq_len", "head_dim", "tflops")


def default_sweep(quick: bool = False):
    """Shapes as (batch, heads, kv_heads, seq_len, head_dim, causal)."""
    shapes = []
    seqs = (512, 2048, 8192) if quick else (512, 1024, 2048, 4096, 8192, 16384)
    for d in (64, 128) if quick else (64, 80, 128, 256):
        h = 2048 // d
        for causal in (False, True):
            for s in seqs:
                shapes.append((16384 // s, h, h, s, d, causal))
    # grouped-query attention (Llama-3-8B's 32 query heads over 8 K/V heads), causal
    for s in (1024, 4096):
        shapes.append((max(1, 16384 // s), 32, 8, s, 128, True))
    return shapes


class CudaTimer:
    """Median CUDA-event time of SDPA forward and backward for one shape."""

    def __init__(self, dtype: str, warmup: int = 5, repeats: int = 30, seed: int = 0):
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("CUDA is not available")
        self.torch = torch
        self.dkey = canonical_dtype(dtype)
        if self.dkey not in ("fp16", "bf16"):
            raise ValueError(f"measure_attention times fp16 or bf16, not {self.dkey}")
        self.tdtype = torch.float16 if self.dkey == "fp16" else torch.bfloat16
        self.warmup, self.repeats = warmup, repeats
        self.gen = torch.Generator(device="cuda").manual_seed(seed)

    def _time(self, fn):
        return cuda_event_median(lambda i: fn(), self.warmup, self.repeats)

    def __call__(self, b, h, kvh, s, d, causal) -> tuple[float, float]:
        """(forward seconds, backward seconds)."""
        torch = self.torch
        F = torch.nn.functional

        def rand(heads):
            return torch.randn(b, heads, s, d, generator=self.gen, device="cuda",
                               dtype=self.tdtype).requires_grad_(True)

        q, k, v = rand(h), rand(kvh), rand(kvh)
        gqa = kvh != h
        t_fwd = self._time(lambda: F.scaled_dot_product_attention(
            q, k, v, is_causal=causal, enable_gqa=gqa))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
        grad = torch.randn_like(out)
        t_bwd = self._time(lambda: torch.autograd.grad(out, (q, k, v), grad,
                                                       retain_graph=True))
        return t_fwd, t_bwd


def measure(shapes, timer, *, gpu_label: str, dtype: str):
    """Rows (schema order) and a comparison table for every shape, forward and backward."""
    dkey = canonical_dtype(dtype)
    rows, table = [], []
    for b, h, kvh, s, d, causal in shapes:
        shape = AttentionShape(b, h, kvh, s, s, d, d, causal)
        times = timer(b, h, kvh, s, d, causal)
        for direction, t in zip(("forward", "backward"), times):
            if not t > 0:
                raise ValueError(f"timer returned {t!r} for {(b, h, kvh, s, d, causal)}")
            measured = shape.flops(direction) / t / 1e12
            p = predict_attention(shape, direction=direction, gpu=gpu_label, dtype=dkey)
            predicted = shape.flops(direction) / p.time_s / 1e12
            rows.append((SOURCE, gpu_label, "sdpa", direction, str(causal).lower(), dkey, b,
                         h, s, d, round(measured, 2)))
            table.append((direction, b, h, kvh, s, d, causal, p.kernel, measured, predicted,
                          100 * (predicted / measured - 1)))
    return rows, table


def write(path, rows) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(COLUMNS)
        w.writerows(rows)


def report(table) -> str:
    head = ("dir", "batch", "heads", "kv", "seq", "d", "causal", "kernel", "measured TF/s",
            "predicted TF/s", "error %")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in table:
        lines.append("| " + " | ".join(
            [str(x) for x in r[:8]] + [f"{r[8]:.0f}", f"{r[9]:.0f}", f"{r[10]:+.1f}"]) + " |")
    errs = sorted(abs(r[10]) for r in table)
    lines.append(f"\nmedian |error| {statistics.median(errs):.1f}%, max {errs[-1]:.1f}% "
                 f"over {len(errs)} measurements")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description="Time SDPA on this machine's GPU.")
    ap.add_argument("--gpu-label", required=True, help="fxshape GPU name or alias (h100, a100)")
    ap.add_argument("--out", required=True, help="CSV file to write")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--sweep", choices=("default", "quick"), default="default")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args(argv)
    try:
        timer = CudaTimer(args.dtype, warmup=args.warmup, repeats=args.repeats)
    except RuntimeError as exc:
        print(f"measure_attention: {exc}: this script needs a GPU visible to PyTorch "
              f"(torch.cuda.is_available() is False).", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"measure_attention: {exc}", file=sys.stderr)
        return 2
    rows, table = measure(default_sweep(args.sweep == "quick"), timer,
                          gpu_label=args.gpu_label, dtype=args.dtype)
    write(args.out, rows)
    print(report(table))
    print(f"wrote {len(rows)} rows to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
