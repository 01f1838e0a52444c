#!/usr/bin/env python
"""Fit the GEMM model's constants to today's libraries: the aiconfigurator tables.

    python bench/fit_aiconfigurator.py [--calibration-dir DIR] [--out fxshape/data/perf_params.json]
                                       [--check] [--format github]

``../shared/calibration/aiconfigurator/`` holds ai-dynamo/aiconfigurator's per-operator
measurements (Apache-2.0, commit 095f58a51) of vLLM 0.24.0's linear layers on an H100 SXM
and a B200: ``F.linear(x, W)`` (cuBLAS, bf16, layout ``nt``), timed as CUDA-graph replays
cycling over 6 copies of the weight (mean per call). They are what a current PyTorch or
vLLM install runs: cuBLAS 12.8+ with Hopper's wgmma and Blackwell's tcgen05 kernels. The
packaged constants of these two GPUs were fitted to 2024 measurements (Vidur's H100, PyTorch
2.1-era cuBLAS; the B200 had none and borrowed the H100's): 11-31% median error on these
tables.

For each GPU (``PLAN``) this fits the tensor-core constants of ``fxshape.cost.gemm`` that do
not need misaligned shapes (``bench/fit_model.py``'s ``_NO_ALIGN``; the alignment constants
stay the A100 fit's, as for every GPU without a step-1 sweep) on the bf16 table:

- **held out**: every row of a quarter of the weight shapes (N, K), chosen by a hash of
  the shape (``held_out``), so no held-out row shares its weight with a fitted one;
- **fitted**: ``TRAIN_ROWS`` rows drawn (by a hash of M, N, K) from the other shapes;
- the fit is ``fxshape.fit.fitting._fit_one`` (robust least squares on log errors from
  fixed starts; deterministic), the rows timed by CUDA events around graph replays (no host
  overhead to fit).

It prints the error per GPU and regime (M <= 128, the decode-sized GEMMs; M > 128), in
sample and held out, and writes each GPU's entry under ``gpus`` of the parameter file with
``library`` (what the constants describe) and ``held_out`` (the figures printed), and the
Blackwell family's source (the B200). The 2024 fits stay reachable: ``bench/fit_model.py``
writes the Vidur H100 fit to ``fxshape/data/perf_params_2024.json``, which ``params="2024"``
(``--params 2024``) selects. ``--check`` fits and compares with the file instead of writing
(the test suite's reproducibility check; numbers to 1e-3, ``same_entry``). About 15 s on
two cores.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import zlib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

import numpy as np  # noqa: E402
from tabulate import tabulate  # noqa: E402

from fxshape.cost.gemm import (CURRENT_LIBRARY, ModelParams, model_params,  # noqa: E402
                               predict_times_array)
from fxshape.fit.calibration import CalibrationRow, calibration_dir  # noqa: E402
from fxshape.fit.fitting import _START, _STARTS, _Problem, _fit_one, _round  # noqa: E402
from fxshape.hardware.gpus import get_gpu  # noqa: E402

from fit_model import _NO_ALIGN  # noqa: E402

SOURCE = "ai-dynamo/aiconfigurator@095f58a51"
#: (fxshape GPU, table prefix in aiconfigurator/)
PLAN = (("h100-sxm", "h100_sxm"), ("b200", "b200_sxm"))
#: the GPU each family's constants come from, for the families this script fits
FAMILIES = {"hopper": "h100-sxm", "blackwell": "b200"}
TRAIN_ROWS = 3000
#: the starting points of the least-squares fit: the two of ``fxshape.fit.fitting``'s six
#: that win on these tables (the fifth on the B200, the sixth on the H100; from each of the
#: other four the fit ends worse on both GPUs, which the full set was run to show)
STARTS = _STARTS[4:6]
HELD_OUT_MOD = 4  # one weight shape in four is held out
TIMING = "cuda-graph-mean"
#: the GEMM regimes the issue's targets are stated for
REGIMES = (("M<=128", 1, 128), ("M>128", 129, 1 << 62))


def held_out(n: int, k: int) -> bool:
    """Is the weight shape (N, K) held out? A hash of the shape, not a random draw: the
    same on every machine and Python."""
    return zlib.crc32(f"{n}x{k}".encode()) % HELD_OUT_MOD == 0


def table_path(name: str, directory: str | None = None) -> str:
    """The path of ``aiconfigurator/<name>.csv`` in the calibration folder;
    ``FileNotFoundError`` saying where the tables live when it is not there."""
    path = os.path.join(calibration_dir(directory), "aiconfigurator", f"{name}.csv")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} not found: the aiconfigurator tables live in "
                                f"../shared/calibration/aiconfigurator (see its README)")
    return path


def shown_path(path: str) -> str:
    """``path`` as a check prints it: relative to the repository when inside it (the same
    line on every machine, which docs/ show)."""
    return os.path.relpath(path, ROOT) if os.path.abspath(path).startswith(ROOT) else path


def write_json(path: str, data) -> None:
    """Write a parameter file as the fit scripts do: indented by one, keys sorted, a final
    newline (the packaged files diff line by line)."""
    with open(path, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.write("\n")


def read_gemm_table(prefix: str, dtype: str = "bfloat16", directory: str | None = None):
    """The rows of ``aiconfigurator/<prefix>_gemm_perf.csv`` with ``gemm_dtype == dtype``,
    as calibration rows (``nt``: vLLM's ``F.linear``, M = tokens)."""
    path = table_path(f"{prefix}_gemm_perf", directory)
    rows = []
    with open(path, newline="") as f:
        for rec in csv.DictReader(f):
            if rec["gemm_dtype"] != dtype:
                continue
            rows.append(CalibrationRow(SOURCE, f"gemm {dtype} {rec['kernel_source']}", prefix,
                                       "linear", "nt", "bf16" if dtype == "bfloat16" else dtype,
                                       1, int(rec["m"]), int(rec["n"]), int(rec["k"]),
                                       float(rec["time_s"]), TIMING))
    if not rows:
        raise ValueError(f"{path}: no rows of gemm_dtype {dtype!r}")
    return rows


def split(rows):
    """(fitted rows, held-out rows): the held-out weight shapes' rows, and ``TRAIN_ROWS``
    of the others chosen by a hash of (M, N, K) (all of them if there are fewer)."""
    held = [r for r in rows if held_out(r.n, r.k)]
    rest = [r for r in rows if not held_out(r.n, r.k)]
    rest.sort(key=lambda r: (zlib.crc32(f"{r.m}x{r.n}x{r.k}".encode()), r.m, r.n, r.k))
    return rest[:TRAIN_ROWS], held


def errors(spec, params: ModelParams, rows):
    """Signed relative errors (predicted / measured - 1) of ``rows`` under ``params``."""
    m = np.array([r.m for r in rows])
    pred = predict_times_array(spec, "bf16", np.ones(len(rows), dtype=np.int64), m,
                               np.array([r.n for r in rows]), np.array([r.k for r in rows]),
                               np.array([r.layout for r in rows]), params)
    return pred / np.array([r.time_s for r in rows]) - 1.0, m


def summary(err, m) -> dict:
    """Per regime: rows, median and p90 absolute error, median signed error (fractions)."""
    out = {}
    for name, lo, hi in REGIMES:
        e = err[(m >= lo) & (m <= hi)]
        if len(e):
            out[name] = {"n": int(len(e)), "median": _round(float(np.median(abs(e)))),
                         "p90": _round(float(np.percentile(abs(e), 90))),
                         "signed_median": _round(float(np.median(e)))}
    return out


def fit_gpu(name: str, prefix: str, directory=None):
    """Fit one GPU: (its parameter-file entry, the held-out errors of the constants it had
    from the 2022-2024 fits, ``params="2024"``)."""
    spec = get_gpu(name)
    rows = read_gemm_table(prefix, directory=directory)
    train, held = split(rows)
    fixed = dict(_START)
    base = model_params("a100-sxm4-40gb")  # the alignment constants (bench/fit_model.py)
    fixed.update({f: getattr(base, f) for f in ModelParams.STORED})
    params, _, _ = _fit_one(_Problem(train, spec), _NO_ALIGN, fixed, starts=STARTS)
    entry = {f: _round(getattr(params, f)) for f in ModelParams.STORED}
    params = ModelParams(**{f: entry[f] for f in ModelParams.STORED})  # as the file has it
    before = summary(*errors(spec, model_params(spec, "2024"), held))
    entry.update(fitted=sorted(_NO_ALIGN), rows=len(train), library=CURRENT_LIBRARY,
                 source=f"bench/fit_aiconfigurator.py: {SOURCE} {prefix}_gemm_perf.csv "
                        f"(bf16, vLLM 0.24.0 F.linear, CUDA-graph replay)",
                 in_sample=summary(*errors(spec, params, train)),
                 held_out=summary(*errors(spec, params, held)))
    return entry, before


def fit(directory=None):
    return {name: fit_gpu(name, prefix, directory) for name, prefix in PLAN}


def table(results) -> list[list]:
    out = []
    for name, (entry, before) in results.items():
        for regime, _, _ in REGIMES:
            b, i, h = before.get(regime), entry["in_sample"].get(regime), \
                entry["held_out"].get(regime)
            out.append([name, "bf16", regime, h["n"],
                        f"{100 * b['median']:.1f}% / {100 * b['p90']:.0f}%",
                        f"{100 * i['median']:.1f}% / {100 * i['p90']:.0f}%",
                        f"{100 * h['median']:.1f}% / {100 * h['p90']:.0f}%",
                        f"{100 * h['signed_median']:+.1f}%"])
    return out


HEADERS = ("gpu", "dtype", "regime", "held-out rows", "2024 constants: median / p90",
           "in sample", "held out", "held out, signed median")


def write(results, path: str) -> None:
    with open(path) as f:
        data = json.load(f)
    for name, (entry, _) in results.items():
        data["gpus"][name] = entry
        data.setdefault("measurement", {})[name] = {}
    for arch, src in FAMILIES.items():
        data["families"][arch] = {"from": src}
    write_json(path, data)


def same_entry(have, new, rel: float = 1e-3) -> bool:
    """Whether a file's entry ``have`` is the refit ``new``: the same keys and text, every
    number within ``rel`` of the refit's (another CPU's BLAS sums in another order and can
    move the 5th digit a constant is rounded to)."""
    if isinstance(new, dict):
        return isinstance(have, dict) and set(have) == set(new) and \
            all(same_entry(have[k], v, rel) for k, v in new.items())
    if isinstance(new, list):
        return isinstance(have, list) and len(have) == len(new) and \
            all(same_entry(a, b, rel) for a, b in zip(have, new))
    if isinstance(new, float) and isinstance(have, (int, float)) \
            and not isinstance(have, bool):
        return abs(have - new) <= rel * abs(new)
    return have == new


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--calibration-dir", default=None)
    ap.add_argument("--out", default=os.path.join(ROOT, "fxshape", "data", "perf_params.json"))
    ap.add_argument("--check", action="store_true",
                    help="fit and compare with --out instead of writing it")
    ap.add_argument("--format", default="simple", help="tabulate format (github for docs)")
    args = ap.parse_args(argv)
    results = fit(args.calibration_dir)
    print(tabulate(table(results), headers=HEADERS, tablefmt=args.format,
                   disable_numparse=True))
    if args.check:
        with open(args.out) as f:
            have = json.load(f)["gpus"]
        bad = [n for n, (e, _) in results.items() if not same_entry(have.get(n), e)]
        print("matches " + shown_path(args.out) if not bad else f"differs for {', '.join(bad)}")
        return 1 if bad else 0
    write(results, args.out)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
