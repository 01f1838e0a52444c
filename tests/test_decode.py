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


def _falcon():
    cfg = transformers.FalconConfig(num_hidden_layers=2, hidden_size=256, num_attention_heads=8,
                                    vocab_size=1000, multi_query=True,
                                    new_decoder_architecture=False, max_position_embeddings=2048)
    with torch.device("meta"):
        return transformers.FalconForCausalLM(cfg)


@pytest.mark.parametrize("build", [_llama, _gpt2, _mistral, lambda: _llama(kv_heads=1),
                                   _falcon],
                         ids=["llama-gqa", "gpt2-mha", "mistral-gqa", "llama-mqa", "falcon-mqa"])
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


def test_falcon_multi_query_cache_by_hand():
    model = _falcon()
    config, before = model.config, model.config.to_dict()
    rep = fxshape.analyze(model, mode="decode", batch_size=2, context_len=128, gpu="h100")
    # multi-query: one KV head of 256 / 8 = 32 dims: 2 (K, V) x 2 layers x 1 x 32 x 2
    # sequences x 128 tokens x 2 bytes
    assert rep.memory.kv_cache == 2 * 2 * 1 * 32 * 2 * 128 * 2
    # the user's config untouched (transformers < 5.25 has no num_key_value_heads on Falcon's
    # config, and fxshape sets it on a copy; 5.25 derives it from multi_query itself)
    assert model.config is config and config.to_dict() == before


@pytest.mark.parametrize("preset,per_token", [
    ("gpt2", 2 * 12 * 12 * 64 * 2),         # MHA: 12 layers x 12 heads x 64
    ("llama-3-8b", 2 * 32 * 8 * 128 * 2),   # GQA: 32 layers x 8 KV heads x 128
    ("mistral-7b", 2 * 32 * 8 * 128 * 2),   # GQA: 32 layers x 8 KV heads x 128
    ("qwen2-7b", 2 * 28 * 4 * 128 * 2),     # GQA: 28 layers x 4 KV heads x 128
    ("llama-2-70b", 2 * 80 * 8 * 128 * 2),  # GQA: 80 layers x 8 KV heads x 128
])
def test_zoo_kv_bytes_per_token_by_hand(preset, per_token):
    from fxshape.presets import build_preset
    from fxshape.tracing.decode import decode_target, kv_cache_bytes

    # K and V x layers x KV heads x head_dim x 2 bytes (bf16), from the published configs;
    # 3 sequences of 64 tokens
    wrapper, _, length = decode_target(build_preset(preset), 3, 64)
    assert kv_cache_bytes(wrapper, 2) == per_token * 3 * length


def test_a_batch_that_does_not_fit_is_reported_not_refused():
    big = fxshape.analyze(_llama(), mode="decode", batch_size=16384, context_len=4096,
                          gpu="l4")
    # 2 x 2 layers x 2 KV heads x 32 x 16384 sequences x 4096 tokens x 2 bytes = 34.4 GB,
    # more than the L4's 24 GB: a report that says so, not an error
    assert big.memory.kv_cache == 2 * 2 * 2 * 32 * 16384 * 4096 * 2 > 24e9
    assert not big.memory.fits and "does NOT fit" in big.memory.describe()
    assert big.capacity.max_batch < 16384


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


def _weight_bytes(model, item=2):
    seen, n = set(), 0
    for p in model.parameters():  # tied weights once
        if id(p) not in seen:
            seen.add(id(p))
            n += p.numel()
    return n * item


def test_decode_is_never_below_its_bandwidth_floor():
    from fxshape.hardware.gpus import get_gpu

    model = _llama()
    bw = get_gpu("h100").memory_bandwidth_gbs * 1e9
    for b, ctx in ((1, 256), (16, 2048)):
        rep = fxshape.analyze(model, mode="decode", batch_size=b, context_len=ctx, gpu="h100")
        # every weight in bf16 but the untied input embedding (1000 x 256 x 2 bytes), plus
        # the cache: 2 x 2 layers x 2 KV heads x 32 x batch x context x 2 bytes
        need = _weight_bytes(model) - 1000 * 256 * 2 + 2 * 2 * 2 * 32 * b * ctx * 2
        assert rep.step.floor_s == pytest.approx(need / bw)
        assert rep.step.time_s >= rep.step.floor_s
        assert rep.step.inter_token_latency_s == rep.step.time_s
        assert rep.step.tokens_per_s == pytest.approx(b / rep.step.time_s)


