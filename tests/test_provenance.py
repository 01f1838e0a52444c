"""Provenance by cause (fxshape.analysis.perturb, fxshape.analysis.provenance.name_by_cause): a
GEMM dimension is set by what changes it, so sizes that coincide in value are not confused."""

import pytest
import torch

import fxshape
from fxshape.analysis import perturb
from fxshape.analysis.provenance import Knob, catalog, environment, name_by_cause

from models import MLP, EinsumBmm

transformers = pytest.importorskip("transformers")

HEAD_DIM_GPT2 = "head_dim = hidden_size / num_attention_heads"


def _meta(cls, cfg):
    with torch.device("meta"):
        return cls(cfg)


def _gpt2(**cfg):
    from transformers import GPT2Config, GPT2LMHeadModel

    return _meta(GPT2LMHeadModel, GPT2Config(n_layer=2, **cfg))


def _rows(report, op, module_end=None, phase="forward"):
    out = [r for r in report.rows if r.op == op and r.phase == phase
           and (module_end is None or r.module.endswith(module_end))]
    assert out, (op, module_end, phase)
    return out


# -- naming from measured points (pure) ------------------------------------------------------

def test_a_dimension_is_named_by_the_expression_it_equals_at_every_point():
    knobs = [Knob("hidden_size", "n_embd", 768, attr="n_embd"),
             Knob("num_attention_heads", "n_head", 12, attr="n_head"),
             Knob("seq_len", "seq_len", 64)]
    env0, labels = environment(None, knobs)
    exprs = catalog(labels)
    assert env0["head_dim"] == 64  # 768 / 12, derived: the config states no head_dim
    moved = {k.name: environment(None, knobs, {k.name: 2 * k.value})[0] for k in knobs}

    def points(f):  # the dimension f(env) at the base point and with each knob doubled
        return [(None, env0, f(env0))] + [(n, e, f(e)) for n, e in moved.items()]

    # 64 = seq_len = head_dim at the base point: only the moved points tell them apart
    assert name_by_cause(points(lambda e: e["seq_len"]), labels, exprs) == \
        ("seq_len", ("seq_len",))
    assert name_by_cause(points(lambda e: e["hidden_size"] // e["num_attention_heads"]),
                         labels, exprs) == \
        ("head_dim = n_embd / n_head", ("hidden_size", "num_attention_heads"))
    # 3 x 768 = 2304, 3 x 1536 = 4608 when n_embd doubles
    assert name_by_cause(points(lambda e: 3 * e["hidden_size"]), labels, exprs)[0] == \
        "3 × n_embd"
    # nothing varied changes it: no label (the caller names the parameter axis)
    assert name_by_cause(points(lambda e: 10), labels, exprs) == (None, ())


def test_dimensions_outside_the_catalog_get_a_monomial_or_their_causes():
    knobs = [Knob("input x.shape[0]", "x.shape[0]", 32), Knob("input x.shape[1]", "x.shape[1]", 8)]
    env0, labels = environment(None, knobs)

    def points(f):
        return [(None, env0, f(env0))] + [
            (k.name, e, f(e)) for k in knobs
            for e in [environment(None, knobs, {k.name: 2 * k.value})[0]]]

    x0, x1 = "input x.shape[0]", "input x.shape[1]"
    # 4 heads per row of x: 4 x 32 = 128 at the base, 256 with x.shape[0] doubled
    assert name_by_cause(points(lambda e: 4 * e[x0]), labels, [])[0] == "4 × x.shape[0]"
    assert name_by_cause(points(lambda e: e[x0] * e[x1]), labels, [])[0] == \
        "x.shape[0] × x.shape[1]"
    assert name_by_cause(points(lambda e: e[x0] // e[x1]), labels, [])[0] == \
        "x.shape[0] / x.shape[1]"
    # 32 + 8 = 40 -> 72 and 48: no monomial fits; the label says what it depends on
    assert name_by_cause(points(lambda e: e[x0] + e[x1]), labels, []) == \
        ("f(x.shape[0], x.shape[1])", (x0, x1))


# -- coinciding values in real models --------------------------------------------------------

def test_seq_len_equal_to_head_dim_and_batch_one():
    # GPT-2: head_dim = 768 / 12 = 64 = seq_len, and batch 1 makes batch x seq = seq
    model = _gpt2()
    report = fxshape.analyze(model, batch_size=1, seq_len=64)
    qk = _rows(report, "sdpa.qk")[0]
    pv = _rows(report, "sdpa.pv")[0]
    assert qk.set_by == ("seq_len", "seq_len", HEAD_DIM_GPT2)
    assert pv.set_by == ("seq_len", HEAD_DIM_GPT2, "seq_len")
    assert qk.causes == (("seq_len",), ("seq_len",), ("hidden_size", "num_attention_heads"))
    fc = _rows(report, "addmm", "c_fc")[0]
    assert fc.set_by[0] == "batch_size × seq_len" and fc.causes[0] == ("batch_size", "seq_len")
    assert any("traced by cause" in n for n in report.notes)
    # matching by value gets the head dimension wrong here (the reason for tracing)
    matched = fxshape.analyze(model, batch_size=1, seq_len=64, provenance="matched")
    assert _rows(matched, "sdpa.qk")[0].set_by[2] == "seq_len"
    assert not any("traced by cause" in n for n in matched.notes)


def test_vocabulary_equal_to_hidden_size():
    model = _gpt2(vocab_size=768)  # = n_embd
    lm = _rows(fxshape.analyze(model, seq_len=32), "linear", "lm_head")[0]
    assert (lm.n, lm.k) == (768, 768)
    assert lm.set_by == ("batch_size × seq_len", "vocab_size", "hidden_size")
    assert lm.causes[1:] == (("vocab_size",), ("hidden_size",))
    matched = fxshape.analyze(model, seq_len=32, provenance="matched")
    assert _rows(matched, "linear", "lm_head")[0].set_by[2] == "vocab_size"  # confused


def test_llama_projections_follow_heads_and_head_dim_not_hidden_size():
    from transformers import LlamaConfig, LlamaForCausalLM

    # head_dim stated and 4 x 32 = 128 != hidden 256: q_proj's N is heads x head_dim
    cfg = LlamaConfig(hidden_size=256, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=32, intermediate_size=512, num_hidden_layers=2,
                      vocab_size=1000)
    report = fxshape.analyze(_meta(LlamaForCausalLM, cfg), seq_len=48, batch_size=2)
    q = _rows(report, "linear", "q_proj")[0]
    k = _rows(report, "linear", "k_proj")[0]
    o = _rows(report, "linear", "o_proj")[0]
    assert (q.m, q.n, q.k) == (96, 128, 256) and q.set_by == (
        "batch_size × seq_len", "num_attention_heads × head_dim", "hidden_size")
    assert q.causes[1] == ("num_attention_heads", "head_dim")
    assert k.n == 64 and k.set_by[1] == "num_key_value_heads × head_dim"  # 2 x 32
    assert o.set_by[2] == "num_attention_heads × head_dim"
    qk = _rows(report, "sdpa.qk")[0]
    assert qk.set_by == ("seq_len", "seq_len", "head_dim") and qk.causes[2] == ("head_dim",)


def test_moe_expert_rows_are_set_by_routing():
    from transformers import MixtralConfig, MixtralForCausalLM

    cfg = MixtralConfig(hidden_size=128, num_attention_heads=4, num_key_value_heads=2,
                        intermediate_size=256, num_hidden_layers=1, vocab_size=1000,
                        num_local_experts=4, num_experts_per_tok=2)
    report = fxshape.analyze(_meta(MixtralForCausalLM, cfg), seq_len=30)
    up = [r for r in report.rows if r.op == "grouped_mm"]
    assert up
    # 1 x 30 tokens x top-2 over 4 experts: ceil(60 / 4) = 15 rows per expert
    assert up[0].m == 15
    assert up[0].set_by[0] == "batch_size × seq_len × top-k / experts (routing)"
    assert set(up[0].causes[0]) == {"batch_size", "seq_len", "num_local_experts",
                                    "num_experts_per_tok"}
    assert "2 × intermediate_size" in up[0].set_by  # fused gate and up projection


def test_plain_module_inputs_are_traced_through_export_dims():
    # x is (64, 64) and fc1 has 64 inputs: M and K coincide in value
    report = fxshape.analyze(MLP(d_in=64, d_hidden=200, d_out=10), (torch.randn(64, 64),))
    fc1 = [r for r in report.rows if r.module == "fc1"][0]
    assert fc1.set_by == ("input x.shape[0]", "fc1.weight[0]", "fc1.weight[1]")
    assert fc1.causes == (("x.shape[0]",), (), ())
    # einsum/matmul/bmm: b's axis 1 must equal a's axis 2 (one knob); a.shape[1] = 3 is M
    ein = fxshape.analyze(EinsumBmm(), (torch.randn(2, 3, 4), torch.randn(2, 4, 5),
                                        torch.randn(5, 6)))
    mm = [r for r in ein.rows if r.op == "matmul"][0]
    assert (mm.m, mm.n, mm.k) == (6, 6, 5)  # 2 x 3 rows, c's 6 columns, b's 5 columns
    assert mm.set_by == ("input a.shape[0]×a.shape[1]", "input c.shape[1]", "input b.shape[2]")


# -- what could not be varied is said -------------------------------------------------------

def test_a_model_its_config_does_not_rebuild_gets_no_hyperparameter_labels():
    model = _gpt2()
    with torch.device("meta"):
        model.lm_head = torch.nn.Linear(768, 50304, bias=False)  # replaced after building
    report = fxshape.analyze(model, seq_len=32)
    lm = _rows(report, "linear", "lm_head")[0]
    assert lm.set_by == ("batch_size × seq_len", "lm_head.weight[0]", "lm_head.weight[1]")
    assert any("hyperparameters not varied" in n for n in report.notes)


def test_a_knob_the_model_rejects_is_named(monkeypatch):
    perturb._CACHE.clear()
    # n_embd 768 -> 5377 is not divisible by 12 heads: GPT2Attention refuses to build
    monkeypatch.setattr(perturb, "_trial_values", lambda v: [7 * v + 1])
    report = fxshape.analyze(_gpt2(), seq_len=32)
    perturb._CACHE.clear()
    note = [n for n in report.notes if "could not vary" in n]
    assert note and "hidden_size" in note[0] and "num_attention_heads" in note[0]
    # "hidden_size" equals it at every point measured, but hidden_size was never varied: an
    # untested expression is no label (it could be a coincidence), so the dimension is named
    # by the parameter axis that carries it, and has no cause
    proj = _rows(report, "addmm", "attn.c_proj")[0]
    assert proj.set_by[1] == "transformer.h.0.attn.c_proj.weight[0]" and proj.causes[1] == ()
    # the knobs that were varied still name what they set
    assert proj.set_by[0] == "batch_size × seq_len"


# -- the fast trace stands in for export exactly; determinism ---------------------------------

def test_fast_trace_and_export_give_the_same_provenance(monkeypatch):
    from fxshape.analysis import fasttrace

    model = _gpt2()
    perturb._CACHE.clear()
    fast = fxshape.analyze(model, seq_len=40, mode="train")
    perturb._CACHE.clear()

    def refuse(*a, **k):
        raise RuntimeError("no fast trace")

    monkeypatch.setattr(fasttrace, "gemm_graph", refuse)  # every point re-captured by export
    slow = fxshape.analyze(model, seq_len=40, mode="train")
    perturb._CACHE.clear()
    assert [(r.set_by, r.causes) for r in fast.rows] == [(r.set_by, r.causes) for r in slow.rows]
    assert {r.phase for r in fast.rows} == {"forward", "backward"}


def test_traced_provenance_is_deterministic_and_cached():
    model = _gpt2()
    perturb._CACHE.clear()
    first = fxshape.analyze(model, seq_len=24)
    again = fxshape.analyze(_gpt2(), seq_len=24)  # a new instance: served from the cache
    perturb._CACHE.clear()
    fresh = fxshape.analyze(model, seq_len=24)
    assert first.to_json() == again.to_json() == fresh.to_json()


def test_provenance_choices():
    model = MLP()
    x = (torch.randn(8, 64),)
    none = fxshape.analyze(model, x, provenance=None)
    assert all(r.set_by == () and r.causes == () for r in none.rows)
    assert "set by" not in none.table()
    matched = fxshape.analyze(model, x, provenance="matched")
    assert all(len(r.set_by) == 3 and r.causes == () for r in matched.rows)
    with pytest.raises(ValueError, match="accepted: 'traced', 'matched', None"):
        fxshape.analyze(model, x, provenance="bycause")


def test_cli_provenance_option_and_json_causes(capsys):
    import csv
    import io
    import json

    from fxshape.cli import main

    assert main(["analyze", "gpt2", "--seq-len", "64", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    lm = [r for r in rows if r["module"] == "lm_head"][0]
    assert lm["set_by_n"] == "vocab_size" and lm["causes_n"] == ["vocab_size"]
    assert lm["causes_m"] == ["batch_size", "seq_len"]
    assert main(["analyze", "gpt2", "--seq-len", "64", "--format", "csv",
                 "--provenance", "none"]) == 0
    table = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [r["set_by_n"] for r in table if r["module"] == "lm_head"] == [""]
    with pytest.raises(SystemExit):  # argparse: not one of traced, matched, none
        main(["analyze", "gpt2", "--provenance", "guess"])


def test_given_token_ids_and_mask_vary_together():
    # inputs given, not synthesized: ids and mask share batch (axis 0) and sequence (axis 1);
    # 3 x 32 tokens, so batch x seq = 96 and seq = 32 are told apart by varying each
    ids = torch.zeros(3, 32, dtype=torch.long, device="meta")
    report = fxshape.analyze(_gpt2(), example_kwargs={"input_ids": ids,
                                                       "attention_mask": torch.ones_like(ids)})
    fc = _rows(report, "addmm", "c_fc")[0]
    assert fc.m == 96 and fc.set_by[0] == "batch_size × seq_len"
    assert fc.causes[0] == ("batch_size", "seq_len")
    assert _rows(report, "sdpa.qk")[0].set_by[:2] == ("seq_len", "seq_len")


# -- labels agree with their causes (MLA, MoE widths) ----------------------------------------

def _deepseek_v3():
    # DeepSeek-V3's attention at a small size: 4 heads, q/kv low-rank 64/32, head dims split
    # 32 (no rope) + 16 (rope) for Q and K, 32 for V; one dense layer, one MoE layer
    cfg = transformers.DeepseekV3Config(
        hidden_size=256, num_hidden_layers=2, first_k_dense_replace=1, num_attention_heads=4,
        num_key_value_heads=4, q_lora_rank=64, kv_lora_rank=32, qk_nope_head_dim=32,
        qk_rope_head_dim=16, v_head_dim=32, intermediate_size=512, moe_intermediate_size=96,
        n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1, vocab_size=1000)
    return _meta(transformers.DeepseekV3ForCausalLM, cfg)


def _label_names_only_its_causes(report):
    # a label names no knob that was varied without changing the dimension
    from fxshape.analysis.provenance import agrees

    varied = report.notes[0].split("one of ", 1)[1].split(" changed", 1)[0].split(", ")
    for r in report.rows:
        for label, causes in zip(r.set_by, r.causes):
            assert agrees(label, causes, varied), (r.module, r.op, label, causes)


def test_mla_dimensions_are_named_by_the_fields_that_set_them():
    rep = fxshape.analyze(_deepseek_v3(), seq_len=64, provenance="traced")
    pv = _rows(rep, "sdpa.pv")[0]
    # V's head dim is 32 = v_head_dim; value matching called it batch_size x heads before
    assert pv.n == 32 and pv.set_by[1] == "v_head_dim" and pv.causes[1] == ("v_head_dim",)
    q_b = _rows(rep, "linear", "q_b_proj")[0]
    # 4 heads x (32 + 16) = 192, which equals 3 x 4 heads x 16 (head_dim is the rope dim in
    # this config and could not be varied alone): that coincidence is no label
    assert q_b.n == 192 and "3 ×" not in q_b.set_by[1] and q_b.set_by[2] == "q_lora_rank"
    assert "num_attention_heads" in q_b.causes[1] and "qk_nope_head_dim" in q_b.causes[1]
    kv_b = _rows(rep, "linear", "kv_b_proj")[0]
    assert kv_b.n == 4 * (32 + 32) and \
        kv_b.set_by[1] == "num_attention_heads × (qk_nope_head_dim + v_head_dim)"
    o = _rows(rep, "linear", "o_proj")[0]
    assert o.k == 4 * 32 and o.set_by[2] == "num_attention_heads × v_head_dim"
    shared = _rows(rep, "linear", "shared_experts.gate_proj")[0]
    assert "moe_intermediate_size" in shared.set_by[1]
    _label_names_only_its_causes(rep)


def test_moe_expert_width_is_a_knob():
    cfg = transformers.Qwen2MoeConfig(hidden_size=128, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=4,
                                      intermediate_size=256, moe_intermediate_size=96,
                                      shared_expert_intermediate_size=160, num_experts=4,
                                      num_experts_per_tok=2, vocab_size=1000)
    rep = fxshape.analyze(_meta(transformers.Qwen2MoeForCausalLM, cfg), seq_len=32)
    shared = _rows(rep, "linear", "shared_expert.gate_proj")[0]
    assert shared.n == 160 and shared.set_by[1] == "shared_expert_intermediate_size"
    experts = [r for r in rep.rows if r.op.startswith("grouped") and r.phase == "forward"]
    assert experts and any("moe_intermediate_size" in c for r in experts for c in r.causes)
    _label_names_only_its_causes(rep)


def test_an_expression_over_a_knob_never_varied_is_not_a_label():
    from fxshape.analysis.provenance import confirmed

    knobs = [Knob("num_attention_heads", "n_head", 4, attr="n_head"),
             Knob("head_dim", "head_dim", 16, attr="head_dim")]
    env0, labels = environment(None, knobs)
    exprs = catalog(labels)
    # with only the heads varied, "n_head × head_dim" is untested: it is left out; with both
    # varied it stays
    only_heads = [lbl for lbl, _ in confirmed(exprs, None, knobs, ["num_attention_heads"])]
    both = [lbl for lbl, _ in confirmed(exprs, None, knobs, ["num_attention_heads",
                                                               "head_dim"])]
    assert "n_head × head_dim" not in only_heads and "n_head × head_dim" in both


def test_rows_of_one_shape_with_other_causes_are_not_merged():
    """Issue 52: seq_len = kv_heads x head_dim (64 = 2 x 32) gives a K projection's input- and
    weight-gradient GEMMs one shape (64 x 128 x 64); the table merged them under one cause."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.Qwen3Config(num_hidden_layers=2, hidden_size=128, intermediate_size=256,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                   vocab_size=500, max_position_embeddings=1024)
    with torch.device("meta"):
        model = transformers.Qwen3ForCausalLM(cfg)
    report = fxshape.analyze(model, seq_len=64, mode="train")
    groups = [g for g in report.groups()
              if g["module"].endswith("k_proj") and g["phase"] == "backward"]
    # dW = dYᵀ X: M = kv_heads x head_dim, K = tokens; dX = dY W: M = tokens, K = kv x head_dim
    assert sorted(g["row"].set_by for g in groups) == [
        ("batch_size × seq_len", "hidden_size", "num_key_value_heads × head_dim"),
        ("num_key_value_heads × head_dim", "hidden_size", "batch_size × seq_len")]
    assert [g["count"] for g in groups] == [2, 2]  # one of each per layer, two layers
