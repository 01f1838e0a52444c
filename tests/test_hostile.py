"""The classes of wrong answers a hostile afternoon found (issue 28), each with a test that
would have caught it: decode on models that cannot decode, options that changed nothing
silently, memory that contradicted its own rows, a floor above the prediction, and the
smaller ones. (The generated option matrices are in tests/test_options.py.)"""

import json
import warnings

import pytest
import torch

import fxshape
from fxshape.cli import main

transformers = pytest.importorskip("transformers")


def _meta(cls, cfg):
    with torch.device("meta"):
        return cls(cfg)


def _llama(**kw):
    cfg = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
               num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
               max_position_embeddings=256)
    return _meta(transformers.LlamaForCausalLM, transformers.LlamaConfig(**{**cfg, **kw}))


# -- 1. decode on models that cannot decode: refused in one line that says why ---------------

def _bert(is_decoder):
    cfg = transformers.BertConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
                                  intermediate_size=128, vocab_size=256,
                                  is_decoder=is_decoder)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _meta(transformers.BertLMHeadModel, cfg)


@pytest.mark.parametrize("build, why", [
    (lambda: _meta(transformers.OpenAIGPTLMHeadModel, transformers.OpenAIGPTConfig(
        n_layer=1, n_embd=64, n_head=4, vocab_size=256, n_positions=512)),
     "OpenAIGPTLMHeadModel has none in transformers (its forward takes no cache"),
    (lambda: _bert(False), "BertLMHeadModel's BertSelfAttention attends both ways (set "
                           "is_decoder=True in its config)"),
    (lambda: _bert(True), "transformers does not offer for BertLMHeadModel"),
    (lambda: torch.nn.Sequential(torch.nn.Linear(8, 8)), "Sequential has no config"),
])
def test_decode_refuses_what_cannot_decode(build, why, capsys):
    with pytest.raises(ValueError) as info:
        fxshape.analyze(build(), mode="decode", context_len=64)
    msg = str(info.value)
    assert why in msg and "\n" not in msg
    # nothing dumped on the terminal on the way (torch's graph dumps were)
    out = capsys.readouterr()
    assert "def forward" not in out.out + out.err


# -- 2. options that change nothing: stated, or refused ---------------------------------------