def test_tied_embedding_counts_in_the_floor():
    from fxshape.hardware.gpus import get_gpu

    model = _gpt2()  # lm_head shares wte: the whole table is read by the output layer
    rep = fxshape.analyze(model, mode="decode", batch_size=1, context_len=128, gpu="h100")
    # GPT-2: MHA, 2 layers x 4 heads x 16 dims x 128 tokens x 2 (K and V) x 2 bytes
    kv = 2 * 2 * 4 * 16 * 128 * 2
    assert rep.memory.kv_cache == kv
    need = _weight_bytes(model) + kv
    assert rep.step.floor_s == pytest.approx(need / (get_gpu("h100").memory_bandwidth_gbs
                                                    * 1e9))


def test_decode_attention_reads_the_cache_once_per_kv_head():
    rep = fxshape.analyze(_llama(kv_heads=2), mode="decode", batch_size=4, context_len=1024,
                          gpu="h100")
    attn = [o for o in rep.ops if o.cls == "attention" and o.kernels]
    # one call per layer; each reads its layer's cache: 2 (K, V) x 2 KV heads x 32 x 4 x 1024
    # x 2 bytes, plus the queries and outputs and the split partials (small)
    assert len(attn) == 2
    for o in attn:
        assert 2 * 2 * 32 * 4 * 1024 * 2 <= o.bytes < 1.2 * 2 * 2 * 32 * 4 * 1024 * 2
    # no copy of the cache to the query heads (repeat_kv) anywhere in the step
    cache = 2 * 32 * 4 * 1024 * 2  # one layer's keys
    assert not [o for o in rep.ops if o.cls == "memory" and o.bytes >= cache]


def test_kv_dtype_and_pages():
    base = fxshape.analyze(_llama(), mode="decode", batch_size=2, context_len=500, gpu="h100")
    fp8 = fxshape.analyze(_llama(), mode="decode", batch_size=2, context_len=500, gpu="h100",
                          kv_dtype="fp8")
    paged = fxshape.analyze(_llama(), mode="decode", batch_size=2, context_len=500,
                            gpu="h100", page_size=16)
    # 2 x 2 layers x 2 KV heads x 32 x 2 sequences x 500 tokens x 2 bytes (bf16) or 1 (fp8);
    # pages of 16 hold 32 pages = 512 tokens a sequence
    assert base.memory.kv_cache == 2 * 2 * 2 * 32 * 2 * 500 * 2
    assert fp8.memory.kv_cache == 2 * 2 * 2 * 32 * 2 * 500 * 1
    assert paged.memory.kv_cache == 2 * 2 * 2 * 32 * 2 * 512 * 2
    assert fp8.step.time_s < base.step.time_s
    assert fp8.workload.kv_dtype == "fp8" and paged.workload.page_size == 16
    assert "fp8" in " ".join(fp8.step.notes) and "paged" in " ".join(paged.step.notes)


