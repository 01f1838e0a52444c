"""The whole step (fxshape.execution.step, opcost, cost.host, cost.optimizer): bytes by hand for
a small graph, the eager timeline by hand, the optimizer's launches by hand, properties of the
step (classes sum to the step, more tokens never faster, more bandwidth never slower,
deduplicated layers give the full trace's step), nothing silently zero, bad input."""

import dataclasses
import json

import pytest
import torch
from torch import nn

import fxshape
from fxshape.analysis.opcost import Sizes, tensor_bytes
from fxshape.cost.host import eager_timeline, host_params
from fxshape.cost.memops import kernel_time
from fxshape.cost.optimizer import optimizer_passes, state_bytes_per_param

transformers = pytest.importorskip("transformers")


class Small(nn.Module):
    """x -> LayerNorm -> Linear(16, 32) -> gelu -> + bias (broadcast) -> dropout (eval)."""

    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(16)
        self.fc = nn.Linear(16, 32)
        self.bias = nn.Parameter(torch.zeros(32))
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        return self.drop(torch.nn.functional.gelu(self.fc(self.ln(x))) + self.bias)


def _small_report(**kw):
    x = torch.zeros(2, 8, 16)
    return fxshape.analyze(Small().eval(), (x,), gpu="a100", dtype=torch.bfloat16,
                           provenance=None, **kw)


def _by_op(report):
    out = {}
    for o in report.ops:
        out.setdefault(o.op.split(".")[0], []).append(o)
    return out


def test_bytes_by_hand_small_graph():
    ops = _by_op(_small_report())
    # bf16 (2 bytes): x is 2*8*16 = 256 elements, the hidden 2*8*32 = 512
    # layer_norm: reads x (512 B) and weight + bias (2 * 16 * 2 = 64 B), writes y (512 B)
    assert [o.bytes for o in ops["layer_norm"]] == [512 + 64 + 512]
    # gelu: reads and writes the hidden: 2 * 512 * 2 = 2,048 B
    assert [o.bytes for o in ops["gelu"]] == [2048]
    # + bias: reads the hidden (1,024 B) and the 32-element bias once (64 B), writes 1,024 B
    assert [o.bytes for o in ops["add"]] == [1024 + 64 + 1024]
    # dropout in eval mode launches nothing
    assert all(o.cls == "view" and o.time_s == 0 for o in ops["dropout"])
    # the linear is a GEMM row: M = 16 tokens, N = 32, K = 16
    (lin,) = [o for o in _small_report().ops if o.cls == "gemm"]
    assert lin.flops == 2 * 16 * 32 * 16


def test_memory_kernels_cost_their_bytes():
    rep = _small_report()
    for o in rep.ops:
        if o.cls == "memory":
            # one kernel at least its launch; never faster than the datasheet bandwidth
            assert o.time_s >= o.kernels * kernel_time("elementwise", 0, gpu="a100").time_s
            assert o.time_s >= o.bytes / (fxshape.get_gpu("a100").memory_bandwidth_gbs * 1e9)


def test_broadcast_moves_its_own_elements():
    t = torch.empty(1, 16, device="meta").expand(8, 16)  # stride 0 along the 8
    assert tensor_bytes(t, 4) == 16 * 4
    assert tensor_bytes(torch.empty(8, 16, device="meta"), 2) == 8 * 16 * 2
    # the model's fp32 counted at the run dtype's size; other dtypes as they are
    sz = Sizes(torch.float32, torch.bfloat16)
    assert sz.bytes(torch.empty(10, device="meta")) == 20
    assert sz.bytes(torch.empty(10, dtype=torch.int64, device="meta")) == 80


def test_timeline_by_hand():
    # host-bound: three ops of 10 us host, 1 us kernel: kernel i runs at 10(i+1)..10(i+1)+1
    tl = eager_timeline([(10e-6, 1e-6)] * 3)
    assert tl.wall_s == pytest.approx(31e-6)
    assert tl.idle_s == pytest.approx(31e-6 - 3e-6)
    # GPU-bound: 1 us host, 10 us kernels: the first starts at 1 us, the rest back to back
    tl = eager_timeline([(1e-6, 10e-6)] * 3)
    assert tl.wall_s == pytest.approx(31e-6)
    assert tl.idle_s == pytest.approx(1e-6)
    # a view advances the host only
    assert eager_timeline([(5e-6, 0.0)]).wall_s == pytest.approx(5e-6)
    with pytest.raises(ValueError, match="negative"):
        eager_timeline([(-1.0, 0.0)])


