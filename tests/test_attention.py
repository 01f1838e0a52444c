"""Attention as it runs on the GPU: the fused custom ops, capture, FLOP counts, the attention
performance model and its fit."""

import csv
import json
import os
from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import fxshape
from fxshape.cost.attention import (ATTENTION_CHOICES, AttentionShape, predict_attention,
                               resolve_kernel)
from fxshape.tracing.attnops import attention, attention_backward, keep_attention_fused
from fxshape.fit.calibration import calibration_dir

transformers = pytest.importorskip("transformers")

ATTN_DIR = os.path.join(calibration_dir(), "attention")
needs_data = pytest.mark.needs_data(ATTN_DIR)


def _meta(cls, cfg):
    with torch.device("meta"):
        return cls(cfg)


# ---------------------------------------------------------------------------------------
# the custom ops compute what F.scaled_dot_product_attention and its autograd compute
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("causal,gqa,mask", [(False, False, False), (True, False, False),
                                             (False, True, False), (False, False, True)])
def test_fused_ops_match_sdpa_and_its_gradients(causal, gqa, mask):
    torch.manual_seed(0)
    b, h, s, d = 2, 4, 16, 8
    kvh = 2 if gqa else h
    q = torch.randn(b, h, s, d, requires_grad=True)
    k = torch.randn(b, kvh, s, d, requires_grad=True)
    v = torch.randn(b, kvh, s, d, requires_grad=True)
    m = torch.randn(1, h, s, s, requires_grad=True) if mask else None
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=causal,
                                         enable_gqa=gqa)
    out, lse = attention(q, k, v, m, 0.0, causal, None, gqa)
    torch.testing.assert_close(out, ref)
    assert lse.shape == (b, h, s) and lse.dtype == torch.float32
    g = torch.randn_like(ref)
    wrt = [q, k, v] + ([m] if mask else [])
    want = torch.autograd.grad(ref, wrt, g)
    got = torch.autograd.grad(out, wrt, g)  # through fxshape::attention_backward
    for a, e in zip(got, want):
        torch.testing.assert_close(a, e)
    # the backward op on its own: dmask only when asked for
    dq, dk, dv, dm = attention_backward(g, q.detach(), k.detach(), v.detach(), out.detach(),
                                        lse, None if m is None else m.detach(), 0.0, causal,
                                        None, gqa, False)
    assert dm.numel() == 0 and dk.shape == k.shape


def test_keep_attention_fused_routes_every_call_style():
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.nn.functional import scaled_dot_product_attention as bound_name

    def f(q):
        a = F.scaled_dot_product_attention(q, q, q, is_causal=True)
        return bound_name(a, q, q, None, 0.0, False)  # imported by name, positional flags

    with keep_attention_fused():
        gm = make_fx(f)(torch.randn(1, 2, 4, 8))
    targets = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    assert targets.count("fxshape.attention.default") == 2
    assert not any("bmm" in t or "softmax" in t for t in targets)


# ---------------------------------------------------------------------------------------
# capture keeps attention whole, forward and backward
# ---------------------------------------------------------------------------------------

class _GQA(nn.Module):
    """Two causal GQA attention layers: 8 query heads share 2 K/V heads (enable_gqa)."""

    def __init__(self, dim=64, heads=8, kv=2, layers=2):
        super().__init__()
        self.heads, self.kv, self.hd = heads, kv, dim // heads
        self.q = nn.ModuleList(nn.Linear(dim, dim) for _ in range(layers))
        self.kv_proj = nn.ModuleList(nn.Linear(dim, 2 * kv * self.hd) for _ in range(layers))
        self.dropout = 0.1

    def forward(self, x):
        b, s, _ = x.shape
        for q_proj, kv_proj in zip(self.q, self.kv_proj):
            q = q_proj(x).view(b, s, self.heads, self.hd).transpose(1, 2)
            k, v = kv_proj(x).view(b, s, 2, self.kv, self.hd).permute(2, 0, 3, 1, 4)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True,
                                               dropout_p=self.dropout if self.training else 0)
            x = x + y.transpose(1, 2).reshape(b, s, -1)
        return x


