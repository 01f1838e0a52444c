"""Model configs checked before a model is built or captured: one line naming the field, its
value and the rule, instead of a traceback from deep inside the model's code, or worse, an
analysis of a model that cannot run.

The rules are the ones every transformer of the Hugging Face families fxshape handles obeys:
sizes are positive integers; query heads split evenly over the hidden size (unless the
config sets ``head_dim`` itself) and over the KV heads; a token goes to no more experts than
there are.
"""

from __future__ import annotations

__all__ = ["check_config", "SIZE_FIELDS"]

#: config fields that are sizes: a positive integer where set (None means "unset" for the
#: ones a config may leave unset, e.g. GPT-2's n_inner, DeepSeek's q_lora_rank)
SIZE_FIELDS = (
    "vocab_size", "hidden_size", "n_embd", "d_model", "num_attention_heads", "n_head",
    "num_heads", "num_key_value_heads", "head_dim", "d_kv", "intermediate_size", "n_inner",
    "d_ff", "ffn_dim", "num_hidden_layers", "n_layer", "num_layers", "max_position_embeddings",
    "n_positions", "num_local_experts", "num_experts", "n_routed_experts",
    "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size",
    "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
    "image_size", "patch_size", "num_channels", "num_mel_bins", "max_source_positions",
    "max_target_positions", "encoder_layers", "decoder_layers",
)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _first(config, *names):
    """(name as the config spells it, value) of the first of ``names`` it sets."""
    amap = getattr(config, "attribute_map", None) or {}
    for name in names:
        v = getattr(config, name, None)
        if v is not None:
            return amap.get(name, name), v
    return None, None


def check_config(config) -> None:
    """Raise ``ValueError`` (one line: the field, its value, the rule) when ``config`` cannot
    describe a model that runs. Fields a config does not have are not checked."""
    name = type(config).__name__
    amap = getattr(config, "attribute_map", None) or {}
    for field in [f for f in SIZE_FIELDS if f not in amap]:  # each field once, as spelled
        v = getattr(config, field, None)
        if v is None:
            continue
        if field == "image_size" and isinstance(v, (list, tuple)):
            vals = list(v)
        else:
            vals = [v]
        if not all(_is_int(x) and x > 0 for x in vals):
            raise ValueError(f"{name}.{field} = {v!r}: must be a positive integer")
    h_name, hidden = _first(config, "hidden_size", "n_embd", "d_model")
    a_name, heads = _first(config, "num_attention_heads", "n_head", "num_heads")
    d_name, _ = _first(config, "head_dim", "d_kv", "qk_nope_head_dim")
    if hidden and heads and d_name is None and hidden % heads:
        raise ValueError(f"{name}.{h_name} = {hidden} is not divisible by {a_name} = {heads}: "
                         f"each head takes {h_name} / {a_name} features (or set head_dim)")
    kv = getattr(config, "num_key_value_heads", None)
    if heads and kv and _is_int(kv) and heads % kv:
        raise ValueError(f"{name}.num_key_value_heads = {kv} does not divide {a_name} = "
                         f"{heads}: each KV head serves a whole group of query heads")
    e_name, experts = _first(config, "num_local_experts", "num_experts", "n_routed_experts")
    top = getattr(config, "num_experts_per_tok", None)
    if experts and top and top > experts:
        raise ValueError(f"{name}.num_experts_per_tok = {top} exceeds {e_name} = {experts}: "
                         "a token is routed to at most every expert")
