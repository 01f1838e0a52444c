"""``fxshape calibrate``: fit the GEMM model's constants to the GPU in this machine.

    fxshape calibrate [--quick] [--out params.json] [--gpu NAME] [--dtype bf16]

It times a built-in sweep (``fxshape.fit.measure.default_sweep``: N, K and F.linear's N in steps
of one around 4096 for the alignment penalties, N in steps of 64 at M = 2304 for the wave
sawtooth, tokens 1 to 8192 through a 4096 x 14336 projection for the decode-to-prefill
regimes, and batched GEMMs) with CUDA events, fits every constant of
``fxshape.cost.gemm.ModelParams`` for the detected GPU (the packaged constants are the starting
point), and writes a parameter file holding that one GPU. ``predict_matmul``, ``analyze``,
``pad`` and ``advise`` use it when given ``params=path`` or with ``FXSHAPE_PARAMS=path`` set;
a report then names the file in its notes. The fit is the one ``bench/fit_model.py`` runs on
the shared data (``fxshape.fit.fitting``).

The measuring half needs CUDA; the fitting half (:func:`fit_rows`) runs anywhere and is
tested on CPU with synthetic measurements of known constants. Tensor-core dtypes only: the
fp32 SIMT constants need the kernel names of a profiler trace (``bench/fit_fp32.py``).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from dataclasses import asdict

from ..cost.gemm import ModelParams, dtype_params, load_class, model_params
from ..hardware.dtypes import canonical_dtype
from ..hardware.gpus import get_gpu
from .calibration import CalibrationRow

__all__ = ["detect_gpu", "calibration_sweep", "fit_rows", "calibrate", "write_params"]

def detect_gpu(device_name: str) -> str:
    """The fxshape GPU for a ``torch.cuda.get_device_name()`` string, by the exact table
    ``fxshape.hardware.gpus.DEVICE_NAMES`` (never a substring: a GH200 is no H200).

    >>> detect_gpu("NVIDIA H100 80GB HBM3")
    'h100-sxm'
    >>> detect_gpu("Tesla V100-PCIE-32GB")
    'v100-pcie'

    Raises:
        ValueError: a device fxshape has no entry for; pass ``--gpu`` with the nearest one.
    """
    try:
        return get_gpu(device_name).name
    except ValueError as exc:
        raise ValueError(f"fxshape has no GPU entry for device {device_name!r}: {exc}; pass "
                         "--gpu with the nearest one") from None


def calibration_sweep(quick: bool = False):
    """The measured shapes, as (sweep, op, layout, batch, m, n, k)."""
    from .measure import default_sweep

    return default_sweep(quick)


def _median_err(prob, params: ModelParams) -> float:
    """Median |predicted / measured - 1| of a ``fxshape.fit.fitting._Problem``."""
    return float(statistics.median((abs(prob.measured_model(params, []) / prob.t - 1)).tolist()))


def fit_rows(rows, gpu, *, start: ModelParams | None = None, hold=()):
    """Fit every constant to measured rows of one GPU and dtype.

    Args:
        rows: :class:`fxshape.fit.calibration.CalibrationRow` (CUDA-event timings).
        gpu: the GPU they were measured on.
        start: starting constants (default: the packaged ones for ``gpu``).
        hold: constants kept at their starting values (the rows cannot tell them).

    Returns:
        ``(params, summary)``: the fitted :class:`ModelParams` and a dict with the median
        error before (packaged constants) and after, and the mean |log error| of the fit.
    """
    from .fitting import _START, _STARTS, _fit_one, _Problem

    rows = list(rows)
    if not rows:
        raise ValueError("no measurements to fit")
    spec = get_gpu(gpu)
    dkeys = {canonical_dtype(r.dtype) for r in rows}
    if len(dkeys) != 1:
        raise ValueError(f"rows mix dtypes {sorted(dkeys)}; fit one dtype at a time")
    dkey = dkeys.pop()
    if dkey == "fp32" and spec.vendor == "nvidia":
        raise ValueError("calibrate fits the tensor-core constants (fp16, bf16, tf32, fp8); "
                         "fp32 without TF32 runs SIMT kernels, fitted by bench/fit_fp32.py")
    # the constants as the packaged model prices this dtype (TF32's own ratios applied)
    before = start or dtype_params(model_params(spec), spec, dkey)
    prob = _Problem(rows, spec)
    # the packaged constants are the first starting point, then the shared fit's starts
    fixed = {**_START, **asdict(before)}
    # batched kernels' own efficiency only when the rows have batched calls to tell it
    free = ModelParams.FIELDS + (ModelParams.OPTIONAL if any(r.batch > 1 for r in rows) else ())
    # and the misalignment constants only when some row has a misaligned operand (else the
    # data cannot tell them, and they keep the starting constants' values)
    if not any(load_class(r.m, r.n, r.k, dkey, r.layout) for r in rows):
        free = tuple(f for f in free if f not in ModelParams.ALIGNMENT)
    free = tuple(f for f in free if f not in hold)
    starts = ({f: getattr(before, f) for f in free},) + _STARTS
    params, _, loss = _fit_one(prob, free, fixed, starts=starts)
    summary = dict(rows=len(rows), dtype=dkey, gpu=spec.name,
                   median_before=_median_err(prob, before),
                   median_after=_median_err(prob, params), mean_abs_log=loss,
                   fitted=tuple(sorted(free)))
    return params, summary


def check_out_path(path) -> None:
    """A parameter file's path a fit may write to, checked before the fit runs: not a
    directory, in a directory that exists (one line naming what is wrong)."""
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
        raise ValueError(f"the parameter file's path must be a file path, got {path!r}")
    path = os.fspath(path)
    if os.path.isdir(path):
        raise ValueError(f"{path!r} is a directory; give the parameter file's path (e.g. "
                         f"{os.path.join(path, 'fxshape_params.json')!r})")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise ValueError(f"cannot write {path!r}: its directory {parent!r} does not exist")


def write_params(path: str, params: ModelParams, summary: dict, device: str = "",
                 extra: dict | None = None, sections: dict | None = None) -> None:
    """Write a parameter file holding one GPU (it overlays the packaged constants);
    ``extra``: more of what the calibration found, under ``calibration``; ``sections``:
    other models' entries beside the GEMM ones (``{"memops": {gpu: entry}}``, as
    ``fxshape calibrate --trace`` writes)."""
    entry = {f: float(f"{getattr(params, f):.5g}") for f in ModelParams.STORED}
    if summary["dtype"] == "tf32":
        # a TF32 fit's load-issue time and mainloop efficiency are stored as the base
        # constants the predictions multiply by the architecture's tf32_issue_ratio and
        # tf32_mainloop_eff (fxshape.cost.gemm.dtype_params), so they reproduce the fit
        from ..cost.gemm import tf32_issue_ratio, tf32_mainloop_eff

        base = params.ld_issue_clk / tf32_issue_ratio(summary["gpu"])
        entry["ld_issue_clk"] = float(f"{base:.5g}")
        entry["e_max"] = float(f"{params.e_max / tf32_mainloop_eff(summary['gpu']):.5g}")
    entry["fitted"] = sorted(summary.get("fitted", ModelParams.STORED))
    entry["rows"] = summary["rows"]
    doc = {"comment": "Written by fxshape calibrate; entries replace the packaged constants "
                      "for these GPUs (use with params= or FXSHAPE_PARAMS).",
           "gpus": {summary["gpu"]: entry},
           "calibration": {"device": device, "dtype": summary["dtype"],
                           "rows": summary["rows"],
                           "median_error_before": round(summary["median_before"], 4),
                           "median_error_after": round(summary["median_after"], 4),
                           **(extra or {})},
           **(sections or {})}
    with open(path, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write("\n")


def calibrate(*, quick: bool = False, out: str = "fxshape_params.json", gpu: str | None = None,
              dtype: str = "bf16", warmup: int | None = None, repeats: int | None = None,
              log=print):
    """Measure the sweep on the local CUDA device, fit, write ``out``; returns the summary.

    Raises:
        RuntimeError: no CUDA device visible to PyTorch.
    """
    import torch

    from .measure import CudaEventTimer, measure

    check_out_path(out)  # before the sweep, not after it
    if not torch.cuda.is_available():
        raise RuntimeError("fxshape calibrate measures GEMMs on a GPU and needs one visible "
                           "to PyTorch (torch.cuda.is_available() is False: no CUDA/ROCm "
                           "device or a CPU-only torch build)")
    device = torch.cuda.get_device_name(0)
    name = get_gpu(gpu).name if gpu else detect_gpu(device)
    dkey = canonical_dtype(dtype)
    timer = CudaEventTimer(dkey, warmup=warmup or (5 if quick else 10),
                           repeats=repeats or (20 if quick else 50))
    shapes = calibration_sweep(quick)
    log(f"calibrating {name} ({device}), {dkey}: timing {len(shapes)} GEMMs ...")
    t0 = time.perf_counter()
    raw = measure(shapes, timer, gpu_label=name, dtype=dkey)
    rows = [CalibrationRow(*r) for r in raw]
    log(f"measured in {time.perf_counter() - t0:.0f} s; fitting ...")
    params, summary = fit_rows(rows, name)
    write_params(out, params, summary, device)
    log(f"median |error| on the sweep: {100 * summary['median_before']:.1f}% with the "
        f"packaged constants, {100 * summary['median_after']:.1f}% fitted; wrote {out}\n"
        f"use it with: FXSHAPE_PARAMS={out} fxshape analyze ...   or   params={out!r}")
    return summary


def main(args) -> int:
    """The CLI entry (``fxshape calibrate``); ``args`` from its argparse subparser."""
    try:
        calibrate(quick=args.quick, out=args.out, gpu=args.gpu, dtype=args.dtype,
                  log=lambda s: print(s, file=sys.stderr))
    except RuntimeError as exc:
        print(f"fxshape calibrate: error: {exc}", file=sys.stderr)
        return 2
    except (ValueError, ImportError) as exc:
        print(f"fxshape calibrate: error: {exc}", file=sys.stderr)
        return 2
    return 0

