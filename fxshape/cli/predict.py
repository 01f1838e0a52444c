"""``fxshape predict``: one GEMM's time and efficiency."""

from __future__ import annotations

import argparse
import json

from tabulate import tabulate

from ..cost.gemm import LAYOUTS, is_default_params, predict_matmul, resolve_params_path
from .args import _positive_int, params_arg


def format_prediction(p) -> str:
    """A two-column table of one prediction."""
    align = ", ".join(
        f"{a.dim}={a.size} ({a.status}" + (f", next aligned {a.next_aligned}" if
                                            a.status == "misaligned" else "") + ")"
        for a in p.alignment)
    rows = [
        ("GEMM", f"C[{p.batch}, {p.m}, {p.n}] = A[{p.batch}, {p.m}, {p.k}] @ B[{p.batch}, "
                 f"{p.k}, {p.n}]  (layout {p.layout})"),
        ("GPU / dtype", f"{p.gpu} / {p.dtype} (dense peak {p.peak_tflops:.1f} TFLOP/s)"),
        ("predicted time", f"{p.time_s * 1e6:.2f} us"),
        ("predicted TFLOP/s", f"{p.tflops:.1f}"),
        ("% of peak", f"{100 * p.efficiency:.1f}%"),
        ("bound", p.bound),
        ("tile (tm, tn)", f"{p.tile[0]} x {p.tile[1]}" + (f", split-K {p.split_k}"
                                                            if p.split_k > 1 else "")),
        ("tile efficiency", f"{100 * p.tile_efficiency:.1f}%"),
        ("CTAs / waves", f"{p.ctas} / {p.waves}"),
        ("wave efficiency", f"{100 * p.wave_efficiency:.1f}%"),
        ("compute / memory time", f"{p.compute_time_s * 1e6:.2f} / {p.memory_time_s * 1e6:.2f} us"),
        ("alignment", align),
    ]
    return tabulate(rows, tablefmt="simple")


def run(args) -> int:
    p = predict_matmul(args.m, args.n, args.k, batch=args.batch, dtype=args.dtype,
                       gpu=args.gpu, layout=args.layout)
    if args.json:
        print(json.dumps(p.to_dict(), indent=2, sort_keys=True))
    else:
        print(format_prediction(p))
        path = resolve_params_path()
        if not is_default_params(path):
            print(f"note: GEMM model constants from {path} (over the packaged ones)")
    return 0


def add_parser(sub) -> argparse.ArgumentParser:
    """The ``predict`` command's parser."""
    pp = sub.add_parser("predict", help="predict one GEMM's time and efficiency",
                        description="Predict C[batch,M,N] = A[batch,M,K] @ B[batch,K,N].")
    pp.add_argument("--m", type=_positive_int, required=True, help="rows of A and C (tokens)")
    pp.add_argument("--n", type=_positive_int, required=True, help="columns of B and C")
    pp.add_argument("--k", type=_positive_int, required=True, help="reduction dimension")
    pp.add_argument("--batch", type=_positive_int, default=1, help="batched GEMMs (default 1)")
    pp.add_argument("--gpu", default="h100", help="GPU name or alias (default h100; "
                                                  "see `fxshape gpus`)")
    pp.add_argument("--dtype", default="bf16",
                    help="fp16, bf16, tf32, fp32 (no TF32) or fp8 (default bf16)")
    pp.add_argument("--layout", default="nn", choices=LAYOUTS,
                    help="operand layout: nn = torch.mm, nt = F.linear (default nn)")
    pp.add_argument("--json", action="store_true", help="print JSON instead of a table")
    pp.set_defaults(func=run)
    params_arg(pp)
    return pp
