"""Megatron-style tensor parallelism: the per-GPU shapes of each GEMM at degree ``tp``.

Column-parallel layers (QKV, MLP up/gate, LM head) split their output features: N / tp in
the forward GEMM. Row-parallel layers (attention output, MLP down) split their input
features: K / tp. Attention runs heads / tp per GPU: batch·heads / tp. In training, the
backward GEMMs split the same feature dimension wherever it appears (K of a column-parallel
layer's dX, the feature side of dW). Layers are recognised by their module names (the
conventions of GPT-2, Llama/Mistral/Qwen, GPT-NeoX, BERT, T5, ViT and Mixtral); anything
else (embeddings, pooler, unknown names) is replicated and left whole.
"""

from __future__ import annotations

import dataclasses

from ..cost.notes import join_notes
from ..parallelism.plan import PlanRefused
from .ops import Gemm

__all__ = ["layer_kind", "shard_gemm", "check_tp", "kv_shard", "kv_heads_per_gpu",
           "sharded_modules", "tp_blocks", "in_blocks"]

_COLUMN = {"q_proj", "k_proj", "v_proj", "qkv_proj", "query", "key", "value", "c_attn",
           "query_key_value", "gate_proj", "up_proj", "gate_up_proj", "c_fc", "fc1", "w1", "w3",
           "wi", "wi_0", "wi_1", "q", "k", "v", "dense_h_to_4h", "lm_head", "embed_out"}
_ROW = {"o_proj", "out_proj", "c_proj", "down_proj", "fc2", "w2", "wo", "o", "dense_4h_to_h"}
#: column-parallel projections that produce K or V heads, and fused Q/K/V projections
_KV = {"k_proj", "v_proj", "key", "value", "k", "v"}
_QKV = {"qkv_proj", "query_key_value", "c_attn", "Wqkv", "W_pack"}
_ATTENTION = {"attn", "attention", "self_attn", "selfattention", "encdecattention",
              "crossattention", "self"}


def layer_kind(module: str, op: str, n: int = 0, k: int = 0) -> str:
    """``"column"``, ``"row"``, ``"attention"`` or ``"replicated"`` for a GEMM's module."""
    parts = module.split(".") if module else []
    leaf = parts[-1] if parts else ""
    parent = parts[-2] if len(parts) > 1 else ""
    if op.startswith("sdpa") or (op in ("bmm", "matmul", "baddbmm")
                                 and leaf.lower() in _ATTENTION):
        return "attention"
    if op.startswith("grouped"):  # MoE experts: gate/up widen, down narrows
        return "column" if n >= k else "row"
    if leaf in _COLUMN:
        return "column"
    if leaf in _ROW:
        return "row"
    if leaf == "dense":  # BERT: intermediate.dense widens; (attention.)output.dense narrows
        if parent == "intermediate":
            return "column"
        if parent == "output":
            return "row"
    return "replicated"


def sharded_modules(rows) -> dict:
    """module -> ``"column"`` or ``"row"`` for every module whose GEMMs tensor parallelism
    splits (``rows``: GEMM rows or records with ``module`` and ``op``); attention calls and
    replicated layers are not in it."""
    out = {}
    for r in rows:
        kind = layer_kind(r.module, r.op, getattr(r, "n", 0), getattr(r, "k", 0))
        if kind in ("column", "row"):
            out.setdefault(r.module, kind)
    return out


def tp_blocks(modules) -> set:
    """The blocks whose projections are tensor-parallel (the parent modules of the column- and
    row-parallel layers in ``modules``: ``...self_attn``, ``...mlp``): what runs inside them
    works on one GPU's heads or MLP columns."""
    return {m.rsplit(".", 1)[0] for m in modules if "." in m}


def in_blocks(module: str, blocks) -> bool:
    """Is ``module`` one of ``blocks`` (a set) or inside one? (Looks up ``module`` and each
    of its ancestors: ``a.b.c``, ``a.b``, ``a``.)"""
    while module:
        if module in blocks:
            return True
        module = module.rpartition(".")[0]
    return False


def check_tp(tp, heads, kv_heads=None) -> int:
    """Validate a TP degree against the number of attention heads and KV heads (None:
    unknown): every GPU must get whole query heads, and whole KV heads, either its share of
    them (``tp`` divides the KV heads) or one each, replicated (the KV heads divide ``tp``,
    as Megatron and the serving engines do when ``tp`` exceeds them)."""
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ValueError(f"tp must be a positive integer, got {tp!r}")
    ok = [d for d in range(1, (heads or 0) + 1) if heads % d == 0
          and (not kv_heads or kv_heads % d == 0 or d % kv_heads == 0)]
    if heads and heads % tp:
        raise PlanRefused(f"tp={tp} does not divide the {heads} attention heads; accepted: "
                          f"{', '.join(map(str, ok))}",
                          "tp does not split the attention heads evenly")
    if kv_heads and kv_heads % tp and tp % kv_heads:
        raise PlanRefused(f"tp={tp} neither divides the {kv_heads} KV heads nor is a "
                          f"multiple of them (a GPU would hold part of a KV head); accepted: "
                          f"{', '.join(map(str, ok))}", "tp does not split the KV heads")
    return tp


