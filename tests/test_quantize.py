"""Quantized linear layers as inference engines run them (``fxshape.cost.quant``, issue 32):
packed bytes by hand, the kernels each method launches, the properties of the model, analyze
/ serve / the serving step and the CLI with ``quantize=``, and bad input."""

import json

import pytest

import fxshape
from fxshape.cost.gemm import predict_matmul
from fxshape.cost.quant import (Quantization, fp8_eligible, packed_weight_bytes,
                                predict_quantized, quantization_of)

transformers = pytest.importorskip("transformers")

from models import tiny_llama  # noqa: E402


@pytest.fixture(scope="module")
def tiny():
    return tiny_llama()


def test_packed_int4_bytes_with_scales_and_zeros_by_hand():
    q = quantization_of("int4", 32)
    # 4096 x 4096 int4: two elements a byte = 8,388,608 bytes; K / 32 = 128 groups per
    # output column, each a bf16 scale and a bf16 zero (4 bytes): 128 x 4096 x 4 = 2,097,152
    assert packed_weight_bytes(4096, 4096, q) == 8_388_608 + 2_097_152
    # group 128: a quarter of the scales and zeros
    assert packed_weight_bytes(4096, 4096, quantization_of("int4")) == 8_388_608 + 524_288
    # int8: a byte an element and a bf16 scale per output column; fp8: an fp32 scale
    assert packed_weight_bytes(4096, 11008, quantization_of("int8")) == \
        4096 * 11008 + 2 * 11008
    assert packed_weight_bytes(4096, 11008, quantization_of("fp8")) == \
        4096 * 11008 + 4 * 11008


def test_the_key_reads_back():
    for q in (quantization_of("int4", 64), quantization_of("int8"), quantization_of("fp8"),
              Quantization("fp8", activations="static")):
        q = quantization_of(q)  # fills the defaults of a hand-made record
        assert quantization_of(q.key) == q
    assert quantization_of("int4").group_size == 128  # gpt-fast's and torchao's default


def test_weight_only_decode_is_cheaper_than_bf16_and_int4_cheaper_than_int8():
    # batch-1 decode is bound by the weight's bytes: int4 (~0.53 B/element with group 128)
    # < int8 (~1 B) < bf16 (2 B), all as Inductor's reduction / tinygemm stream them
    kw = dict(gpu="a100", gemv="inductor")
    t_bf16 = fxshape.cost.gemv.predict_gemv(1, 4096, 4096, gpu="a100", layout="nt").time_s
    t8 = predict_quantized(1, 4096, 4096, quantization_of("int8"), **kw).prediction.time_s
    t4 = predict_quantized(1, 4096, 4096, quantization_of("int4"), **kw).prediction.time_s
    assert t4 < t8 < t_bf16


def test_int8_weight_only_without_inductor_converts_the_weight_first():
    # eager (or M > 1): W.to(bf16) is its own kernel (read 1 byte, write 2 per element),
    # then the bf16 GEMM: two kernels, slower than the bf16 GEMM alone
    q = quantization_of("int8")
    got = predict_quantized(64, 4096, 4096, q, gpu="h100")
    plain = predict_matmul(64, 4096, 4096, gpu="h100", layout="nt")
    assert got.kernels == 2 and got.prediction.time_s > plain.time_s
    # at least the conversion's bytes on top, at the datasheet bandwidth
    assert got.prediction.time_s - plain.time_s > 4096 * 4096 * 3 / 3.35e12


def test_tinygemm_dequantizes_again_for_every_16_rows():
    # tinygemm's m16n8k16 blocks: 64 rows dequantize the weight four times over 16 rows;
    # the dequantization is bound by arithmetic there, so the time grows with the blocks
    q = quantization_of("int4", 128)
    t16 = predict_quantized(16, 8192, 8192, q, gpu="a100").prediction
    t64 = predict_quantized(64, 8192, 8192, q, gpu="a100").prediction
    assert t64.compute_time_s == pytest.approx(4 * t16.compute_time_s, rel=1e-12)
    assert t64.time_s > 2 * t16.time_s


def test_fp8_never_slower_than_bf16_for_an_aligned_compute_bound_gemm_on_hopper():
    for m, n, k in ((4096, 4096, 4096), (8192, 14336, 4096), (16384, 8192, 8192)):
        bf16 = predict_matmul(m, n, k, gpu="h100", layout="nt").time_s
        for act in ("dynamic", "static"):
            fp8 = predict_quantized(m, n, k, quantization_of("fp8", activations=act),
                                    gpu="h100").prediction.time_s
            assert fp8 < bf16, (m, n, k, act)
    # static scales save the quantization kernel dynamic ones launch
    dyn = predict_quantized(4096, 4096, 4096, quantization_of("fp8"), gpu="h100")
    sta = predict_quantized(4096, 4096, 4096, quantization_of("fp8", activations="static"),
                            gpu="h100")
    assert (dyn.kernels, sta.kernels) == (2, 1)
    assert sta.prediction.time_s < dyn.prediction.time_s