def test_train_graph_of_a_causal_gqa_model_has_fused_forward_and_backward_nodes():
    model = _GQA()
    gm = fxshape.capture(model, (torch.randn(2, 32, 64),), train=True)
    targets = Counter(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
    # one fused forward and one fused backward per layer; no unfused attention GEMMs
    assert targets["fxshape.attention.default"] == 2
    assert targets["fxshape.attention_backward.default"] == 2
    assert targets["aten.bmm.default"] == 0
    rep = fxshape.analyze(model, (torch.randn(2, 32, 64),), mode="train")
    attn = [r for r in rep.rows if r.op.startswith("sdpa")]
    assert Counter((r.op, r.phase) for r in attn) == Counter(
        {("sdpa.qk", "forward"): 2, ("sdpa.pv", "forward"): 2, ("sdpa.bwd.qk", "backward"): 2,
         ("sdpa.bwd.dv", "backward"): 2, ("sdpa.bwd.dp", "backward"): 2,
         ("sdpa.bwd.dq", "backward"): 2, ("sdpa.bwd.dk", "backward"): 2})
    shape = attn[0].attention.shape
    # batch 2, 8 query heads over 2 K/V heads, 32 tokens, head_dim 64 / 8 = 8, causal
    assert (shape.batch, shape.heads, shape.kv_heads, shape.seq_q, shape.head_dim,
            shape.causal) == (2, 8, 2, 32, 8, True)
    # the GEMMs run per query head: batch x heads = 16, half the blocks
    assert all(r.batch == 16 and r.work == 0.5 for r in attn)


def test_torch_multihead_attention_trains_fused_when_pytorch_does():
    """Issue 52: nn.TransformerEncoderLayer calls its MultiheadAttention with need_weights=False,
    so PyTorch runs SDPA (the fused kernel and its backward); nn.MultiheadAttention's default
    need_weights=True runs the bmm path, and is priced so."""
    layer = nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128,
                                       batch_first=True)
    enc = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
    x = torch.randn(2, 32, 64)
    rep = fxshape.analyze(enc, (x,), mode="train")
    ops = Counter((r.op, r.phase) for r in rep.rows if r.op.startswith(("sdpa", "bmm")))
    # two layers: one fused forward (2 rows) and one fused backward (5 rows) each, no bmm
    assert ops == Counter({("sdpa.qk", "forward"): 2, ("sdpa.pv", "forward"): 2,
                           ("sdpa.bwd.qk", "backward"): 2, ("sdpa.bwd.dv", "backward"): 2,
                           ("sdpa.bwd.dp", "backward"): 2, ("sdpa.bwd.dq", "backward"): 2,
                           ("sdpa.bwd.dk", "backward"): 2})
    assert rep.workload.kernels  # the kernel the workload line names really ran

    class Weights(nn.Module):  # need_weights=True (the default): the attention probabilities
        def __init__(self):
            super().__init__()
            self.mha = nn.MultiheadAttention(64, 4, batch_first=True)

        def forward(self, x):
            return self.mha(x, x, x)[0]

    rep = fxshape.analyze(Weights(), (x,), mode="train")
    assert not any(r.op.startswith("sdpa") for r in rep.rows)
    # QK^T and PV forward, and their four backward GEMMs, as batched matmuls
    assert sum(r.op == "bmm" for r in rep.rows) == 6
    assert "no fused attention call captured" in rep.workload.describe()


def test_dropout_does_not_change_the_gemms():
    x = torch.randn(2, 32, 64)
    with_dropout = _GQA()
    without = _GQA()
    without.dropout = 0.0
    a = fxshape.analyze(with_dropout, (x,), mode="train")
    b = fxshape.analyze(without, (x,), mode="train")
    key = lambda r: (r.op, r.phase, r.batch, r.m, r.n, r.k, r.work)  # noqa: E731
    assert sorted(map(key, a.rows)) == sorted(map(key, b.rows))