def test_contradictions_are_refused_in_one_line(capsys):
    m = _llama()
    with pytest.raises(ValueError, match="sequence_parallel .* needs tp > 1, got tp=1"):
        fxshape.analyze(m, seq_len=16, sequence_parallel=True)
    with pytest.raises(ValueError, match="a decode step has one token per sequence"):
        fxshape.analyze(m, mode="decode", tp=2, sequence_parallel=True)
    assert main(["analyze", "gpt2", "--mode", "decode", "--train"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("fxshape: error: --train means --mode train, but --mode decode was given: "
                   "give one of them")


def test_an_option_without_effect_says_so():
    m = _llama()
    base = fxshape.analyze(m, seq_len=16, provenance=None)
    r = fxshape.analyze(m, seq_len=16, provenance=None, optimizer="sgd", dp=4)
    said = {o.name: o for o in r.options}
    assert not said["optimizer"].applied and "no optimizer step" in said["optimizer"].effect
    assert not said["dp"].applied and "one replica's" in said["dp"].effect
    # ...and indeed nothing changed: the same step to the last bit
    assert r.step.time_s == base.step.time_s and r.memory == base.memory
    text = str(r)
    assert "optimizer=sgd has no effect: mode 'inference' has no optimizer step" in text


# -- 3. memory that agrees with its rows -------------------------------------------------------

def test_parameters_per_gpu_follow_the_split_by_hand():
    # tiny Llama: hidden 64, 4 heads over 2 KV heads (head_dim 16), MLP 128, vocabulary 256,
    # one layer, untied LM head, no biases. At tp 4 each GPU holds (elements):
    #   embedding 256*64/4 = 4096 (vocabulary-parallel); q_proj and o_proj 64*64/4 = 1024
    #   each; k_proj and v_proj one whole KV head each (tp 4 > 2 KV heads): 16*64 = 1024
    #   each, not (32*64)/4 = 512; gate, up, down 128*64/4 = 2048 each; three RMSNorm
    #   weights of 64, replicated; lm_head 256*64/4 = 4096
    per_gpu = 4096 + 1024 * 2 + 1024 * 2 + 2048 * 3 + 3 * 64 + 4096
    r = fxshape.analyze(_llama(), seq_len=16, provenance=None, tp=4)
    assert r.memory.parameters == 2 * per_gpu  # bf16
    # the K/V GEMMs say the same: N = one head's 16 features
    kv = [row for row in r.rows if row.module.endswith(("k_proj", "v_proj"))]
    assert kv and all(row.n == 16 for row in kv)


def test_activations_split_with_tp_and_sequence_parallel():
    m = _llama(num_hidden_layers=2)
    act = {}
    for kw in ({}, {"tp": 2}, {"tp": 2, "sequence_parallel": True}):
        r = fxshape.analyze(m, seq_len=64, provenance=None, mode="train", **kw)
        act[tuple(kw)] = r.memory.activations
    assert act[()] > act[("tp",)] > act[("tp", "sequence_parallel")]
    # with sequence parallelism every saved tensor is split: half of tp 1's, to the byte per
    # tensor (each is rounded down on its own; there are fewer than a thousand)
    assert 0 <= act[()] - 2 * act[("tp", "sequence_parallel")] < 1000


def test_tp_on_a_model_with_no_parallel_layer_is_refused():
    mlp = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                              torch.nn.Linear(256, 64))
    with pytest.raises(ValueError) as info:
        fxshape.analyze(mlp, (torch.zeros(8, 64),), tp=2)
    assert "tp=2: no layer of Sequential is tensor-parallel" in str(info.value)
    # at tp 1 it is analyzed, and nothing is halved
    r = fxshape.analyze(mlp, (torch.zeros(8, 64),))
    assert r.memory.parameters == 2 * sum(p.numel() for p in mlp.parameters())


# -- 4. the floor is never above the prediction ------------------------------------------------

def test_a_page_beyond_the_positions_is_refused():
    with pytest.raises(ValueError, match="page_size=100000000 exceeds the model's 256 "
                                         "positions"):
        fxshape.analyze(_llama(), mode="decode", context_len=100, page_size=10**8)


@pytest.mark.parametrize("context, page", [(20, 128), (100, 256), (17, 16), (256, 1)])
def test_the_floor_reads_the_context_and_stays_under_the_step(context, page):
    r = fxshape.analyze(_llama(), mode="decode", context_len=context, page_size=page)
    # held: whole pages of 2 (K, V) x 1 layer x 2 KV heads x 16 x 2 bytes = 128 bytes a token
    pages = -(-context // page)
    assert r.memory.kv_cache == 128 * pages * page
    # read: the context's tokens, with every weight but the input embedding's
    w = r.memory.parameters - 256 * 64 * 2
    bw = fxshape.get_gpu("h100").memory_bandwidth_gbs * 1e9
    assert r.step.floor_s == pytest.approx((w + 128 * context) / bw, rel=1e-12)
    assert r.step.floor_s < r.step.time_s


# -- 5. the smaller ones ------------------------------------------------------------------------

def test_a_sweep_whose_every_point_fails_is_an_error(capsys):
    # GPT-2's 768 features over 5 or 7 heads: no value gives a model
    code = main(["sweep", "gpt2", "--param", "n_head", "--range", "5:7:2", "--seq-len", "16"])
    captured = capsys.readouterr()
    assert code == 2
    assert captured.err.strip().startswith("fxshape: error: every value of the sweep failed")
    assert captured.err.strip().count("\n") == 0
    assert "not divisible by n_head = 5" in captured.out  # the table still says why


def test_the_sweep_plot_breaks_at_a_failed_point():
    from fxshape.report.plot import _segments
    from fxshape.codesign.advise import SweepPoint

    pts = [SweepPoint(v, 1.0, t, 1, "") if t is not None else SweepPoint(v, None, None, None,
                                                                          "bad")
           for v, t in ((1, 10.0), (2, 11.0), (3, None), (4, 12.0), (5, None), (6, None),
                        (7, 9.0))]
    assert _segments(pts) == [([1, 2], [10.0, 11.0]), ([4], [12.0]), ([7], [9.0])]


def test_plot_colours_mean_one_thing_and_titles_wrap():
    from fxshape.report.plot import AT_PEAK, CAUSES, STEP_COLOURS, _wrap

    gemm_panel = set(CAUSES.values()) | {AT_PEAK}
    assert not gemm_panel & set(STEP_COLOURS.values())
    assert len(set(STEP_COLOURS.values())) == len(STEP_COLOURS)
    title = "x" * 30 + " " + "y" * 50 + " " + "z" * 40 + "\nsecond line"
    assert all(len(line) <= 90 for line in _wrap(title, 90).splitlines())
    assert _wrap(title, 90).replace("\n", " ") == title.replace("\n", " ")


def test_head_dim_advice_in_decode_gives_the_decode_reason():
    from fxshape.codesign.advise import _candidates

    cfg = transformers.GPT2Config(n_layer=1, n_embd=256, n_head=4)  # head_dim 64
    for mode, reason in (("train", "larger attention GEMMs"),
                         ("decode", "the decode step reads the KV cache")):
        heads = [r for g, _, r in _candidates(cfg, 1, False, mode) if g == "num_attention_heads"]
        assert heads and all(reason in r for r in heads), (mode, heads)


def test_training_calls_print_no_deprecation_warning():
    # transformers 5 deprecated is_gradient_checkpointing; fxshape reads the layers' flags
    m = _llama()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fxshape.analyze(m, seq_len=16, mode="train", provenance=None)
    assert not [w for w in caught if issubclass(w.category, FutureWarning)]


def test_tokens_per_s_with_dp_is_per_replica_and_says_so():
    m = _llama()
    one = fxshape.analyze(m, seq_len=16, mode="train", provenance=None)
    four = fxshape.analyze(m, seq_len=16, mode="train", provenance=None, dp=4)
    assert four.step.replicas == 4 and four.step.tokens == one.step.tokens == 16
    text = four.step.describe()
    total = 4 * four.step.tokens_per_s
    assert f"tokens/s per replica ({total:,.0f} over 4 data-parallel replicas)" in text


def test_gpus_lists_memory_and_help_says_what_analyze_prints(capsys):
    assert main(["gpus"]) == 0
    out = capsys.readouterr().out
    head = out.splitlines()[0]
    assert "memory GiB" in head
    h100 = next(line for line in out.splitlines() if line.startswith("h100-sxm "))
    assert " 80 " in h100  # the 80 GB an H100 SXM holds, what "fits" is checked against
    with pytest.raises(SystemExit):
        main(["analyze", "--help"])
    text = capsys.readouterr().out
    assert "whole step" in text and "print its GEMMs" not in text


def test_the_default_mode_is_said(capsys):
    m = _llama()
    r = fxshape.analyze(m, seq_len=16, provenance=None)
    assert "workload: inference (the default mode)" in str(r)
    r = fxshape.analyze(m, seq_len=16, provenance=None, mode="inference")
    assert "workload: inference, " in str(r)
    a = fxshape.advise(m.config, seq_len=16)
    assert "(bf16, train (advise's default mode)," in a.table()
    s = fxshape.sweep(m.config, "intermediate_size", [128], seq_len=16)
    assert s.header().endswith("(bf16, inference (sweep's default mode), eager)")
    assert s[0].tokens_per_s == pytest.approx(16 / s[0].step_s)
    assert json.loads(r.to_json())["workload"]["mode_default"] is False
