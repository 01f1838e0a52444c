"""``fxshape compare``: a profiler trace against the model."""

from __future__ import annotations

import argparse
import sys

from .args import params_arg


def run(args) -> int:
    from ..traces import compare_trace

    if args.worst < 0:
        raise ValueError(f"--worst must be 0 or more, got {args.worst}")
    got = compare_trace(args.trace, gpu=args.gpu)
    if args.format == "json":
        print(got.to_json())
    elif args.format == "csv":
        sys.stdout.write(got.to_csv())
    else:
        sys.stdout.write(got.to_markdown(worst=args.worst))
    return 0


def add_parser(sub) -> argparse.ArgumentParser:
    """The ``compare`` command's parser."""
    pt = sub.add_parser("compare", help="compare a PyTorch profiler trace with the model",
                        description="Pair every kernel of a PyTorch profiler (Kineto) trace "
                                    "with the operator that launched it, predict each "
                                    "operator from its recorded shapes, and report the "
                                    "error per class, the worst operators and the device "
                                    "time the model cannot attribute.")
    pt.add_argument("trace", help="the trace: prof.export_chrome_trace's JSON, or .json.gz")
    pt.add_argument("--gpu", default=None,
                    help="the GPU it ran on (default: the trace's deviceProperties)")
    pt.add_argument("--format", choices=("markdown", "json", "csv"), default="markdown",
                    help="markdown (default): the summary; json: every record; csv: one "
                         "line per operator")
    pt.add_argument("--worst", type=int, default=10,
                    help="operators listed as the worst (markdown; default 10)")
    pt.set_defaults(func=run)
    params_arg(pt)
    return pt
