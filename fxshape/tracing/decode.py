"""One decode step with a static KV cache, as a module ``capture`` can take (issue 22, first
part).

A decode step feeds one new token per sequence to a model whose KV cache already holds
``context_len`` tokens. :func:`decode_target` wraps a Hugging Face causal LM in
``transformers``' own export recipe for a static cache
(``transformers.integrations.executorch.TorchExportableModuleWithStaticCache``: the cache's
key and value tensors are the wrapper's buffers, one pair per layer), on the meta device,
and returns the forward arguments of the step: ``input_ids`` of shape ``(batch, 1)`` and the
cache position ``context_len - 1``, so that attention reads ``context_len`` keys. The user's
model is not changed: the wrapper gets a shallow copy whose generation config asks for the
static cache.
"""

from __future__ import annotations

import contextlib
import copy
import os
import warnings

import torch

from .export import resolve_seq_len, check_size
from .facts import kv_heads_of

__all__ = ["decode_target", "kv_cache_bytes", "kv_bytes_by_layer", "check_decoder",
           "decode_capture", "latent_kv"]


def check_decoder(model) -> None:
    """A one-line ``ValueError`` unless ``model`` can run one decode step here: a Hugging Face
    causal LM (a decoder) whose forward takes a KV cache and whose class transformers lets
    run with a static one (``_can_compile_fullgraph``), the cache this capture uses."""
    import inspect

    name = type(model).__name__
    cfg = getattr(model, "config", None)
    if cfg is None or not hasattr(cfg, "to_dict"):
        raise ValueError(f"mode='decode' needs a Hugging Face causal LM (its config sizes the "
                         f"KV cache); {name} has no config: build the model with transformers "
                         "(a ...ForCausalLM from its config), or analyze its forward with "
                         "mode='inference' and example inputs")
    causal = name.endswith(("ForCausalLM", "LMHeadModel"))
    if not causal or getattr(cfg, "is_encoder_decoder", False):
        raise ValueError(f"mode='decode' needs a Hugging Face causal LM (a decoder with a KV "
                         f"cache: ...ForCausalLM, ...LMHeadModel); {name} is not one")
    try:
        params = inspect.signature(inspect.unwrap(type(model).forward)).parameters
    except (TypeError, ValueError):
        params = {}
    if params and not any(p in params for p in ("cache", "past_key_values")):
        raise ValueError(f"mode='decode' needs a KV cache, and {name} has none in transformers "
                         "(its forward takes no cache: every step recomputes the whole "
                         "sequence); analyze it with mode='inference' instead")
    # attention modules say whether they mask the future (BERT's follow config.is_decoder)
    bidirectional = sorted({type(m).__name__ for m in model.modules()
                            if getattr(m, "is_causal", None) is False})
    if bidirectional:
        hint = " (set is_decoder=True in its config)" if "is_decoder" in cfg.to_dict() else ""
        raise ValueError(f"mode='decode' needs causal attention; {name}'s "
                         f"{bidirectional[0]} attends both ways{hint}, so a token's keys "
                         "and values change with every new token: no KV cache to reuse. Use "
                         "mode='inference'")
    if getattr(type(model), "_can_compile_fullgraph", True) is False:
        raise ValueError(f"mode='decode' captures the step through transformers' static KV "
                         f"cache, which transformers does not offer for {name} "
                         "(_can_compile_fullgraph is False); analyze it with "
                         "mode='inference' instead")


def decode_target(model, batch_size=None, context_len=None):
    """``(wrapper, kwargs, context_len)``: the static-cache module and its forward arguments
    for one decode step of ``batch_size`` sequences over ``context_len`` cached tokens
    (default: 1024, capped at the model's positions).

    Raises:
        ValueError: not a causal LM, a size that is not a positive integer, or a context
            beyond the model's positions.
    """
    from transformers.integrations.executorch import TorchExportableModuleWithStaticCache

    check_decoder(model)
    b = check_size("batch_size", batch_size) or 1
    try:
        length = resolve_seq_len(model.config, context_len)
    except ValueError as exc:
        raise ValueError(str(exc).replace("seq_len", "context_len")) from None
    shallow = copy.copy(model)
    gen = copy.deepcopy(getattr(model, "generation_config", None))
    if gen is None:
        raise ValueError(f"{type(model).__name__} has no generation_config: it cannot run "
                         "with a KV cache")
    gen.cache_implementation = "static"
    gen.use_cache = True
    shallow.generation_config = gen
    kv = kv_heads_of(model.config)
    if kv is not None and getattr(model.config, "num_key_value_heads", None) != kv:
        # the static cache is sized by num_key_value_heads (else the query heads): say
        # what the model really makes (Falcon's multi-query attention: one KV head)
        cfg = copy.deepcopy(model.config)
        cfg.num_key_value_heads = kv
        shallow.config = cfg
    wrapper = TorchExportableModuleWithStaticCache(shallow, batch_size=b,
                                                   max_cache_len=length, device="meta")
    _latent_cache(wrapper, model, b)
    kwargs = {"input_ids": torch.zeros(b, 1, dtype=torch.long, device="meta"),
              "cache_position": torch.tensor([length - 1], device="meta")}
    return wrapper, kwargs, length


