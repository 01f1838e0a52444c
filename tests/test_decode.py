"""Decode and prefill (issue 22, first part): one decode step captured through a static KV
cache, GEMMs with M = batch for every linear, the KV cache's bytes by hand for MHA, GQA and
MQA models, prefill == inference, decode time monotonic in batch and context, bad input."""

import pytest
import torch

import fxshape

transformers = pytest.importorskip("transformers")


def _llama(kv_heads=2, layers=2):
    cfg = transformers.LlamaConfig(num_hidden_layers=layers, hidden_size=256,
                                   intermediate_size=512, num_attention_heads=8,
                                   num_key_value_heads=kv_heads, vocab_size=1000,
                                   max_position_embeddings=4096)
    with torch.device("meta"):
        return transformers.LlamaForCausalLM(cfg)


def _gpt2():
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=320,
                                  n_positions=512)
    with torch.device("meta"):
        return transformers.GPT2LMHeadModel(cfg)


def _mistral():
    cfg = transformers.MistralConfig(num_hidden_layers=2, hidden_size=128,
                                     intermediate_size=256, num_attention_heads=8,
                                     num_key_value_heads=2, vocab_size=500,
                                     max_position_embeddings=4096)
    with torch.device("meta"):
        return transformers.MistralForCausalLM(cfg)


@pytest.mark.parametrize("build", [_llama, _gpt2, _mistral, lambda: _llama(kv_heads=1)],
                         ids=["llama-gqa", "gpt2-mha", "mistral-gqa", "llama-mqa"])
def test_decode_gemms_have_m_equal_to_the_batch(build):
    rep = fxshape.analyze(build(), mode="decode", batch_size=3, context_len=256,
                          gpu="h100")
    linears = [r for r in rep.rows if not r.kernel]
    assert linears and all(r.m == 3 for r in linears)
    # attention: one query per sequence against the cache's 256 keys
    attn = [r for r in rep.rows if r.op == "sdpa.qk"]
    assert attn and all(r.m == 1 and r.n == 256 for r in attn)
    assert rep.workload.mode == "decode" and rep.workload.context_len == 256
    assert rep.step.tokens == 3 and rep.step.execution == "cudagraphs"


@pytest.mark.parametrize("kv_heads", [8, 2, 1])  # MHA, GQA, MQA
def test_kv_cache_bytes_by_hand(kv_heads):
    rep = fxshape.analyze(_llama(kv_heads=kv_heads), mode="decode", batch_size=4,
                          context_len=512, gpu="h100", dtype=torch.bfloat16)
    # keys and values (2) x 2 layers x kv heads x head_dim 256 / 8 = 32 x batch 4 x 512
    # tokens x 2 bytes (bf16)
    assert rep.memory.kv_cache == 2 * 2 * kv_heads * 32 * 4 * 512 * 2
    assert rep.memory.peak >= rep.memory.parameters + rep.memory.kv_cache


def test_prefill_is_inference():
    kw = dict(gpu="h100", batch_size=2, seq_len=64, provenance=None)
    a = fxshape.analyze(_gpt2(), mode="prefill", **kw)
    b = fxshape.analyze(_gpt2(), mode="inference", **kw)
    assert a.rows == b.rows and a.step.time_s == b.step.time_s
    assert a.workload.mode == "prefill" and a.step.mode == "prefill"


def test_decode_time_grows_with_batch_and_context():
    t = {}
    for b, ctx in ((1, 256), (8, 256), (1, 2048)):
        t[b, ctx] = fxshape.analyze(_llama(), mode="decode", batch_size=b, context_len=ctx,
                                    gpu="h100").step.time_s
    assert t[1, 256] <= t[8, 256] and t[1, 256] <= t[1, 2048]


def test_decode_does_not_change_the_model():
    model = _llama()
    before = model.generation_config.cache_implementation
    fxshape.analyze(model, mode="decode", batch_size=1, context_len=64, gpu="h100")
    assert model.generation_config.cache_implementation == before


def test_decode_bad_input():
    with pytest.raises(ValueError, match="context_len 8192 exceeds"):
        fxshape.analyze(_llama(), mode="decode", context_len=8192)
    cfg = transformers.BertConfig(num_hidden_layers=1, hidden_size=64, num_attention_heads=4,
                                  intermediate_size=128)
    with torch.device("meta"):
        bert = transformers.BertModel(cfg)
    with pytest.raises(ValueError, match="needs a Hugging Face causal LM"):
        fxshape.analyze(bert, mode="decode")
    with pytest.raises(ValueError, match="give context_len"):
        fxshape.analyze(_llama(), mode="decode", seq_len=16)
    with pytest.raises(ValueError, match="context_len is for mode='decode'"):
        fxshape.analyze(_llama(), context_len=16)
    with pytest.raises(ValueError, match="unknown mode 'serve'; accepted: 'inference', "
                                         "'prefill', 'train', 'decode'"):
        fxshape.analyze(_llama(), mode="serve")
