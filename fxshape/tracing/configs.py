"""Model configs checked before a model is built or captured: one line naming the field, its
value and the rule, instead of a traceback from deep inside the model's code, or worse, an
analysis of a model that cannot run.

The rules are the ones every transformer of the Hugging Face families fxshape handles obeys:
sizes are positive integers; query heads split evenly over the hidden size (unless the
config sets ``head_dim`` itself) and over the KV heads; a token goes to no more experts than
there are. A value equal to the config class's own default is not checked (some defaults
are sentinels: XLNet's ``max_position_embeddings = -1``), and a family whose default splits
the hidden size unevenly (GLM-4-MoE) does not get the even-split rule: every default config
of transformers passes (``tests/test_bad_inputs.py``).
"""

from __future__ import annotations

import functools

__all__ = ["check_config", "model_class_for", "SIZE_FIELDS", "HIDDEN_FIELDS", "HEAD_FIELDS"]

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


#: config attributes that hold the hidden size and the query-head count, first found wins
HIDDEN_FIELDS = ("hidden_size", "n_embd", "d_model")
HEAD_FIELDS = ("num_attention_heads", "n_head", "num_heads")
_HEAD_DIM = ("head_dim", "d_kv", "qk_nope_head_dim", "attention_head_size", "kv_channels",
             "head_size")
#: a field the config has but will not give one global value of (a per-layer field)
_UNREADABLE = object()


def _get(config, name):
    """``config.name``; None where the config has no such field; :data:`_UNREADABLE` where it
    will not give one global value (heterogeneous per-layer configs raise their own errors)."""
    try:
        return getattr(config, name, None)
    except Exception:  # noqa: BLE001 - a per-layer field: not checked here
        return _UNREADABLE


@functools.lru_cache(maxsize=None)
def _defaults(cls) -> dict:
    """The size fields of ``cls()``: a library's own defaults are not the user's mistakes
    (some are sentinels: XLNet's max_position_embeddings = -1, head_dim = 0 for "derived")."""
    try:
        cfg = cls()
    except Exception:  # noqa: BLE001 - a config class without defaults: check everything
        return {}
    out = {f: repr(_get(cfg, f)) for f in SIZE_FIELDS}
    # a family whose own default splits the hidden size unevenly over the heads derives its
    # head_dim some other way (GLM-4-MoE: 4096 over 96 heads): the rule is not its rule
    hidden, heads = _first(cfg, *HIDDEN_FIELDS)[1], _first(cfg, *HEAD_FIELDS)[1]
    out["uneven heads"] = _is_int(hidden) and _is_int(heads) and hidden % heads != 0
    return out


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _first(config, *names):
    """(name as the config spells it, value) of the first of ``names`` it sets."""
    amap = getattr(config, "attribute_map", None) or {}
    for name in names:
        v = _get(config, name)
        if v is not None:  # an unreadable per-layer field counts as set
            return amap.get(name, name), v
    return None, None


class ConfigRefused(ValueError):
    """A config that cannot describe a model that runs, refused in one line (a
    ``ValueError``, its message unchanged): what a search over configs (``fxshape.advise``'s
    candidates) leaves out, by type, never by parsing the message."""


def check_config(config) -> None:
    """Raise :class:`ConfigRefused` (one line: the field, its value, the rule) when
    ``config`` cannot describe a model that runs. Fields a config does not have are not
    checked."""
    name = type(config).__name__
    amap = getattr(config, "attribute_map", None) or {}
    defaults = _defaults(type(config))
    for field in [f for f in SIZE_FIELDS if f not in amap]:  # each field once, as spelled
        v = _get(config, field)
        if v is None or v is _UNREADABLE or defaults.get(field) == repr(v):
            continue
        # per-stage values (Swin's num_heads, a (height, width) image_size) are lists,
        # per-part ones (LXMERT's layers) dicts
        vals = list(v.values() if isinstance(v, dict) else v) \
            if isinstance(v, (list, tuple, dict)) and v else [v]
        if not all(_is_int(x) and x > 0 for x in vals):
            raise ConfigRefused(f"{name}.{field} = {v!r}: must be a positive integer")
    h_name, hidden = _first(config, *HIDDEN_FIELDS)
    a_name, heads = _first(config, *HEAD_FIELDS)
    d_name, _ = _first(config, *_HEAD_DIM)
    if _is_int(hidden) and _is_int(heads) and d_name is None and hidden % heads \
            and not defaults.get("uneven heads"):
        raise ConfigRefused(f"{name}.{h_name} = {hidden} is not divisible by {a_name} = "
                            f"{heads}: each head takes {h_name} / {a_name} features (or set "
                            "head_dim)")
    kv = _get(config, "num_key_value_heads")
    if _is_int(heads) and _is_int(kv) and heads % kv:
        raise ConfigRefused(f"{name}.num_key_value_heads = {kv} does not divide {a_name} = "
                            f"{heads}: each KV head serves a whole group of query heads")
    e_name, experts = _first(config, "num_local_experts", "num_experts", "n_routed_experts")
    top = _get(config, "num_experts_per_tok")
    if _is_int(experts) and _is_int(top) and top > experts:
        raise ConfigRefused(f"{name}.num_experts_per_tok = {top} exceeds {e_name} = "
                            f"{experts}: a token is routed to at most every expert")


def model_class_for(config):
    """``(transformers class, how it was chosen)`` for a config built without a model: the
    class its ``architectures`` names (a ``config.json``'s own), else the first auto class
    that takes it (causal LM, seq2seq, masked LM, base model), except that an encoder family
    that also has a causal-LM head (BERT, RoBERTa: ``...ForCausalLM`` wants ``is_decoder``)
    is built as its masked LM unless the config says it is a decoder."""
    import transformers as tf

    for name in getattr(config, "architectures", None) or ():
        cls = getattr(tf, name, None) if isinstance(name, str) else None
        if isinstance(cls, type):
            return cls, f"its architectures ({name})"
    from transformers.models.auto import modeling_auto as ma

    key = type(config)
    masked = key in ma.MODEL_FOR_MASKED_LM_MAPPING
    order = ("AutoModelForCausalLM", "AutoModelForSeq2SeqLM", "AutoModelForMaskedLM",
             "AutoModel")
    if masked and not getattr(config, "is_decoder", False):
        order = ("AutoModelForMaskedLM", "AutoModelForSeq2SeqLM", "AutoModelForCausalLM",
                 "AutoModel")
    for auto in order:
        mapping = getattr(tf, auto)._model_mapping
        if key in mapping:
            return mapping[key], f"{auto} (the config names no architectures)"
    raise ValueError(f"no transformers model class for model_type "
                     f"{getattr(config, 'model_type', type(config).__name__)!r}")