def test_flop_counts_follow_the_papers_convention():
    # GPT-2 shapes, 2 layers, 1 x 1024 causal, train mode
    cfg = transformers.GPT2Config(n_layer=2)
    rep = fxshape.analyze(_meta(transformers.GPT2LMHeadModel, cfg), seq_len=1024, mode="train")
    fwd = sum(r.flops for r in rep.rows if r.op in ("sdpa.qk", "sdpa.pv"))
    bwd = sum(r.flops for r in rep.rows if r.op.startswith("sdpa.bwd"))
    # forward: 4 x batch 1 x 12 heads x 1024^2 x head_dim 64, halved (causal), x 2 layers
    #   = 4 * 12 * 1048576 * 64 / 2 * 2 = 3,221,225,472
    assert fwd == 3_221_225_472
    assert bwd == fwd * 5 // 2  # backward = 2.5 x forward (5 GEMMs of the forward's size)
    # the whole 12-layer GPT-2 at 1 x 1024: 6 x (fwd + bwd) = 67,645,734,912 = 67.6 GFLOP
    assert 6 * (fwd + bwd) == 67_645_734_912
    # what sets each backward GEMM's dimensions: seq_len (1024) and head_dim (768 / 12 = 64)
    names = {1024: "seq_len", 64: "head_dim = hidden_size / num_attention_heads"}
    for r in rep.rows:
        if r.op.startswith("sdpa.bwd"):
            assert r.set_by == tuple(names[x] for x in (r.m, r.n, r.k)), (r.op, r.set_by)


def test_math_kernel_runs_unfused_gemms_without_recompute():
    cfg = transformers.GPT2Config(n_layer=1, n_embd=256, n_head=4, vocab_size=1024)
    model = _meta(transformers.GPT2LMHeadModel, cfg)
    rep = fxshape.analyze(model, seq_len=256, mode="train", attention="math")
    attn = [r for r in rep.rows if r.op.startswith("sdpa")]
    # forward S = QK^T, O = PV; backward dV, dP, dQ, dK: no recomputed QK^T
    assert sorted(r.op for r in attn) == ["sdpa.bwd.dk", "sdpa.bwd.dp", "sdpa.bwd.dq",
                                          "sdpa.bwd.dv", "sdpa.pv", "sdpa.qk"]
    # the full score matrix: causal masking skips nothing (work 1)
    assert all(r.kernel == "math" and r.work == 1.0 for r in attn)
    default = fxshape.analyze(model, seq_len=256, mode="train")
    # PyTorch 2.13's SDPA on an H100 (the default GPU) runs cuDNN's fused kernel
    assert {r.kernel for r in default.rows if r.op.startswith("sdpa")} == {"cudnn"}
    fused = fxshape.analyze(model, seq_len=256, mode="train", attention="fa2")
    t_math = sum(r.time_s for r in attn)
    t_flash = sum(r.time_s for r in fused.rows if r.op.startswith("sdpa"))
    assert t_flash < t_math


