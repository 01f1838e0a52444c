"""``fxshape calibrate``: the GEMM model fitted to this machine's GPU, or to a trace."""

from __future__ import annotations

import argparse


def run(args) -> int:
    from ..fit.calibrate import main as calibrate_main

    if args.trace is None:
        if args.dtype is None:
            args.dtype = "bf16"
        return calibrate_main(args)
    if args.quick:
        raise ValueError("--quick sets the sweep timed on the local GPU; with --trace the "
                         "trace's kernels are the measurements: drop one of them")
    from ..traces.calibrate import calibrate_from_trace

    got = calibrate_from_trace(args.trace, gpu=args.gpu, out=args.out, dtype=args.dtype)
    print(got.describe())
    print(f"use it with: FXSHAPE_PARAMS={got.out} fxshape analyze ...   or   "
          f"params={got.out!r}")
    return 0


def add_parser(sub) -> argparse.ArgumentParser:
    """The ``calibrate`` command's parser."""
    pc = sub.add_parser("calibrate", help="fit the GEMM model to this machine's GPU",
                        description="Time a built-in GEMM sweep on the local CUDA device, "
                                    "fit the model's constants, write a parameter file.")
    pc.add_argument("--quick", action="store_true",
                    help="a coarser sweep and fewer repeats (under 3 minutes)")
    pc.add_argument("--out", default="fxshape_params.json",
                    help="parameter file to write (default fxshape_params.json)")
    pc.add_argument("--gpu", default=None,
                    help="fxshape GPU name (default: detected from the device name)")
    pc.add_argument("--dtype", default=None,
                    help="fp16, bf16 or tf32 (default bf16; with --trace, the trace's most "
                         "common GEMM dtype)")
    pc.add_argument("--trace", default=None, metavar="TRACE",
                    help="fit to the GEMM and memory-bound kernels of this PyTorch "
                         "profiler trace instead of timing a sweep on the local GPU (no GPU "
                         "needed)")
    pc.set_defaults(func=run)
    return pc
