#!/usr/bin/env python
"""fxshape's per-operator predictions against real profiler traces (``fxshape compare``).

    python bench/validate_traces.py [--format github] [--calibration] [--legacy]
                                    [TRACE[:GPU] ...]

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
quotes). ``--legacy``: the first trace rewritten as PyTorch's first Kineto traces were
written (categories ``Operator`` / ``Runtime`` / ``Kernel`` / ``Memcpy`` / ``Memset``,
``Input dims``, no ``Input type``), compared operator by operator with the trace as recorded:
how many are priced alike once the element types come from the kernels' names. Deterministic;
a few seconds (about 15 more with ``--calibration``, 10 with ``--legacy``).
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
    ap.add_argument("--legacy", action="store_true",
                    help="the first trace without 'Input type', in the first Kineto format")
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
    if args.legacy:
        print()
        _legacy(todo[0], args.format)
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


_LEGACY_CATS = {"cpu_op": "Operator", "cuda_runtime": "Runtime", "cuda_driver": "Runtime",
                "kernel": "Kernel", "gpu_memcpy": "Memcpy", "gpu_memset": "Memset"}


def _legacy(trace, fmt):
    """``trace`` as the first Kineto traces were written, operator by operator against the
    trace as recorded: priced alike (the same class and time), priced otherwise, or without
    a model only there (its kernels' names do not say one element type)."""
    import collections
    import gzip
    import json
    import tempfile

    with gzip.open(trace[0], "rt") if trace[0].endswith(".gz") else open(trace[0]) as f:
        doc = json.load(f)
    for e in doc["traceEvents"]:
        if e.get("cat") in _LEGACY_CATS:
            e["cat"] = _LEGACY_CATS[e["cat"]]
        a = e.get("args")
        if isinstance(a, dict) and "Input Dims" in a:
            a["Input dims"] = a.pop("Input Dims")
            a.pop("Input type", None)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "legacy.json")
        with open(path, "w") as f:
            json.dump(doc, f)
        old = compare_trace(path, gpu=trace[1])
    new = compare_trace(trace[0], gpu=trace[1])
    counts = collections.defaultdict(collections.Counter)
    for o, n in zip(old.ops, new.ops):
        assert o.index == n.index and o.name == n.name
        if n.predicted_s is None:
            continue
        how = ("alike" if (o.cls, o.predicted_s) == (n.cls, n.predicted_s)
               else "no model" if o.predicted_s is None else "otherwise")
        counts[n.cls][how] += 1
    rows = [(os.path.basename(trace[0]), cls, sum(c.values()), c["alike"], c["otherwise"],
             c["no model"]) for cls, c in sorted(counts.items())]
    print(tabulate(rows, headers=("trace without Input type", "class", "priced ops",
                                  "priced alike", "priced otherwise",
                                  "no model (types unknown)"), tablefmt=fmt,
                   disable_numparse=True))


if __name__ == "__main__":
    sys.exit(main())