@pytest.mark.parametrize("name", ["bert", "t5"])
def test_train_mode_for_parameters_without_gradients_and_tied_heads(name):
    if name == "bert":  # the pooler gets no gradient from a loss on the hidden states
        cfg = transformers.BertConfig(hidden_size=128, num_attention_heads=4,
                                      intermediate_size=256, num_hidden_layers=1,
                                      vocab_size=1000)
        model = _meta(transformers.BertModel, cfg)
    else:  # the LM head is tied to the shared embedding; position bias is a float mask
        cfg = transformers.T5Config(d_model=128, d_kv=32, num_heads=4, d_ff=256,
                                    num_layers=1, vocab_size=1000)
        model = _meta(transformers.T5ForConditionalGeneration, cfg)
    rep = fxshape.analyze(model, seq_len=64, mode="train")
    phases = Counter((r.module.split(".")[0], r.phase) for r in rep.rows)
    if name == "bert":
        # pooler: its forward GEMM runs, no weight-gradient (or input-gradient) GEMM
        assert phases[("pooler", "forward")] == 1 and phases[("pooler", "backward")] == 0
        # q k v, attention output, intermediate, output: dX and dW each = 12 backward GEMMs
        assert sum(1 for r in rep.rows if r.phase == "backward" and r.op == "mm") == 12
    else:
        lm = [r for r in rep.rows if r.module == "lm_head"]
        # forward, dX, and one weight gradient for the tied weight
        assert Counter(r.phase for r in lm) == Counter({"forward": 1, "backward": 2})
    # every attention call has a fused backward
    assert sum(1 for r in rep.rows if r.op == "sdpa.bwd.qk") == \
        sum(1 for r in rep.rows if r.op == "sdpa.qk")


def test_tensor_parallel_shards_attention_heads():
    cfg = transformers.LlamaConfig(hidden_size=512, intermediate_size=1024,
                                   num_hidden_layers=1, num_attention_heads=8,
                                   num_key_value_heads=4, vocab_size=1024)
    rep = fxshape.analyze(_meta(transformers.LlamaForCausalLM, cfg), seq_len=128, tp=4)
    qk = [r for r in rep.rows if r.op == "sdpa.qk"][0]
    # 8 heads / 4 GPUs = 2 per GPU (HF repeats K/V heads to 8 before SDPA: 2 per GPU too)
    assert qk.attention.shape.heads == 2 and qk.batch == 2


def test_report_names_the_kernel():
    cfg = transformers.GPT2Config(n_layer=1, n_embd=128, n_head=2, vocab_size=512)
    rep = fxshape.analyze(_meta(transformers.GPT2LMHeadModel, cfg), seq_len=128,
                          gpu="a100")
    assert "sdpa.qk (fa2)" in rep.table()
    header, *lines = rep.to_csv().splitlines()
    cols = header.split(",")
    kernels = {line.split(",")[cols.index("op")]: line.split(",")[cols.index("kernel")]
               for line in lines}
    assert kernels["sdpa.qk"] == "fa2" and kernels["addmm"] == ""
    assert json.loads(rep.to_json())["rows"][-1]["kernel"] in ("", "fa2")


# ---------------------------------------------------------------------------------------
# which kernel, and bad input
# ---------------------------------------------------------------------------------------

def test_kernel_choice_per_gpu_dtype_and_head_dim():
    # PyTorch 2.13 prefers cuDNN's kernel on sm90 for fp16/bf16 at head_dim <= 256, a
    # multiple of 8 (check_prefer_cudnn_attention); FA2 elsewhere on sm80+
    kernel, note = resolve_kernel("flash", "h100", "bf16", 128)
    assert kernel == "cudnn" and "cuDNN" in note and "attention='fa2'" in note
    assert resolve_kernel("flash", "h100", "bf16", 100)[0] == "fa2"  # 100 % 8 != 0
    assert resolve_kernel("fa2", "h100", "bf16", 128) == ("fa2", "")
    assert resolve_kernel("cudnn", "h200", "fp16", 64) == ("cudnn", "")
    # on sm100 PyTorch runs cuDNN too, which is not modelled there: FA2, said so
    kernel, note = resolve_kernel("flash", "b200", "bf16", 128)
    assert kernel == "fa2" and "not modelled" in note
    assert resolve_kernel("flash", "a100", "fp16", 64) == ("fa2", "")
    assert resolve_kernel("flash", "v100", "fp16", 64)[0] == "mem_efficient"  # no sm80
    assert resolve_kernel("fa3", "h200", "bf16", 128) == ("fa3", "")
    # no flash kernel takes fp32 or head_dim > 256: PyTorch falls back to math, said so
    kernel, note = resolve_kernel("flash", "h100", "fp32", 128)
    assert kernel == "math" and "fp32" in note
    kernel, note = resolve_kernel("flash", "h100", "bf16", 320)
    assert kernel == "math" and "head_dim 320 > 256" in note


