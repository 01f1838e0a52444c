"""Row notes: the short texts a prediction or a GEMM row carries (``"a; b"``)."""

from __future__ import annotations

__all__ = ["join_notes"]


def join_notes(a: str, b: str) -> str:
    """Two row notes as one ("a; b"), either of them possibly empty."""
    return f"{a}; {b}" if a and b else (a or b)
