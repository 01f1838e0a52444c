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


@pytest.fixture(scope="module")
def wide():
    # int4 pays where reading the weights bounds the step: a 2048 x 8192 bf16 weight is 32
    # MiB, about 10 us at an H100's 3.35 TB/s, int4 a quarter of it. The 256-wide tiny
    # model's GEMMs are launch-bound (about 2 us each as a graph replays them, bf16 or int4)
    return tiny_llama(hidden_size=2048, intermediate_size=8192, vocab_size=32000)


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
    # static scales save the quantization kernels dynamic ones launch: on the H100 vLLM's
    # dynamic per-tensor scale is 3 (zero the scale, reduce the maximum, cast); on a GPU
    # without fitted kernels (L40S) one generic per-token kernel
    dyn = predict_quantized(4096, 4096, 4096, quantization_of("fp8"), gpu="h100")
    sta = predict_quantized(4096, 4096, 4096, quantization_of("fp8", activations="static"),
                            gpu="h100")
    assert (dyn.kernels, sta.kernels) == (1 + 3, 1)
    assert sta.prediction.time_s < dyn.prediction.time_s
    ada = predict_quantized(4096, 4096, 4096, quantization_of("fp8"), gpu="l40s")
    assert ada.kernels == 2


def test_fp8_alignment_rule():
    assert fp8_eligible(4096, 4096) and not fp8_eligible(4096, 4100)
    assert not fp8_eligible(50257, 768)
    with pytest.raises(ValueError, match="multiples of 16"):
        predict_quantized(8, 50257, 768, quantization_of("fp8"), gpu="h100")


def test_analyze_decode_quantized(tiny, wide):
    kw = dict(mode="decode", context_len=64, batch_size=1, gpu="h100", provenance=None)
    plain = fxshape.analyze(tiny, **kw)
    q4 = fxshape.analyze(tiny, quantize="int4", group_size=32, **kw)
    linears = [r for r in q4.rows if r.op == "linear"]
    # q, k, v, o, gate, up, down per layer and the LM head (untied): all quantized
    assert len(linears) == 2 * 7 + 1 and all(r.quant == "int4:g32" for r in linears)
    wide_plain = fxshape.analyze(wide, **kw)
    wide_q4 = fxshape.analyze(wide, quantize="int4", group_size=32, **kw)
    assert wide_q4.step.time_s < wide_plain.step.time_s
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
    # the GEMM and vLLM's dynamic per-tensor quantization (3 kernels) on the H100
    assert by["q_proj"].quant == "fp8:dynamic" and by["q_proj"].kernels == 1 + 3
    assert by["q_proj"].dtype == "fp8"
    for name in ("gate_proj", "up_proj", "down_proj", "lm_head"):
        assert by[name].quant == "" and by[name].dtype == "bf16"
    notes = " ".join(r.notes)
    assert "lm_head" in notes and "unquantized" in notes
    assert "N=520" in notes and "multiples of 16" in notes
    # each quantization kernel counts as a launch of the step: 3 per quantized GEMM
    plain = fxshape.analyze(m, mode="decode", context_len=64, gpu="h100", provenance=None)
    assert r.step.kernels - plain.step.kernels == 3 * sum(1 for x in r.rows if x.quant)


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


def test_speculation_and_capacity_planning_take_the_quantization(tiny, wide):
    kw = dict(prompt_len=8, output_len=4, gpu="h100", acceptance=0.6, k=2)
    plain = fxshape.speculate(wide, **kw)
    q4 = fxshape.speculate(wide, quantize="int4", group_size=32, **kw)
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


# --- Blackwell's block formats (nvfp4, mxfp8) ---------------------------------------------

def test_packed_block_format_bytes_by_hand():
    from fxshape.cost.quant import block_scale_bytes

    nv, mx = quantization_of("nvfp4"), quantization_of("mxfp8")
    # 4096 x 4096 nvfp4: two e2m1 a byte = 8,388,608; an e4m3 scale per 16 elements of K:
    # 4096 rows x 256 scales = 1,048,576 (both already whole 128 x 4 tiles); a float scale
    # for the tensor: 4
    assert packed_weight_bytes(4096, 4096, nv) == 8_388_608 + 1_048_576 + 4
    # mxfp8: a byte an element, an e8m0 scale per 32: 4096 x 128 = 524,288
    assert packed_weight_bytes(4096, 4096, mx) == 16_777_216 + 524_288 + 4
    # the swizzled layout pads rows to 128 and scale columns to 4: 1056 rows -> 1152
    # (9 x 128); K = 96 has 6 blocks of 16 -> 8 columns: 1152 x 8 = 9,216
    assert block_scale_bytes(1056, 96, "nvfp4") == 9_216
    # 64 rows pad to 128; K = 256: 16 blocks, already a multiple of 4: 128 x 16 = 2,048
    assert block_scale_bytes(64, 256, "nvfp4") == 2_048
    with pytest.raises(ValueError, match="not a multiple"):
        packed_weight_bytes(4104, 4096, mx)  # 4104 = 32 x 128 + 8


