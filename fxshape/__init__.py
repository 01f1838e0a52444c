"""fxshape: see how efficiently every matmul in a model runs on a GPU, and why.

Public API so far: the GPU table (:func:`get_gpu`, :func:`list_gpus`) and the GEMM
performance model (:func:`predict_matmul`).
"""

from .dtypes import canonical_dtype
from .gpus import GPUSpec, Peaks, get_gpu, list_gpus
from .perf import DimAlignment, MatmulPrediction, ModelParams, model_params, predict_matmul

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
]

__version__ = "0.1.0"
