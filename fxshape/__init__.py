"""fxshape: see how efficiently every matmul in a model runs on a GPU, and why.

Public API: the GPU table (:func:`get_gpu`, :func:`list_gpus`), the GEMM performance model
(:func:`predict_matmul`), the attention performance model (:func:`predict_attention`),
memory-bound kernels (:func:`predict_memop`),
graph capture (:func:`capture`) and the per-GEMM analysis
(:func:`analyze` -> :class:`Report`, with the whole step: :class:`Step`, one
:class:`OpRecord` per op), with registries of per-op GEMM handlers
(:func:`register_gemm_handler`) and memory-bound op handlers (:func:`register_memop_handler`).
"""

from .report.build import analyze
from .analysis.opcost import register_memop_handler
from .analysis.ops import Gemm, register_gemm_handler
from .report.report import Report
from .analysis.rows import GemmRow, Unsupported
from .execution.step import OpRecord, Step
from .config.setup import Kernels, Machine, Setup, Workload
from .codesign.advise import Advice, Recommendation, advise, sweep
from .cost.attention import AttentionPrediction, AttentionShape, predict_attention
from .cost.gemm import (DimAlignment, MatmulPrediction, ModelParams, model_params, predict_matmul,
                        use_params)
from .cost.memops import MemOpPrediction, predict_memop
from .cost.quant import Quantization
from .hardware.dtypes import canonical_dtype
from .hardware.gpus import GPUSpec, Peaks, get_gpu, list_gpus
from .parallelism.plan import Parallel
from .planning import PlanResult, PlanSearch, plan
from .serving import (CapacityPlan, Request, ServeResult, ServingSimulation,
                      SpeculationResult, plan_capacity, serve, simulate_serving, speculate)
from .cost.allreduce import AllReduceTime, predict_allreduce
from .padding.plan import PadDecision, PaddingPlan, can_pad, plan_padding
from .padding.rewrite import PaddedConv1D, PaddedLinear, pad
from .tracing.export import CaptureError, capture
from .torchtitan import TitanJob, read_torchtitan
from .traces import TraceComparison, compare_trace

__all__ = [
    "Setup",
    "Workload",
    "Machine",
    "Kernels",
    "compare_trace",
    "TraceComparison",
    "serve",
    "ServeResult",
    "simulate_serving",
    "ServingSimulation",
    "speculate",
    "SpeculationResult",
    "plan_capacity",
    "CapacityPlan",
    "Request",
    "predict_allreduce",
    "AllReduceTime",
    "Parallel",
    "plan",
    "read_torchtitan",
    "TitanJob",
    "PlanSearch",
    "PlanResult",
    "GPUSpec",
    "Peaks",
    "get_gpu",
    "list_gpus",
    "canonical_dtype",
    "predict_matmul",
    "Quantization",
    "MatmulPrediction",
    "DimAlignment",
    "ModelParams",
    "model_params",
    "use_params",
    "predict_attention",
    "AttentionShape",
    "AttentionPrediction",
    "predict_memop",
    "MemOpPrediction",
    "capture",
    "CaptureError",
    "analyze",
    "advise",
    "sweep",
    "Advice",
    "Recommendation",
    "Report",
    "GemmRow",
    "Unsupported",
    "Gemm",
    "register_gemm_handler",
    "register_memop_handler",
    "Step",
    "OpRecord",
    "plan_padding",
    "PaddingPlan",
    "PadDecision",
    "can_pad",
    "pad",
    "PaddedConv1D",
    "PaddedLinear",
]

__version__ = "0.1.0"