def test_optimizer_launches_by_hand():
    full = 320 * 65536  # one launch holds 320 chunks of 65,536 elements
    (fused,) = optimizer_passes("adamw-fused", [full])
    assert fused.launches == 1
    assert fused.bytes == 28 * full  # reads p, g, m, v and writes p, m, v: 7 x 4 B
    (fused,) = optimizer_passes("adamw-fused", [full + 1])
    assert fused.launches == 2
    # 37 tiny tensors: four lists hold at most 36 tensors per launch
    (fused,) = optimizer_passes("adamw-fused", [10] * 37)
    assert fused.launches == 2
    # SGD without momentum reads p and g and writes p: 12 B per parameter
    (sgd,) = optimizer_passes("sgd", [1000])
    assert sgd.bytes == 12_000
    foreach = optimizer_passes("adamw", [1000])
    assert len(foreach) == 8 and sum(p.bytes for p in foreach) > 28_000
    assert optimizer_passes(None, [1000]) == ()
    assert state_bytes_per_param("adamw") == 8 and state_bytes_per_param("sgd") == 0


def _gpt2(n_layer=2, **kw):
    cfg = transformers.GPT2Config(n_layer=n_layer, n_embd=64, n_head=4, vocab_size=320,
                                  n_positions=128, **kw)
    with torch.device("meta"):
        return transformers.GPT2LMHeadModel(cfg)


@pytest.mark.parametrize("mode", ["inference", "train"])
def test_classes_sum_to_the_step(mode):
    rep = fxshape.analyze(_gpt2(), gpu="h100", batch_size=2, seq_len=32, mode=mode,
                          provenance=None)
    s = rep.step
    assert sum(s.by_class.values()) == pytest.approx(s.time_s, rel=1e-12)
    assert s.tokens == 64 and s.tokens_per_s == pytest.approx(64 / s.time_s)
    # the GEMM rows are in the ops, with their FLOPs
    # the GEMM rows are in the ops, with their FLOPs; FlashAttention's backward recomputes
    # QKᵀ, which is no useful work (MFU conventions leave it out): it is the forward's QKᵀ
    # again, so the model FLOPs are the rows' less one forward QKᵀ per layer in training
    qk = sum(r.flops for r in rep.rows if r.op == "sdpa.qk" and r.phase == "forward")
    assert qk > 0
    assert s.model_flops == sum(r.flops for r in rep.rows) - (qk if mode == "train" else 0)
    assert 0 < s.mfu < 1
    assert not rep.unsupported_ops
    if mode == "train":
        assert s.by_class["optimizer"] > 0
        assert {o.op for o in rep.ops} >= {"log_softmax", "log_softmax_backward"}


def test_loss_is_cross_entropy_over_the_vocabulary():
    rep = fxshape.analyze(_gpt2(), gpu="h100", batch_size=2, seq_len=32, mode="train",
                          provenance=None)
    (ls,) = [o for o in rep.ops if o.op == "log_softmax"]
    # 64 rows of 320 logits in fp32: read 4 B and write 4 B per element
    assert ls.bytes == 64 * 320 * 8


def test_dropout_is_one_kernel():
    rep = fxshape.analyze(_gpt2(n_layer=1), gpu="h100", batch_size=2, seq_len=32,
                          mode="train", provenance=None)
    gm = rep.graph_module
    bernoulli = sum(1 for n in gm.graph.nodes if "bernoulli" in str(n.target))
    # each dropout on fake tensors traces as empty_like, bernoulli_, div_, mul; in the step
    # it is one kernel (native_dropout), recorded on the mul that applies it
    rng = [o for o in rep.ops if o.family == "rng"]
    assert bernoulli > 0 and len(rng) == bernoulli
    assert not [o for o in rep.ops if o.op.startswith("bernoulli") and o.kernels]


