"""Traces: a real PyTorch profiler (Kineto) trace against fxshape's models (issue 34).

``kineto`` reads a trace (gzipped or not, CUDA or ROCm) into frozen records: operators with
their recorded shapes, launches, kernels; ``pairing`` gives each kernel to the innermost
operator enclosing its launch (correlation ids); ``price`` predicts one operator from its
recorded shapes with the cost models; ``compare`` puts them together
(:func:`compare_trace` -> :class:`TraceComparison`: per-class errors, the worst operators,
the device time no model accounts for); ``calibrate`` fits the GEMM constants to a trace's
kernels (``fxshape calibrate --trace``). It reads the GPU table and the fitted cost models;
``fit`` lends its device-name lookup, its fit and its parameter file.

May import: hardware, cost, fit.
"""

from .compare import (ClassError, TraceComparison, TraceOpRecord, Unattributed, compare_trace,
                      resolve_trace_gpu)
from .kineto import Trace, read_trace

__all__ = ["compare_trace", "TraceComparison", "TraceOpRecord", "ClassError", "Unattributed",
           "resolve_trace_gpu", "read_trace", "Trace"]
