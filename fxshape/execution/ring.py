"""Ring attention's send/recv in the step: one communication record per attention call of
a context-parallel plan (``fxshape.parallelism.context``), after the call's kernel, and one
record of the memory-bound kernels that merge the ring's partial results.

The send/recv record's ``time_s`` is what the ring's transfers add to the critical path
(each transfer beyond the kernel it overlaps); ``overlapped_s`` the rest of their time.

The merges (:func:`merge_kernels`) are PyTorch's ``_templated_ring_attention`` as torchtitan
runs it (``torch.distributed.tensor.experimental._context_parallel``, torch 2.13,
``_SDPAMerger`` with ``convert_to_f32=True``): in the forward, each later step's partial
output is cast to fp32 and folded into the running one,
``out - sigmoid(block_lse - lse) * (out - block_out)`` (a cast, a subtraction, a product and
a subtraction over the output; the log-sum-exp's own ops are a head's-worth of bytes), the
first output cast to fp32 and the result back; in the backward, each step's dQ, dK and dV
are added into fp32 accumulators, cast back at the end. Each is an elementwise kernel priced
by its bytes (``fxshape.cost.memops.kernel_time``) with eager PyTorch's host time per op.
Every step is priced as updating the whole output (the load-balanced ring's later steps
update half of it on some ranks, all of it on the last rank, which the step waits for).
"""

from __future__ import annotations

import dataclasses

from ..cost.comm import predict_collective
from ..cost.host import host_params
from ..cost.memops import kernel_time
from ..parallelism.context import block_times, ring_exposed, ring_step_bytes, ring_steps
from ..parallelism.placement import per_node
from .step import OpRecord

__all__ = ["ring_records", "merge_kernels"]


def merge_kernels(shape, cp: int, direction: str, item: int) -> list:
    """Bytes of each elementwise kernel one rank runs to merge an attention call's ring
    steps (module docstring), fp32 accumulators, ``item``: the compute dtype's bytes."""
    if cp == 1:
        return []
    out = shape.batch * shape.heads * shape.seq_q * shape.head_dim_v  # one rank's output
    f32 = 4
    if direction == "forward":
        cast = out * (item + f32)         # bf16 -> fp32: read one, write the other
        binary = out * 3 * f32            # two fp32 operands read, one written
        scale = out * 2 * f32             # the output times a per-row factor
        per_step = [cast, binary, scale, binary]
        return [cast] + per_step * (cp - 1) + [cast]  # the first cast in, the result out
    q = shape.batch * shape.heads * shape.seq_q * shape.head_dim
    kv = shape.batch * shape.kv_heads * shape.seq_k * (shape.head_dim + shape.head_dim_v)
    add = [n * (item + 2 * f32) for n in (q, kv)]  # fp32 += the step's gradient
    return add * cp + [n * (item + f32) for n in (q, kv)]  # each step, then cast back


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
    out, seen, total_bytes, merge_bytes = [], set(), 0, 0
    hp = host_params()
    for rec in records:
        pred = calls.get(rec.node)
        if rec.cls != "attention" or pred is None or rec.node in seen:
            out.append(rec)
            continue
        seen.add(rec.node)
        # the ring is a Python loop (PyTorch's context_parallel): each of its cp kernels is
        # an op the host dispatches, as the call's one kernel was
        out.append(dataclasses.replace(rec, host_s=rec.host_s * cp))
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
            "communication", steps, steps * nbytes, 0, exposed,
            steps * hp.op_s("kernel", rec.phase), family=p.link_class,
            note=f"ring attention: {steps} transfers of {nbytes / 2**20:.2f} MiB "
                 f"({'K, V, dK, dV' if direction == 'backward' else 'K, V'}) to the next "
                 f"of {cp} ranks ({p.link}), {total * 1e3:.3f} ms, "
                 f"{exposed * 1e3:.3f} ms beyond the kernels they overlap",
            overlapped_s=max(0.0, total - exposed)))
        kernels = merge_kernels(shape, cp, direction, item)
        if kernels:
            moved = sum(kernels)
            merge_bytes += moved
            out.append(OpRecord(
                f"{rec.node}.cp_merge", "cp merge", rec.module, rec.phase, "memory",
                len(kernels), moved, 0,
                sum(kernel_time("elementwise", b, gpu=spec).time_s for b in kernels),
                len(kernels) * hp.op_s("kernel", rec.phase), family="elementwise",
                note=f"ring attention's {'gradient accumulation' if direction == 'backward' else 'output merge'}"
                     f" in fp32: {len(kernels)} elementwise kernels, {moved / 2**20:.1f} MiB"))
    if not seen:
        raise ValueError(f"cp={cp}: the model has no fused attention call to run as ring "
                         "attention (context parallelism needs scaled_dot_product_attention; "
                         "a Hugging Face model with attn_implementation='eager' runs its "
                         "attention as separate matmuls): use attn_implementation='sdpa'")
    span = "inside a node" if link == 2 else "across nodes"
    note = (f"context parallel over {cp} ranks: each rank runs every op on 1/{cp} of each "
            f"sequence, attention as ring attention ({cp} kernels per call; its K/V chunks "
            f"passed around the ring {span}, overlapped with the kernels: "
            f"{total_bytes / 2**20:.1f} MiB per micro-batch and rank; the partial outputs "
            f"merged and the gradients accumulated in fp32 by elementwise kernels: "
            f"{merge_bytes / 2**20:.1f} MiB)")
    return out, note