def test_more_tokens_never_faster():
    t = [fxshape.analyze(_gpt2(), gpu="a100", batch_size=b, seq_len=32, mode="train",
                         provenance=None).step.time_s for b in (1, 2, 4)]
    assert t[0] <= t[1] <= t[2]


def test_more_bandwidth_never_slower():
    base = fxshape.get_gpu("a100")
    fast = dataclasses.replace(base, memory_bandwidth_gbs=2 * base.memory_bandwidth_gbs)
    a = fxshape.analyze(_gpt2(), gpu=base, batch_size=2, seq_len=32, provenance=None)
    b = fxshape.analyze(_gpt2(), gpu=fast, batch_size=2, seq_len=32, provenance=None)
    assert b.step.by_class["memory"] < a.step.by_class["memory"]
    assert b.step.time_s <= a.step.time_s


@pytest.mark.parametrize("mode", ["inference", "train"])
@pytest.mark.parametrize("execution", ["eager", "compiled"])
def test_dedup_gives_the_full_traces_step(mode, execution):
    kw = dict(gpu="h100", batch_size=2, seq_len=32, mode=mode, provenance=None,
              execution=execution)
    a = fxshape.analyze(_gpt2(n_layer=3), dedup=True, **kw)
    b = fxshape.analyze(_gpt2(n_layer=3), dedup=False, **kw)
    assert len(a.ops) == len(b.ops)
    for c in ("gemm", "attention", "memory", "optimizer"):
        # compiled: the first layer's LayerNorm fuses with the embeddings' add in both, so
        # the kernels' bytes differ by a few bytes of rounding only
        assert a.step.by_class[c] == pytest.approx(b.step.by_class[c], rel=1e-3)
    assert a.step.kernels == b.step.kernels


@pytest.mark.parametrize("mode", ["inference", "train"])
def test_compiled_never_slower_than_eager(mode):
    kw = dict(gpu="a100", batch_size=2, seq_len=64, mode=mode, provenance=None)
    eager = fxshape.analyze(_gpt2(), execution="eager", **kw).step
    compiled = fxshape.analyze(_gpt2(), execution="compiled", **kw).step
    graphs = fxshape.analyze(_gpt2(), execution="cudagraphs", **kw).step
    # fusion only removes kernels and bytes; CUDA graphs only remove launches
    assert compiled.kernels < eager.kernels
    assert compiled.by_class["memory"] < eager.by_class["memory"]
    assert graphs.time_s <= compiled.time_s <= eager.time_s
    # GEMMs and attention are the same library calls in every regime
    assert compiled.by_class["gemm"] == pytest.approx(eager.by_class["gemm"])


def test_host_bound_small_batch_waits_for_the_host():
    hp = host_params()
    rep = fxshape.analyze(_gpt2(), gpu="h100", batch_size=1, seq_len=8, provenance=None)
    # tiny kernels: the GPU waits for the host's dispatch of every op
    assert rep.step.by_class["host_idle"] > 0.5 * rep.step.time_s
    assert rep.step.host_s >= hp.kernel_s * sum(1 for o in rep.ops if o.cls == "memory")


