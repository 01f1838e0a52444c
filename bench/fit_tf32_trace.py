#!/usr/bin/env python
"""Fit the TF32 GEMM constants (``tf32_issue_ratio``, ``tf32_mainloop_eff``) from a trace.

    python bench/fit_tf32_trace.py [--fit TRACE:GPU] [--check TRACE:GPU ...] [--write]

The GEMM model's constants are fitted on fp16 sweeps (``bench/fit_model.py``); cuBLAS's sm80
TF32 kernels (``cutlass_80_tensorop_s1688gemm_...``) differ from the fp16 ones in two ways
the fp16 data cannot show, each one number per architecture:

- ``ld_issue_ratio`` multiplies ``ld_issue_clk``, the mainloop time each extra operand load
  costs a kernel whose operands are not 16-byte aligned: the ``..._align1`` kernels copy one
  4-byte element per ``cp.async`` (on the shared A100 trace they ran 30% slower than the
  fp16 figure says);
- ``mainloop_eff`` multiplies ``e_max``, the fraction of the datasheet peak a CTA's mainloop
  sustains: aligned TF32 GEMMs with a long reduction per CTA were predicted 40% too fast
  with the fp16 ``e_max``, short ones matched (a likely cause, not measured: TF32 MMAs are fed from
  shared memory by 32-bit loads where fp16 ones use ``ldmatrix``).

Both are fitted together to the TF32 GEMMs of one trace that ran alone (no collective beside
them), each priced as the kernel that ran (its tile and split-K from the trace): the pair
of least median absolute log error (the per-GEMM figure traces are judged on), by a grid
search (coarse, then fine around the best; deterministic, the first best kept on ties).
``--zero-bias`` fits instead each constant to zero the median log error of the GEMMs it
governs (``mainloop_eff`` on the aligned kernels, which pay no narrow loads, then
``ld_issue_ratio`` on the narrow ones), to compare.

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
_PACKAGED = gemm._tf32_params
OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fxshape",
                   "data", "tf32_params.json")


def _split(spec: str):
    path, _, gpu = spec.rpartition(":")
    return (path, gpu) if path else (spec, None)


def _with(arch: str, ratio: float, eff: float):
    """Predict with these TF32 constants for ``arch`` (the packaged file's other entries
    kept)."""
    base = json.loads(json.dumps(_PACKAGED()))
    base.setdefault("archs", {})[arch] = {"ld_issue_ratio": ratio, "mainloop_eff": eff}
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


def _loss(rows) -> float:
    """The median absolute log error (the per-GEMM figure the traces are judged on)."""
    return statistics.median(abs(math.log1p(e)) for e, _ in rows)


def _grid(lo, hi, step):
    n = int(round((hi - lo) / step))
    return [round(lo + i * step, 4) for i in range(n + 1)]


def fit(path, gpu, arch):
    """The ``(ratio, eff)`` of least median absolute log error over ``path``'s TF32 GEMMs
    that ran alone: a grid (ratio 1..4 by 0.25, eff 0.6..1 by 0.05), then a finer one
    around its best (by 0.05 and 0.01); the first best is kept on ties."""
    best = None

    def search(ratios, effs):
        nonlocal best
        for eff in effs:
            for ratio in ratios:
                _with(arch, ratio, eff)
                loss = _loss(tf32_rows(path, gpu))
                if best is None or loss < best[0] - 1e-12:
                    best = (loss, ratio, eff)

    search(_grid(1.0, 4.0, 0.25), _grid(0.6, 1.0, 0.05))
    _, r0, e0 = best
    search(_grid(max(1.0, r0 - 0.25), r0 + 0.25, 0.05),
           _grid(max(0.5, e0 - 0.05), min(1.0, e0 + 0.05), 0.01))
    return best[1], best[2]


def _median_log(rows, narrow: bool) -> float:
    return statistics.median(math.log1p(e) for e, nar in rows if nar == narrow)


def _bisect(f, lo, hi, rising: bool, steps: int = 12) -> float:
    """The root of the monotonic ``f`` on [lo, hi] (``rising``: f grows with x), to
    (hi - lo) / 2**steps, rounded to 3 decimals; an end of the range if f keeps one sign."""
    for _ in range(steps):
        mid = (lo + hi) / 2
        if (f(mid) < 0) == rising:
            lo = mid
        else:
            hi = mid
    return round((lo + hi) / 2, 3)


def fit_zero_bias(path, gpu, arch):
    """``(ratio, eff)``, each zeroing the median log error of the GEMMs it governs."""
    def aligned(eff):
        _with(arch, 1.0, eff)
        return _median_log(tf32_rows(path, gpu), False)

    eff = min(1.0, _bisect(aligned, 0.5, 1.0, rising=False))  # lower eff: slower

    def narrow(ratio):
        _with(arch, ratio, eff)
        return _median_log(tf32_rows(path, gpu), True)

    return max(1.0, _bisect(narrow, 1.0, 8.0, rising=True)), eff


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fit", default=FIT, help="TRACE:GPU to fit on")
    ap.add_argument("--check", nargs="*", default=list(CHECK), help="TRACE:GPU to check on")
    ap.add_argument("--write", action="store_true", help=f"write {os.path.relpath(OUT)}")
    ap.add_argument("--zero-bias", action="store_true",
                    help="fit each constant to zero its GEMMs' median log error instead")
    args = ap.parse_args(argv)
    path, gpu = _split(args.fit)
    arch = get_gpu(gpu).arch
    packaged = gemm._tf32_params
    _with(arch, 1.0, 1.0)
    before = tf32_rows(path, gpu)
    print(f"fit trace {path} ({gpu}, {arch}); the fp16 constants: " + _summary(before))
    ratio, eff = (fit_zero_bias if args.zero_bias else fit)(path, gpu, arch)
    _with(arch, ratio, eff)
    after = tf32_rows(path, gpu)
    print(f"fitted ld_issue_ratio = {ratio}, mainloop_eff = {eff} on {len(after)} TF32 "
          "GEMMs: " + _summary(after))
    checks = {}
    for spec in args.check:
        cpath, cgpu = _split(spec)
        _with(arch, 1.0, 1.0)
        b = tf32_rows(cpath, cgpu)
        _with(arch, ratio, eff)
        a = tf32_rows(cpath, cgpu)
        print(f"check {cpath} ({cgpu}): fp16 constants: {_summary(b)}\n"
              f"    fitted: {_summary(a)}")
        checks[os.path.basename(cpath)] = {
            "tf32_gemms": len(a),
            "median_abs_error_before": round(statistics.median(abs(e) for e, _ in b), 4),
            "median_abs_error_after": round(statistics.median(abs(e) for e, _ in a), 4)}
    gemm._tf32_params = packaged
    gemm._predict_cached.cache_clear()
    if args.write:
        data = json.loads(json.dumps(packaged()))
        data.setdefault("archs", {})[arch] = {
            "ld_issue_ratio": ratio,
            "mainloop_eff": eff,
            "fitted_on": f"{os.path.basename(path)} as {gpu}: {len(after)} TF32 GEMMs that "
                         "ran alone, priced as the kernel that ran; "
                         + ("each constant zeroing its GEMMs' median log error"
                            if args.zero_bias else "least median absolute log error"),
            "median_abs_error_in_sample": round(statistics.median(abs(e) for e, _ in after),
                                                4),
            "checked_on (same job, another rank: not independent)": checks}
        with open(OUT, "w") as f:
            json.dump(data, f, indent=2, sort_keys=True)
            f.write("\n")
        print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
