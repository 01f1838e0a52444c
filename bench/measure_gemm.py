#!/usr/bin/env python
"""Measure GEMM times on your own GPU and write them in the calibration schema.

    python bench/measure_gemm.py --gpu-label h100 --out my_h100.csv [--dtype fp16]
                                 [--sweep default|quick] [--repeats 50] [--warmup 10]

Then refit on them (together with the shared data, or alone):

    FXSHAPE_CALIBRATION_DIR=folder_with_my_csv python bench/fit_model.py

Timing (fxshape/fit/measure.py): CUDA events around each call, after warm-up; the median of
``--repeats`` timed calls, with rotating operand buffers larger than twice the L2 cache.
Rows are tagged ``timing=cuda-event-median``.
Without CUDA the script says so and exits with status 2.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fxshape.fit.calibration import write_rows  # noqa: E402
from fxshape.fit.measure import (  # noqa: E402,F401  (re-exported for callers of this script)
    SOURCE, TIMING, CudaEventTimer, cuda_event_median, default_sweep, measure)


def main(argv=None):
    ap = argparse.ArgumentParser(description="Time GEMMs on this machine's GPU.")
    ap.add_argument("--gpu-label", required=True,
                    help="label for the gpu column (e.g. h100, a100); see fxshape gpus")
    ap.add_argument("--out", required=True, help="CSV file to write")
    ap.add_argument("--dtype", default="fp16")
    ap.add_argument("--sweep", choices=("default", "quick"), default="default")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=50)
    args = ap.parse_args(argv)
    try:
        timer = CudaEventTimer(args.dtype, warmup=args.warmup, repeats=args.repeats)
    except RuntimeError as exc:
        print(f"measure_gemm: {exc}: this script needs an NVIDIA or AMD GPU visible to "
              f"PyTorch (torch.cuda.is_available() is False).", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"measure_gemm: {exc}", file=sys.stderr)
        return 2
    rows = measure(default_sweep(args.sweep == "quick"), timer, gpu_label=args.gpu_label,
                   dtype=args.dtype)
    write_rows(args.out, rows)
    print(f"wrote {len(rows)} rows to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