@torch.library.custom_op("fxshapetest::mystery", mutates_args=())
def _mystery(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


@_mystery.register_fake
def _(x):
    return torch.empty_like(x)


class UsesMystery(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return self.fc(torch.ops.fxshapetest.mystery(x))


def test_op_without_a_cost_model_is_listed_not_zero():
    rep = fxshape.analyze(UsesMystery(), (torch.zeros(4, 8),), gpu="h100", provenance=None)
    assert [u.target for u in rep.unsupported_ops] == ["fxshapetest.mystery.default"]
    assert "no cost model" in rep.unsupported_ops[0].reason
    assert "ops without a cost model" in rep.table()
    assert not [o for o in rep.ops if "mystery" in o.op]


def test_json_carries_the_step_and_is_deterministic():
    a, b = _small_report().to_json(), _small_report().to_json()
    assert a == b
    d = json.loads(a)
    assert d["step"]["time_s"] > 0 and d["step"]["execution"] == "eager"
    assert len(d["ops"]) == len(_small_report().ops)
    assert _small_report().ops_csv().splitlines()[0].startswith("node,op,module")


def test_bad_input():
    x = (torch.zeros(2, 8, 16),)
    with pytest.raises(ValueError, match="unknown execution 'graph'; accepted: 'eager', "
                                         "'compiled', 'cudagraphs'"):
        fxshape.analyze(Small(), x, execution="graph")
    with pytest.raises(ValueError, match="unknown optimizer 'adam'; accepted: 'adamw'"):
        fxshape.analyze(Small(), x, mode="train", optimizer="adam")
    with pytest.raises(ValueError, match="unknown kernel family"):
        kernel_time("warp_shuffle", 10)
    with pytest.raises(ValueError, match="bytes must be an integer >= 0"):
        kernel_time("copy", -1)
    with pytest.raises(ValueError, match="unknown host op kind"):
        host_params().op_s("kernelz")


def test_cli_step_options(capsys):
    from fxshape.cli import main

    assert main(["analyze", "gpt2", "--gpu", "a100", "--train", "--batch-size", "1",
                 "--seq-len", "64", "--execution", "compiled", "--optimizer", "sgd",
                 "--dp", "2", "--provenance", "none", "--format", "json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["step"]["execution"] == "compiled" and d["step"]["optimizer"] == "sgd"
    assert d["step"]["by_class"]["communication"] >= 0 and d["memory"]["peak"] > 0
    assert any(o["op"] == "dp gradient all-reduce" for o in d["ops"])
    assert main(["analyze", "gpt2", "--seq-len", "64", "--provenance", "none", "--format",
                 "ops-csv"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("node,op,module,phase,cls") and len(lines) > 100
    with pytest.raises(SystemExit):  # argparse refuses it, listing the choices
        main(["analyze", "gpt2", "--execution", "graph"])
    assert "invalid choice: 'graph'" in capsys.readouterr().err


def test_activation_checkpointing_recomputes_each_layer():
    kw = dict(gpu="h100", batch_size=2, seq_len=32, mode="train", provenance=None)
    plain = fxshape.analyze(_gpt2(n_layer=2), **kw)
    model = _gpt2(n_layer=2)
    model.activation_checkpointing_enable(  # transformers 5's name (gradient_... is deprecated)
        activation_checkpointing_kwargs={"use_reentrant": False})
    ckpt = fxshape.analyze(model, **kw)
    # every forward op of the two blocks runs again in the backward, before that block's
    # backward; nothing outside the blocks (embeddings, final norm, LM head) does
    in_blocks = [o for o in plain.ops if o.phase == "forward"
                 and o.module.startswith("transformer.h.")]
    again = [o for o in ckpt.ops if o.node.endswith("@recompute")]
    assert len(again) == len(in_blocks) and all(o.phase == "backward" for o in again)
    # recomputation is not useful work: the model FLOPs (and so MFU's numerator) stay
    assert ckpt.step.model_flops == plain.step.model_flops
    assert ckpt.step.time_s > plain.step.time_s
    # each block keeps only its input until its backward
    assert ckpt.memory.activations < plain.memory.activations


@pytest.mark.parametrize("name", ["gpt2", "bert-base", "t5-base", "vit-base", "llama-3-8b",
                                  "mixtral-8x7b"])
@pytest.mark.parametrize("mode", ["inference", "train"])
def test_every_op_of_the_zoo_has_a_cost(name, mode):
    from fxshape.presets import build_preset

    rep = fxshape.analyze(build_preset(name), gpu="h100", mode=mode, seq_len=128,
                          provenance=None)
    # nothing left without a cost model: every node is a GEMM, a kernel or nothing at all
    assert not rep.unsupported_ops, [(u.target, u.reason) for u in rep.unsupported_ops]
    assert rep.step.by_class["memory"] > 0 and sum(rep.step.by_class.values()) == \
        pytest.approx(rep.step.time_s)
