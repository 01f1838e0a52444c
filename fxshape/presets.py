"""Built-in model presets: published configuration values, built on the meta device.

No weights are downloaded or allocated; each preset needs the ``hf`` extra (transformers).
``fxshape presets`` lists them. The values are those of the models' published ``config.json``
files (Hugging Face Hub model cards), restated here so that nothing is fetched.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import sys

import torch

from .tracing.configs import check_config, model_class_for

__all__ = ["PRESETS", "list_presets", "build_preset", "load_target", "resolve_target"]

# name -> (config class, model class, config kwargs, description)
PRESETS = {
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", {}, "GPT-2 124M (vocab 50257)"),
    "gpt2-medium": ("GPT2Config", "GPT2LMHeadModel",
                    dict(n_embd=1024, n_layer=24, n_head=16), "GPT-2 355M"),
    "gpt2-large": ("GPT2Config", "GPT2LMHeadModel",
                   dict(n_embd=1280, n_layer=36, n_head=20), "GPT-2 774M"),
    "gpt2-xl": ("GPT2Config", "GPT2LMHeadModel",
                dict(n_embd=1600, n_layer=48, n_head=25), "GPT-2 1.5B"),
    "llama-2-7b": ("LlamaConfig", "LlamaForCausalLM",
                   dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                        num_attention_heads=32, num_key_value_heads=32, vocab_size=32000,
                        max_position_embeddings=4096), "Llama-2 7B"),
    "llama-2-70b": ("LlamaConfig", "LlamaForCausalLM",
                    dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                         num_attention_heads=64, num_key_value_heads=8, vocab_size=32000,
                         max_position_embeddings=4096), "Llama-2 70B (GQA, 8 KV heads)"),
    "llama-3-8b": ("LlamaConfig", "LlamaForCausalLM",
                   dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                        num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                        max_position_embeddings=8192, rope_theta=500000.0),
                   "Llama-3 8B (GQA, 8 KV heads)"),
    "mistral-7b": ("MistralConfig", "MistralForCausalLM",
                   dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                        num_attention_heads=32, num_key_value_heads=8, vocab_size=32000,
                        max_position_embeddings=32768, sliding_window=4096), "Mistral 7B v0.1"),
    "qwen2-7b": ("Qwen2Config", "Qwen2ForCausalLM",
                 dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                      num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
                      max_position_embeddings=32768), "Qwen2 7B"),
    "pythia-2.8b": ("GPTNeoXConfig", "GPTNeoXForCausalLM",
                    dict(hidden_size=2560, intermediate_size=10240, num_hidden_layers=32,
                         num_attention_heads=32, vocab_size=50304, max_position_embeddings=2048,
                         rotary_pct=0.25), "Pythia 2.8B (head_dim 80)"),
    "bert-base": ("BertConfig", "BertModel", {}, "BERT-base uncased (max 512 positions)"),
    "t5-base": ("T5Config", "T5ForConditionalGeneration",
                dict(d_model=768, d_ff=3072, num_layers=12, num_heads=12, d_kv=64,
                     vocab_size=32128), "T5-base (encoder-decoder)"),
    "vit-base": ("ViTConfig", "ViTModel", {}, "ViT-B/16, 224x224"),
    "mixtral-8x7b": ("MixtralConfig", "MixtralForCausalLM",
                     dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                          num_attention_heads=32, num_key_value_heads=8, vocab_size=32000,
                          max_position_embeddings=32768, num_local_experts=8,
                          num_experts_per_tok=2), "Mixtral 8x7B (MoE, top-2 of 8)"),
    "qwen3-30b-a3b": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                      dict(hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
                           num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4,
                           head_dim=128, num_experts=128, num_experts_per_tok=8,
                           vocab_size=151936, max_position_embeddings=40960,
                           rope_theta=1000000.0, norm_topk_prob=True),
                      "Qwen3-30B-A3B (MoE, top-8 of 128)"),
    "deepseek-v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM",
                    dict(hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048,
                         num_hidden_layers=61, num_attention_heads=128, num_key_value_heads=128,
                         n_routed_experts=256, n_shared_experts=1, num_experts_per_tok=8,
                         first_k_dense_replace=3, n_group=8, topk_group=4, q_lora_rank=1536,
                         kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
                         v_head_dim=128, vocab_size=129280, max_position_embeddings=163840),
                    "DeepSeek-V3 671B (MLA; MoE, top-8 of 256 + 1 shared; 3 dense layers)"),
}


def list_presets() -> list[tuple[str, str]]:
    return [(name, PRESETS[name][3]) for name in sorted(PRESETS)]


def _transformers():
    try:
        return importlib.import_module("transformers")
    except ImportError:
        raise ValueError("this target needs the Hugging Face extra: pip install "
                         "'fxshape[hf]'") from None


def build_preset(name: str) -> torch.nn.Module:
    """Build a preset on the meta device (no weights in memory)."""
    key = name.strip().lower()
    if key not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; known: {', '.join(sorted(PRESETS))}")
    cfg_cls, model_cls, kwargs, _ = PRESETS[key]
    tf = _transformers()
    cfg = getattr(tf, cfg_cls)(**kwargs)
    check_config(cfg)
    with torch.device("meta"):
        model = getattr(tf, model_cls)(cfg)
    return model.eval()


def _from_config_file(path: str) -> torch.nn.Module:
    tf = _transformers()
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    if not os.path.isfile(path):
        raise ValueError(f"config file not found: {path}")
    try:
        with open(path) as f:
            data = json.load(f)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON: {exc}") from None
    except (UnicodeDecodeError, RecursionError) as exc:
        raise ValueError(f"{path} is not JSON text ({type(exc).__name__}: a binary or "
                         "compressed file?)") from None
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror}") from None
    if not isinstance(data, dict) or "model_type" not in data:
        raise ValueError(f"{path} has no 'model_type': not a Hugging Face config")
    return _from_config_dict(tf, data, path)


def _from_config_dict(tf, data: dict, where: str) -> torch.nn.Module:
    """A model on the meta device from a ``config.json``'s contents (``where``: its name)."""
    model_type = data["model_type"]
    known = tf.CONFIG_MAPPING if hasattr(tf, "CONFIG_MAPPING") else {}
    if model_type not in known:
        remote = (" Its auto_map names remote code, which fxshape does not run."
                  if "auto_map" in data else "")
        raise ValueError(f"{where}: unknown model_type {model_type!r} (not one of the "
                         f"{len(known)} types transformers {tf.__version__} knows).{remote}")
    if "auto_map" in data:
        print(f"fxshape: note: {where}: its auto_map names remote code, which fxshape does not "
              f"run: built with transformers' own {model_type!r} classes", file=sys.stderr)
    try:
        cfg = tf.AutoConfig.for_model(**data)
    except Exception as exc:  # noqa: BLE001 - any rejection (strict dataclass fields too)
        why = " ".join(ln.strip() for ln in str(exc).splitlines() if ln.strip())
        raise ValueError(f"{where}: transformers rejects the config: {why[:300]}") from None
    check_config(cfg)
    cls, _ = model_class_for(cfg)  # its architectures, else the auto class that fits
    with torch.device("meta"):
        try:
            return cls(cfg).eval()
        except (ValueError, TypeError, AttributeError) as exc:
            raise ValueError(f"{where}: building {cls.__name__} failed: "
                             f"{str(exc).splitlines()[0][:300]}") from None


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def _from_hub_cache(target: str) -> torch.nn.Module:
    """A Hugging Face Hub id resolved from the local cache only (nothing is fetched)."""
    tf = _transformers()
    try:
        from transformers.utils import cached_file

        path = cached_file(target, "config.json", local_files_only=True)
    except Exception:  # noqa: BLE001 - not in the cache, whatever the library says
        path = None
    if not path:
        raise ValueError(f"{target!r} looks like a Hugging Face Hub id, but its config.json is "
                         "not in the local Hugging Face cache; fxshape works offline: download "
                         "the config.json into the cache, or pass a path to it")
    with open(path) as f:
        data = json.load(f)
    return _from_config_dict(tf, data, target)