def test_block_formats_are_blackwell_only_and_two_kernels():
    from fxshape.cost.quant import block_eligible

    q = quantization_of("nvfp4")
    got = predict_quantized(4096, 6144, 4096, q, gpu="b200")
    # the activation's quantization kernel, then the block-scaled GEMM
    assert got.kernels == 2 and got.prediction.dtype == "nvfp4"
    assert got.prediction.peak_tflops == 9000.0  # B200's dense FP4: HGX B200 144 PF / 8 / 2
    for gpu in ("h100", "a100", "mi300x"):
        with pytest.raises(ValueError, match="needs Blackwell"):
            predict_quantized(4096, 6144, 4096, q, gpu=gpu)
    # K and N multiples of 32: 4112 = 16 x 257 is FP8-aligned but not NVFP4-aligned
    assert fp8_eligible(4112, 4096) and not block_eligible(4112, 4096, "nvfp4")
    with pytest.raises(ValueError, match="multiples of 32"):
        predict_quantized(64, 4112, 4096, q, gpu="b200")


def test_block_formats_order_on_a_large_aligned_gemm_on_blackwell():
    # compute-bound: FP4 tensor cores run twice FP8's, FP8 twice bf16's (B200 datasheet);
    # the quantization kernel costs less than what each step saves
    m, n, k = 16384, 8192, 8192
    bf16 = predict_matmul(m, n, k, gpu="b200", layout="nt").time_s
    mx = predict_quantized(m, n, k, quantization_of("mxfp8"), gpu="b200").prediction.time_s
    nv = predict_quantized(m, n, k, quantization_of("nvfp4"), gpu="b200").prediction.time_s
    assert nv < mx < bf16
    # batch-1 decode streams the weight: nvfp4's ~0.56 bytes an element against bf16's 2
    bf16_1 = fxshape.cost.gemv.predict_gemv(1, n, k, gpu="b200", layout="nt").time_s
    nv_1 = predict_quantized(1, n, k, quantization_of("nvfp4"), gpu="b200").prediction.time_s
    assert nv_1 < bf16_1


def test_analyze_nvfp4_memory_and_the_layers_it_keeps(tiny):
    kw = dict(mode="decode", context_len=64, gpu="b200", provenance=None)
    plain = fxshape.analyze(tiny, **kw)
    nv = fxshape.analyze(tiny, quantize="nvfp4", **kw)
    linears = [r for r in nv.rows if r.op == "linear"]
    assert [r.module for r in linears if not r.quant] == ["lm_head"]  # ModelOpt's rule
    assert all(r.quant == "nvfp4" and r.kernels == 2 for r in linears if r.module != "lm_head")
    # packed bytes (values + 128 x 4 padded scales + 4) per layer, hidden 256, 2 KV heads of
    # 32, intermediate 512: q, o 256x256: 32,768 + 256 x 16 + 4 = 36,868; k, v N = 64:
    # 8,192 + 128 x 16 + 4 = 10,244; gate, up 256x512: 65,536 + 512 x 16 + 4 = 73,732;
    # down K = 512, N = 256: 65,536 + 256 x 32 + 4 = 73,732; in bf16 the same layers are
    # 2 x 557,056 = 1,114,112 bytes
    packed = 2 * 36_868 + 2 * 10_244 + 3 * 73_732
    assert plain.memory.parameters - nv.memory.parameters == 2 * (1_114_112 - packed)
    assert "ModelOpt" in " ".join(nv.notes)


def test_a_misaligned_layer_stays_in_bf16_in_every_layer_of_the_stack():
    # intermediate 528 = 16 x 33: FP8 takes it, the block formats do not; the layers priced
    # once and copied are named too (both layers), however often the capture was reused
    m = tiny_llama(intermediate_size=528)
    for _ in range(2):
        r = fxshape.analyze(m, mode="decode", context_len=64, gpu="b200", provenance=None,
                            quantize="mxfp8")
        notes = [n for n in r.notes if "N=528" in n]
        assert len(notes) == 1 and "multiples of 32" in notes[0]
        assert "layers.0.mlp.gate_proj" in notes[0] and "layers.1.mlp.up_proj" in notes[0]
        kept = {x.module for x in r.rows if x.op == "linear" and not x.quant}
        assert {"model.layers.1.mlp.down_proj", "lm_head"} <= kept
    f8 = fxshape.analyze(m, mode="decode", context_len=64, gpu="b200", provenance=None,
                         quantize="fp8")
    assert all(x.quant for x in f8.rows if x.op == "linear" and x.module != "lm_head")


