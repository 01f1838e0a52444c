"""Ring attention's send/recv in the step: one communication record per attention call of
a context-parallel plan (``fxshape.parallelism.context``), after the call's kernel.

The record's ``time_s`` is what the ring's transfers add to the critical path (each
transfer beyond the kernel it overlaps); ``overlapped_s`` the rest of their time.
"""

from __future__ import annotations

from ..cost.attention import predict_attention
from ..cost.comm import predict_collective
from ..parallelism.context import ring_blocks, ring_exposed, ring_step_bytes, ring_steps
from ..parallelism.placement import per_node
from .step import OpRecord

__all__ = ["ring_records", "block_times"]


def block_times(shape, cp: int, direction: str, kernel: str, dkey: str, spec) -> list:
    """Seconds of each kernel one rank runs for an attention call of ``shape`` (its own
    block) under ring attention over ``cp`` ranks, in ring order
    (``fxshape.parallelism.context.ring_blocks``), as ``kernel`` runs them."""
    return [predict_attention(b, direction=direction, attention=kernel, dtype=dkey,
                              gpu=spec).time_s
            for b, n in ring_blocks(shape, cp) for _ in range(n)]


def ring_records(records, rows, *, cp: int, tp: int, topology, item: int, dkey: str, spec):
    """``(records, note)``: ``records`` with a ``cp send_recv`` record after each attention
    call's kernel record; ``rows``: the graph's GEMM rows (an attention call's rows carry
    its prediction, whose shape is one rank's own block)."""
    calls = {}
    for r in rows:
        if r.attention is not None and r.kernel not in ("", "math"):
            calls.setdefault(r.node, r.attention)
    # the ring's ranks are tp apart: a ring of cp ranks spans tp × cp consecutive GPUs
    ranks_per_node = per_node(cp, tp, topology.gpus_per_node)
    link = 2 if ranks_per_node > 1 else 1
    out, seen, total_bytes = [], set(), 0
    for rec in records:
        out.append(rec)
        pred = calls.get(rec.node)
        if rec.cls != "attention" or pred is None or rec.node in seen:
            continue
        seen.add(rec.node)
        shape, direction = pred.shape, pred.direction
        nbytes = ring_step_bytes(shape, item, direction)
        p = predict_collective("send_recv", nbytes, 2, topology=topology, per_node=link)
        blocks = block_times(shape, cp, direction, pred.kernel, dkey, spec)
        steps = ring_steps(cp)
        exposed = ring_exposed(blocks, p.time_s)
        total = steps * p.time_s
        total_bytes += steps * nbytes
        out.append(OpRecord(
            f"{rec.node}.cp_send_recv", "cp send_recv", rec.module, rec.phase,
            "communication", steps, steps * nbytes, 0, exposed, 0.0, family=p.link_class,
            note=f"ring attention: {steps} transfers of {nbytes / 2**20:.2f} MiB "
                 f"({'K, V, dK, dV' if direction == 'backward' else 'K, V'}) to the next "
                 f"of {cp} ranks ({p.link}), {total * 1e3:.3f} ms, "
                 f"{exposed * 1e3:.3f} ms beyond the kernels they overlap",
            overlapped_s=max(0.0, total - exposed)))
    if not seen:
        raise ValueError(f"cp={cp}: the model has no fused attention call to run as ring "
                         "attention (context parallelism needs scaled_dot_product_attention; "
                         "a Hugging Face model with attn_implementation='eager' runs its "
                         "attention as separate matmuls): use attn_implementation='sdpa'")
    span = "inside a node" if link == 2 else "across nodes"
    note = (f"context parallel over {cp} ranks: each rank runs every op on 1/{cp} of each "
            f"sequence, attention as ring attention ({cp} kernels per call; its K/V chunks "
            f"passed around the ring {span}, overlapped with the kernels: "
            f"{total_bytes / 2**20:.1f} MiB per micro-batch and rank)")
    return out, note
