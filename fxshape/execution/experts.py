"""Expert parallelism's all-to-alls in the step: the dispatch before each MoE layer's expert
GEMMs and the combine after them, in the forward, and their gradients in the backward
(``fxshape.parallelism.experts``).

Each exchange moves the rows the busiest rank of the group receives (the rank the layer
waits for): its experts' routed rows × the hidden size × the compute dtype's bytes. Neither
Megatron-Core's default MoE layer nor torchtitan's overlaps them with compute: they are on
the critical path, whole.
"""

from __future__ import annotations

from ..cost.comm import predict_collective
from ..parallelism.placement import per_node
from .step import OpRecord

__all__ = ["all_to_all_records", "moe_layers"]


def moe_layers(rows) -> dict:
    """``{(module, phase): routed rows}``: the rows one expert-parallel rank's experts take in
    each MoE layer and phase (the rows of the layer's first grouped GEMM that is not a weight
    gradient, summed over its experts)."""
    first: dict = {}
    out: dict = {}
    for r in rows:
        if not r.op.startswith("grouped") or r.op.endswith(".dw"):
            continue
        key = (r.module, r.phase)
        if first.setdefault(key, r.node) == r.node:
            out[key] = out.get(key, 0) + round(r.batch * r.m * r.work)
    return out


def all_to_all_records(records, rows, *, ep: int, tp: int, topology, item: int, hidden: int):
    """``(records, note)``: ``records`` with an ``ep all_to_all`` record before the first and
    after the last grouped-GEMM record of each MoE layer and phase (the dispatch and the
    combine in the forward; in the backward the combine's gradient first, the dispatch's
    last); ``hidden``: the model's hidden size (the rows' width)."""
    layers = moe_layers(rows)
    first, last = {}, {}
    for i, rec in enumerate(records):
        key = (rec.module, rec.phase)
        if rec.cls == "gemm" and rec.op.startswith("grouped") and key in layers:
            first.setdefault(key, i)
            last[key] = i
    # the expert-parallel ranks are tp apart (fxshape.parallelism.plan layout)
    d = per_node(ep, tp, topology.gpus_per_node)
    out, total = [], 0
    for i, rec in enumerate(records):
        key = (rec.module, rec.phase)
        if first.get(key) == i:
            out.append(_exchange(rec, layers[key], hidden, "dispatch" if rec.phase ==
                                 "forward" else "combine's gradient", ep, d, topology, item))
            total += out[-1].bytes
        out.append(rec)
        if last.get(key) == i:
            out.append(_exchange(rec, layers[key], hidden, "combine" if rec.phase ==
                                 "forward" else "dispatch's gradient", ep, d, topology, item))
            total += out[-1].bytes
    if not first:
        raise ValueError(f"ep={ep}: the model has no MoE expert layers (grouped expert GEMMs) "
                         "to spread over expert-parallel ranks: use ep=1")
    span = "inside a node" if d == ep else f"across {ep // d} nodes"
    note = (f"expert parallel over {ep} ranks ({span}): each MoE layer's routed rows sent to "
            f"their experts' ranks and back by all-to-all, 2 in the forward and 2 in the "
            f"backward, not overlapped (Megatron-Core's and torchtitan's default): "
            f"{total / 2**20:.1f} MiB per micro-batch and rank")
    return out, note


def _exchange(rec, rows, hidden, what, ep, d, topology, item) -> OpRecord:
    nbytes = rows * hidden * item
    p = predict_collective("all_to_all", nbytes, ep, topology=topology, per_node=d)
    return OpRecord(
        f"{rec.node}.ep_{what.split()[0].replace(chr(39), '')}", "ep all_to_all", rec.module,
        rec.phase, "communication", 1, nbytes, 0, p.time_s, 0.0, family=p.link_class,
        note=f"expert parallelism: the {what} all-to-all over {ep} ranks ({p.link}): "
             f"{rows} routed rows × {hidden} × {item} bytes = {nbytes / 2**20:.2f} MiB, "
             f"{p.time_s * 1e3:.3f} ms, not overlapped")