def test_bad_attention_choices_are_refused_clearly():
    with pytest.raises(ValueError,
                       match="accepted: 'flash', 'fa2', 'fa3', 'cudnn', 'trtllm', 'vllm', "
                             "'math'"):
        resolve_kernel("flash2", "h100", "bf16", 64)
    with pytest.raises(ValueError, match="Hopper GPUs only.*b200 is blackwell"):
        resolve_kernel("cudnn", "b200", "bf16", 64)
    with pytest.raises(ValueError, match="head_dim <= 256, a multiple of 8; got bf16, "
                                         "head_dim 100"):
        resolve_kernel("cudnn", "h100", "bf16", 100)
    with pytest.raises(ValueError, match="Hopper GPUs only.*a100-sxm4-80gb is ampere"):
        resolve_kernel("fa3", "a100", "bf16", 64)
    with pytest.raises(ValueError, match="head_dim <= 256"):
        resolve_kernel("fa3", "h100", "bf16", 320)
    with pytest.raises(ValueError, match="sm80 or newer"):
        resolve_kernel("fa2", "v100", "fp16", 64)
    model = _GQA(layers=1)
    with pytest.raises(ValueError, match="Hopper GPUs only"):
        fxshape.analyze(model, (torch.randn(1, 8, 64),), gpu="a100", attention="fa3")
    with pytest.raises(ValueError, match="accepted"):
        fxshape.analyze(model, (torch.randn(1, 8, 64),), attention="xformers")
    with pytest.raises(ValueError, match="kv_heads must divide heads"):
        AttentionShape(1, 8, 3, 16, 16, 64, 64)
    with pytest.raises(ValueError, match="seq_q must be a positive integer"):
        AttentionShape(1, 8, 8, 0, 16, 64, 64)
    with pytest.raises(ValueError, match="unknown direction"):
        predict_attention(AttentionShape(1, 8, 8, 16, 16, 64, 64), direction="both")
    assert set(ATTENTION_CHOICES) == {"flash", "fa2", "fa3", "cudnn", "trtllm", "vllm",
                                      "math"}


def test_head_dim_beyond_every_kernel_is_predicted_not_crashed():
    s = AttentionShape(1, 4, 4, 512, 512, 320, 320)
    p = predict_attention(s, gpu="h100")
    assert p.kernel == "math" and "falls back to the math path" in p.note and p.time_s > 0


def test_cli_takes_attention(tmp_path, capsys):
    from fxshape.cli import main

    cfg = transformers.GPT2Config(n_layer=1, n_embd=128, n_head=2, vocab_size=512)
    path = tmp_path / "config.json"
    cfg.to_json_file(str(path))
    assert main(["analyze", str(path), "--seq-len", "128", "--attention", "math"]) == 0
    assert "sdpa.qk (math)" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["analyze", str(path), "--attention", "flash3"])
    assert main(["analyze", str(path), "--gpu", "a100", "--attention", "fa3"]) == 2
    assert "Hopper" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------
# the model: properties, physics, measured data
# ---------------------------------------------------------------------------------------

_GPUS = st.sampled_from(["h100", "a100", "a40", "v100", "mi250x"])


@settings(max_examples=60, deadline=None)
@given(gpu=_GPUS, b=st.integers(1, 8), h=st.sampled_from([1, 4, 16]),
       s=st.integers(1, 4096), d=st.sampled_from([32, 64, 80, 128, 256]),
       causal=st.booleans(), direction=st.sampled_from(["forward", "backward"]))
