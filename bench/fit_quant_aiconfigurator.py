#!/usr/bin/env python
"""Fit the quantized linear layers' kernels to today's libraries: the aiconfigurator tables.

    python bench/fit_quant_aiconfigurator.py [--calibration-dir DIR]
                                             [--out fxshape/data/quant_params.json]
                                             [--check] [--format github]

``../shared/calibration/aiconfigurator/<gpu>_gemm_perf.csv`` times vLLM 0.24.0's quantized
linear layers (ai-dynamo/aiconfigurator, Apache-2.0, commit 095f58a51) as CUDA-graph replays
cycling over 6 copies of the weight: ``fp8`` (``CutlassFP8ScaledMMLinearKernel``: the
activation's dynamic per-tensor quantization and CUTLASS's ``cutlass_scaled_mm``) on the H100
SXM and the B200, ``nvfp4`` (``FlashInferCuteDslNvFp4LinearKernel``: ``scaled_fp4_quant`` and
FlashInfer's CuTe-DSL GEMM) on the B200. Before this fit fxshape priced them with the bf16
GEMM constants at the format's peak (cuBLAS's split-K and tile choice, the quantization
as a generic streaming kernel): on the H100's FP8 table 11.9% / 40.6% median off (M <= 128 /
M > 128, held-out shapes), predicted too fast at large M.

What is modelled (``fxshape.cost.quant_kernels``): the GEMM at vLLM's dispatched tile
(NVFP4: the model's tile) **without split-K**, with six tensor-core constants of its own
(``GEMM_FIELDS``; the rest stay the GPU's bf16 fit's), plus the activation's quantization
kernels (a cost per kernel, a streaming efficiency, a cost per token row). Nine constants
per kernel and GPU, fitted as ``bench/fit_aiconfigurator.py`` fits the bf16 ones:

- **held out**: every row of a quarter of the weight shapes (N, K), by a hash of the
  shape (``fit_aiconfigurator.held_out``: the same shapes as the bf16 fit's);
- **fitted**: ``TRAIN_ROWS`` of the other rows, drawn by a hash of (M, N, K);
- robust least squares (soft L1 on log errors) from ``STARTS``; the best L1 wins.

It prints the error per GPU, kernel and regime (M <= 128, M > 128) before (the generic
pricing), in sample and held out, and writes ``fxshape/data/quant_params.json``.
``--check`` fits and compares with the file instead (about 10 s on two cores).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import math
import os
import sys
import tempfile
import zlib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

import numpy as np  # noqa: E402
from scipy.optimize import least_squares  # noqa: E402
from tabulate import tabulate  # noqa: E402

from fxshape.cost.gemm import model_params  # noqa: E402
from fxshape.cost.quant import (predict_quantized, predict_quantized_times,  # noqa: E402
                                quantization_of)
from fxshape.cost.quant_kernels import (GEMM_FIELDS, QUANT_FIELDS,  # noqa: E402
                                        QUANT_KERNEL_NAMES, QuantKernelParams)
from fxshape.fit.fitting import _round  # noqa: E402
from fxshape.hardware.gpus import get_gpu  # noqa: E402

from fit_aiconfigurator import (REGIMES, SOURCE, held_out, shown_path,  # noqa: E402
                                summary, table_path, write_json)

#: (fxshape GPU, table prefix, method, the table's gemm_dtype, its kernel_source)
PLAN = (("h100-sxm", "h100_sxm", "fp8", "fp8", "CutlassFP8ScaledMMLinearKernel"),
        ("b200", "b200_sxm", "fp8", "fp8", "CutlassFP8ScaledMMLinearKernel"),
        ("b200", "b200_sxm", "nvfp4", "nvfp4", "FlashInferCuteDslNvFp4LinearKernel"))
TRAIN_ROWS = 3000
#: bounds of each constant (log-spaced where the range spans decades)
BOUNDS = {"e_max": (0.3, 1.0), "power_eff": (0.3, 1.0), "launch_s": (5e-7, 2e-5),
          "wave_s": (1e-8, 5e-5), "sm_stream_bytes_per_clk": (8.0, 512.0),
          "dram_eff": (0.3, 1.0), "quant_launch_s": (1e-7, 2e-5),
          "quant_bw_eff": (0.2, 1.0), "quant_row_s": (1e-12, 1e-7)}
LOG = ("launch_s", "wave_s", "sm_stream_bytes_per_clk", "quant_launch_s", "quant_row_s")
NAMES = GEMM_FIELDS + QUANT_FIELDS
#: starting points: the GPU's bf16 constants for the GEMM with these quantization guesses
#: and a lower mainloop efficiency (the objective has kinks where the model's tile choice
#: changes: a start from the bf16 constants themselves with quant_launch_s 2 µs, quant_bw_eff
#: 0.8 and quant_row_s 1 ns was tried beside it and ended worse on all three kernels)
STARTS = (dict(quant_launch_s=1e-6, quant_bw_eff=0.5, quant_row_s=1e-8, e_max=0.7,
               power_eff=0.6),)


def read_rows(prefix: str, dtype: str, kernel: str, directory=None):
    """``(m, n, k, time_s)`` arrays of the table's rows of ``dtype`` run by ``kernel``."""
    path = table_path(f"{prefix}_gemm_perf", directory)
    rows = []
    with open(path, newline="") as f:
        for rec in csv.DictReader(f):
            if rec["gemm_dtype"] == dtype and rec["kernel_source"] == kernel:
                rows.append((int(rec["m"]), int(rec["n"]), int(rec["k"]),
                             float(rec["time_s"])))
    if not rows:
        raise ValueError(f"{path}: no rows of {dtype} run by {kernel}")
    return tuple(np.array(c, dtype=np.int64 if i < 3 else np.float64)
                 for i, c in enumerate(zip(*rows)))