def test_tp_shards_the_linears_and_the_cache():
    one = fxshape.analyze(_llama(kv_heads=2), mode="decode", batch_size=2, context_len=256,
                          gpu="h100")
    two = fxshape.analyze(_llama(kv_heads=2), mode="decode", batch_size=2, context_len=256,
                          gpu="h100", tp=2)
    four = fxshape.analyze(_llama(kv_heads=2), mode="decode", batch_size=2, context_len=256,
                           gpu="h100", tp=4)
    assert two.memory.kv_cache * 2 == one.memory.kv_cache  # a KV head on each GPU
    assert four.memory.kv_cache == two.memory.kv_cache  # 4 GPUs, 2 heads: replicated
    q = [r for r in two.rows if r.module.endswith("q_proj")]
    assert q and all(r.m == 2 and r.n == 256 // 2 for r in q)  # column-parallel
    assert two.step.by_class["communication"] > 0 and two.workload.tp == 2


def test_eager_decode_is_slower_than_cuda_graphs():
    kw = dict(mode="decode", batch_size=1, context_len=256, gpu="h100")
    eager = fxshape.analyze(_llama(), execution="eager", **kw)
    graphs = fxshape.analyze(_llama(), **kw)
    assert graphs.step.execution == "cudagraphs" and eager.step.time_s > graphs.step.time_s
    assert eager.step.host_idle_s > 0


def test_capacity_is_what_analyze_says_fits():
    from fxshape.execution.serving import capacity_of

    model = _llama()
    rep = fxshape.analyze(model, mode="decode", batch_size=1, context_len=4096, gpu="l4")
    cap = rep.capacity
    # KV bytes per token: 2 x 2 layers x 2 KV heads x 32 x 2 bytes
    assert cap.kv_bytes_per_token == 512
    assert cap.max_context == 4096 and cap.capped_by_positions  # the model's positions
    # the largest batch fits, 5% more does not (the limit is a lower bound: the batch-1
    # report's activations that do not grow with the batch are counted per sequence), each
    # checked by a new analysis
    n = cap.max_batch
    at = fxshape.analyze(model, mode="decode", batch_size=n, context_len=4096, gpu="l4")
    over = fxshape.analyze(model, mode="decode", batch_size=int(n * 1.05), context_len=4096,
                           gpu="l4")
    assert at.memory.fits and not over.memory.fits
    half = capacity_of(rep, utilization=0.5)
    assert half.max_batch < n
    assert "largest batch at 4,096 tokens" in rep.table()
    with pytest.raises(ValueError, match="utilization must be in"):
        capacity_of(rep, utilization=1.5)
    prefill = fxshape.analyze(model, batch_size=1, seq_len=64, gpu="l4", provenance=None)
    with pytest.raises(ValueError, match="needs a mode='decode' report"):
        capacity_of(prefill)


def test_kv_options_bad_input():
    with pytest.raises(ValueError, match="kv_dtype is for mode='decode'"):
        fxshape.analyze(_llama(), kv_dtype="fp8")
    with pytest.raises(ValueError, match="page_size is for mode='decode'"):
        fxshape.analyze(_llama(), page_size=16)
    with pytest.raises(ValueError, match="page_size must be a positive integer"):
        fxshape.analyze(_llama(), mode="decode", context_len=64, page_size=0)
    with pytest.raises(ValueError, match="tp=3 does not divide"):
        fxshape.analyze(_llama(), mode="decode", context_len=64, tp=3)


def test_advise_decode_ranks_by_decode_tokens_and_reports_kv_bytes():
    from fxshape.codesign.advise import advise

    cfg = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=256, intermediate_size=688,
                                   num_attention_heads=8, num_key_value_heads=4,
                                   vocab_size=1003, max_position_embeddings=4096)
    adv = advise(cfg, gpu="h100", mode="decode", batch_size=8, context_len=2048,
                 param_tolerance=0.5)
    # the model's cache: 2 (K, V) x 2 layers x 4 KV heads x 32 x 2 bytes per token
    assert adv.kv_bytes_per_token == 2 * 2 * 4 * 32 * 2 and adv.decode
    kv = [r for r in adv.recommendations if r.hyperparameter == "num_key_value_heads"]
    for r in kv:  # fewer KV heads: the cache shrinks in proportion
        assert r.kv_bytes_per_token == 2 * 2 * r.suggested * 32 * 2
    assert all(r.predicted_speedup > 0 for r in adv.recommendations)
    text = adv.table()
    assert "KV bytes/token" in text and "tokens/s at batch 8" in text
    assert any(n.startswith("tp 2:") for n in adv.notes)
    with pytest.raises(ValueError, match="are for mode='decode'"):
        advise(cfg, gpu="h100", mode="train", context_len=128)


