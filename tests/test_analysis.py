"""Capture and analysis on real model families, expectations computed from their configs."""

import json
from collections import Counter

import pytest
import torch

import fxshape
import fxshape.presets
from fxshape import CaptureError, analyze, capture
from fxshape.analysis.annotate import META_KEY

from models import MLP, EinsumBmm, NanoGPT, NoMatmul

transformers = pytest.importorskip("transformers")


def _shapes(report, op=None):
    """Counter of (module pattern, op, batch, M, N, K) over all rows."""
    import re

    return Counter((re.sub(r"\.\d+(?=\.|$)", ".*", r.module), r.op, r.batch, r.m, r.n, r.k)
                   for r in report.rows if op is None or r.op == op)


# ---------------------------------------------------------------------------------------
# plain modules
# ---------------------------------------------------------------------------------------

def test_mlp_real_weights_untouched():
    torch.manual_seed(0)
    model = MLP()
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(32, 64)
    rep = analyze(model, (x,), gpu="a100", dtype="fp16")
    # fc1: M = 32 tokens, K = 64 in, N = 200 out; fc2: M = 32, K = 200, N = 10
    assert _shapes(rep) == Counter({("fc1", "linear", 1, 32, 200, 64): 1,
                                    ("fc2", "linear", 1, 32, 10, 200): 1})
    assert model.training  # flag restored
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]) and v.device.type == "cpu"
    # 2 * (32*200*64 + 32*10*200) = 947200
    assert rep.total_flops == 947_200
    assert rep.total_time_s == pytest.approx(sum(r.prediction.time_s for r in rep.rows))


def test_nanogpt_on_meta_device():
    with torch.device("meta"):
        model = NanoGPT(vocab_size=50257, n_layer=2, n_head=4, n_embd=128)
    idx = torch.zeros(2, 256, dtype=torch.long)
    rep = analyze(model, (idx,), gpu="h100")
    tokens = 2 * 256  # batch x seq
    s = _shapes(rep)
    assert s[("h.*.attn.c_attn", "linear", 1, tokens, 384, 128)] == 2  # 3 x 128
    assert s[("h.*.attn.c_proj", "linear", 1, tokens, 128, 128)] == 2
    assert s[("h.*.c_fc", "linear", 1, tokens, 512, 128)] == 2  # 4 x 128
    assert s[("h.*.c_proj", "linear", 1, tokens, 128, 512)] == 2
    assert s[("lm_head", "linear", 1, tokens, 50257, 128)] == 1
    # attention: batch x heads = 8, head_dim = 32; causal -> half the work
    assert s[("h.*.attn", "sdpa.qk", 8, 256, 256, 32)] == 2
    assert s[("h.*.attn", "sdpa.pv", 8, 256, 32, 256)] == 2
    qk = [r for r in rep.rows if r.op == "sdpa.qk"][0]
    assert qk.work == 0.5 and qk.flops == 2 * 8 * 256 * 256 * 32 // 2
    lm = [r for r in rep.rows if r.module == "lm_head"][0]
    assert "N=50257->50264" in str(rep)
    assert lm.prediction.alignment[1].status == "misaligned"


def test_matmul_flavours():
    a, b, c = torch.randn(4, 16, 24), torch.randn(4, 24, 40), torch.randn(40, 8)
    rep = analyze(EinsumBmm(), (a, b, c), gpu="h100")
    ops = {r.op: (r.batch, r.m, r.n, r.k) for r in rep.rows}
    assert ops["einsum"] == (4, 16, 40, 24)  # bij,bjk->bik
    # y[4, 16, 40] @ c[40, 8]: the batch dimension folds into M = 4 x 16 = 64
    assert ops["matmul"] == (1, 4 * 16, 8, 40)
    assert ops["bmm"] == (4, 16, 16, 8)  # y[4,16,8] @ y^T[4,8,16]


def test_no_matmul_report_says_so():
    rep = analyze(NoMatmul(), (torch.randn(3, 3),))
    assert rep.rows == () and "no matmuls found" in str(rep)
    assert rep.total_time_s == 0 and rep.efficiency == 0


def test_non_hf_model_without_inputs_is_rejected():
    with pytest.raises(ValueError, match="pass example_inputs"):
        analyze(MLP())


def test_capture_error_names_the_paths():
    class Broken(torch.nn.Module):
        def forward(self, x):
            raise RuntimeError("boom in forward")

    with pytest.raises(CaptureError) as exc:
        capture(Broken(), (torch.randn(2),))
    msg = str(exc.value)
    assert "Broken" in msg and "torch.export (non-strict)" in msg and "boom in forward" in msg
    assert "hint:" in msg


def test_bad_arguments():
    with pytest.raises(ValueError, match="unknown GPU"):
        analyze(MLP(), (torch.randn(2, 64),), gpu="h300")
    with pytest.raises(ValueError, match="unknown dtype"):
        analyze(MLP(), (torch.randn(2, 64),), dtype="int4")
    with pytest.raises(ValueError, match="expected a torch.nn.Module"):
        capture(lambda x: x, (torch.randn(2),))