def test_fused_time_grows_with_seq_len_and_batch_and_causal_is_not_slower(
        gpu, b, h, s, d, causal, direction):
    def t(bb, ss, c=causal):
        shape = AttentionShape(bb, h, h, ss, ss, d, d, c)
        return predict_attention(shape, direction=direction, gpu=gpu, dtype="fp16").time_s

    assert t(b, s) <= t(b, s + 1) * (1 + 1e-12)
    assert t(b, s) <= t(b, s + 64) * (1 + 1e-12)
    assert t(b, s) <= t(b + 1, s) * (1 + 1e-12)
    assert t(b, s, True) <= t(b, s, False) * (1 + 1e-12)


@settings(max_examples=30, deadline=None)
@given(b=st.integers(1, 8), s16=st.integers(1, 256), causal=st.booleans())
def test_math_time_grows_with_seq_len_within_an_alignment_class(b, s16, causal):
    # unfused GEMMs are slower at sizes that are not 16-byte aligned (vector width) or not
    # 32-byte aligned (sectors: the GEMM model): compare multiples of 16 fp16 elements
    def t(bb, ss):
        return predict_attention(AttentionShape(bb, 8, 8, ss, ss, 64, 64, causal),
                                 attention="math").time_s

    assert t(b, 16 * s16) <= t(b, 16 * s16 + 16) * (1 + 1e-12)
    assert t(b, 16 * s16) <= t(b + 1, 16 * s16) * (1 + 1e-12)


def test_softmax_not_gemm_rate_bounds_flash_attention():
    # H100: 16 exponentials per clock per SM against ~3786 bf16 FLOP per clock per SM.
    # Per score, head_dim 64 does 4 * 64 = 256 FLOP of GEMM work (0.068 clocks at peak) and
    # one exponential (0.0625 clocks): FA2 running them one after the other cannot exceed
    # 256 / (0.068 + 0.0625) / 3786 = 52% of peak, whatever its other constants.
    s = AttentionShape(1, 32, 32, 16384, 16384, 64, 64)
    p = predict_attention(s, gpu="h100", attention="fa2")
    assert p.efficiency < 0.52
    # FA3 overlaps them, so it is faster on the same shape
    assert predict_attention(s, gpu="h100", attention="fa3").time_s < p.time_s
    # backward is slower per FLOP than forward (recompute, dQ atomics) but does 2.5x the work
    bwd = predict_attention(s, gpu="h100", attention="fa2", direction="backward")
    assert bwd.flops == 2.5 * p.flops and bwd.time_s > 2.5 * p.time_s * 0.8


def test_unmeasured_gpus_and_kernels_say_so():
    s = AttentionShape(2, 16, 16, 4096, 4096, 128, 128)
    # H100: FA2 and the unfused path forward (calibration data), backward and FA3
    # (published figures in bench/) were compared with measurements; nothing else was
    for kw in (dict(attention="fa2"), dict(attention="math"), dict(attention="fa3"),
               dict(attention="fa2", direction="backward")):
        assert predict_attention(s, gpu="h100", **kw).validated, kw
    # cuDNN's kernel (SDPA's default there) is priced with FA3's constants, not measured
    assert not predict_attention(s, gpu="h100").validated
    assert not predict_attention(s, gpu="a100").validated
    assert not predict_attention(s, gpu="v100", dtype="fp16").validated


def test_a100_flash_forward_lands_in_the_fa2_papers_band():
    # not fitted: the A100 prediction uses A100 hardware constants with the H100-fitted
    # algorithm constants. The FlashAttention-2 paper reports its forward pass at 50-73% of
    # the A100's 312 TFLOP/s. head_dim 128 lands inside; head_dim 64 is predicted at 48%,
    # just below the band (docs/attention.md lists it), so it is not asserted here.
    s = AttentionShape(4, 16, 16, 4096, 4096, 128, 128)
    p = predict_attention(s, gpu="a100", dtype="fp16")
    assert 0.50 <= p.efficiency <= 0.73, p.efficiency