def kv_heads_per_gpu(kv_heads: int, tp: int) -> int:
    """KV heads each GPU holds at TP degree ``tp``: its share, or one whole head (a replica)
    when ``tp`` exceeds them."""
    return max(1, kv_heads // tp)


def kv_shard(module: str, features, tp: int, heads, kv_heads):
    """(per-GPU output features, note) of a column-parallel projection that produces K/V
    heads (``k_proj``, ``v_proj``, a fused QKV) when there are fewer KV heads than query
    heads, or None for any other layer. With ``tp`` above the KV heads each GPU holds one
    whole KV head (a replica), not a fraction of one."""
    leaf = module.rsplit(".", 1)[-1]
    if not (heads and kv_heads and features) or kv_heads == heads or tp <= 1:
        return None
    kv_per_gpu = kv_heads_per_gpu(kv_heads, tp)
    if leaf in _KV and features % kv_heads == 0:
        size = features // kv_heads * kv_per_gpu
    elif leaf in _QKV and features % (heads + 2 * kv_heads) == 0:
        size = features // (heads + 2 * kv_heads) * (heads // tp + 2 * kv_per_gpu)
    else:
        return None
    note = (f"{kv_heads} KV heads < tp {tp}: each GPU holds one whole KV head "
            f"({tp // kv_heads} replicas of each)" if tp > kv_heads else "")
    return size, note


def _div(x: int, tp: int) -> int:
    return -(-x // tp)


def shard_gemm(g: Gemm, kind: str, tp: int, phase: str, features: int | None = None,
               kv=None) -> Gemm:
    """The per-GPU GEMM of ``g`` at TP degree ``tp``.

    Args:
        g: the unsharded GEMM.
        kind: from :func:`layer_kind`.
        phase: ``"forward"`` or ``"backward"``.
        features: the layer's sharded feature count (output features of a column-parallel
            layer, input features of a row-parallel one), to find it in backward GEMMs.
        kv: for a projection producing KV heads, its per-GPU features and note
            (:func:`kv_shard`); the sharded dimension takes that size instead of 1/tp.
    """
    if tp == 1 or kind == "replicated":
        return g
    note = f"TP {tp}: {kind}-parallel"
    if kind == "attention":
        if g.attn is None:
            return dataclasses.replace(g, batch=_div(g.batch, tp), note=join_notes(g.note, note))
        # a fused call: heads / tp per GPU; K/V heads too when they split, else each GPU
        # keeps a copy for each of its query heads
        s = g.attn.shape
        heads = _div(s.heads, tp)
        if s.kv_heads % tp == 0:
            kv_heads = s.kv_heads // tp
        elif tp % s.kv_heads == 0:  # fewer KV heads than GPUs: one whole (replicated) each
            kv_heads = 1
            note += f" ({s.kv_heads} KV heads < tp: one KV head per GPU)"
        else:
            kv_heads = heads
        call = dataclasses.replace(g.attn, shape=dataclasses.replace(s, heads=heads,
                                                                     kv_heads=kv_heads))
        return dataclasses.replace(g, batch=s.batch * heads, note=join_notes(g.note, note),
                                   attn=call)
    if phase == "forward" or features is None:
        dim = "n" if kind == "column" else "k"
    else:
        hits = [d for d in ("k", "n", "m") if getattr(g, d) == features]
        if len(hits) > 1:  # square weight: dX reduces over the output (column) / yields input
            if g.k == features and kind == "column":
                dim = "k"
            elif g.n == features and kind == "row" and g.k != features:
                dim = "n"
            else:
                dim = hits[-1] if g.k not in (g.m, g.n) else hits[0]
        elif hits:
            dim = hits[0]
        else:
            return dataclasses.replace(g, note=join_notes(g.note,
                                                          note + " (dimension not found)"))
    value = getattr(g, dim)
    if kv is not None and value == features:
        size, kv_note = kv
        return dataclasses.replace(g, **{dim: size}, note=join_notes(g.note, join_notes(
            note, kv_note)))
    if value % tp:
        note += f" ({dim.upper()}={value} not divisible: padded to {_div(value, tp) * tp})"
    return dataclasses.replace(g, **{dim: _div(value, tp)}, note=join_notes(g.note, note))