def test_meta_annotations_and_networkx():
    rep = analyze(MLP(), (torch.randn(8, 64),))
    gm = rep.graph_module
    annotated = [n for n in gm.graph.nodes if META_KEY in n.meta]
    assert len(annotated) == 2
    assert all(isinstance(r, fxshape.GemmRow) for n in annotated for r in n.meta[META_KEY])
    g = rep.to_networkx()
    assert g.number_of_nodes() == 2 and g.number_of_edges() == 1  # fc1 -> relu -> fc2


def test_custom_handler_registration():
    with pytest.raises(ValueError, match="already registered"):
        fxshape.register_gemm_handler(torch.ops.aten.mm)(lambda n: [])


# ---------------------------------------------------------------------------------------
# Hugging Face models from their configs (small layer counts keep the tests fast; sizes real)
# ---------------------------------------------------------------------------------------

def _meta(model_cls, cfg):
    with torch.device("meta"):
        return model_cls(cfg)


def test_gpt2():
    cfg = transformers.GPT2Config(n_layer=2)  # 768 wide, 12 heads, vocab 50257
    rep = analyze(_meta(transformers.GPT2LMHeadModel, cfg), seq_len=128, batch_size=2)
    t = 2 * 128
    s = _shapes(rep)
    # GPT-2's Conv1D is addmm with the weight stored (in, out)
    assert s[("transformer.h.*.attn.c_attn", "addmm", 1, t, 3 * 768, 768)] == 2
    assert s[("transformer.h.*.attn.c_proj", "addmm", 1, t, 768, 768)] == 2
    assert s[("transformer.h.*.mlp.c_fc", "addmm", 1, t, 3072, 768)] == 2
    assert s[("transformer.h.*.mlp.c_proj", "addmm", 1, t, 768, 3072)] == 2
    assert s[("lm_head", "linear", 1, t, 50257, 768)] == 1
    # attention: batch 2 x 12 heads, head_dim 64
    assert s[("transformer.h.*.attn", "sdpa.qk", 24, 128, 128, 64)] == 2
    assert s[("transformer.h.*.attn", "sdpa.pv", 24, 128, 64, 128)] == 2
    assert not rep.unsupported


def test_default_inputs_respect_max_positions():
    cfg = transformers.BertConfig(num_hidden_layers=1)
    model = _meta(transformers.BertModel, cfg)
    rep = analyze(model)  # default seq_len = min(1024, 512)
    q = [r for r in rep.rows if r.module.endswith("attention.self.query")][0]
    assert q.m == 512 and (q.n, q.k) == (768, 768)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        analyze(model, seq_len=1024)


def test_llama_gqa():
    cfg = transformers.LlamaConfig(hidden_size=4096, intermediate_size=14336,
                                   num_hidden_layers=1, num_attention_heads=32,
                                   num_key_value_heads=8, vocab_size=128256)
    rep = analyze(_meta(transformers.LlamaForCausalLM, cfg), seq_len=256)
    s = _shapes(rep)
    # head_dim = 4096 / 32 = 128; K/V projections: 8 KV heads x 128 = 1024
    assert s[("model.layers.*.self_attn.q_proj", "linear", 1, 256, 4096, 4096)] == 1
    assert s[("model.layers.*.self_attn.k_proj", "linear", 1, 256, 1024, 4096)] == 1
    assert s[("model.layers.*.self_attn.v_proj", "linear", 1, 256, 1024, 4096)] == 1
    assert s[("model.layers.*.self_attn.o_proj", "linear", 1, 256, 4096, 4096)] == 1
    assert s[("model.layers.*.mlp.gate_proj", "linear", 1, 256, 14336, 4096)] == 1
    assert s[("model.layers.*.mlp.up_proj", "linear", 1, 256, 14336, 4096)] == 1
    assert s[("model.layers.*.mlp.down_proj", "linear", 1, 256, 4096, 14336)] == 1
    assert s[("lm_head", "linear", 1, 256, 128256, 4096)] == 1
    # attention runs over the 32 query heads (KV heads are repeated)
    assert s[("model.layers.*.self_attn", "sdpa.qk", 32, 256, 256, 128)] == 1


def test_t5_encoder_decoder():
    cfg = transformers.T5Config(num_layers=1, num_decoder_layers=1)  # t5-small sizes
    rep = analyze(_meta(transformers.T5ForConditionalGeneration, cfg), seq_len=64)
    d, dff, h, dkv = cfg.d_model, cfg.d_ff, cfg.num_heads, cfg.d_kv
    s = _shapes(rep)
    assert s[("encoder.block.*.layer.*.SelfAttention.q", "linear", 1, 64, h * dkv, d)] == 1
    assert s[("decoder.block.*.layer.*.EncDecAttention.k", "linear", 1, 64, h * dkv, d)] == 1
    assert s[("encoder.block.*.layer.*.DenseReluDense.wi", "linear", 1, 64, dff, d)] == 1
    assert s[("lm_head", "linear", 1, 64, cfg.vocab_size, d)] == 1
    # self-attention in encoder and decoder plus cross-attention: 3 attention calls
    assert sum(1 for r in rep.rows if r.op == "sdpa.qk") == 3


