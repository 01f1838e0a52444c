"""Tracing each distinct layer once (fxshape.tracing.dedup) gives exactly the full trace's rows."""

import pytest
import torch
from torch import nn

import fxshape
from fxshape.tracing.dedup import find_stacks

transformers = pytest.importorskip("transformers")


def _key(r):
    # everything a row says except the graph node it came from
    return (r.module, r.op, r.phase, r.batch, r.m, r.n, r.k, r.layout, r.work, r.flops,
            r.time_s, r.kernel, r.set_by, r.causes, r.note)


def _meta(cls, cfg):
    with torch.device("meta"):
        return cls(cfg)


def _model(name):
    from fxshape.presets import build_preset

    t = transformers
    if name == "gemma2":  # sliding and global attention alternate: two groups
        return _meta(t.Gemma2ForCausalLM, t.Gemma2Config(
            hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=64, vocab_size=1000, sliding_window=32))
    if name == "qwen2moe":  # dense layers 0 and 2, MoE layers 1 and 3
        return _meta(t.Qwen2MoeForCausalLM, t.Qwen2MoeConfig(
            hidden_size=256, intermediate_size=512, moe_intermediate_size=128,
            shared_expert_intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=1000, num_experts=4, num_experts_per_tok=2,
            decoder_sparse_step=2, mlp_only_layers=[0]))
    if name == "whisper":
        return _meta(t.WhisperModel, t.WhisperConfig(
            d_model=128, encoder_layers=3, decoder_layers=3, encoder_attention_heads=2,
            decoder_attention_heads=2, encoder_ffn_dim=256, decoder_ffn_dim=256,
            num_mel_bins=80, max_source_positions=1500, vocab_size=51865))
    model = build_preset(name)
    # the preset's sizes at fewer layers: dedup still traces one layer of a group and scales
    # it (the full traces took 10-35 s each for the 32-layer models, 25 s for T5's training)
    fewer = {"llama-3-8b": {"num_hidden_layers": 6}, "mixtral-8x7b": {"num_hidden_layers": 6},
             # T5's block 0 holds the relative position bias: groups (0,) and (1, 2, 3)
             "t5-base": {"num_layers": 4, "num_decoder_layers": 4},
             "bert-base": {"num_hidden_layers": 4}, "vit-base": {"num_hidden_layers": 4},
             "gpt2": {"n_layer": 4}}
    if name in fewer:
        import copy

        cfg = copy.deepcopy(model.config)
        for k, v in fewer[name].items():
            setattr(cfg, k, v)
        model = _meta(type(model), cfg)
    return model


@pytest.mark.parametrize("mode", ["inference", "train"])
@pytest.mark.parametrize("name", ["gpt2", "llama-3-8b", "t5-base", "bert-base", "vit-base",
                                  "mixtral-8x7b", "gemma2", "qwen2moe", "whisper"])
def test_dedup_equals_the_full_trace(name, mode):
    # provenance matched by value here (every layer of the full trace traced by cause would
    # cost minutes); test_traced_provenance_equals_the_full_trace's below
    model = _model(name)
    seq = None if name == "vit-base" else 64
    fast = fxshape.analyze(model, seq_len=seq, mode=mode, provenance="matched")
    full = fxshape.analyze(model, seq_len=seq, mode=mode, dedup=False, provenance="matched")
    assert sorted(map(_key, fast.rows)) == sorted(map(_key, full.rows))
    assert fast.total_time_s == pytest.approx(full.total_time_s, rel=1e-12)
    assert fast.notes and fast.notes[0].startswith("traced one layer per group")
    # the full trace says nothing of layers (its one note: the step's validation)
    assert [n for n in full.notes if not _validation_note(n)] == []


@pytest.mark.parametrize("name,mode", [("gpt2", "train"), ("qwen2moe", "inference"),
                                       ("whisper", "inference")])
def test_traced_provenance_equals_the_full_trace(name, mode):
    # one layer per group re-traced with each knob changed, against every layer re-traced:
    # the same labels and causes on every row (layer names follow their layer)
    model = _model(name)
    if name == "gpt2":
        import copy

        cfg = copy.deepcopy(model.config)
        cfg.n_layer = 3
        model = _meta(type(model), cfg)
    fast = fxshape.analyze(model, seq_len=32, mode=mode)
    full = fxshape.analyze(model, seq_len=32, mode=mode, dedup=False)
    assert sorted(map(_key, fast.rows)) == sorted(map(_key, full.rows))
    assert all(r.set_by and r.causes for r in fast.rows)
    assert [n for n in full.notes if not n.startswith("set by") and not _validation_note(n)] \
        == []


