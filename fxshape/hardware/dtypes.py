"""Dtype names: one canonical key per tensor-core math mode.

fxshape talks about the *math mode* a GEMM runs in, not only the storage dtype:
``torch.float32`` means plain fp32 (no TF32), while ``"tf32"`` means fp32 storage with
TF32 tensor-core math.  Every public function that takes a dtype goes through
:func:`canonical_dtype`.
"""

from __future__ import annotations

__all__ = ["DTYPE_KEYS", "KV_FORMATS", "canonical_dtype", "itemsize", "output_itemsize",
           "kv_format"]

#: Canonical keys, in the order tables list them.
DTYPE_KEYS = ("fp16", "bf16", "tf32", "fp32", "fp8")

_ALIASES = {
    "fp16": "fp16", "float16": "fp16", "half": "fp16", "f16": "fp16",
    "bf16": "bf16", "bfloat16": "bf16",
    "tf32": "tf32", "tensorfloat32": "tf32",
    "fp32": "fp32", "float32": "fp32", "float": "fp32", "f32": "fp32",
    "fp8": "fp8", "float8": "fp8", "float8_e4m3fn": "fp8", "float8_e5m2": "fp8",
    "float8_e4m3fnuz": "fp8", "float8_e5m2fnuz": "fp8", "e4m3": "fp8", "e5m2": "fp8",
}

# Bytes per stored element (tf32 is stored as fp32).
_ITEMSIZE = {"fp16": 2, "bf16": 2, "tf32": 4, "fp32": 4, "fp8": 1}
# Bytes per output element: fp8 GEMMs write a 16-bit result (as torch._scaled_mm usually does).
_OUT_ITEMSIZE = {"fp16": 2, "bf16": 2, "tf32": 4, "fp32": 4, "fp8": 2}


def canonical_dtype(dtype) -> str:
    """Return the canonical key ("fp16", "bf16", "tf32", "fp32", "fp8") for ``dtype``.

    Args:
        dtype: a ``torch.dtype`` (float16, bfloat16, float32, float8_*) or a string such as
            ``"float16"``, ``"fp16"``, ``"bf16"``, ``"float32"`` (fp32 without TF32), ``"tf32"``,
            ``"fp8"``. Strings are case-insensitive; a ``"torch."`` prefix is allowed.

    Raises:
        ValueError: for anything else, naming the value and the accepted spellings.
    """
    if isinstance(dtype, str):
        key = dtype.strip().lower()
        if key.startswith("torch."):
            key = key[len("torch."):]
    elif type(dtype).__name__ == "dtype" and type(dtype).__module__ == "torch":
        key = str(dtype)[len("torch."):]
    else:
        key = None
    if key not in _ALIASES:
        accepted = ", ".join(sorted(_ALIASES))
        raise ValueError(
            f"unknown dtype {dtype!r}; accepted: torch.float16, torch.bfloat16, torch.float32, "
            f"torch.float8_* or one of the strings: {accepted}"
        )
    return _ALIASES[key]


def itemsize(key: str) -> int:
    """Bytes per input element for a canonical dtype key."""
    return _ITEMSIZE[key]


def output_itemsize(key: str) -> int:
    """Bytes per output element for a canonical dtype key."""
    return _OUT_ITEMSIZE[key]


#: KV-cache formats beyond the compute dtypes, with their bytes per element: TensorRT-LLM's
#: INT8 KV cache (a byte an element, a scale per tensor) and its NVFP4 KV cache (Blackwell:
#: e2m1, two elements a byte, and an e4m3 scale per 16 elements: 0.5 + 1/16 bytes), which
#: the attention kernels dequantize as they read.
KV_FORMATS = {"int8": 1.0, "nvfp4": 0.5 + 1 / 16}
_KV_ALIASES = {"int8": "int8", "torch.int8": "int8", "nvfp4": "nvfp4", "fp4": "nvfp4",
               "fp4_e2m1": "nvfp4", "e2m1": "nvfp4"}


def kv_format(kv_dtype) -> tuple:
    """``(key, bytes per element)`` of a KV cache stored as ``kv_dtype``: a compute dtype
    (:func:`canonical_dtype`: ``"fp8"`` is a byte an element) or a format of
    :data:`KV_FORMATS` (``"int8"``; ``"nvfp4"``, also spelled ``"fp4"``).

    Raises:
        ValueError: anything else, naming what is accepted.
    """
    if isinstance(kv_dtype, str) and kv_dtype.strip().lower() in _KV_ALIASES:
        key = _KV_ALIASES[kv_dtype.strip().lower()]
        return key, KV_FORMATS[key]
    if type(kv_dtype).__name__ == "dtype" and str(kv_dtype) == "torch.int8":
        return "int8", KV_FORMATS["int8"]
    try:
        key = canonical_dtype(kv_dtype)
    except ValueError:
        raise ValueError(f"unknown kv_dtype {kv_dtype!r}; accepted: a dtype (bf16, fp16, "
                         "fp32, fp8 / torch.float8_e4m3fn), 'int8' or 'nvfp4' (also 'fp4'; "
                         "Blackwell)") from None
    return key, float(_ITEMSIZE[key])
