"""What an analysis's phases produce before the report is built: :class:`ReportParts`.

The capture and its costing (``fxshape.report.build``) make the parts; the decode step
(``execution.decode``), the low-precision runs (``execution.quantized``), the parameter
file's note and the step's error band each turn them into the next parts; ``analyze`` then
builds the :class:`fxshape.report.report.Report` once, from the last parts, what each
option did and the setup. No phase patches a finished report.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch

from ..analysis.rows import WorkloadRecord
from .memory import Memory
from .serving import Capacity
from .step import Step

__all__ = ["ReportParts"]


@dataclass(frozen=True)
class ReportParts:
    """An analysis's findings, the fields of a ``Report`` but what each option did and the
    setup. ``rows``: one record per GEMM node (not collapsed)."""

    rows: tuple
    unsupported: tuple
    gpu: str
    dtype: str
    model_name: str = ""
    graph_module: torch.fx.GraphModule | None = field(default=None, compare=False,
                                                       repr=False)
    #: how the model was traced (one layer per group of identical layers, or all of them)
    notes: tuple = ()
    #: what the report describes (mode, inputs, tp, attention; ``fxshape.analysis.rows``)
    workload: WorkloadRecord | None = None
    #: every costed op of the step, GEMMs included, in program order
    #: (``fxshape.execution.step.OpRecord``)
    ops: tuple = ()
    #: the predicted step: time, its split by class, tokens/s, MFU
    #: (``fxshape.execution.step.Step``); None for a report built by hand
    step: Step | None = None
    #: non-GEMM ops without a cost model (listed, never counted as zero)
    unsupported_ops: tuple = ()
    #: memory per GPU: parameters, gradients, optimizer state, activations, peak, fits
    #: (``fxshape.execution.memory.Memory``); None for a report built by hand
    memory: Memory | None = None
    #: decode: what fits a GPU (``fxshape.execution.serving.Capacity``); None otherwise
    capacity: Capacity | None = None

    def parts(self) -> dict:
        """The parts as keywords (``Report(**parts.parts(), options=..., setup=...)``)."""
        return {f.name: getattr(self, f.name) for f in fields(ReportParts)}
