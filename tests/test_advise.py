"""Dimension provenance and the co-design advisor (fxshape.advise, fxshape advise / sweep)."""

import copy

import pytest
import torch

import fxshape
from fxshape.codesign.advise import advise, parse_range, sweep
from fxshape.analysis.provenance import hyperparameters

from models import MLP

transformers = pytest.importorskip("transformers")


def _meta(name, **overrides):
    from fxshape.presets import build_preset

    model = build_preset(name)
    if overrides:
        cfg = copy.deepcopy(model.config)
        for k, v in overrides.items():
            setattr(cfg, k, v)
        with torch.device("meta"):
            model = type(model)(cfg)
    return model


def _expected(cfg, b, s):
    """What each labelled dimension must equal, from the config (the test's own arithmetic)."""
    hp = {k: v for k, (_, v) in hyperparameters(cfg).items()}
    h, a = hp["hidden_size"], hp["num_attention_heads"]
    hd = hp.get("head_dim", h // a)
    kv = hp.get("num_key_value_heads", a)
    vals = {
        "batch_size × seq_len": b * s, "seq_len": s, "batch_size": b,
        "vocab_size": hp.get("vocab_size"), "hidden_size": h,
        "3 × hidden_size": 3 * h,
        "num_key_value_heads × head_dim": kv * hd,
        "num_attention_heads × head_dim": a * hd,
    }
    f = hp.get("intermediate_size")
    for label in ("intermediate_size", "d_ff", "4 × hidden_size (n_inner unset)"):
        vals[label] = f
    for label in ("head_dim", "head_dim = hidden_size / num_attention_heads"):
        vals[label] = hd
    return vals


@pytest.mark.parametrize("name", ["gpt2", "llama-3-8b", "bert-base", "t5-base"])
def test_provenance_of_every_gemm_dimension(name):
    model = _meta(name, **({"num_hidden_layers": 1} if name != "t5-base"
                           else {"num_layers": 1, "num_decoder_layers": 1}))
    b, s = 2, 96  # sizes that coincide with no hyperparameter of these models
    # BERT's pooler and T5's tied head leave parameters without gradients, which the joint
    # (train) capture rejects: their forward GEMMs only
    mode = "train" if name in ("gpt2", "llama-3-8b") else "inference"
    report = fxshape.analyze(model, batch_size=b, seq_len=s, mode=mode)
    vals = _expected(model.config, b, s)
    assert report.rows
    for r in report.rows:
        assert len(r.set_by) == 3, r
        for dim, label in zip((r.m, r.n, r.k), r.set_by):
            assert label in vals, (r.module, r.op, r.phase, label)
            assert vals[label] == dim, (r.module, r.op, r.phase, label, dim)
    # the headline cases, by name
    lm = [r for r in report.rows if r.module.endswith("lm_head") and r.phase == "forward"]
    if lm:
        assert lm[0].set_by == ("batch_size × seq_len", "vocab_size", "hidden_size")
    # attention (fused sdpa, or the bmm pairs autograd runs): some dimension is head_dim
    attn = [r for r in report.rows if r.op in ("sdpa.qk", "sdpa.pv", "bmm")]
    assert attn and all(any(x.startswith("head_dim") for x in r.set_by) for r in attn)
    assert "set by" in report.table() and "set_by_n" in report.to_csv()
    assert "batch_size × seq_len" in report.to_csv()


def test_provenance_without_config_names_parameters_and_inputs():
    report = fxshape.analyze(MLP(d_in=64, d_hidden=200, d_out=10), (torch.randn(32, 64),))
    fc1 = [r for r in report.rows if r.module == "fc1"][0]
    # M = 32 rows of the input x; N = fc1.weight's 200 rows; K = its 64 columns
    assert fc1.set_by[1] == "fc1.weight[0]" and fc1.set_by[2] == "fc1.weight[1]"
    assert fc1.set_by[0].startswith("input ") and "shape[0]" in fc1.set_by[0]


@pytest.fixture(scope="module")
def gpt2_advice():
    # CUDA graphs: the GPU never waits for the host, so the GEMM shapes decide the step (in
    # eager PyTorch a batch-1 GPT-2 step on an H100 is host-bound: see
    # test_host_bound_step_gains_nothing_from_the_vocabulary)
    return advise(_meta("gpt2"), gpu="h100", dtype=torch.bfloat16, execution="cudagraphs")


def test_advise_gpt2_pads_the_vocabulary(gpt2_advice):
    recs = {r.hyperparameter: r for r in gpt2_advice.recommendations}
    assert "vocab_size" in recs
    v = recs["vocab_size"]
    assert v.current == 50257 and v.suggested % 64 == 0 and v.suggested > 50257
    assert v.predicted_speedup > 0 and v.throughput_gain > 0
    # param delta: (suggested - 50257) more rows of the tied 768-wide embedding
    assert v.param_delta == (v.suggested - 50257) * 768
    assert "vocab_size" in gpt2_advice.table()


def test_advise_is_deterministic(gpt2_advice):
    again = advise(_meta("gpt2"), gpu="h100", dtype=torch.bfloat16, execution="cudagraphs")
    assert again.recommendations == gpt2_advice.recommendations
    assert again.table() == gpt2_advice.table()


def test_head_count_advice_depends_on_the_attention_kernel(gpt2_advice):
    # GPT-2 at 1 x 1024 tokens, training: with FlashAttention-2 (PyTorch's SDPA on an H100)
    # 6 heads of 128 would leave 6 x 8 = 48 causal CTAs for 132 SMs: no head change pays
    assert "num_attention_heads" not in {r.hyperparameter for r in gpt2_advice.recommendations}
    # unfused attention streams the batch x heads x seq^2 score matrix through memory, which
    # halves with the heads: the change pays, and the reason says which kernel says so
    math = advise(_meta("gpt2"), gpu="h100", attention="math", execution="cudagraphs")
    heads = {r.hyperparameter: r for r in math.recommendations}["num_attention_heads"]
    assert (heads.current, heads.suggested) == (12, 6) and heads.predicted_speedup > 0.05
    assert "attention predicted as math" in heads.reason and "score matrix" in heads.reason
    assert "attention=math" in math.table()


def test_host_bound_step_gains_nothing_from_the_vocabulary():
    from fxshape.codesign.advise import evaluate_config

    # eager PyTorch, GPT-2 training at 1 x 1024 tokens on an H100: ~1,000 kernels, each
    # dispatched from Python, many shorter than their dispatch: padding the vocabulary makes
    # the LM head's GEMMs faster (GEMM time down by a fifth or more) but the GPU still waits
    # for the host, so the step hardly changes; at 8 x 1024 tokens the GPU is the bottleneck
    # and most of the GEMM gain reaches the step
    kw = dict(gpu="h100", dtype=torch.bfloat16, mode="train")
    gains = {}
    for b in (1, 8):
        base = evaluate_config(_meta("gpt2"), {}, batch_size=b, **kw)
        pad = evaluate_config(_meta("gpt2"), {"vocab_size": 50304}, batch_size=b, **kw)
        gains[b] = (base.time_s / pad.time_s - 1, base.step_s / pad.step_s - 1)
    assert gains[1][0] > 0.2 and abs(gains[1][1]) < 0.02
    assert gains[8][1] > 0.1 and gains[8][1] < gains[8][0]


def test_advise_fixes_a_bad_config():
    cfg = transformers.LlamaConfig(hidden_size=4100, num_attention_heads=41,
                                   num_key_value_heads=41, vocab_size=32001,
                                   intermediate_size=11008, num_hidden_layers=4)
    adv = advise(cfg, mode="inference", batch_size=4, seq_len=512)
    touched = {a for r in adv.recommendations for a, _, _ in r.changes}
    assert {"hidden_size", "num_attention_heads", "vocab_size"} <= touched, adv.table()
    for r in adv.recommendations:
        assert r.predicted_speedup >= 0.01 and abs(r.param_delta) <= 0.02 * adv.params
        for attr, _, new in r.changes:
            if attr == "hidden_size":
                assert new % 64 == 0
            if attr == "vocab_size":
                assert new % 64 == 0


def test_advise_llama3_recommends_nothing_large():
    # the counterpart of test_advise_fixes_a_bad_config (where recommendations must appear):
    # Llama-3-8B's sizes are all multiples of 128, so nothing may promise 5% or more (one of
    # its 32 layers: the layers repeat, and each candidate is a capture)
    adv = advise(_meta("llama-3-8b", num_hidden_layers=1), mode="inference", batch_size=4,
                 seq_len=1024)
    # it analysed the model it was given: embedding and head 128256 x 4096 each; a layer's
    # q, o 4096^2, k, v 4096 x 1024, gate, up, down 4096 x 14336, two norms; the final norm
    layer = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096
    assert adv.params == 2 * 128256 * 4096 + layer + 4096 and adv.time_s > 0
    assert all(r.predicted_speedup < 0.05 for r in adv.recommendations), adv.table()


def test_advise_bad_input():
    with pytest.raises(ValueError, match="Hugging Face"):
        advise(MLP())
    with pytest.raises(TypeError, match="nn.Module or a Hugging Face config"):
        advise("gpt2")
    with pytest.raises(ValueError, match="param_tolerance"):
        advise(_meta("gpt2"), param_tolerance=2)


def test_a_candidate_is_left_out_by_the_type_of_its_refusal():
    # advise leaves out a candidate the family cannot build (ConfigRefused), the plan cannot
    # split (PlanRefused) or int4 cannot pack (PackingRefused), whatever its message says;
    # any other error is a fault and surfaces, even one whose text names heads or tp
    from fxshape.codesign.advise import Evaluation, _ranked
    from fxshape.cost.quant import PackingRefused
    from fxshape.parallelism.plan import PlanRefused
    from fxshape.tracing.configs import ConfigRefused

    base = Evaluation(time_s=1.0, flops=10, params=100, step_s=1.0, tokens_per_s=1.0)
    fast = Evaluation(time_s=0.5, flops=10, params=100, step_s=0.5, tokens_per_s=2.0)

    class Ev:
        def __init__(self, exc):
            self.exc = exc

        def params(self, changes):
            return 100

        def __call__(self, changes):
            if changes[0][2] == 1:
                raise self.exc
            return fast

    cands = [("hidden_size", (("hidden_size", 4, 1),), "refused"),
             ("hidden_size", (("hidden_size", 4, 8),), "priced")]
    for exc in (ConfigRefused("x"), PlanRefused("x", "heads"), PackingRefused("x")):
        recs, too_big, too_slow = _ranked(Ev(exc), cands, base, 0.02, 0.01)
        # the refused candidate is gone; the other is the one recommendation (2x faster)
        assert [r.changes for r in recs] == [(("hidden_size", 4, 8),)], exc
        assert (too_big, too_slow) == (0, 0)
    with pytest.raises(ValueError, match="tp does not divide the heads"):
        _ranked(Ev(ValueError("tp does not divide the heads")), cands, base, 0.02, 0.01)
    # each refusal is still the ValueError callers catch, its message unchanged
    assert issubclass(ConfigRefused, ValueError) and issubclass(PackingRefused, ValueError)
    from fxshape.tracing.configs import check_config

    cfg = transformers.LlamaConfig(hidden_size=64, num_attention_heads=4)
    cfg.num_attention_heads = 3  # as advise's candidates are made: 4 KV heads cannot serve 3
    with pytest.raises(ConfigRefused, match="= 4 does not divide num_attention_heads = 3"):
        check_config(cfg)


def test_sweep_and_range():
    pts = sweep(_meta("gpt2", n_layer=1), "n_embd", range(760, 777, 8), batch_size=4,
                seq_len=256)
    assert [p.value for p in pts] == [760, 768, 776]
    # 760 and 776 are not divisible by GPT-2's 12 heads; 768 is
    assert pts[0].time_s is None and "divisible" in pts[0].note
    assert pts[1].tflops > 0 and pts[2].time_s is None
    assert list(parse_range("64:256:64")) == [64, 128, 192, 256]
    for bad in ("64", "a:b", "256:64", "0:10", "1:100000:1"):
        with pytest.raises(ValueError, match="range"):
            parse_range(bad)
    with pytest.raises(ValueError, match="no attribute 'hiden_size'"):
        sweep(_meta("gpt2"), "hiden_size", [768])


def test_cli_advise_and_sweep_plot(tmp_path, capsys):
    from fxshape.cli import main

    assert main(["advise", "gpt2", "--mode", "inference", "--batch-size", "4"]) == 0
    out = capsys.readouterr().out
    assert "vocab_size" in out and "50257" in out
    svg = tmp_path / "sweep.svg"
    assert main(["sweep", "gpt2", "--param", "vocab_size", "--range", "50240:50304:16",
                 "--batch-size", "4", "--seq-len", "256", "--out", str(svg)]) == 0
    out = capsys.readouterr().out
    assert "50257" not in out and "50256" in out and "TFLOP/s" in out
    pytest.importorskip("matplotlib")
    assert svg.stat().st_size > 1000 and svg.read_text().lstrip().startswith("<?xml")
    assert main(["sweep", "gpt2", "--param", "vocab_size", "--range", "1:2", "--out",
                 str(tmp_path / "x.pdf")]) == 2


def test_wave_boundary_note():
    from types import SimpleNamespace

    from fxshape.codesign.advise import _rule_notes

    # H100 SXM has 132 SMs: 140 tiles = 1 full wave + 8 tiles (8 <= 15% of 132), so the
    # second wave is 8/132 full and wave efficiency 140 / (2 * 132) = 53%
    pred = SimpleNamespace(waves=2, ctas=140, wave_efficiency=140 / 264, bound="compute")
    row = SimpleNamespace(prediction=pred, m=4096, n=4480, k=4096, op="linear",
                          set_by=("batch_size × seq_len", "intermediate_size", "hidden_size"))
    group = {"row": row, "module": "mlp.up", "share": 0.5}
    report = SimpleNamespace(gpu="h100", groups=lambda: [group], unsupported=())
    notes = _rule_notes(SimpleNamespace(), report, tp=1, batch_size=None)
    assert len(notes) == 1 and "1 full waves + 8 tiles" in notes[0]
    assert "N (intermediate_size)" in notes[0]
    # 200 tiles = 1 wave + 68: well into the second wave, no note
    pred2 = SimpleNamespace(waves=2, ctas=200, wave_efficiency=200 / 264, bound="compute")
    group["row"] = SimpleNamespace(**{**vars(row), "prediction": pred2})
    assert _rule_notes(SimpleNamespace(), report, tp=1, batch_size=None) == ()


def test_advise_and_sweep_are_the_package_level_functions():
    # the README calls fxshape.advise(...): the function, even once its module is imported
    import subprocess
    import sys

    code = ("import fxshape, fxshape.codesign.advise; "
            "assert callable(fxshape.advise) and callable(fxshape.sweep); "
            "assert fxshape.advise.__module__ == 'fxshape.codesign.advise'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_advice_says_what_the_step_times_leave_out():
    from fxshape import analyze
    from fxshape.codesign.advise import _rule_notes

    class UsesAddbmm(torch.nn.Module):
        def forward(self, c, a, b):
            return torch.addbmm(c, a, b)  # no GEMM handler: reported, not counted

    rep = analyze(UsesAddbmm(), (torch.randn(8, 16), torch.randn(4, 8, 12),
                                 torch.randn(4, 12, 16)))
    cfg = transformers.LlamaConfig(hidden_size=256, num_attention_heads=4)
    notes = _rule_notes(cfg, rep, 1, 1)
    assert any("not in the step times: aten.addbmm.default" in n for n in notes), notes
