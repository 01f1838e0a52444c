"""``fxshape sweep``: predicted throughput across a hyperparameter's range."""

from __future__ import annotations

import argparse

from tabulate import tabulate

from .args import (SWEEP_FLAGS, _check_plot_path, _quantize_args, advise_args, params_arg,
                   setup_keywords)
from .shared import _model_config


def run(args) -> int:
    from ..report.plot import plot_sweep
    from ..codesign.advise import parse_range, sweep

    values = parse_range(args.range)
    if args.out:
        _check_plot_path(args.out, "--out")
    model = _model_config(args.target)
    points = sweep(model, args.param, values, **setup_keywords(args, SWEEP_FLAGS))
    rows = [(p.value, "-" if p.tflops is None else f"{p.tflops:.1f}",
             "-" if p.time_s is None else f"{p.time_s * 1e3:.3f}",
             "-" if p.step_s is None else f"{p.step_s * 1e3:.3f}",
             "-" if p.tokens_per_s is None else f"{p.tokens_per_s:,.0f}",
             "-" if p.params is None else f"{p.params:,}", p.note) for p in points]
    print(points.header() + "\n")
    print(tabulate(rows, headers=(args.param, "TFLOP/s", "GEMM ms/step", "step ms",
                                  "tokens/s", "params", "note"), disable_numparse=True))
    if points.notes:
        print("\nnotes:\n" + "\n".join(f"- {n}" for n in points.notes))
    if points.failed:
        raise ValueError(f"every value of the sweep failed ({len(points)} of {len(points)}); "
                         f"the first: {points[0].value}: {points[0].note}")
    if args.out:
        plot_sweep(points, args.param, args.out, title=f"{args.target}: " + points.header())
        print(f"\nwrote {args.out}")
    return 0


def add_parser(sub) -> argparse.ArgumentParser:
    """The ``sweep`` command's parser."""
    ps = sub.add_parser("sweep", help="predicted throughput across a hyperparameter range",
                        description="Predict GEMM TFLOP/s for each value of one config "
                                    "attribute; draw it with --out (matplotlib).")
    advise_args(ps, "inference")
    ps.add_argument("--param", required=True, help="config attribute, e.g. hidden_size")
    ps.add_argument("--range", required=True, help="START:STOP[:STEP], STOP included")
    ps.add_argument("--out", default=None, help="write a plot (.png or .svg)")
    _quantize_args(ps, training=True)
    ps.set_defaults(func=run)
    params_arg(ps)
    return ps
