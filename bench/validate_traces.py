#!/usr/bin/env python
"""fxshape's per-operator predictions against real profiler traces (``fxshape compare``).

    python bench/validate_traces.py [--format github] [TRACE[:GPU] ...]

Default traces: the three of ``../shared/calibration/traces`` (HTA's test data: two ranks of
a 128-GPU A100 training run, TF32 GEMMs from cuBLAS and CUTLASS, and a tiny MI250 step),
with their GPUs (the A100 traces carry no device properties: A100 SXM4 40GB, the HTA data's
machine class, is assumed). They are development data, used to build and test the trace
reader; one constant is fitted to rank 0 (the TF32 narrow-load ratio,
``bench/fit_tf32_trace.py``), and the project is judged on other traces.

Prints, per trace, the share of device time paired with an operator and with a model, and
the error per class (median and p90 of |predicted / measured - 1|, the median signed, how
many within 20%). Deterministic; a few seconds.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tabulate import tabulate  # noqa: E402

from fxshape.fit.calibration import calibration_dir  # noqa: E402
from fxshape.traces import compare_trace  # noqa: E402

_DIR = os.path.join(calibration_dir(), "traces")
DEFAULT = ((os.path.join(_DIR, "hta_a100_128rank_sampled_rank0.json.gz"), "a100-sxm4-40gb"),
           (os.path.join(_DIR, "hta_a100_128rank_sampled_rank1.json.gz"), "a100-sxm4-40gb"),
           (os.path.join(_DIR, "hta_mi250_minitoy_train.json.gz"), "mi250-gcd"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="*", help="TRACE or TRACE:GPU (default: the shared ones)")
    ap.add_argument("--format", default="simple")
    args = ap.parse_args(argv)
    todo = [tuple(t.rsplit(":", 1)) if ":" in t else (t, None) for t in args.traces] \
        or DEFAULT
    summary, classes = [], []
    for path, gpu in todo:
        c = compare_trace(path, gpu=gpu)
        name = os.path.basename(path)
        summary.append((name, c.gpu, f"{c.kernel_s * 1e3:.2f}",
                        f"{100 * c.attributed_fraction:.1f}", f"{100 * c.modelled_fraction:.1f}",
                        f"{c.idle_s * 1e3:.2f}"))
        for k in c.by_class:
            classes.append((name, k.cls, k.ops, f"{k.measured_s * 1e3:.3f}",
                            f"{k.predicted_s * 1e3:.3f}", f"{100 * k.median:.1f}",
                            f"{100 * k.p90:.1f}", f"{100 * k.signed_median:+.1f}",
                            f"{k.within_20}/{k.ops}"))
    print(tabulate(summary, headers=("trace", "gpu", "device ms", "attributed %",
                                     "with a model %", "idle ms"), tablefmt=args.format,
                   disable_numparse=True))
    print()
    print(tabulate(classes, headers=("trace", "class", "ops", "measured ms", "predicted ms",
                                     "median abs err %", "p90 %", "median signed %",
                                     "within 20%"), tablefmt=args.format,
                   disable_numparse=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
