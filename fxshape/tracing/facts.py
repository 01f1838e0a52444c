"""What a model is, read once from its config and modules: heads, KV heads, hidden size,
routed experts and their parameters, the input embedding and whether the output layer
shares it, positions, the KV heads a cache holds (issue 53: these were read in five places,
and the plan search reached into the analysis's private names for them).

:func:`model_facts` gives them as one frozen record (:class:`ModelFacts`); the functions are
the rules themselves, each in one place, for callers that need one fact.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .configs import HEAD_FIELDS, HIDDEN_FIELDS

__all__ = ["ModelFacts", "model_facts", "query_heads", "head_counts", "routed_experts",
           "linear_features", "attention_windows",
           "expert_params", "hidden_size", "input_embedding", "tied_embedding_elements",
           "max_positions", "kv_heads_of"]


def _config(model):
    return getattr(model, "config", None)


def _int(v) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def query_heads(model) -> int | None:
    """The query heads a model's config names (``num_attention_heads``, ``n_head``, ...)."""
    cfg = _config(model)
    for attr in HEAD_FIELDS:
        v = getattr(cfg, attr, None)
        if isinstance(v, int):
            return v
    return None


def head_counts(model) -> tuple:
    """``(query heads, KV heads)`` from a model's config (the KV heads as
    ``num_key_value_heads`` names them); either None when unknown."""
    if not isinstance(model, torch.nn.Module):
        return None, None
    return query_heads(model), _int(getattr(_config(model), "num_key_value_heads", None))


def routed_experts(model) -> int:
    """Routed experts per MoE layer from the model's config (0: not a MoE model)."""
    cfg = _config(model)
    return next((v for a in ("num_local_experts", "n_routed_experts", "num_experts",
                             "moe_num_experts")
                 if isinstance(v := getattr(cfg, a, None), int) and v > 1), 0)


def expert_params(model) -> set:
    """``id``s of the routed experts' parameters: tensors of ``E`` stacked experts (leading
    dimension ``E``, Transformers' fused expert layers) and the parameters of a module list
    of ``E`` experts."""
    e = routed_experts(model)
    if not e:
        return set()
    out = set()
    for name, mod in model.named_modules():
        if name.split(".")[-1] != "experts":
            continue
        if isinstance(mod, torch.nn.ModuleList) and len(mod) == e:
            out.update(id(p) for p in mod.parameters())
            continue
        out.update(id(p) for p in mod.parameters(recurse=False)
                   if p.dim() >= 2 and p.shape[0] == e)
    return out


def hidden_size(model) -> int:
    """The model's hidden size from its config (0 when it has none)."""
    cfg = _config(model)
    return next((getattr(cfg, a) for a in HIDDEN_FIELDS
                 if isinstance(getattr(cfg, a, None), int)), 0)


def input_embedding(model):
    """``(weight, tied)``: the input embedding's weight (None without one) and whether the
    output layer shares it."""
    get_in = getattr(model, "get_input_embeddings", None)
    get_out = getattr(model, "get_output_embeddings", None)
    emb = get_in() if callable(get_in) else None
    w = getattr(emb, "weight", None)
    if not isinstance(w, torch.Tensor):
        return None, False
    out = get_out() if callable(get_out) else None
    return w, out is not None and getattr(out, "weight", None) is w


def tied_embedding_elements(model) -> int:
    """Elements of an input embedding the output layer shares (0 when not tied)."""
    w, tied = input_embedding(model)
    return w.numel() if tied else 0


def linear_features(model) -> dict:
    """module name -> (out_features, in_features) for linear-like layers."""
    out = {}
    for name, mod in model.named_modules():
        w = getattr(mod, "weight", None)
        if not isinstance(w, torch.Tensor) or w.dim() != 2:
            continue
        if type(mod).__name__ == "Conv1D":  # GPT-2 stores (in, out)
            out[name] = (w.shape[1], w.shape[0])
        else:
            out[name] = (w.shape[0], w.shape[1])
    return out


def attention_windows(model) -> dict:
    """Attention module name -> its sliding window (keys), for the layers that have one: the
    module's own ``sliding_window`` (Gemma 2/3, Qwen2/3's ``layer_types``, gpt-oss), else the
    config's ``layer_types`` at its ``layer_idx``, else the config's ``sliding_window`` for
    every attention layer (Mistral). Empty for a model without windows."""
    cfg = getattr(model, "config", None)
    if cfg is None:
        return {}
    sw = getattr(cfg, "sliding_window", None)
    sw = sw if isinstance(sw, int) and not isinstance(sw, bool) and sw > 0 else None
    types = getattr(cfg, "layer_types", None)
    out = {}
    for name, mod in model.named_modules():
        idx = getattr(mod, "layer_idx", None)
        if not type(mod).__name__.endswith("Attention") or not isinstance(idx, int):
            continue
        if hasattr(mod, "sliding_window"):
            w = mod.sliding_window
        elif isinstance(types, (list, tuple)) and idx < len(types):
            w = sw if types[idx] == "sliding_attention" else None
        else:
            w = sw
        if isinstance(w, int) and not isinstance(w, bool) and w > 0:
            out[name] = w
    return out


def max_positions(cfg) -> int | None:
    """The positions a config allows (``max_position_embeddings``, ``n_positions``), or None."""
    for attr in ("max_position_embeddings", "n_positions"):
        v = getattr(cfg, attr, None)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return None


def kv_heads_of(cfg) -> int | None:
    """The KV heads a config's attention makes, where the config does not name them
    ``num_key_value_heads``: Falcon's ``multi_query`` (one KV head, or ``num_kv_heads``
    with the new decoder architecture) and ``num_kv_heads``."""
    if isinstance(getattr(cfg, "num_key_value_heads", None), int):
        return cfg.num_key_value_heads
    if getattr(cfg, "multi_query", False):
        return cfg.num_kv_heads if getattr(cfg, "new_decoder_architecture", False) else 1
    v = getattr(cfg, "num_kv_heads", None)
    return v if isinstance(v, int) else None


@dataclass(frozen=True)
class ModelFacts:
    """A model's shape facts, read once: ``heads``/``kv_heads`` as its config names them
    (None when it does not), ``cache_kv_heads`` the KV heads its attention makes (Falcon's
    multi-query included), ``experts`` routed per MoE layer (0: dense), ``expert_elements``
    the elements of their parameters, ``hidden``, ``vocab`` and ``positions`` (None when the
    config has none), ``tied_elements`` of an input embedding the output layer shares,
    ``layers`` the longest stack of identical layers."""

    name: str
    heads: int | None
    kv_heads: int | None
    cache_kv_heads: int | None
    experts: int
    expert_elements: int
    hidden: int
    vocab: int | None
    positions: int | None
    tied_elements: int
    layers: int


def model_facts(model) -> ModelFacts:
    """:class:`ModelFacts` of ``model`` (an ``nn.Module``; its config where it has one)."""
    from .dedup import find_stacks

    cfg = _config(model)
    heads, kv = head_counts(model)
    ids = expert_params(model)
    return ModelFacts(
        name=type(model).__name__, heads=heads, kv_heads=kv, cache_kv_heads=kv_heads_of(cfg),
        experts=routed_experts(model),
        expert_elements=sum(p.numel() for p in model.parameters() if id(p) in ids),
        hidden=hidden_size(model), vocab=_int(getattr(cfg, "vocab_size", None)),
        positions=max_positions(cfg), tied_elements=tied_embedding_elements(model),
        layers=max((s.length for s in find_stacks(model)), default=0))
