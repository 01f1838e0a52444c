"""How far each GPU's predictions are from published measurements they were not fitted to.

``fxshape/data/validation.json`` (written by ``bench/validation_summary.py``, which runs the
held-out validations of ``bench/``) holds, per GPU and *regime* (:data:`REGIMES`), the
number of measured rows and the median, 90th percentile and largest absolute error of the
prediction, with the median signed error. :func:`validations` reads a GPU's records;
:func:`error_band` turns one into the expected error of a prediction in that regime (the
90th percentile with ten rows or more, the largest error with fewer: never below the
median); :func:`step_regime` says which regime a report's step belongs to. A GPU or regime
without a record is *unvalidated*: ``fxshape gpus`` and the report's notes say so.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass

from .dtypes import canonical_dtype
from .gpus import get_gpu

__all__ = ["REGIMES", "VALIDATION_PATH", "Validation", "ErrorBand", "validations",
           "error_band", "step_regime"]

#: What each regime covers.
REGIMES = {
    "gemm": "fp16/bf16 tensor-core GEMM kernels",
    "gemm-fp8": "FP8 GEMMs with their activation quantization",
    "gemm-nvfp4": "NVFP4 GEMMs with their activation quantization",
    "step-fp32": "whole-model steps in fp32 (eager; inference and training)",
    "step-fp32-compiled": "whole-model steps in fp32 under torch.compile (Inductor)",
    "step-train": "training steps in bf16/fp16, FP8 GEMMs included (one or many GPUs)",
    "step-inference": "prefill / inference steps in bf16/fp16",
    "serving": "decode and serving latency in bf16/fp16",
    "collectives": "NCCL collectives inside one node (all-reduce, all-gather, reduce-scatter, "
                   "all-to-all)",
    "allreduce-custom": "serving engines' custom all-reduce kernels under CUDA graphs",
    "attention-prefill": "fused prefill attention as a serving engine runs it (vLLM's layer: "
                         "the KV-cache write and the kernel)",
    "attention-decode": "decode attention over a paged KV cache (vLLM's layer)",
}

VALIDATION_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                               "data", "validation.json")

#: Rows from which the 90th percentile, not the largest error, bounds a band.
_P90_ROWS = 10


@dataclass(frozen=True)
class Validation:
    """One GPU's held-out error in one regime (fractions: 0.05 is 5%)."""

    gpu: str
    regime: str
    n: int
    median: float
    p90: float
    max: float
    signed_median: float | None
    source: str

    def describe(self) -> str:
        sign = ("" if self.signed_median is None else
                f", {'slow' if self.signed_median > 0 else 'fast'} by "
                f"{100 * abs(self.signed_median):.0f}% typically")
        return (f"{self.regime}: median {100 * self.median:.1f}% over {self.n} held-out "
                f"row{'s' if self.n != 1 else ''}{sign}")


@dataclass(frozen=True)
class ErrorBand:
    """The expected relative error of a prediction (``report.step.error_band``): the
    prediction is within ``± fraction`` of what is measured on about nine runs of ten
    like those of its GPU and regime's validation (``validation``)."""

    fraction: float
    validation: Validation

    def describe(self) -> str:
        v = self.validation
        how = "p90" if v.n >= _P90_ROWS else "largest"
        return (f"expected error ±{100 * self.fraction:.0f}% ({how} of {v.n} held-out "
                f"{v.regime} rows on {v.gpu}; median {100 * v.median:.1f}%)")

    def as_dict(self) -> dict:
        v = self.validation
        return {"fraction": self.fraction, "gpu": v.gpu, "regime": v.regime, "rows": v.n,
                "median": v.median, "p90": v.p90, "max": v.max,
                "signed_median": v.signed_median, "source": v.source}


@functools.lru_cache(maxsize=4)
def _load(path: str) -> dict:
    with open(path) as f:
        doc = json.load(f)
    gpus = doc.get("gpus")
    if not isinstance(gpus, dict):
        raise ValueError(f"{path}: no 'gpus' object (expected the file "
                         "bench/validation_summary.py writes)")
    return gpus


def validations(gpu, path: str | None = None) -> dict:
    """``{regime: Validation}`` of ``gpu`` (a name, alias or ``GPUSpec``); empty when it
    has none."""
    spec = get_gpu(gpu)
    out = {}
    for regime, r in _load(path or VALIDATION_PATH).get(spec.name, {}).items():
        out[regime] = Validation(spec.name, regime, int(r["n"]), float(r["median"]),
                                 float(r["p90"]), float(r["max"]),
                                 None if r.get("signed_median") is None
                                 else float(r["signed_median"]), str(r["source"]))
    return out


def error_band(gpu, regime: str, path: str | None = None) -> ErrorBand | None:
    """The expected error of a ``regime`` prediction on ``gpu``, or None (unvalidated)."""
    if regime not in REGIMES:
        raise ValueError(f"unknown regime {regime!r}; accepted: {', '.join(REGIMES)}")
    v = validations(gpu, path).get(regime)
    if v is None:
        return None
    return ErrorBand(v.p90 if v.n >= _P90_ROWS else v.max, v)


def step_regime(mode: str, dtype, execution: str = "eager") -> str:
    """The regime of a step: ``"step-fp32"`` for fp32 (without TF32) run eagerly,
    ``"step-fp32-compiled"`` under ``torch.compile`` (``execution`` ``"compiled"`` or
    ``"cudagraphs"``), else by mode."""
    if canonical_dtype(dtype) == "fp32":
        return "step-fp32" if execution == "eager" else "step-fp32-compiled"
    if mode == "train":
        return "step-train"
    if mode == "decode":
        return "serving"
    return "step-inference"