@needs_data
def test_every_measured_figure_within_15_percent():
    with open(os.path.join(ATTN_DIR, "h100_forward_public.csv")) as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 22
    for r in rows:
        h, s, d = int(r["heads"]), int(r["seq_len"]), int(r["head_dim"])
        shape = AttentionShape(int(r["batch"]), h, h, s, s, d, d, r["causal"] == "true")
        kernel = {"fa2": "fa2", "standard": "math"}[r["kernel"]]
        p = predict_attention(shape, attention=kernel, gpu=r["gpu"], dtype=r["dtype"])
        assert abs(p.tflops / float(r["tflops"]) - 1) <= 0.15, r


@needs_data
def test_fit_script_reproduces_the_packaged_constants_and_holds_out_well(tmp_path):
    fit_attention = pytest.importorskip("fit_attention")
    out = tmp_path / "attention_params.json"
    fit_attention.main(["--out", str(out), "--no-cv"])
    fitted = json.loads(out.read_text())["params"]
    packaged = json.loads(open(os.path.join(os.path.dirname(fxshape.__file__), "data",
                                            "attention_params.json")).read())["params"]
    assert fitted.keys() == packaged.keys()
    for k in fitted:
        assert fitted[k] == pytest.approx(packaged[k], rel=1e-3), k
    # each sequence length of what PyTorch's SDPA runs (FA2) and of the unfused path,
    # predicted by constants fitted without it: within the 15% but at 512 tokens
    # (FA2 head_dim 256 there: +20%, documented)
    _, results = fit_attention.cross_validation(fit_attention.read_rows())
    for r, err in results:
        if r.kernel in ("fa2", "math") and not (r.shape.head_dim == 256 and
                                                r.shape.seq_q == 512):
            assert abs(err) <= 15.0, (r.kernel, r.direction, r.shape)


@needs_data
def test_causal_figures_never_fitted_are_predicted_within_12_percent():
    fit_attention = pytest.importorskip("fit_attention")
    from fxshape.cost.attention import attention_params

    with open(fit_attention._CAUSAL) as f:
        rows = [fit_attention.Row(d) for d in csv.DictReader(f)]
    params = attention_params()
    flash = [r for r in rows if r.kernel in ("fa2", "fa3")]
    assert len(flash) == 24 and all(r.shape.causal for r in flash)
    for r in flash:
        assert abs(r.predicted(params) / r.tflops - 1) <= 0.12, (r.kernel, r.shape)


def test_measure_attention_plumbing_with_a_fake_timer(tmp_path):
    measure_attention = pytest.importorskip("measure_attention")
    fit_attention = pytest.importorskip("fit_attention")

    shapes = measure_attention.default_sweep(quick=True)

    def fake_timer(b, h, kvh, s, d, causal):
        # 10% slower than predicted, forward and backward
        shape = AttentionShape(b, h, kvh, s, s, d, d, causal)
        return tuple(1.1 * predict_attention(shape, direction=dd, gpu="h100").time_s
                     for dd in ("forward", "backward"))

    rows, table = measure_attention.measure(shapes, fake_timer, gpu_label="h100", dtype="bf16")
    assert len(rows) == 2 * len(shapes)
    # measured = predicted / 1.1, so every prediction reads 10% high
    assert all(r[-1] == pytest.approx(10.0, abs=1e-6) for r in table)
    path = tmp_path / "attn.csv"
    measure_attention.write(str(path), rows)
    with open(path) as f:  # the fit script reads what the measurement writes
        back = [fit_attention.Row(d) for d in csv.DictReader(f)]
    assert [b.kernel for b in back] == ["flash"] * len(rows)
    assert back[0].shape == AttentionShape(*shapes[0][:4], shapes[0][3], shapes[0][4],
                                           shapes[0][4], shapes[0][5])
    if not torch.cuda.is_available():
        assert measure_attention.main(["--gpu-label", "h100", "--out",
                                       str(tmp_path / "o.csv")]) == 2
