"""Attention as today's libraries run it (issue 50): sliding windows, FlashInfer's
TensorRT-LLM kernels on datacenter Blackwell, what vLLM picks (``attention="vllm"``), the
per-kernel constants bench/fit_attention_aiconfigurator.py fits, and the fit reproducing
them."""

import dataclasses
import json
import os

import pytest

from fxshape.cost.attention import (AttentionShape, attention_params, kernel_params,
                                    predict_attention, predict_with, resolve_kernel)
from fxshape.cost.decode_attention import (DecodeAttentionParams, decode_attention_params,
                                           predict_decode)
from fxshape.cost.gemm import model_params
from fxshape.fit.calibration import calibration_dir
from fxshape.hardware.gpus import get_gpu


def test_a_sliding_window_keeps_its_band():
    # 8 queries over 8 keys, window 3: row i keeps min(i + 1, 3) keys = 1 + 2 + 3 x 6 = 21
    s = AttentionShape(1, 1, 1, 8, 8, 64, 64, causal=True, window=3)
    assert s.causal_fraction == pytest.approx(21 / 64)
    # forward FLOPs: 2 x 8 x 8 x (64 + 64) x 21/64 = 5376
    assert s.flops() == 5376
    # a window as long as the sequence is plain causal (the papers' 1/2)
    assert AttentionShape(1, 1, 1, 8, 8, 64, 64, causal=True, window=8).causal_fraction == 0.5
    # 4 queries over 10 keys (top-left aligned), window 2: rows keep 1, 2, 2, 2 = 7 of 40
    assert AttentionShape(1, 1, 1, 4, 10, 64, 64, causal=True,
                          window=2).causal_fraction == pytest.approx(7 / 40)


def test_bad_windows_are_refused():
    with pytest.raises(ValueError, match="window must be a non-negative integer"):
        AttentionShape(1, 1, 1, 8, 8, 64, 64, causal=True, window=-1)
    with pytest.raises(ValueError, match="needs causal=True"):
        AttentionShape(1, 1, 1, 8, 8, 64, 64, window=4)


@pytest.mark.parametrize("attention,gpu", [("flash", "h100"), ("fa3", "h100"),
                                           ("trtllm", "b200")])
def test_a_window_skips_the_blocks_outside_it(attention, gpu):
    full = AttentionShape(1, 16, 8, 16384, 16384, 128, 128, causal=True)
    band = dataclasses.replace(full, window=128)
    t_full = predict_attention(full, attention=attention, gpu=gpu).time_s
    t_band = predict_attention(band, attention=attention, gpu=gpu).time_s
    # 128 of ~8,192 keys a query: a fraction of the work, but never less than the loads
    assert t_band < t_full / 5
    wide = dataclasses.replace(full, window=16384)  # a window the length of the prompt
    assert predict_attention(wide, attention=attention, gpu=gpu).time_s == \
        pytest.approx(t_full)


def test_decode_under_a_window_reads_the_window():
    long = AttentionShape(8, 32, 8, 1, 65536, 128, 128, causal=True, window=128)
    short = AttentionShape(8, 32, 8, 1, 128, 128, 128, causal=True)
    for attention, gpu in (("fa3", "h100"), ("trtllm", "b200"), ("flash", "a100")):
        assert predict_attention(long, attention=attention, gpu=gpu).time_s == \
            predict_attention(short, attention=attention, gpu=gpu).time_s


def test_trtllm_runs_on_datacenter_blackwell_only():
    assert resolve_kernel("trtllm", "b200", "bf16", 128) == ("trtllm", "")
    assert resolve_kernel("trtllm", "gb300", "fp8", 64) == ("trtllm", "")
    for gpu in ("h100", "a100", "rtx-pro-6000-server"):  # sm120 has no tcgen05
        with pytest.raises(ValueError, match="datacenter Blackwell GPUs only "
                                             r"\(b200, b300, gb200, gb300\)"):
            resolve_kernel("trtllm", gpu, "bf16", 128)
    with pytest.raises(ValueError, match="fp16/bf16/fp8 and head_dim <= 512"):
        resolve_kernel("trtllm", "b200", "fp32", 128)
    s = AttentionShape(2, 8, 8, 512, 512, 128, 128, causal=True)
    with pytest.raises(ValueError, match="forward only"):
        predict_attention(s, direction="backward", attention="trtllm", gpu="b200")


def test_vllm_picks_the_kernel_vllm_runs():
    assert resolve_kernel("vllm", "h100", "bf16", 128) == ("fa3", "")
    assert resolve_kernel("vllm", "h200", "fp8", 64) == ("fa3", "")
    assert resolve_kernel("vllm", "b200", "bf16", 128) == ("trtllm", "")
    assert resolve_kernel("vllm", "a100", "bf16", 128) == ("fa2", "")
    assert resolve_kernel("vllm", "rtx-pro-6000-server", "bf16", 128) == ("fa2", "")
    # kernels the model does not have are priced as the nearest, and said so
    kernel, note = resolve_kernel("vllm", "b200", "bf16", 192)
    assert kernel == "trtllm" and "Triton" in note and "not validated" in note
    kernel, note = resolve_kernel("vllm", "h100", "bf16", 512)
    assert kernel == "fa3" and "FlashAttention-4" in note
    kernel, note = resolve_kernel("vllm", "mi300x", "bf16", 128)
    assert kernel == "fa2" and "ROCm" in note
    with pytest.raises(ValueError, match="compute capability 8.0"):
        resolve_kernel("vllm", "v100", "fp16", 128)
    with pytest.raises(ValueError, match="fp16/bf16/fp8"):
        resolve_kernel("vllm", "h100", "fp32", 128)