def test_vit_conv_patch_embedding():
    cfg = transformers.ViTConfig(num_hidden_layers=1)  # 224 px, patch 16, 768 wide
    rep = analyze(_meta(transformers.ViTModel, cfg))
    conv = [r for r in rep.rows if r.op == "conv"][0]
    # implicit GEMM: M = 1 x (224/16)^2 = 196 patches, N = 768, K = 3 x 16 x 16 = 768
    assert (conv.batch, conv.m, conv.n, conv.k) == (1, 196, 768, 768)
    # 196 patches + CLS token = 197 tokens through the projections
    q = [r for r in rep.rows if r.module.endswith("q_proj") or r.module.endswith("query")][0]
    assert q.m == 197


def test_mixtral_experts_balanced_routing():
    cfg = transformers.MixtralConfig(hidden_size=256, intermediate_size=512,
                                     num_hidden_layers=1, num_attention_heads=8,
                                     num_key_value_heads=2, vocab_size=1000,
                                     num_local_experts=4, num_experts_per_tok=2)
    rep = analyze(_meta(transformers.MixtralForCausalLM, cfg), seq_len=64)
    experts = [r for r in rep.rows if r.op == "grouped_mm"]
    # 64 tokens x top-2 = 128 routed rows over 4 experts -> M = 32 per expert
    assert sorted((r.batch, r.m, r.n, r.k) for r in experts) == [(4, 32, 256, 512),
                                                                 (4, 32, 1024, 256)]
    assert all("balanced routing" in r.note for r in experts)


def test_json_is_deterministic():
    def run():
        cfg = transformers.GPT2Config(n_layer=1)
        return analyze(_meta(transformers.GPT2LMHeadModel, cfg), seq_len=64).to_json()

    a, b = run(), run()
    assert a == b
    d = json.loads(a)
    assert d["gpu"] == "h100-sxm" and d["dtype"] == "bf16" and len(d["rows"]) == 7


# ---------------------------------------------------------------------------------------
# training mode: the backward GEMMs autograd runs
# ---------------------------------------------------------------------------------------

