"""Dtype names: one canonical key per tensor-core math mode.

fxshape talks about the *math mode* a GEMM runs in, not only the storage dtype:
``torch.float32`` means plain fp32 (no TF32), while ``"tf32"`` means fp32 storage with
TF32 tensor-core math.  Every public function that takes a dtype goes through
:func:`canonical_dtype`.
"""

from __future__ import annotations

__all__ = ["DTYPE_KEYS", "canonical_dtype", "itemsize", "output_itemsize"]

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
