"""Context parallelism: ring attention over ``cp`` ranks, as Megatron-LM (Transformer
Engine's ``AttnFuncWithCPAndKVP2P``) and torchtitan (``context_parallel``, the
``_templated_ring_attention``) run it.

Each sequence of ``s`` tokens is cut into ``2 × cp`` chunks; rank ``i`` holds chunks ``i``
and ``2cp − 1 − i`` (``s / cp`` tokens), which gives every rank the same share of a causal
mask's work. Every op but attention runs on those ``s / cp`` tokens. Attention runs ``cp``
steps: at step 0 a rank's queries meet its own keys/values (a causal block, for a causal
model); at each later step it meets the K/V chunk pair that arrived from its ring neighbour,
while it sends the pair it holds on (send/recv, overlapped with the step's kernel). With the
chunk pairs, a later step computes half a block: either both query chunks against the first
received K/V chunk, or the second query chunk against both (``s/cp × s/2cp`` scores either
way). The backward walks the same ring, with dK and dV passed along beside K and V (twice the
bytes).

Per rank and attention call:

- score elements: causal ``(s/cp)² / 2 + (cp − 1)(s/cp)² / 2 = s² / 2cp`` (the whole causal
  matrix's ``s²/2`` over ``cp``); without a mask ``cp (s/cp)² = s²/cp``;
- K/V bytes per step: ``b · kv_heads · (s/cp) · (d + dv) · item``; ``cp − 1`` steps;
- exposed communication: per step, what the transfer takes beyond the kernel it overlaps.

Pure functions of numbers and attention shapes; ``fxshape.analysis`` prices the blocks.

May import: hardware, cost.
"""

from __future__ import annotations

import dataclasses

from ..cost.attention import AttentionShape, predict_attention

__all__ = ["ring_blocks", "ring_step_bytes", "ring_steps", "ring_exposed", "block_times", "KEY_DIMS"]

#: the dimension that runs over the keys, of each attention GEMM (``fxshape.analysis.ops``):
#: with context parallelism it spans the whole sequence (``s``), not the local ``s / cp``
KEY_DIMS = {"sdpa.qk": "n", "sdpa.pv": "k", "sdpa.bwd.qk": "n", "sdpa.bwd.dv": "m",
            "sdpa.bwd.dp": "n", "sdpa.bwd.dq": "k", "sdpa.bwd.dk": "m"}


def _check(shape: AttentionShape, cp: int) -> None:
    if isinstance(cp, bool) or not isinstance(cp, int) or cp < 1:
        raise ValueError(f"cp must be a positive integer, got {cp!r}")
    if shape.seq_q != shape.seq_k:
        raise ValueError("ring attention splits self-attention (as many queries as keys), got "
                         f"{shape.seq_q} queries over {shape.seq_k} keys")
    if cp > 1 and shape.causal and shape.seq_q % 2:
        raise ValueError(f"a rank's {shape.seq_q} tokens must be two whole chunks (causal load "
                         "balancing): an even number")


def ring_blocks(shape: AttentionShape, cp: int) -> list:
    """``[(AttentionShape, count)]``: the kernels one rank runs for one attention call.

    ``shape`` is the rank's own call as captured: its ``s / cp`` queries against its own
    ``s / cp`` keys. Causal: that block (causal) once, then ``cp − 1`` unmasked half blocks
    (``s/cp`` queries over ``s/2cp`` keys, the same score count as the ``s/2cp × s/cp``
    variant); unmasked: ``cp`` full blocks."""
    _check(shape, cp)
    if cp == 1:
        return [(shape, 1)]
    if not shape.causal:
        return [(shape, cp)]
    half = dataclasses.replace(shape, seq_k=shape.seq_k // 2, causal=False)
    return [(shape, 1), (half, cp - 1)]


def ring_steps(cp: int) -> int:
    """Transfers one rank makes per attention call and direction: ``cp − 1``."""
    return max(0, cp - 1)


def ring_step_bytes(shape: AttentionShape, item: int, direction: str) -> int:
    """Bytes a rank sends at one ring step: its K and V chunk pair (``b · kv_heads · s/cp ·
    (d + dv) · item``); the backward sends dK and dV along with them (twice)."""
    if direction not in ("forward", "backward"):
        raise ValueError(f"unknown direction {direction!r}; accepted: 'forward', 'backward'")
    kv = shape.batch * shape.kv_heads * shape.seq_k * (shape.head_dim + shape.head_dim_v) * item
    return kv * (2 if direction == "backward" else 1)


def ring_exposed(block_times, step_comm_s: float) -> float:
    """Exposed seconds of the ring's transfers: transfer ``j`` (``j = 0 … cp − 2``) runs
    while block ``j`` computes and must arrive before block ``j + 1`` starts; what it takes
    beyond block ``j`` is exposed. ``block_times``: the ``cp`` blocks' seconds, in order."""
    blocks = list(block_times)
    return sum(max(0.0, step_comm_s - t) for t in blocks[:-1])


def block_times(shape, cp: int, direction: str, kernel: str, dkey: str, spec) -> list:
    """Seconds of each kernel one rank runs for an attention call of ``shape`` (its own
    block) under ring attention over ``cp`` ranks, in ring order
    (:func:`ring_blocks`), as ``kernel`` runs them."""
    return [predict_attention(b, direction=direction, attention=kernel, dtype=dkey,
                              gpu=spec).time_s
            for b, n in ring_blocks(shape, cp) for _ in range(n)]
