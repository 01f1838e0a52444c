"""fxshape: see how efficiently every matmul in a model runs on a GPU, and why.

Public API: the GPU table (:func:`get_gpu`, :func:`list_gpus`), the GEMM performance model
(:func:`predict_matmul`), the attention performance model (:func:`predict_attention`),
graph capture (:func:`capture`) and the per-GEMM analysis
(:func:`analyze` -> :class:`Report`), with a registry of per-op GEMM handlers
(:func:`register_gemm_handler`).
"""

from .analysis import GemmRow, Unsupported, analyze
# the functions, not the submodule of the same name: ``fxshape.advise(...)`` as documented
from .advise import Advice, Recommendation, advise, sweep
from .attention import AttentionPrediction, AttentionShape, predict_attention
from .capture import CaptureError, capture
from .dtypes import canonical_dtype
from .gpus import GPUSpec, Peaks, get_gpu, list_gpus
from .ops import Gemm, register_gemm_handler
from .padplan import PadDecision, PaddingPlan, can_pad, plan_padding
from .rewrite import PaddedConv1D, PaddedLinear, pad
from .perf import (DimAlignment, MatmulPrediction, ModelParams, model_params, predict_matmul,
                   use_params)
from .report import Report

__all__ = [
    "GPUSpec",
    "Peaks",
    "get_gpu",
    "list_gpus",
    "canonical_dtype",
    "predict_matmul",
    "MatmulPrediction",
    "DimAlignment",
    "ModelParams",
    "model_params",
    "use_params",
    "predict_attention",
    "AttentionShape",
    "AttentionPrediction",
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
    "plan_padding",
    "PaddingPlan",
    "PadDecision",
    "can_pad",
    "pad",
    "PaddedConv1D",
    "PaddedLinear",
]

__version__ = "0.1.0"