class _RecordGemms(torch.utils._python_dispatch.TorchDispatchMode):
    """Independent reference: the mm/addmm/bmm calls a real CPU backward makes."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in ("mm", "addmm", "bmm"):
            a, b = (args[1], args[2]) if name == "addmm" else (args[0], args[1])
            if name == "bmm":
                self.calls.append((a.shape[0], a.shape[1], b.shape[2], a.shape[2]))
            else:
                self.calls.append((1, a.shape[0], b.shape[1], a.shape[1]))
        return func(*args, **(kwargs or {}))


def _reference_gemms(model, x):
    model = model.train()
    rec = _RecordGemms()
    with rec:
        out = model(x)
        out.float().sum().backward()
    return Counter(rec.calls)


def test_train_mode_matches_real_autograd_mlp():
    torch.manual_seed(0)
    model = MLP(d_in=64, d_hidden=200, d_out=10)
    x = torch.randn(32, 64)
    rep = analyze(model, (x,), mode="train", gpu="a100", dtype="fp16")
    got = Counter((r.batch, r.m, r.n, r.k) for r in rep.rows)
    assert got == _reference_gemms(model, x)
    by_phase = Counter((r.module, r.phase) for r in rep.rows)
    # forward: fc1, fc2; backward: fc2 dX and dW, fc1 dW (x needs no gradient: no fc1 dX)
    assert by_phase == Counter({("fc1", "forward"): 1, ("fc2", "forward"): 1,
                                ("fc2", "backward"): 2, ("fc1", "backward"): 1})
    back = {(r.m, r.n, r.k) for r in rep.rows if r.phase == "backward"}
    # dX = dY[32,10] @ W2[10,200]; dW2 = dY^T[10,32] @ H[32,200]; dW1 = dH^T[200,32] @ X[32,64]
    assert back == {(32, 200, 10), (10, 200, 32), (200, 64, 32)}
    assert all(p.grad is None for p in MLP().parameters())


def test_train_mode_matches_real_autograd_tied_lm():
    class TinyLM(torch.nn.Module):
        def __init__(self, vocab=100, d=48):
            super().__init__()
            self.emb = torch.nn.Embedding(vocab, d)
            self.fc = torch.nn.Linear(d, 4 * d)
            self.proj = torch.nn.Linear(4 * d, d)
            self.head = torch.nn.Linear(d, vocab, bias=False)
            self.head.weight = self.emb.weight  # tied, as in GPT-2

        def forward(self, idx):
            h = self.emb(idx)
            return self.head(h + self.proj(torch.relu(self.fc(h))))

    model = TinyLM()
    idx = torch.randint(0, 100, (2, 16))
    rep = analyze(model, (idx,), mode="train")
    assert Counter((r.batch, r.m, r.n, r.k) for r in rep.rows) == _reference_gemms(model, idx)
    # the tied head still gets its weight gradient: forward, dX and dW
    assert Counter(r.phase for r in rep.rows if r.module == "head") == Counter(
        {"forward": 1, "backward": 2})
    assert model.head.weight is model.emb.weight  # still tied


def test_gpt2_train_mode():
    cfg = transformers.GPT2Config(n_layer=2)
    model = _meta(transformers.GPT2LMHeadModel, cfg).eval()
    rep = analyze(model, seq_len=64, mode="train")
    assert not model.training  # captured in training mode, then restored
    counts = Counter((r.module.replace(".0.", ".*.").replace(".1.", ".*."), r.phase)
                     for r in rep.rows if r.op in ("mm", "addmm"))
    for proj in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"):
        name = f"transformer.h.*.{proj}"
        assert counts[(name, "forward")] == 2  # two layers
        assert counts[(name, "backward")] == 4  # dX and dW per layer
    assert counts[("lm_head", "forward")] == 1 and counts[("lm_head", "backward")] == 2
    dw = [r for r in rep.rows if r.module == "lm_head" and r.phase == "backward"
          and r.k == 64]
    # weight gradient of the LM head: (vocab, tokens) x (tokens, hidden), K = 64 tokens
    assert {(r.m, r.n) for r in dw} <= {(50257, 768), (768, 50257)}


def test_flash_attention_head_dim_padding():
    # Pythia-2.8B: 2560 / 32 heads = head_dim 80, which flash kernels run as 96
    cfg = transformers.GPTNeoXConfig(hidden_size=2560, intermediate_size=10240,
                                     num_hidden_layers=1, num_attention_heads=32,
                                     vocab_size=50304, rotary_pct=0.25)
    rep = analyze(_meta(transformers.GPTNeoXForCausalLM, cfg), seq_len=2048)
    qk = [r for r in rep.rows if r.op == "sdpa.qk"][0]
    assert (qk.batch, qk.m, qk.n, qk.k) == (32, 2048, 2048, 80)
    assert qk.attention.run_head_dim == 96 and "head_dim 80 as 96" in qk.note
    # useful FLOPs are counted at 80: 2 * 32 * 2048 * 2048 * 80 (times the causal half)
    assert qk.flops == 2 * 32 * 2048 * 2048 * 80 * qk.work
    # the same attention at head_dim 96 (hidden 3072) costs the same time: 80 wastes 1/6
    cfg96 = transformers.GPTNeoXConfig(hidden_size=3072, intermediate_size=10240,
                                       num_hidden_layers=1, num_attention_heads=32,
                                       vocab_size=50304, rotary_pct=0.25)
    rep96 = analyze(_meta(transformers.GPTNeoXForCausalLM, cfg96), seq_len=2048)
    qk96 = [r for r in rep96.rows if r.op == "sdpa.qk"][0]
    # compute-bound at 2048 tokens: the same time within the Q/K/V traffic difference
    assert qk96.k == 96 and qk96.time_s == pytest.approx(qk.time_s, rel=0.02)
    assert qk.efficiency == pytest.approx(qk96.efficiency * 80 / 96, rel=0.02)


# ---------------------------------------------------------------------------------------
# tensor parallelism
# ---------------------------------------------------------------------------------------

def _llama_small():
    cfg = transformers.LlamaConfig(hidden_size=4096, intermediate_size=14336,
                                   num_hidden_layers=1, num_attention_heads=32,
                                   num_key_value_heads=8, vocab_size=128256)
    return _meta(transformers.LlamaForCausalLM, cfg)


def test_tp_shapes_llama():
    rep = analyze(_llama_small(), seq_len=128, tp=4)
    s = _shapes(rep)
    # column-parallel: N / 4; row-parallel: K / 4; attention: 32 heads / 4 = 8 per GPU
    assert s[("model.layers.*.self_attn.q_proj", "linear", 1, 128, 4096 // 4, 4096)] == 1
    assert s[("model.layers.*.self_attn.k_proj", "linear", 1, 128, 1024 // 4, 4096)] == 1
    assert s[("model.layers.*.self_attn.o_proj", "linear", 1, 128, 4096, 4096 // 4)] == 1
    assert s[("model.layers.*.mlp.gate_proj", "linear", 1, 128, 14336 // 4, 4096)] == 1
    assert s[("model.layers.*.mlp.down_proj", "linear", 1, 128, 4096, 14336 // 4)] == 1
    assert s[("lm_head", "linear", 1, 128, 128256 // 4, 4096)] == 1
    assert s[("model.layers.*.self_attn", "sdpa.qk", 8, 128, 128, 128)] == 1


def test_tp_refuses_degree_not_dividing_heads():
    with pytest.raises(ValueError, match="tp=3 does not divide the 32 attention heads"):
        analyze(_llama_small(), seq_len=64, tp=3)
    with pytest.raises(ValueError, match="positive integer"):
        analyze(_llama_small(), seq_len=64, tp=0)


@pytest.mark.parametrize("mode", ["inference", "train"])
def test_tp_beyond_the_kv_heads_replicates_whole_kv_heads(mode):
    # 8 KV heads at tp 16: each GPU holds one whole KV head (128 features), never half of
    # one (1024 / 16 = 64); query heads still split: 32 / 16 = 2 per GPU
    # (tp 16 needs an NVLink domain of 16 GPUs or more: a DGX node holds 8)
    rep = analyze(_llama_small(), seq_len=128, tp=16, mode=mode, provenance=None,
                  topology="gb200-nvl72")
    kv = [r for r in rep.rows if r.module.endswith(("k_proj", "v_proj"))]
    assert kv and all(r.phase == "backward" or r.n == 128 for r in kv)
    # the backward GEMMs carry the same 128 wherever the output features appear
    assert all(128 in (r.m, r.n, r.k) and 64 not in (r.m, r.n, r.k) for r in kv)
    assert all("one whole KV head" in r.note for r in kv if r.phase == "forward")
    q = [r for r in rep.rows if r.module.endswith("q_proj") and r.phase == "forward"]
    assert q[0].n == 4096 // 16
    attn = [r for r in rep.rows if r.attention is not None]
    # 2 query heads per GPU; Llama's code repeats the KV heads before SDPA (repeat_kv), so the
    # call it makes has 32 KV heads, 2 per GPU
    assert {(r.attention.shape.heads, r.attention.shape.kv_heads) for r in attn} == {(2, 2)}
    assert any("each GPU holds one whole KV head" in n for n in rep.notes)


def test_tp_shards_a_gqa_attention_call_into_whole_kv_heads():
    # an SDPA call that takes its 8 KV heads as they are (enable_gqa): at tp 16 every GPU
    # runs 2 query heads against 1 whole KV head; at tp 4, 8 query heads against 2
    from fxshape.analysis.ops import AttentionCall, Gemm
    from fxshape.analysis.parallel import shard_gemm
    from fxshape.cost.attention import AttentionShape

    shape = AttentionShape(batch=1, heads=32, kv_heads=8, seq_q=128, seq_k=128, head_dim=128,
                           head_dim_v=128)
    g = Gemm("sdpa.qk", 32, 128, 128, 128, "nt", attn=AttentionCall(shape, "forward"))
    for tp, heads, kv in ((16, 2, 1), (4, 8, 2)):
        s = shard_gemm(g, "attention", tp, "forward").attn.shape
        assert (s.heads, s.kv_heads) == (heads, kv)


def test_tp_must_give_whole_kv_heads():
    # Qwen2-7B's shape: 28 heads, 4 KV heads. tp 7 divides the heads but would put 4/7 of a
    # KV head on each GPU: neither 7 | 4 nor 4 | 7
    cfg = transformers.Qwen2Config(hidden_size=3584, intermediate_size=18944,
                                   num_hidden_layers=1, num_attention_heads=28,
                                   num_key_value_heads=4, vocab_size=152064)
    model = _meta(transformers.Qwen2ForCausalLM, cfg)
    with pytest.raises(ValueError, match=r"tp=7 neither divides the 4 KV heads nor is a "
                                         r"multiple of them.*accepted: 1, 2, 4, 28$"):
        analyze(model, seq_len=64, tp=7)


def test_tp_gpt2_vocab_padding_note():
    cfg = transformers.GPT2Config(n_layer=1)
    rep = analyze(_meta(transformers.GPT2LMHeadModel, cfg), seq_len=64, tp=2)
    lm = [r for r in rep.rows if r.module == "lm_head"][0]
    # 50257 / 2 -> 25129 per GPU, padded (Megatron pads the vocabulary)
    assert lm.n == 25129 and "not divisible" in lm.note
    c_fc = [r for r in rep.rows if r.module.endswith("mlp.c_fc")][0]
    c_proj = [r for r in rep.rows if r.module.endswith("mlp.c_proj")][0]
    assert (c_fc.n, c_fc.k) == (3072 // 2, 768) and (c_proj.n, c_proj.k) == (768, 3072 // 2)


def test_tp_train_mode_backward_shards():
    torch.manual_seed(0)

    class TwoLayer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.up_proj = torch.nn.Linear(64, 256, bias=False)    # column-parallel
            self.down_proj = torch.nn.Linear(256, 64, bias=False)  # row-parallel

        def forward(self, x):
            return self.down_proj(torch.relu(self.up_proj(x)))

    x = torch.randn(32, 64, requires_grad=True)
    rep = analyze(TwoLayer(), (x,), mode="train", tp=2)
    got = {(r.module, r.phase, r.m, r.n, r.k) for r in rep.rows}
    # forward: up N 256/2; down K 256/2
    assert ("up_proj", "forward", 32, 128, 64) in got
    assert ("down_proj", "forward", 32, 64, 128) in got
    # backward: down dX = dY[32,64] @ W[64,128] -> N = 128; up dX reduces over its 128 outputs
    assert ("down_proj", "backward", 32, 128, 64) in got
    assert ("up_proj", "backward", 32, 64, 128) in got
    # weight gradients: every one has 128 on its feature side and K = 32 tokens
    dw = [r for r in rep.rows if r.phase == "backward" and r.k == 32]
    assert len(dw) == 2 and all(128 in (r.m, r.n) for r in dw)


# ---------------------------------------------------------------------------------------
# every preset at its real size (short sequences keep it to ~2 minutes on 2 cores)
# ---------------------------------------------------------------------------------------

def _per_layer_gemms(name, cfg):
    """GEMM rows per layer from the architecture (2 per attention call: QK^T and PV)."""
    if name.startswith("gpt2"):
        return cfg.n_layer, 4 + 2, 1                    # c_attn, attn c_proj, c_fc, mlp c_proj
    if name == "qwen3-30b-a3b":
        return cfg.num_hidden_layers, 4 + 1 + 2 + 2, 1  # q k v o, router, 2 grouped experts
    if name == "deepseek-v3":
        # MLA: q_a q_b kv_a kv_b o + 2 attention; the 3 dense layers' gate up down; the 58
        # MoE layers' router, 2 grouped experts and the shared expert's gate up down; the head
        dense, moe = cfg.first_k_dense_replace, cfg.num_hidden_layers - cfg.first_k_dense_replace
        return None, None, dense * (7 + 3) + moe * (7 + 1 + 2 + 3) + 1
    if name.startswith(("llama", "mistral", "qwen")):
        return cfg.num_hidden_layers, 7 + 2, 1          # q k v o gate up down
    if name.startswith("mixtral"):
        return cfg.num_hidden_layers, 4 + 1 + 2 + 2, 1  # q k v o, router, 2 grouped experts
    if name.startswith("pythia"):
        return cfg.num_hidden_layers, 4 + 2, 1          # qkv, dense, h_to_4h, 4h_to_h
    if name == "bert-base":
        return cfg.num_hidden_layers, 6 + 2, 1          # q k v, out, intermediate, output; pooler
    if name == "t5-base":
        # encoder layer: q k v o wi wo + 1 attention; decoder: 2 x (q k v o) + wi wo + 2
        return None, None, 1 + cfg.num_layers * (6 + 2) + cfg.num_decoder_layers * (10 + 4)
    if name == "vit-base":
        return cfg.num_hidden_layers, 6 + 2, 2          # patch conv + pooler
    raise AssertionError(name)


@pytest.mark.parametrize("name", sorted(fxshape.presets.PRESETS))
def test_every_preset_at_real_size(name):
    from fxshape.presets import build_preset

    model = build_preset(name)
    cfg = model.config
    seq = None if name == "vit-base" else 32
    rep = analyze(model, seq_len=seq)
    assert not rep.unsupported
    layers, per_layer, extra = _per_layer_gemms(name, cfg)
    expected = extra if layers is None else layers * per_layer + extra
    assert len(rep.rows) == expected
    hidden = getattr(cfg, "hidden_size", None) or getattr(cfg, "n_embd", None) or cfg.d_model
    tokens = 197 if name == "vit-base" else 32  # ViT: (224/16)^2 patches + CLS
    linears = [r for r in rep.rows if r.op in ("linear", "addmm")]
    assert all(r.m == tokens for r in linears if "pooler" not in r.module)
    assert any(r.k == hidden for r in linears) and any(r.n == hidden for r in linears)
    vocab = getattr(cfg, "vocab_size", None)
    if name not in ("bert-base", "vit-base"):
        assert any(r.n == vocab for r in rep.rows)  # the LM head


def test_decoder_masks_count_as_causal_but_encoders_do_not():
    llama = analyze(_llama_small(), seq_len=128)
    qk = [r for r in llama.rows if r.op == "sdpa.qk"][0]
    assert qk.work == 0.5 and "causal (decoder mask)" in qk.note
    bert = analyze(_meta(transformers.BertModel, transformers.BertConfig(num_hidden_layers=1)),
                   seq_len=64)
    assert all(r.work == 1.0 for r in bert.rows if r.op.startswith("sdpa"))
    t5 = analyze(_meta(transformers.T5ForConditionalGeneration,
                       transformers.T5Config(num_layers=1, num_decoder_layers=1)), seq_len=64)
    works = {r.module.split(".")[0] + ("/cross" if "EncDec" in r.module else ""): r.work
             for r in t5.rows if r.op == "sdpa.qk"}
    # encoder self-attention and decoder cross-attention are full; decoder self is causal
    assert works == {"encoder": 1.0, "decoder": 0.5, "decoder/cross": 1.0}


def test_attention_is_one_fused_kernel():
    rep = analyze(_llama_small(), seq_len=512)
    qk, pv = [r for r in rep.rows if r.op.startswith("sdpa")][:2]
    # one call, one prediction: the kernel's time is split over its two GEMMs by FLOPs (the
    # kernel PyTorch 2.13's SDPA runs on an H100, the default GPU: cuDNN's)
    assert qk.attention is pv.attention and qk.kernel == pv.kernel == "cudnn"
    assert qk.time_s + pv.time_s == pytest.approx(qk.attention.time_s, rel=1e-12)
    # Llama-3-like: 32 heads of 4096/32 = 128, one sequence of 512, causal (half the scores):
    # each GEMM does 2 x 32 x 512 x 512 x 128 / 2 FLOPs (GQA shares K/V, not the work)
    assert qk.flops == pv.flops == 2 * 32 * 512 * 512 * 128 // 2
    # cheaper than the two GEMMs on their own at half the work (two launches, the score
    # matrix through memory, a softmax pass between them)
    assert qk.time_s + pv.time_s < qk.prediction.time_s + pv.prediction.time_s


def _mixtral_small():
    """Mixtral with 4 experts, 2 per token: hidden 256, experts' width 512, one layer."""
    cfg = transformers.MixtralConfig(hidden_size=256, intermediate_size=512,
                                     num_hidden_layers=1, num_attention_heads=8,
                                     num_key_value_heads=2, vocab_size=1000,
                                     num_local_experts=4, num_experts_per_tok=2)
    return _meta(transformers.MixtralForCausalLM, cfg)