def _mixtral():
    cfg = transformers.MixtralConfig(num_hidden_layers=2, hidden_size=128,
                                     intermediate_size=256, num_attention_heads=4,
                                     num_key_value_heads=2, vocab_size=500, num_local_experts=8,
                                     num_experts_per_tok=2, max_position_embeddings=1024)
    with torch.device("meta"):
        return transformers.MixtralForCausalLM(cfg)


def test_moe_decode_floor_reads_only_the_routed_experts():
    """Issue 52: the floor read every expert while the grouped GEMMs read the routed ones
    (mixtral-8x7b at batch 1 was priced at x0.42 its floor)."""
    from fxshape.hardware.gpus import get_gpu

    model = _mixtral()
    bw = get_gpu("h100").memory_bandwidth_gbs * 1e9
    # experts: 2 layers x 8 experts x (gate_up 2*256 x 128 + down 128 x 256) x 2 bytes
    experts = 2 * 8 * (2 * 256 * 128 + 128 * 256) * 2
    embed = 500 * 128 * 2  # the untied input embedding: a row a token is gathered
    kv = lambda b, ctx: 2 * 2 * 2 * 32 * b * ctx * 2  # K and V, 2 layers, 2 KV heads of 32
    # batch 1, top-2 of 8: two experts a layer read, 6/8 of the expert weights not
    rep = fxshape.analyze(model, mode="decode", batch_size=1, context_len=256, gpu="h100")
    need = _weight_bytes(model) - embed - experts * 6 // 8 + kv(1, 256)
    assert rep.step.floor_s == pytest.approx(need / bw)
    assert rep.step.time_s >= rep.step.floor_s
    assert any("routed experts only" in n for n in rep.step.notes)
    # batch 8: 16 routed rows over 8 experts, every expert read
    rep = fxshape.analyze(model, mode="decode", batch_size=8, context_len=256, gpu="h100")
    assert rep.step.floor_s == pytest.approx((_weight_bytes(model) - embed + kv(8, 256)) / bw)
    assert not any("routed experts only" in n for n in rep.step.notes)
    # routing given: the 2 rows go to experts 0 and 3, again 6 of 8 experts not read
    rep = fxshape.analyze(model, mode="decode", batch_size=1, context_len=256, gpu="h100",
                          moe_routing=[0.5, 0, 0, 0.5, 0, 0, 0, 0])
    assert rep.step.floor_s == pytest.approx(need / bw)
    assert rep.step.time_s >= rep.step.floor_s
    # tp 2: the experts' weights are split like memory.parameters holds them, so the floor
    # stays positive and below the step
    rep = fxshape.analyze(model, mode="decode", batch_size=1, context_len=256, gpu="h100", tp=2)
    assert 0 < rep.step.floor_s <= rep.step.time_s


def test_mla_decode_caches_the_latent():
    """Issue 52: DeepSeek-V3's decode failed inside transformers' static cache (sized by
    heads x head_dim while MLA caches its latent)."""
    cfg = transformers.DeepseekV3Config(
        num_hidden_layers=2, hidden_size=128, intermediate_size=256, moe_intermediate_size=64,
        num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8, num_experts_per_tok=2,
        n_group=2, topk_group=1, first_k_dense_replace=1, q_lora_rank=64, kv_lora_rank=32,
        qk_rope_head_dim=16, qk_nope_head_dim=32, v_head_dim=32, vocab_size=500,
        max_position_embeddings=1024)
    with torch.device("meta"):
        model = transformers.DeepseekV3ForCausalLM(cfg)
    rep = fxshape.analyze(model, mode="decode", batch_size=2, context_len=256, gpu="h100")
    # the latent (32) and the rotary key (16) a token a layer: 2 layers x 48 x 2 x 256 x 2 bytes
    assert rep.memory.kv_cache == 2 * (32 + 16) * 2 * 256 * 2
    assert any("MLA as transformers runs it" in n for n in rep.step.notes)
    assert 0 < rep.step.floor_s <= rep.step.time_s
    # tp 2: the latent is whole on each GPU (one "head")
    rep2 = fxshape.analyze(model, mode="decode", batch_size=2, context_len=256, gpu="h100", tp=2)
    assert rep2.memory.kv_cache == rep.memory.kv_cache