def test_todays_kernels_have_their_own_forward_constants():
    fa3, trt = kernel_params("fa3"), kernel_params("trtllm")
    assert fa3 is not None and trt is not None and "aiconfigurator" in fa3.source
    assert kernel_params("fa2") is None  # FA2 keeps the shared constants
    ap, spec = attention_params(), get_gpu("h100")
    s = AttentionShape(4, 32, 8, 4096, 4096, 128, 128, causal=True)
    now = predict_with(ap, s, "forward", "fa3", "bf16", spec).time_s
    shared = predict_with(ap, s, "forward", "fa3", "bf16", spec, kernels={}).time_s
    assert now != shared
    # the backward keeps the FA3 paper's fit: the kernels section does not touch it
    assert predict_with(ap, s, "backward", "fa3", "bf16", spec).time_s == \
        predict_with(ap, s, "backward", "fa3", "bf16", spec, kernels={}).time_s


def test_an_fp8_kv_cache_quantizes_the_queries_first():
    # prefill over an fp8 cache: the same kernel, plus a pass reading Q at 2 bytes and
    # writing it at 1, and its launch: 3 x (4 x 2048 x 32 x 128) bytes at the DRAM rate
    s = AttentionShape(4, 32, 8, 2048, 2048, 128, 128, causal=True)
    gp, spec = model_params("h100"), get_gpu("h100")
    base = predict_attention(s, attention="fa3", gpu="h100").time_s
    fp8 = predict_attention(s, attention="fa3", gpu="h100", kv_dtype="fp8").time_s
    q_bytes = 3 * 4 * 2048 * 32 * 128
    assert fp8 - base == pytest.approx(
        q_bytes / (spec.memory_bandwidth_gbs * 1e9 * gp.dram_eff) + gp.launch_s)


def test_blackwell_ultra_doubles_the_exponentials():
    # B300's SFUs run MUFU.EX2 at twice B200's rate: at head_dim 64 the softmax bounds the
    # tcgen05 kernel, so the same B300 with B200's 16 exponentials a clock is slower
    b300 = get_gpu("b300")
    assert b300.sfu_per_clk_per_sm == 32 and get_gpu("b200").sfu_per_clk_per_sm == 16
    s = AttentionShape(2, 32, 8, 8192, 8192, 64, 64, causal=True)
    half = dataclasses.replace(b300, sfu_per_clk_per_sm=16)
    assert predict_attention(s, attention="trtllm", gpu=b300).time_s < \
        predict_attention(s, attention="trtllm", gpu=half).time_s


def test_decode_kernels_have_their_own_constants(tmp_path):
    default = decode_attention_params()
    assert decode_attention_params(kernel="fa3") != default
    assert decode_attention_params(kernel="fa2") == default  # no entry: the default
    # the split cap: one sequence over 64k tokens on an H100 splits at most max_splits ways
    capped = dataclasses.replace(default, max_splits=16)
    p = predict_decode(1, 8, 1, 1, 65536, 128, gpu="h100", params=capped)
    assert p.splits <= 16
    assert predict_decode(1, 8, 1, 1, 65536, 128, gpu="h100", params=default).splits > 16
    # an entry that mangles a constant is refused with the file and the kernel named
    path = tmp_path / "dec.json"
    entry = {k: getattr(default, k) for k in DecodeAttentionParams.FIELDS}
    path.write_text(json.dumps({**entry, "kernels": {"fa3": {"fixed_s": 1e-6}}}))
    with pytest.raises(ValueError, match="kernel 'fa3'.*lacks or mangles"):
        decode_attention_params(str(path), kernel="fa3")


@pytest.mark.needs_data(os.path.join(calibration_dir(), "aiconfigurator"))
def test_fit_script_reproduces_the_h100_prefill_constants():
    # bench/fit_attention_aiconfigurator.py's prefill fit on the H100 (FA3) table, about
    # 15 s: the packaged entry is what it fits; a quarter of the layer shapes (heads, KV
    # heads, head_dim) is held out and none of them is fitted
    pytest.importorskip("scipy")
    import fit_attention_aiconfigurator as f

    rows = f.main_rows(f.read_table("h100-sxm", "h100_sxm", "prefill"), "prefill",
                       "vllm_flash_attn_fa3")
    train = [r for r in rows if not r.held_out]
    held = [r for r in rows if r.held_out]
    assert {r.layer for r in train}.isdisjoint({r.layer for r in held})
    assert 0.15 < len(held) / len(rows) < 0.35
    fitted = f.fit_prefill(train, "fa3")
    packaged = kernel_params("fa3")
    assert dataclasses.astuple(fitted) == dataclasses.astuple(packaged)


def test_the_2024_generation_prices_the_kernels_as_they_were():
    # params="2024" (the GEMM constants of 2022-2024) also drops today's per-kernel attention
    # constants: FA3's forward from the FA3 paper's fit, its decode from FlashAttention-2's
    import fxshape

    s = AttentionShape(4, 32, 8, 4096, 4096, 128, 128, causal=True)
    d = AttentionShape(16, 32, 8, 1, 4096, 128, 128, causal=True)
    now = predict_attention(s, attention="fa3", gpu="h100").time_s
    now_d = predict_attention(d, attention="fa3", gpu="h100").time_s
    with fxshape.use_params("2024"):
        old = predict_attention(s, attention="fa3", gpu="h100").time_s
        old_d = predict_attention(d, attention="fa3", gpu="h100").time_s
        shared = predict_with(attention_params(), s, "forward", "fa3", "bf16",
                              get_gpu("h100"), kernels={}).time_s
    assert old != now and old == shared
    assert old_d != now_d
