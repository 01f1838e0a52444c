"""The decode attention model (fxshape/cost/decode_attention.py): FlashAttention-2's split
heuristic on the hand examples of its source, never faster than the cache's bytes at peak
bandwidth, GQA reading each KV head once, an fp8 cache half the bytes, the fit reproducible
from its script, bad input."""

import importlib.util
import math
import os

import pytest

from fxshape.cost.attention import AttentionShape, predict_attention
from fxshape.cost.decode_attention import (decode_attention_params, is_decode_shape,
                                           kv_block_tokens, num_splits, predict_decode)
from fxshape.hardware.gpus import get_gpu

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_split_heuristic_on_its_source_examples():
    # flash_api.cpp's comment: batch x heads = 48 on 108 SMs: 2 splits (efficiency 0.89) beat
    # 3 (0.67), and 2 is the fewest within 85% of the best
    assert num_splits(48, 108, 64) == 2
    # units that fill 80% of the slots: no split
    assert num_splits(87, 108, 64) == 1
    # 64 KV blocks: 11 and 12 splits both give 6 blocks a split, so 12 is not eligible;
    # 4 units on 132 slots: the best wave efficiency is 4s/132 -> 1 at s = 33 (132/4); the
    # fewest splits within 85% need 4s/132 >= 0.85 * 1 -> s >= 28.05, and among s = 29..32
    # the first with a new blocks-per-split count is s = 32 (64/32 = 2, 64/31 -> 3)
    assert num_splits(4, 132, 64) == 32
    # never more splits than KV blocks
    assert num_splits(1, 264, 3) <= 3


@pytest.mark.parametrize("b,h,hk,ctx,d", [(1, 32, 8, 4096, 128), (64, 64, 8, 512, 128),
                                          (256, 32, 32, 8192, 128), (1, 16, 1, 131072, 64),
                                          (7, 28, 4, 1000, 96)])
@pytest.mark.parametrize("gpu", ["h100", "a100", "b200", "l4"])
def test_never_below_the_bandwidth_limit(b, h, hk, ctx, d, gpu):
    p = predict_decode(b, h, hk, 1, ctx, d, gpu=gpu)
    # the cache's keys and values: 2 x batch x kv heads x context x head_dim x 2 bytes
    kv = 2 * b * hk * ctx * d * 2
    assert p.kv_bytes == kv
    assert p.time_s >= kv / (get_gpu(gpu).memory_bandwidth_gbs * 1e9)
    assert p.bandwidth_fraction <= 1.0


def test_large_batches_reach_the_fitted_efficiency():
    # 256 sequences x 8 KV heads fill the GPU many times over: the time tends to the bytes at
    # the fitted share of the bandwidth, the fixed cost a small part of it
    p = predict_decode(256, 32, 8, 1, 32768, 128, gpu="h100")
    eff = decode_attention_params().dram_efficiency
    assert p.splits == 1 and p.bound == "bandwidth"
    assert p.bandwidth_fraction == pytest.approx(eff, rel=0.05)


def test_gqa_reads_each_kv_head_once():
    # 32 query heads over 8 KV heads read what 8 heads of MHA read: the same bytes and time
    # (the 4 query heads of a group are 4 rows of one CTA, under the 64-row block)
    gqa = predict_decode(2, 32, 8, 1, 8192, 128, gpu="h100")
    mha8 = predict_decode(2, 8, 8, 1, 8192, 128, gpu="h100")
    mha32 = predict_decode(2, 32, 32, 1, 8192, 128, gpu="h100")
    assert gqa.kv_bytes == mha8.kv_bytes == mha32.kv_bytes // 4
    assert gqa.time_s == pytest.approx(mha8.time_s, rel=0.02)
    assert mha32.time_s > 2 * gqa.time_s


def test_fp8_cache_halves_the_bytes_and_time_grows_with_context_and_batch():
    bf16 = predict_decode(16, 32, 8, 1, 16384, 128, gpu="h100")
    fp8 = predict_decode(16, 32, 8, 1, 16384, 128, gpu="h100", kv_itemsize=1)
    assert fp8.kv_bytes * 2 == bf16.kv_bytes and fp8.time_s < bf16.time_s
    times = [predict_decode(b, 32, 8, 1, ctx, 128, gpu="h100").time_s
             for b, ctx in ((1, 1024), (1, 8192), (8, 8192), (64, 8192), (64, 32768))]
    assert times == sorted(times)


def test_attention_routes_decode_shapes_to_the_decode_path():
    assert is_decode_shape(1, 4096) and is_decode_shape(4, 4096)
    assert not is_decode_shape(512, 512) and not is_decode_shape(64, 4096)
    shape = AttentionShape(1, 32, 8, 1, 4096, 128, 128)
    pred = predict_attention(shape, gpu="h100", dtype="bf16")
    direct = predict_decode(1, 32, 8, 1, 4096, 128, gpu="h100")
    assert pred.time_s == direct.time_s and pred.kernels == direct.kernels
    assert pred.decode == direct and "decode path" in pred.note
    assert pred.tile == (64, kv_block_tokens(128)) == (64, 128)
    # a prefill shape keeps the prefill model
    assert predict_attention(AttentionShape(1, 32, 8, 512, 512, 128, 128),
                             gpu="h100").decode is None
    # the math path has no decode kernel
    assert predict_attention(shape, attention="math", gpu="h100").decode is None


def test_packaged_constants_are_the_fit_of_the_script():
    pytest.importorskip("scipy")
    spec = importlib.util.spec_from_file_location(
        "fit_decode_attention", os.path.join(ROOT, "bench", "fit_decode_attention.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    fitted = mod.fit(mod.rows())
    packaged = decode_attention_params()
    for k in packaged.FIELDS:
        got, want = getattr(fitted, k), getattr(packaged, k)
        assert math.isclose(got, want, rel_tol=1e-3, abs_tol=1e-12), k
    # the held-out rows are never in the fit
    rows = mod.rows()
    assert {r["split"] for r in rows} == {"fit", "heldout", "excluded"}
    assert {r["source"] for r in rows if r["split"] == "fit"}.isdisjoint(
        {r["source"] for r in rows if r["split"] == "heldout" and r["kernel"] != "flashinfer"})


def test_bad_input():
    with pytest.raises(ValueError, match="cannot share 3 KV heads"):
        predict_decode(1, 32, 3, 1, 128, 128)
    with pytest.raises(ValueError, match="context must be a positive integer"):
        predict_decode(1, 32, 8, 1, 0, 128)
    with pytest.raises(ValueError, match="page_size must be a positive integer or None"):
        predict_decode(1, 32, 8, 1, 128, 128, page_size=0)
    with pytest.raises(ValueError, match="page_size must be a positive integer or None"):
        predict_attention(AttentionShape(1, 32, 8, 1, 4096, 128, 128), page_size=-16)
    with pytest.raises(ValueError, match="unknown dtype|dtype"):
        predict_attention(AttentionShape(1, 32, 8, 1, 4096, 128, 128), kv_dtype="int3")