def test_fp8_alignment_rule():
    assert fp8_eligible(4096, 4096) and not fp8_eligible(4096, 4100)
    assert not fp8_eligible(50257, 768)
    with pytest.raises(ValueError, match="multiples of 16"):
        predict_quantized(8, 50257, 768, quantization_of("fp8"), gpu="h100")


def test_analyze_decode_quantized(tiny):
    kw = dict(mode="decode", context_len=64, batch_size=1, gpu="h100", provenance=None)
    plain = fxshape.analyze(tiny, **kw)
    q4 = fxshape.analyze(tiny, quantize="int4", group_size=32, **kw)
    linears = [r for r in q4.rows if r.op == "linear"]
    # q, k, v, o, gate, up, down per layer and the LM head (untied): all quantized
    assert len(linears) == 2 * 7 + 1 and all(r.quant == "int4:g32" for r in linears)
    assert q4.step.time_s < plain.step.time_s
    # the weights shrink by what packing saves: hidden 256, intermediate 512, 2 KV heads
    # of 32 (k, v: 256 -> 64), vocab 1000; per layer q 256x256, k 256x64, v 256x64,
    # o 256x256, gate and up 256x512, down 512x256; bf16 2 bytes, int4 0.5 + 4 / 32
    per_layer = 256 * 256 * 2 + 256 * 64 * 2 + 256 * 512 * 3
    elements = 2 * per_layer + 256 * 1000
    saved = elements * 2 - (elements // 2 + elements // 32 * 4)
    assert plain.memory.parameters - q4.memory.parameters == saved
    assert q4.workload.quantize == "int4 weight-only (group 32)"
    (opt,) = [o for o in q4.options if o.name == "quantize"]
    assert opt.applied and "15 linear-layer GEMMs" in opt.effect
    d = json.loads(q4.to_json())
    assert d["workload"]["quantize"] and d["rows"][0]["quant"] == "int4:g32"
    # an unquantized report's JSON has neither key (bf16 exports unchanged)
    p = json.loads(plain.to_json())
    assert "quantize" not in p["workload"] and all("quant" not in r for r in p["rows"])


def test_fp8_keeps_the_head_and_misaligned_layers_in_bf16_and_says_why():
    # intermediate 520: gate/up N = 520 and down K = 520 are not multiples of 16
    m = tiny_llama(intermediate_size=520)
    r = fxshape.analyze(m, mode="decode", context_len=64, gpu="h100", provenance=None,
                        quantize="fp8")
    by = {row.module.split(".")[-1]: row for row in r.rows if row.op == "linear"}
    assert by["q_proj"].quant == "fp8:dynamic" and by["q_proj"].kernels == 2
    assert by["q_proj"].dtype == "fp8"
    for name in ("gate_proj", "up_proj", "down_proj", "lm_head"):
        assert by[name].quant == "" and by[name].dtype == "bf16"
    notes = " ".join(r.notes)
    assert "lm_head" in notes and "unquantized" in notes
    assert "N=520" in notes and "multiples of 16" in notes
    # each quantization kernel counts as a launch of the step
    plain = fxshape.analyze(m, mode="decode", context_len=64, gpu="h100", provenance=None)
    assert r.step.kernels - plain.step.kernels == sum(1 for x in r.rows if x.quant)


def test_serve_and_the_serving_step_take_the_quantization(tiny):
    kw = dict(gpu="a100", prompt_len=8, output_len=4, fuse="qkv", gemv="inductor")
    plain = fxshape.serve(tiny, **kw)
    q8 = fxshape.serve(tiny, quantize="int8", **kw)
    assert q8.inter_token_latency_s < plain.inter_token_latency_s
    assert all(r.quant == "int8" for r in q8.decode.rows if r.op == "linear")
    # the serving step re-prices the quantized GEMMs at other token counts with their method
    step = fxshape.serving.BatchStep(q8.decode, fuse="qkv")
    base = fxshape.serving.BatchStep(plain.decode, fuse="qkv")
    assert step.body_s(1)[0] < base.body_s(1)[0]
    # at 64 tokens int8 without the reduction converts each weight first: slower, and one
    # conversion kernel more per quantized GEMM
    assert step.body_s(64)[0] > base.body_s(64)[0]
    assert step.body_s(64)[1] > base.body_s(64)[1]


@pytest.mark.parametrize("kwargs, match", [
    (dict(quantize="int3"), "unknown quantize 'int3'; accepted: fp8, int8, int4"),
    (dict(quantize="int4", group_size=48), "group_size=48; accepted for int4: 32, 64"),
    (dict(quantize="int8", group_size=32), "group_size is for quantize='int4'"),
    (dict(group_size=32), "give quantize= too"),
    (dict(quantize="fp8", gpu="a100"), "no FP8 tensor cores"),
    (dict(quantize="fp8", gpu="mi250x"), "no FP8 tensor cores"),
    (dict(quantize="int4", mode="train"), "mode 'train'"),
    (dict(quantize="int8", dtype="fp32"), "bf16 or fp16"),
    (dict(quantize=Quantization("int8", activations="static")), "activations= is for"),
])
def test_bad_input(tiny, kwargs, match):
    kw = dict(seq_len=8, provenance=None)
    kw.update(kwargs)
    with pytest.raises(ValueError, match=match):
        fxshape.analyze(tiny, **kw)


def test_a_group_size_that_does_not_divide_k_names_the_layer():
    # hidden 160: K = 160 is not a multiple of 128 (but of 32)
    m = tiny_llama(hidden_size=160, num_attention_heads=5, num_key_value_heads=1)
    with pytest.raises(ValueError, match=r"group_size=128 does not divide K=160 of "
                                         r".*; accepted: a group size of 32"):
        fxshape.analyze(m, seq_len=8, provenance=None, quantize="int4")


def test_cli_quantize(capsys, tiny, monkeypatch):
    from fxshape import cli

    with pytest.raises(SystemExit):
        cli.main(["analyze", "gpt2", "--quantize", "int5"])
    assert "invalid choice: 'int5'" in capsys.readouterr().err
    assert cli.main(["analyze", "gpt2", "--seq-len", "16", "--provenance", "none",
                     "--group-size", "32"]) == 2
    assert "give --quantize too" in capsys.readouterr().err


def test_the_published_quantized_rows_read():
    # bench/quantized_published.csv: every row measured and its quantization one fxshape
    # accepts (a blank quantize: the same engine unquantized)
    import csv
    import os

    path = os.path.join(os.path.dirname(__file__), "..", "bench", "quantized_published.csv")
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) >= 10 and all(float(r["measured"]) > 0 for r in rows)
    for r in rows:
        if r["quantize"]:
            q = quantization_of(r["quantize"], int(r["group_size"]) if r["group_size"] else None,
                                r["activations"] or None)
            assert q.method == r["quantize"]


