"""Padding plans: the decisions (tests/test_rewrite.py applies them)."""

import pytest
import torch

from fxshape import analyze, plan_padding, predict_matmul
from fxshape.padding.plan import can_pad, padded_size

from models import MLP, NanoGPT


def test_padded_size_and_bad_multiples():
    assert padded_size(50257, 64) == 50304  # nanoGPT's padded vocabulary
    assert padded_size(50257, 8) == 50264
    assert padded_size(4096, 128) == 4096
    for bad in (0, -8, 12, 3, 1.5, True):
        with pytest.raises(ValueError, match="positive power of two"):
            padded_size(10, bad)
    with pytest.raises(ValueError, match="positive power of two"):
        plan_padding(analyze(MLP(), (torch.randn(8, 64),)), multiples=(8, 48))
    with pytest.raises(ValueError, match="min_gain"):
        plan_padding(analyze(MLP(), (torch.randn(8, 64),)), min_gain=-0.1)


def _nanogpt_report(gpu="a100", dtype="fp16"):
    with torch.device("meta"):
        model = NanoGPT(vocab_size=50257, n_layer=2, n_head=12, n_embd=768)
    return analyze(model, (torch.zeros(8, 256, dtype=torch.long),), gpu=gpu, dtype=dtype)


def test_gpt2_vocab_is_padded_with_its_predicted_gain():
    rep = _nanogpt_report()
    plan = plan_padding(rep)
    lm = [d for d in plan.decisions if d.module == "lm_head"][0]
    assert lm.pads and lm.pad_n % 8 == 0 and lm.pad_n >= 50257 and (lm.pad_m, lm.pad_k) == (
        lm.m, lm.k)
    # Checked against what it must exceed, not against its own arithmetic. Padding N makes
    # the output (M, pad_n): slicing it back to (M, 50257) reads M x pad_n and writes
    # M x 50257 fp16 values, which cannot take less than those bytes at the A100 80 GB's
    # datasheet 2039 GB/s (nor, at any sane efficiency, more than twice that).
    copy_floor = (lm.m * lm.pad_n + lm.m * 50257) * 2 / 2039e9
    assert copy_floor * (1 - 1e-9) <= lm.copy_time_s <= 2 * copy_floor
    # the padded GEMM as the public predictor sees it, plus that copy, is what is promised
    padded = predict_matmul(lm.pad_m, lm.pad_n, lm.pad_k, dtype="fp16", gpu="a100",
                            layout="nt").time_s
    unpadded = predict_matmul(lm.m, lm.n, lm.k, dtype="fp16", gpu="a100", layout="nt").time_s
    assert lm.time_s == pytest.approx(unpadded, rel=1e-9)  # the report's row is that GEMM
    assert lm.padded_time_s >= padded + copy_floor * (1 - 1e-9)
    # and it pays: at least 3% of the LM head's time (50257 = 2-byte aligned in fp16)
    assert lm.padded_time_s <= 0.97 * unpadded and lm.gain >= 0.03
    # the weight is padded once: (pad_n - 50257) x 768 more fp16 elements of memory
    assert lm.weight_extra_bytes == (lm.pad_n - 50257) * 768 * 2
    assert "lm_head" in str(plan) and "predicted GEMM time" in str(plan)
    assert plan.time_after_s < plan.time_before_s


def test_aligned_gemms_are_left_alone_and_attention_is_not_paddable():
    plan = plan_padding(_nanogpt_report())
    for d in plan.decisions:
        if d.module != "lm_head":
            assert not d.pads
        if d.op.startswith("sdpa"):
            assert not d.safe and "not a paddable op" in d.reason


def test_min_gain_and_filter_fn():
    rep = _nanogpt_report()
    assert not plan_padding(rep, min_gain=0.99).padded  # nothing saves 99%
    plan = plan_padding(rep, filter_fn=lambda row: row.module != "lm_head")
    lm = [d for d in plan.decisions if d.module == "lm_head"][0]
    assert not lm.pads and lm.reason == "excluded by filter_fn"


def test_plan_from_a_model_and_determinism():
    with torch.device("meta"):  # compute-bound sizes, no memory spent on them
        model = MLP(d_in=4096, d_hidden=4095, d_out=4096)  # odd hidden width
        x = torch.zeros(4096, 4096)
    a = plan_padding(model, (x,), gpu="a100", dtype="fp16")
    b = plan_padding(model, (x,), gpu="a100", dtype="fp16")
    assert a == b and str(a) == str(b)
    fc1 = [d for d in a.decisions if d.module == "fc1"][0]
    fc2 = [d for d in a.decisions if d.module == "fc2"][0]
    # fc1's N and fc2's K are the odd 4095: both should round up (to a multiple of 8 at least)
    assert fc1.pads and fc1.pad_n % 8 == 0
    assert fc2.pads and fc2.pad_k % 8 == 0


def test_symbolic_rows_are_not_padded():
    from torch.export import Dim

    from fxshape.analysis.annotate import annotate
    from fxshape.report.report import Report

    ep = torch.export.export(MLP(d_hidden=4095), (torch.randn(48, 64),),
                             dynamic_shapes={"x": {0: Dim("batch", min=2, max=8192)}})
    rows, _ = annotate(ep.module(), gpu="a100", dtype="fp16")
    plan = plan_padding(Report(rows=tuple(rows), unsupported=(), gpu="a100-sxm4-80gb",
                               dtype="fp16"))
    assert all(not d.pads and "symbolic" in d.reason for d in plan.decisions)
    ok, why = can_pad(rows[0])
    assert not ok and why == "symbolic sizes: left unpadded"
