"""``fxshape advise``: hyperparameters with efficient GEMM shapes."""

from __future__ import annotations

import argparse
import json

from .args import SWEEP_FLAGS, _quantize_args, advise_args, params_arg, setup_keywords
from .shared import _model_config


def run(args) -> int:
    from ..codesign.advise import advise

    advice = advise(_model_config(args.target), param_tolerance=args.tolerance,
                    min_speedup=args.min_speedup, **setup_keywords(args, SWEEP_FLAGS))
    if args.format == "json":
        recs = [{"hyperparameter": r.hyperparameter, "current": r.current,
                 "suggested": r.suggested, "predicted_speedup": r.predicted_speedup,
                 "gemm_speedup": r.gemm_speedup,
                 "throughput_gain": r.throughput_gain, "param_delta": r.param_delta,
                 "kv_bytes_per_token": r.kv_bytes_per_token,
                 "reason": r.reason} for r in advice.recommendations]
        print(json.dumps({"model": advice.model_name, "gpu": advice.gpu, "dtype": advice.dtype,
                          "mode": advice.mode, "tp": advice.tp, "params": advice.params,
                          "time_s": advice.time_s, "step_s": advice.step_s,
                          "execution": advice.execution, "recommendations": recs,
                          "kv_bytes_per_token": advice.kv_bytes_per_token,
                          "notes": list(advice.notes)}, indent=2, sort_keys=True))
    else:
        print(advice.table(fmt="github" if args.format == "markdown" else "simple"))
    return 0


def add_parser(sub) -> argparse.ArgumentParser:
    """The ``advise`` command's parser."""
    pv = sub.add_parser("advise", help="recommend hyperparameters with efficient GEMM shapes",
                        description="Search vocab, hidden size, heads and MLP width for "
                                    "shapes the GPU runs faster; re-analyze each candidate.")
    advise_args(pv, "train")
    pv.add_argument("--tolerance", type=float, default=0.02,
                    help="largest relative change of the parameter count (default 0.02)")
    pv.add_argument("--min-speedup", type=float, default=0.01,
                    help="significance threshold (default 0.01 = 1%%)")
    pv.add_argument("--format", choices=("table", "json", "markdown"), default="table")
    _quantize_args(pv, training=True)
    pv.set_defaults(func=run)
    params_arg(pv)
    return pv