def split(m, n, k):
    """(fitted row indices, held-out row indices): the held-out weight shapes' rows, and
    ``TRAIN_ROWS`` of the others by a hash of (M, N, K)."""
    held = np.array([held_out(int(b), int(c)) for b, c in zip(n, k)])
    rest = [i for i in np.flatnonzero(~held)]
    rest.sort(key=lambda i: (zlib.crc32(f"{m[i]}x{n[i]}x{k[i]}".encode()), m[i], n[i], k[i]))
    return np.array(sorted(rest[:TRAIN_ROWS])), np.flatnonzero(held)


def _to_x(name, v):
    lo, hi = BOUNDS[name]
    if name in LOG:
        lo, hi, v = math.log(lo), math.log(hi), math.log(v)
    x = min(max((v - lo) / (hi - lo), 1e-6), 1 - 1e-6)
    return math.log(x / (1 - x))


def _from_x(name, u):
    lo, hi = BOUNDS[name]
    if name in LOG:
        lo, hi = math.log(lo), math.log(hi)
    v = lo + (hi - lo) / (1 + math.exp(-max(min(u, 50.0), -50.0)))
    return math.exp(v) if name in LOG else v


def params_of(values: dict, method: str, gpu: str, source: str = "") -> QuantKernelParams:
    return QuantKernelParams(method, tuple((f, values[f]) for f in GEMM_FIELDS),
                             *(values[f] for f in QUANT_FIELDS), gpu, source)


def predict(spec, method, values, m, n, k):
    return predict_quantized_times(spec, method, m, n, k,
                                   params_of(values, method, spec.name))


@contextlib.contextmanager
def generic_pricing():
    """fxshape.cost.quant without the fitted kernels (an empty quantized-kernel file in
    ``$FXSHAPE_QUANT_PARAMS``): the pricing before this fit."""
    old = os.environ.get("FXSHAPE_QUANT_PARAMS")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "none.json")
        with open(path, "w") as f:
            json.dump({"gpus": {}}, f)
        os.environ["FXSHAPE_QUANT_PARAMS"] = path
        try:
            yield
        finally:
            if old is None:
                del os.environ["FXSHAPE_QUANT_PARAMS"]
            else:
                os.environ["FXSHAPE_QUANT_PARAMS"] = old


