#!/usr/bin/env python
"""fxshape's per-operator predictions against real profiler traces (``fxshape compare``).

    python bench/validate_traces.py [--format github] [--calibration] [TRACE[:GPU] ...]

Default traces: the three of ``../shared/calibration/traces`` (HTA's test data: two ranks of
a 128-GPU A100 training run, TF32 GEMMs from cuBLAS and CUTLASS, and a tiny MI250 step),
with their GPUs (the A100 traces carry no device properties: A100 SXM4 40GB, the HTA data's
machine class, is assumed). They are development data, used to build and test the trace
reader; two constants are fitted to rank 0 (TF32's narrow-load ratio and mainloop
efficiency, ``bench/fit_tf32_trace.py``), and the project is judged on other traces.

Prints, per trace, the share of device time paired with an operator and with a model, the
error per class (median and p90 of |predicted / measured - 1|, the median signed, how many
within 20%) and the GEMMs' error by setting (alone, beside a collective, the model's own
kernel choice). ``--calibration``: ``calibrate --trace`` on the first trace (its held-out
figures), then the second predicted without and with the file it wrote (what docs/traces.md
quotes). Deterministic; a few seconds (about 15 more with ``--calibration``).
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
    ap.add_argument("--calibration", action="store_true",
                    help="calibrate on the first trace, check on the second")
    args = ap.parse_args(argv)
    todo = [tuple(t.rsplit(":", 1)) if ":" in t else (t, None) for t in args.traces] \
        or DEFAULT
    summary, classes, settings = [], [], []
    for path, gpu in todo:
        c = compare_trace(path, gpu=gpu)
        name = os.path.basename(path)
        settings += [_row(name, k) for k in c.gemm_by_setting]
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
    print()
    print(tabulate(settings, headers=_SETTING_HEADERS, tablefmt=args.format,
                   disable_numparse=True))
    if args.calibration:
        print()
        _calibration(todo[0], todo[1], args.format)
    return 0


_SETTING_HEADERS = ("trace", "GEMMs by setting", "ops", "median abs err %", "median signed %",
                    "within 20%")


def _row(name, k):
    return (name, k.cls, k.ops, f"{100 * k.median:.1f}", f"{100 * k.signed_median:+.1f}",
            f"{k.within_20}/{k.ops}")


def _calibration(fit, check, fmt):
    """``calibrate --trace`` on ``fit``; ``check`` without and with the file it wrote."""
    import tempfile

    from fxshape.traces.calibrate import calibrate_from_trace

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "calibrated.json")
        got = calibrate_from_trace(fit[0], gpu=fit[1], out=out)
        print(f"calibrate --trace {os.path.basename(fit[0])}:")
        print(got.describe().replace(out, "<file>"))
        rows = []
        name = os.path.basename(check[0])
        for label, params in (("packaged", None), ("calibrated on the first", out)):
            c = compare_trace(check[0], gpu=check[1], params_path=params)
            mem = c.class_error("memory")
            rows += [(f"{name} ({label})",) + _row("", k)[1:] for k in c.gemm_by_setting]
            if mem is not None:
                rows.append((f"{name} ({label})",) + _row("", mem)[1:])
    print()
    print(tabulate(rows, headers=_SETTING_HEADERS, tablefmt=fmt, disable_numparse=True))


if __name__ == "__main__":
    sys.exit(main())