@pytest.mark.parametrize("kwargs, match", [
    (dict(quantize="nvfp4", gpu="h100"), "h100-sxm has no block-scaled tensor cores: "
                                         "quantize='nvfp4' needs Blackwell"),
    (dict(quantize="mxfp8", gpu="a100"), "accepted here: 'int8', 'int4'$"),
    (dict(quantize=Quantization("nvfp4", activations="static"), gpu="b200"),
     "'nvfp4' quantizes activations per block"),
    (dict(quantize="nvfp4", group_size=16, gpu="b200"), "group_size is for quantize='int4'"),
])
def test_block_format_bad_input(tiny, kwargs, match):
    with pytest.raises(ValueError, match=match):
        fxshape.analyze(tiny, seq_len=8, provenance=None, **kwargs)


# --- KV-cache formats (int8, nvfp4) --------------------------------------------------------

def test_kv_cache_formats_bytes_by_hand_and_their_attention(tiny):
    # tiny Llama: 2 layers, 2 KV heads of 32: K and V hold 2 x 2 x 64 = 256 elements a token
    # bf16 2 bytes -> 512; int8 and fp8 1 -> 256; nvfp4 0.5 + an e4m3 scale per 16 -> 144
    kw = dict(mode="decode", context_len=512, batch_size=32, gpu="b200", provenance=None)
    got = {kv: fxshape.analyze(tiny, kv_dtype=kv, **kw) for kv in (None, "fp8", "int8", "fp4")}
    per_token = {kv: r.capacity.kv_bytes_per_token for kv, r in got.items()}
    assert per_token == {None: 512, "fp8": 256, "int8": 256, "fp4": 144}
    assert got["fp4"].memory.kv_cache == 32 * 512 * 144
    assert got["fp4"].workload.kv_dtype == "nvfp4" and got["int8"].workload.kv_dtype == "int8"

    def attn(r):
        return sum(x.time_s for x in r.rows if x.kernel)

    # the decode kernels stream the cache: fewer bytes, less time; int8 reads what fp8 does
    assert attn(got["fp4"]) < attn(got["int8"]) == attn(got["fp8"]) < attn(got[None])
    assert "an nvfp4 KV cache" in " ".join(got["fp4"].step.notes)


@pytest.mark.parametrize("kv, gpu, match", [
    ("nvfp4", "h100", "kv_dtype='nvfp4' needs Blackwell"),
    ("int4", "h100", "unknown kv_dtype 'int4'; accepted: .*'int8' or 'nvfp4'"),
])
def test_kv_cache_format_bad_input(tiny, kv, gpu, match):
    with pytest.raises(ValueError, match=match):
        fxshape.analyze(tiny, mode="decode", context_len=64, gpu=gpu, kv_dtype=kv,
                        provenance=None)


def test_the_published_block_format_rows_read_and_are_predicted(capsys):
    # bench/block_formats_published.csv: B200 kernel benchmarks (held out, nothing fitted);
    # each row's kernel is one the script prices, and the script runs end to end
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
    import validate_block_formats as v

    rows = v.rows()
    assert len(rows) >= 50 and all(float(r["measured"]) > 0 for r in rows)
    assert {r["unit"] for r in rows} <= {"tflops", "us"} and all(r["url"] for r in rows)
    assert v.main(["--format", "github"]) == 0
    out = capsys.readouterr().out
    # docs/quantization.md shows the summary table as the script prints it (cells compared
    # with their padding stripped)
    def cells(line):
        return tuple(c.strip() for c in line.strip().strip("|").split("|"))

    summary = [cells(x) for x in out.strip().split("\n\n")[-1].splitlines()[2:]]
    with open(os.path.join(os.path.dirname(__file__), "..", "docs", "quantization.md")) as f:
        doc = {cells(x) for x in f if x.startswith("| ")}
    assert len(summary) == 10 and all(row in doc for row in summary)


def test_a_sweep_point_says_which_layers_its_value_keeps_out_of_the_format():
    # intermediate 512 = 16 x 32 packs in NVFP4; 528 = 16 x 33 does not (gate, up, down
    # stay in bf16): that point says so, the other has no note (the LM head, kept at every
    # value, is in the sweep's notes)
    cfg = tiny_llama().config
    pts = fxshape.sweep(cfg, "intermediate_size", [512, 528], quantize="nvfp4", seq_len=32,
                        gpu="b200")
    assert pts[0].note == "" and pts[0].time_s is not None
    assert "left in bf16" in pts[1].note and "N=528" in pts[1].note
    assert any("lm_head" in n for n in pts.notes)