def test_moe_routing_given():
    model = _mixtral_small()
    rep = analyze(model, seq_len=64, moe_routing=[0.5, 0.25, 0.25, 0.0])
    experts = sorted((r.m, r.n, r.k) for r in rep.rows if r.op == "grouped_mm")
    # 128 routed rows: 64, 32, 32 and none -> 3 experts x 2 GEMMs
    assert experts == sorted([(64, 1024, 256), (32, 1024, 256), (32, 1024, 256),
                              (64, 256, 512), (32, 256, 512), (32, 256, 512)])
    with pytest.raises(ValueError, match="4 experts"):
        analyze(model, seq_len=64, moe_routing=[0.5, 0.5])
    with pytest.raises(ValueError, match="sum to 1"):
        analyze(model, seq_len=64, moe_routing=[0.5, 0.5, 0.5, 0.5])


# ---------------------------------------------------------------------------------------
# training mode across the model zoo
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["gpt2", "llama3", "bert", "t5", "mixtral", "nanogpt", "vit"])
def test_train_mode_captures_every_zoo_model_with_nothing_unsupported(name):
    from test_pad_zoo import _build

    with torch.device("meta"):
        model = transformers.ViTModel(transformers.ViTConfig(
            hidden_size=192, num_attention_heads=3, intermediate_size=512, num_hidden_layers=1,
            image_size=64, patch_size=16)) if name == "vit" else _build(name)
    if name == "nanogpt":
        rep = analyze(model, (torch.zeros(2, 128, dtype=torch.long, device="meta"),),
                      mode="train")
    else:
        rep = analyze(model, seq_len=None if name == "vit" else 128, mode="train")
    assert not rep.unsupported, rep.unsupported
    # every attention call has its fused backward
    ops = Counter(r.op for r in rep.rows)
    assert ops["sdpa.qk"] >= 1 and ops["sdpa.bwd.qk"] == ops["sdpa.qk"]
    if name == "vit":
        # patch embedding: 3 -> 192 channels, 16 x 16 kernel, stride 16 on 64 x 64: 4 x 4 = 16
        # patches. Weight gradient: M = 192, N = 3 * 16 * 16 = 768, K = 1 image x 16 patches;
        # no input gradient (the pixels need none)
        conv = {(r.op, r.m, r.n, r.k) for r in rep.rows if r.op.startswith("conv")}
        assert conv == {("conv", 16, 192, 768), ("conv.wgrad", 192, 768, 16)}
    if name == "mixtral":
        # 4 experts, hidden 256, intermediate 512 (gate and up fused: 1024); 128 tokens x top-2
        # = 256 routed rows, 64 per expert. dX = dY W^T: (64, in, out); dW = X^T dY: (in, out, 64)
        back = {(r.op, r.batch, r.m, r.n, r.k) for r in rep.rows
                if r.op.startswith("grouped") and r.phase == "backward"}
        assert back == {("grouped_mm.dx", 4, 64, 256, 1024), ("grouped_mm.dw", 4, 256, 1024, 64),
                        ("grouped_mm.dx", 4, 64, 512, 256), ("grouped_mm.dw", 4, 512, 256, 64)}
        # given routing splits the weight gradients along their reduction (the rows):
        # 256 rows x (0.5, 0.25, 0.25, 0) = 128, 64, 64 and none
        routed = analyze(model, seq_len=128, mode="train", moe_routing=[0.5, 0.25, 0.25, 0.0])
        dw = sorted(r.k for r in routed.rows if r.op == "grouped_mm.dw")
        assert dw == [64, 64, 64, 64, 128, 128]