def latent_kv(cfg):
    """``(latent, rope)`` per token for multi-head latent attention (DeepSeek-V2/V3, Kimi-K2:
    ``kv_lora_rank`` and ``qk_rope_head_dim`` in the config), whose cache holds the compressed
    latent and the shared rotary key, one "head" each; None for other attention."""
    r, rope = getattr(cfg, "kv_lora_rank", None), getattr(cfg, "qk_rope_head_dim", None)
    if isinstance(r, int) and isinstance(rope, int) and r > 0 and rope > 0:
        return r, rope
    return None


def _latent_cache(wrapper, model, batch) -> None:
    """transformers' static-cache export sizes every layer's keys and values by the config's
    heads and ``head_dim``; an MLA layer caches its latent ``[b, 1, L, kv_lora_rank]`` and
    rotary key ``[b, 1, L, qk_rope_head_dim]`` instead (the ``cache.update`` of
    ``DeepseekV3Attention``), so those layers are sized as such."""
    latent = latent_kv(model.config)
    if latent is None:
        return
    r, rope = latent
    dtype = wrapper.model.dtype
    for i, layer in enumerate(wrapper.static_cache.layers):
        if getattr(layer, "max_cache_len", 0) == 0:
            continue  # a KV-sharing consumer: no cache of its own
        layer.lazy_initialization(torch.zeros(batch, 1, 0, r, dtype=dtype, device="meta"),
                                  torch.zeros(batch, 1, 0, rope, dtype=dtype, device="meta"))
        setattr(wrapper, f"key_cache_{i}", layer.keys)
        setattr(wrapper, f"value_cache_{i}", layer.values)


def _kv_buffers(wrapper):
    """``(layer index, elements, length)`` of each of the static cache's key and value
    buffers (length 0 where the buffer is not ``[batch, heads, length, dim]``)."""
    for name, buf in wrapper.named_buffers():
        if name.startswith(("key_cache_", "value_cache_")):
            yield (int(name.rsplit("_", 1)[1]), buf.numel(),
                   buf.shape[2] if buf.dim() == 4 else 0)


def kv_bytes_by_layer(wrapper, itemsize: float) -> dict:
    """``{layer index: bytes a token of the batch holds in that layer's keys and values}``
    (the static cache's buffers over their length)."""
    out: dict = {}
    for i, numel, length in _kv_buffers(wrapper):
        if length:
            out[i] = out.get(i, 0.0) + numel / length * itemsize
    return out


def kv_cache_bytes(wrapper, itemsize: float, windows=None) -> int:
    """Bytes of the static cache's key and value tensors at ``itemsize`` bytes each (0.5625
    for NVFP4: a fraction). ``windows``: layer index -> sliding window: such a layer holds
    only its last ``window`` tokens, as a serving engine's sliding-window cache does
    (transformers' export wrapper gives it the whole context)."""
    n = 0
    for i, numel, length in _kv_buffers(wrapper):
        w = (windows or {}).get(i)
        n += numel * min(w, length) // length if w and length else numel
    return int(round(n * itemsize))


@contextlib.contextmanager
def decode_capture():
    """The context a decode step is captured in: Hugging Face's SDPA integration passes
    grouped-query K/V to ``scaled_dot_product_attention`` as they are (``enable_gqa``), as
    serving kernels read them (each KV head once per group), instead of repeating them to the
    query heads (``repeat_kv``, a copy of the whole cache per layer that no serving engine
    makes); and ``torch.export``'s warnings about the static cache's lifted constants are
    silenced (they say nothing about the step)."""
    key = "TRANSFORMERS_SDPA_FORCE_GQA"
    old = os.environ.get(key)
    os.environ[key] = "1"
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*requires gradient.*",
                                    category=UserWarning)
            yield
    finally:
        if old is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = old