def _validation_note(note: str) -> bool:
    """The note every report ends with: the step's expected error, or that it has none."""
    return note.startswith(("step expected error", "unvalidated:"))


@pytest.mark.parametrize("name,tp", [("llama-3-8b", 8), ("gpt2", 2)])
def test_dedup_with_tensor_parallelism(name, tp):
    model = _model(name)
    for mode in ("inference", "train"):
        fast = fxshape.analyze(model, seq_len=64, mode=mode, tp=tp, provenance="matched")
        full = fxshape.analyze(model, seq_len=64, mode=mode, tp=tp, dedup=False,
                               provenance="matched")
        assert sorted(map(_key, fast.rows)) == sorted(map(_key, full.rows))


def test_groups_follow_what_decides_the_gemms():
    stacks = {s.name: s.groups for s in find_stacks(_model("gemma2"))}
    assert stacks == {"model.layers": ((0, 2), (1, 3))}  # sliding, global, sliding, global
    from fxshape.presets import build_preset

    stacks = {s.name: s.groups for s in find_stacks(build_preset("t5-base"))}
    # block 0 holds the relative position bias; blocks 1-11 reuse it
    assert stacks["encoder.block"] == ((0,), tuple(range(1, 12)))


class _Indexed(nn.Module):
    """Reads its layers by index, up to a count of its own: a reduced stack breaks it."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(64, 64) for _ in range(4))
        self.n = 4

    def forward(self, x):
        for i in range(self.n):
            x = self.layers[i](x)
        return x


def test_models_that_do_not_reduce_are_traced_fully_and_say_so():
    model = _Indexed()
    rep = fxshape.analyze(model, (torch.randn(8, 64),))
    assert len(rep.rows) == 4  # every layer, traced
    assert rep.notes and rep.notes[0].startswith("traced every layer")
    assert "note: traced every layer" in rep.table()
    assert len(model.layers) == 4  # the user's model is untouched


def test_dedup_leaves_the_model_alone_and_keeps_a_graph_view():
    model = _model("gpt2")
    layers = list(model.transformer.h)
    rep = fxshape.analyze(model, seq_len=64)
    assert list(model.transformer.h) == layers
    g = rep.to_networkx()
    # per layer: c_attn, attention (one node, two rows), attn c_proj, c_fc, mlp c_proj;
    # 4 layers x 5 + lm_head = 21
    assert len(layers) == 4
    assert g.number_of_nodes() == len({r.node for r in rep.rows}) == 4 * 5 + 1
    # within a layer: c_attn feeds the attention, which feeds c_proj
    names = {(d["module"], d["op"]): n for n, d in g.nodes(data=True)}
    attn = names[("transformer.h.3.attn", "sdpa.qk")]
    assert g.has_edge(names[("transformer.h.3.attn.c_attn", "addmm")], attn)
    assert not g.has_edge(names[("transformer.h.2.attn.c_attn", "addmm")], attn)


class _Zipped(nn.Module):
    """Two stacks walked together, with a GEMM between them outside either: fewer layers
    would silently drop copies of it, so the two-layer check must refuse the reduction."""

    def __init__(self):
        super().__init__()
        self.a = nn.ModuleList(nn.Linear(64, 64) for _ in range(3))
        self.b = nn.ModuleList(nn.Linear(64, 64) for _ in range(3))
        self.w = nn.Parameter(torch.randn(64, 64))

    def forward(self, x):
        for a, b in zip(self.a, self.b):
            x = b(a(x) @ self.w)
        return x


def test_work_outside_the_stacks_that_repeats_with_them_is_caught():
    rep = fxshape.analyze(_Zipped(), (torch.randn(8, 64),))
    assert rep.notes[0] == ("traced every layer: the GEMMs outside the layer stacks change "
                            "with the number of layers")
    # 3 x (a, the mm with w, b) = 9 GEMMs, as the full trace has
    assert len(rep.rows) == 9