def test_advise_prices_its_candidates_quantized_and_says_what_stays_in_bf16():
    # intermediate 520: gate, up and down cannot run in FP8 (520 is not a multiple of 16);
    # the advice is priced with FP8 layers (the option stated) and names those left out
    m = tiny_llama(intermediate_size=520)
    adv = fxshape.advise(m, mode="decode", gpu="h100", quantize="fp8", context_len=64,
                         batch_size=8)
    notes = " ".join(adv.notes)
    assert "option quantize=fp8:dynamic" in notes
    assert "left in bf16" in notes and "K=256, N=520" in notes and "multiples of 16" in notes
    plain = fxshape.advise(m, mode="decode", gpu="h100", context_len=64, batch_size=8)
    assert "left in bf16" not in " ".join(plain.notes)


def test_speculation_and_capacity_planning_take_the_quantization(tiny):
    kw = dict(prompt_len=8, output_len=4, gpu="h100", acceptance=0.6, k=2)
    plain = fxshape.speculate(tiny, **kw)
    q4 = fxshape.speculate(tiny, quantize="int4", group_size=32, **kw)
    # the target's layers are int4 (the draft's stay bf16): a cheaper plain step
    assert all(r.quant == "int4:g32" for r in q4.target_step.report.rows if r.op == "linear")
    assert all(not r.quant for r in q4.draft_step.report.rows)
    assert q4.plain_tpot_s < plain.plain_tpot_s
    cap = fxshape.plan_capacity(tiny, gpu="h100", prompt_len=8, output_len=4,
                                slo_itl="50ms", tp=(1,), num_requests=20, quantize="int8")
    base = fxshape.plan_capacity(tiny, gpu="h100", prompt_len=8, output_len=4,
                                 slo_itl="50ms", tp=(1,), num_requests=20)
    assert cap.options[0].itl_s != base.options[0].itl_s


def test_sweep_draws_the_quantized_sawtooth():
    # int4 with groups of 128 packs K = 256 but not K = 320: that point says why, the others
    # are priced quantized; the notes name what the model keeps in bf16 (its tied head)
    cfg = transformers.GPT2Config(n_layer=1, n_head=4, n_embd=256, vocab_size=1000)
    pts = fxshape.sweep(cfg, "n_embd", [256, 320], quantize="int4", seq_len=32, gpu="a100")
    assert pts[0].time_s is not None
    assert pts[1].time_s is None and "does not divide K=320" in pts[1].note
    assert any("left in bf16" in n and "tied" in n for n in pts.notes)
    with pytest.raises(ValueError, match="give mode='train'"):
        fxshape.sweep(cfg, "n_embd", [256], float8="tensorwise")
