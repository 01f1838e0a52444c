"""A model's facts read in one place (``fxshape.tracing.facts``, issue 53), by hand."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

from fxshape.tracing.facts import ModelFacts, model_facts  # noqa: E402


def _meta(cls, cfg):
    with torch.device("meta"):
        return cls(cfg)


def test_a_moe_models_facts_by_hand():
    cfg = transformers.MixtralConfig(num_hidden_layers=2, hidden_size=128, intermediate_size=256,
                                     num_attention_heads=4, num_key_value_heads=2,
                                     vocab_size=500, num_local_experts=8,
                                     max_position_embeddings=1024)
    f = model_facts(_meta(transformers.MixtralForCausalLM, cfg))
    # experts: 2 layers x 8 x (gate_up 2*256 x 128 + down 128 x 256) elements
    assert f == ModelFacts(name="MixtralForCausalLM", heads=4, kv_heads=2, cache_kv_heads=2,
                           experts=8, expert_elements=2 * 8 * 3 * 256 * 128, hidden=128,
                           vocab=500, positions=1024, tied_elements=0, layers=2)


def test_a_tied_multi_query_model_and_a_plain_module():
    f = model_facts(_meta(transformers.GPT2LMHeadModel, transformers.GPT2Config(
        n_layer=3, n_embd=64, n_head=4, vocab_size=320, n_positions=128)))
    # GPT-2 names no KV heads; lm_head shares wte: 320 x 64 elements
    assert (f.heads, f.kv_heads, f.cache_kv_heads, f.tied_elements, f.layers, f.positions) == \
        (4, None, None, 320 * 64, 3, 128)
    falcon = model_facts(_meta(transformers.FalconForCausalLM, transformers.FalconConfig(
        num_hidden_layers=1, hidden_size=64, num_attention_heads=4, vocab_size=100,
        multi_query=True, new_decoder_architecture=False)))
    # Falcon's multi-query attention: one KV head the cache holds, none named in the config
    assert falcon.cache_kv_heads == 1 and falcon.experts == 0 and falcon.expert_elements == 0
    plain = model_facts(torch.nn.Linear(4, 4))
    assert (plain.heads, plain.hidden, plain.vocab, plain.layers) == (None, 0, None, 0)