def _from_factory(spec: str) -> tuple:
    """(model, example_inputs, example_kwargs) from ``package.module:factory``: an
    ``nn.Module``, or a callable returning one, or returning ``(module, example_inputs)`` or
    ``(module, example_inputs, example_kwargs)``. The current directory is importable, as
    under ``python -m``."""
    mod_name, _, attr = spec.partition(":")
    if not mod_name or not attr:
        raise ValueError(f"{spec!r}: expected package.module:factory")
    cwd = os.getcwd()
    added = cwd not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as exc:
        raise ValueError(f"cannot import {mod_name!r}: {exc}") from None
    finally:
        if added:
            sys.path.remove(cwd)
    if not hasattr(mod, attr):
        raise ValueError(f"{mod_name!r} has no attribute {attr!r}")
    obj = getattr(mod, attr)
    out = obj
    if callable(obj) and not isinstance(obj, torch.nn.Module):
        try:
            out = obj()
        except Exception as exc:  # noqa: BLE001 - the user's factory: say what went wrong
            raise ValueError(f"calling {spec}() failed: {type(exc).__name__}: {exc}") from None
    inputs = kwargs = None
    if isinstance(out, (tuple, list)) and 2 <= len(out) <= 3:
        out, inputs, *rest = out
        kwargs = rest[0] if rest else None
        if isinstance(inputs, torch.Tensor):
            inputs = (inputs,)
        if not isinstance(inputs, (tuple, list)):
            raise ValueError(f"{spec}: example_inputs must be a tensor or a tuple of them, got "
                             f"{type(inputs).__name__}")
        if kwargs is not None and not isinstance(kwargs, dict):
            raise ValueError(f"{spec}: example_kwargs must be a dict, got "
                             f"{type(kwargs).__name__}")
    if not isinstance(out, torch.nn.Module):
        raise ValueError(f"{spec} did not return a torch.nn.Module, (module, example_inputs) "
                         f"or (module, example_inputs, example_kwargs) (got "
                         f"{type(out).__name__})")
    return out, (tuple(inputs) if inputs is not None else None), kwargs


def resolve_target(target: str) -> tuple:
    """(model, example_inputs, example_kwargs) for a CLI target: a preset name, a path to a
    Hugging Face ``config.json`` (or its folder), a Hugging Face Hub id found in the local
    cache, or ``package.module:factory`` (the only kind that may bring inputs)."""
    if not isinstance(target, str) or not target.strip():
        raise ValueError(f"expected a target name, got {target!r}")
    if target.strip().lower() in PRESETS:
        return build_preset(target), None, None
    if target.endswith(".json") or os.path.isdir(target) or os.path.exists(target):
        return _from_config_file(target), None, None
    if ":" in target and os.sep not in target.partition(":")[0]:
        return _from_factory(target)
    if _HUB_ID.match(target):
        return _from_hub_cache(target), None, None
    if os.sep in target:
        return _from_config_file(target), None, None
    raise ValueError(f"unknown target {target!r}: expected a preset ({', '.join(sorted(PRESETS))}),"
                     " a path to a config.json, a Hugging Face Hub id in the local cache, or "
                     "package.module:factory")


def load_target(target: str) -> torch.nn.Module:
    """The model of :func:`resolve_target` (its example inputs, if any, left out)."""
    return resolve_target(target)[0]