# ---------------------------------------------------------------------------------------
# input synthesis and capture robustness
# ---------------------------------------------------------------------------------------

def _whisper():
    cfg = transformers.WhisperConfig(d_model=128, encoder_layers=1, decoder_layers=1,
                                     encoder_attention_heads=2, decoder_attention_heads=2,
                                     encoder_ffn_dim=256, decoder_ffn_dim=256, num_mel_bins=80,
                                     max_source_positions=1500, vocab_size=51865)
    return _meta(transformers.WhisperModel, cfg)


@pytest.mark.parametrize("mode", ["inference", "train"])
def test_whisper_gets_input_features(mode):
    rep = analyze(_whisper(), seq_len=64, mode=mode)
    assert not rep.unsupported
    conv = {(r.module, r.op, r.m, r.n, r.k) for r in rep.rows if r.op.startswith("conv")}
    # input_features 1 x 80 mels x 3000 frames (2 x 1500 positions). conv1 (kernel 3, stride 1):
    # M = 3000 frames, N = 128 channels, K = 80 x 3 = 240; conv2 (stride 2): M = 1500,
    # K = 128 x 3 = 384
    assert ("encoder.conv1", "conv", 3000, 128, 240) in conv
    assert ("encoder.conv2", "conv", 1500, 128, 384) in conv
    qk = {r.module: (r.m, r.n, r.work) for r in rep.rows if r.op == "sdpa.qk"}
    # encoder self-attention over 1500 positions; causal decoder over 64 tokens; cross 64 x 1500
    assert qk == {"encoder.layers.0.self_attn": (1500, 1500, 1.0),
                  "decoder.layers.0.self_attn": (64, 64, 0.5),
                  "decoder.layers.0.encoder_attn": (64, 1500, 1.0)}
    if mode == "train":  # conv2's input needs a gradient, conv1's (the features) does not
        assert {op for _, op, *_ in conv} == {"conv", "conv.dgrad", "conv.wgrad"}
        assert sum(1 for c in conv if c[0] == "encoder.conv1") == 2  # forward + wgrad