def fit_one(name, prefix, method, dtype, kernel, directory=None):
    """One GPU's kernel: (its file entry, the generic pricing's held-out summary)."""
    spec = get_gpu(name)
    m, n, k, t = read_rows(prefix, dtype, kernel, directory)
    train, held = split(m, n, k)
    base = model_params(spec)
    best = None
    for start in STARTS:
        init = {**{f: getattr(base, f) for f in GEMM_FIELDS}, **start}
        x0 = np.array([_to_x(f, init[f]) for f in NAMES])

        def resid(x):
            vals = {f: _from_x(f, u) for f, u in zip(NAMES, x)}
            return np.log(predict(spec, method, vals, m[train], n[train], k[train])
                          / t[train])

        res = least_squares(resid, x0, loss="soft_l1", f_scale=0.03, diff_step=1e-3,
                            max_nfev=2000)
        score = float(np.mean(np.abs(resid(res.x))))
        if best is None or score < best[0]:
            best = (score, res.x)
    values = {f: _round(_from_x(f, u)) for f, u in zip(NAMES, best[1])}  # as the file has it

    def errors(idx):
        return predict(spec, method, values, m[idx], n[idx], k[idx]) / t[idx] - 1.0, m[idx]

    q = quantization_of(method)
    with generic_pricing():
        before = np.array([predict_quantized(int(m[i]), int(n[i]), int(k[i]), q, gpu=spec,
                                             layout="nt").prediction.time_s for i in held])
    entry = {"gemm": {f: values[f] for f in GEMM_FIELDS},
             **{f: values[f] for f in QUANT_FIELDS},
             "kernel": QUANT_KERNEL_NAMES[method], "rows": int(len(train)),
             "source": f"bench/fit_quant_aiconfigurator.py: {SOURCE} {prefix}_gemm_perf.csv "
                       f"({dtype}, vLLM 0.24.0 {kernel}, CUDA-graph replay)",
             "in_sample": summary(*errors(train)), "held_out": summary(*errors(held))}
    return entry, summary(before / t[held] - 1.0, m[held])


def fit(directory=None):
    return {(name, method): fit_one(name, prefix, method, dtype, kernel, directory)
            for name, prefix, method, dtype, kernel in PLAN}


HEADERS = ("gpu", "kernel", "regime", "held-out rows", "generic pricing: median / p90",
           "in sample", "held out", "held out, signed median")


def table(results) -> list[list]:
    out = []
    for (name, method), (entry, before) in results.items():
        for regime, _, _ in REGIMES:
            b, i, h = before[regime], entry["in_sample"][regime], entry["held_out"][regime]
            out.append([name, method, regime, h["n"],
                        f"{100 * b['median']:.1f}% / {100 * b['p90']:.0f}%",
                        f"{100 * i['median']:.1f}% / {100 * i['p90']:.0f}%",
                        f"{100 * h['median']:.1f}% / {100 * h['p90']:.0f}%",
                        f"{100 * h['signed_median']:+.1f}%"])
    return out


def as_file(results) -> dict:
    gpus = {}
    for (name, method), (entry, _) in results.items():
        gpus.setdefault(name, {})[method] = entry
    return {"about": "Quantized linear layers' kernels as vLLM 0.24 runs them, fitted by "
                     "bench/fit_quant_aiconfigurator.py (fxshape.cost.quant_kernels)",
            "gpus": gpus}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--calibration-dir", default=None)
    ap.add_argument("--out", default=os.path.join(ROOT, "fxshape", "data",
                                                  "quant_params.json"))
    ap.add_argument("--check", action="store_true",
                    help="fit and compare with --out instead of writing it")
    ap.add_argument("--format", default="simple", help="tabulate format (github for docs)")
    args = ap.parse_args(argv)
    results = fit(args.calibration_dir)
    print(tabulate(table(results), headers=HEADERS, tablefmt=args.format,
                   disable_numparse=True))
    data = as_file(results)
    if args.check:
        with open(args.out) as f:
            have = json.load(f)
        ok = have == data
        print("matches " + shown_path(args.out) if ok else "differs from "
              + shown_path(args.out))
        return 0 if ok else 1
    write_json(args.out, data)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
