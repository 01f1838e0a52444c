#!/usr/bin/env python
"""Fit the TF32 narrow-load constant (``tf32_issue_ratio``) from a profiler trace.

    python bench/fit_tf32_trace.py [--fit TRACE:GPU] [--check TRACE:GPU ...] [--write]

The GEMM model's ``ld_issue_clk`` (the mainloop time each extra operand load costs a kernel
whose operands are not 16-byte aligned) is fitted on fp16 sweeps (``bench/fit_model.py``).
cuBLAS's sm80 TF32 kernels for such operands (``cutlass_80_tensorop_s1688gemm_..._align1``)
copy one 4-byte element per ``cp.async`` and run slower against their aligned twins than the
fp16 figure says: on the shared A100 trace the aligned (``align4``) TF32 GEMMs are predicted
within a few percent in the median, the narrow ones 30% too fast. This script fits one
number per architecture, the multiplier of ``ld_issue_clk`` for TF32 kernels, to the TF32
GEMMs of one trace that ran alone (no collective beside them) with misaligned operands,
each priced as the kernel that ran (its tile and split-K from the trace): the multiplier
that zeroes their median log error (bisection; the error is monotonic in it).

Fitted on rank 0 of the shared 128-GPU A100 trace; checked on rank 1 of the same job (the
same model and shapes on another GPU: a check of the fit's stability, not an independent
validation, which needs other traces: ``bench/validate_traces.py TRACE:GPU``). ``--write``
stores the result in ``fxshape/data/tf32_params.json``. Deterministic; about a minute.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fxshape.cost import gemm  # noqa: E402
from fxshape.cost.gemm import load_class  # noqa: E402
from fxshape.fit.calibration import calibration_dir  # noqa: E402
from fxshape.hardware.gpus import get_gpu  # noqa: E402
from fxshape.traces import compare_trace  # noqa: E402

_DIR = os.path.join(calibration_dir(), "traces")
FIT = os.path.join(_DIR, "hta_a100_128rank_sampled_rank0.json.gz") + ":a100-sxm4-40gb"
CHECK = (os.path.join(_DIR, "hta_a100_128rank_sampled_rank1.json.gz") + ":a100-sxm4-40gb",)
OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fxshape",
                   "data", "tf32_params.json")


def _split(spec: str):
    path, _, gpu = spec.rpartition(":")
    return (path, gpu) if path else (spec, None)


def _with_ratio(arch: str, ratio: float):
    """Predict with ``ratio`` for ``arch`` (the packaged file's other entries kept)."""
    base = json.loads(json.dumps(gemm._tf32_params()))
    base.setdefault("archs", {})[arch] = {"ld_issue_ratio": ratio}
    gemm._tf32_params = lambda: base
    gemm._predict_cached.cache_clear()


def tf32_rows(path, gpu):
    """``(error, narrow?)`` of the trace's TF32 GEMMs that ran alone, as run."""
    c = compare_trace(path, gpu=gpu)
    out = []
    for r in c.ops:
        if r.cls != "gemm" or r.error is None or r.sms is not None or not r.gemm:
            continue
        b, m, n, k, dkey, layout = r.gemm
        if dkey == "tf32":
            out.append((r.error, load_class(m, n, k, dkey, layout) > 0))
    return out


def _summary(rows):
    def stats(xs):
        if not xs:
            return "none"
        return (f"{len(xs)} GEMMs, median |err| {100 * statistics.median(abs(x) for x in xs):.1f}%"
                f", signed {100 * statistics.median(xs):+.1f}%")
    return (f"narrow: {stats([e for e, nar in rows if nar])}; "
            f"aligned: {stats([e for e, nar in rows if not nar])}; "
            f"all: {stats([e for e, _ in rows])}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fit", default=FIT, help="TRACE:GPU to fit on")
    ap.add_argument("--check", nargs="*", default=list(CHECK), help="TRACE:GPU to check on")
    ap.add_argument("--write", action="store_true", help=f"write {os.path.relpath(OUT)}")
    args = ap.parse_args(argv)
    path, gpu = _split(args.fit)
    arch = get_gpu(gpu).arch
    packaged = gemm._tf32_params
    _with_ratio(arch, 1.0)
    before = tf32_rows(path, gpu)
    print(f"fit trace {path} ({gpu}, {arch}); ratio 1 (the fp16 ld_issue_clk): "
          + _summary(before))

    def median_log(ratio):
        _with_ratio(arch, ratio)
        errs = [e for e, nar in tf32_rows(path, gpu) if nar]
        return statistics.median(math.log1p(e) for e in errs), len(errs)

    lo, hi = 1.0, 8.0
    if median_log(lo)[0] >= 0:
        ratio = lo
    else:
        for _ in range(12):  # bisection to ~0.002
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if median_log(mid)[0] < 0 else (lo, mid)
        ratio = round((lo + hi) / 2, 3)
    _with_ratio(arch, ratio)
    after = tf32_rows(path, gpu)
    n_fit = sum(nar for _, nar in after)
    print(f"fitted ld_issue_ratio = {ratio} on {n_fit} narrow TF32 GEMMs: " + _summary(after))
    checks = {}
    for spec in args.check:
        cpath, cgpu = _split(spec)
        _with_ratio(arch, 1.0)
        b = tf32_rows(cpath, cgpu)
        _with_ratio(arch, ratio)
        a = tf32_rows(cpath, cgpu)
        print(f"check {cpath} ({cgpu}): ratio 1: {_summary(b)}\n    fitted: {_summary(a)}")
        narrow = [e for e, nar in a if nar]
        checks[os.path.basename(cpath)] = {
            "narrow_gemms": len(narrow),
            "median_abs_error_before": round(statistics.median(abs(e) for e, nar in b if nar), 4),
            "median_abs_error_after": round(statistics.median(abs(e) for e in narrow), 4)}
    gemm._tf32_params = packaged
    gemm._predict_cached.cache_clear()
    if args.write:
        data = json.loads(json.dumps(packaged()))
        data.setdefault("archs", {})[arch] = {
            "ld_issue_ratio": ratio,
            "fitted_on": f"{os.path.basename(path)} as {gpu}: {n_fit} TF32 GEMMs with "
                         "operands not 16-byte aligned that ran alone, priced as the kernel "
                         "that ran",
            "median_abs_error_in_sample": round(statistics.median(
                abs(e) for e, nar in after if nar), 4),
            "checked_on (same job, another rank: not independent)": checks}
        with open(OUT, "w") as f:
            json.dump(data, f, indent=2, sort_keys=True)
            f.write("\n")
        print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