def test_user_kwargs_default_use_cache_off():
    # a KV cache object in the output would break export: off unless the user says so
    cfg = transformers.GPT2Config(n_layer=1, n_embd=128, n_head=2, vocab_size=512)
    model = _meta(transformers.GPT2LMHeadModel, cfg)
    rep = analyze(model, example_kwargs={"input_ids": torch.zeros(2, 64, dtype=torch.long)})
    assert any(r.n == 512 and r.m == 128 for r in rep.rows)  # the LM head over 2 x 64 tokens


def test_failed_capture_keeps_torch_tracebacks_off_stderr(capfd):
    with pytest.raises(CaptureError, match="same reduction dim"):
        analyze(MLP(), (torch.randn(4, 63),))  # MLP takes 64 features
    assert "failed while attempting to run meta" not in capfd.readouterr().err


def test_moe_routing_keeps_the_total_when_shares_do_not_divide():
    # 128 routed rows (64 tokens x 2 experts each) at [0.6, 0.3, 0.1, 0.0]: 76.8, 38.4, 12.8
    # and 0. Floors 76 + 38 + 12 = 126 leave two rows for the two largest remainders (0.8 of
    # experts 0 and 2; expert 1's is 0.4): 77, 38, 13, 0. Rounding each share instead can
    # miss the total: 3 rows at [0.25] x 4 round to 1 + 1 + 1 + 1 = 4.
    from fxshape.analysis.annotate import apportion

    assert apportion(128, [0.6, 0.3, 0.1, 0.0]) == [77, 38, 13, 0]
    assert apportion(7, [0.5, 0.3, 0.2]) == [4, 2, 1]  # 3.5, 2.1, 1.4: +1 to the 0.5
    assert apportion(3, [0.25] * 4) == [1, 1, 1, 0]  # equal remainders: lower index first
    model = _mixtral_small()
    rep = analyze(model, seq_len=64, moe_routing=[0.6, 0.3, 0.1, 0.0])
    up = [r for r in rep.rows if r.op == "grouped_mm" and r.k == 256]
    assert sorted(r.m for r in up) == [13, 38, 77]
    assert sum(r.flops for r in up) == 2 * 128 * 1024 * 256  # every routed row, once
    assert all("sum to 128" in r.note and "experts 3 get no rows" in r.note for r in up)


def test_balanced_moe_counts_rows_exactly_when_experts_do_not_divide_them():
    # 3 tokens x 2 experts each = 6 routed rows over 4 experts: at most 2 per expert, and the
    # FLOPs are those of 6 rows, not 4 x 2 = 8
    rep = analyze(_mixtral_small(), batch_size=1, seq_len=3)
    up = [r for r in rep.rows if r.op == "grouped_mm" and r.k == 256]
    assert [(r.batch, r.m) for r in up] == [(4, 2)]
    assert up[0].flops == 2 * 6 * 1024 * 256
    assert "FLOPs count the 6 rows exactly" in up[0].note
