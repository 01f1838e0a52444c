"""Issue 20: the kernel class each alignment leaves, and what it costs.

Expectations are derived by hand (byte arithmetic in the comments) or are properties of the
model; none restates the cost formula.
"""

import dataclasses
import math
import os

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from fxshape import get_gpu, predict_matmul
from fxshape.cost.gemm import (LOAD_CLASSES, load_class, load_instructions_per_byte, model_params,
                               operand_alignment)
from fxshape.fit.calibration import calibration_dir

# ---------------------------------------------------------------------------------------
# Which operand's leading dimension is which, by layout (worked by hand)
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("m,n,k,dtype,layout,expected", [
    # nt (F.linear): A is M x K (leading K), B stored N x K (leading K), C is M x N (leading N).
    # K = 51201 is odd: 51201 * 2 B = 102402 B, divisible by 2 only -> A and B 2-byte aligned;
    # N = 14336 = 2^11 * 7: 28672 B, capped at 16.
    (8192, 14336, 51201, "fp16", "nt", (2, 2, 16)),
    # the same with N odd instead: only C is 2-byte aligned (A and B are fine)
    (8192, 14337, 51200, "fp16", "nt", (16, 16, 2)),
    # K = 51202 = 2 * 25601: 102404 B = 4 * 25601 -> 4-byte aligned
    (8192, 14336, 51202, "fp16", "nt", (4, 4, 16)),
    # K = 51204 = 4 * 12801: 102408 B -> 8-byte aligned
    (8192, 14336, 51204, "bf16", "nt", (8, 8, 16)),
    # nn (torch.mm): A M x K (leading K), B K x N (leading N), C leading N. N odd hits B and C.
    (4096, 65, 4096, "fp16", "nn", (16, 2, 2)),
    # tn: A stored K x M (leading M), B K x N (leading N). An odd M hits A only.
    (4097, 4096, 4096, "fp16", "tn", (2, 16, 16)),
    # fp8 (1 byte) writes a 2-byte output: N = 4100 = 4 * 1025 -> C is 8200 = 8 * 1025 bytes
    (4096, 4100, 4096, "fp8", "nt", (16, 16, 8)),
    # ... and in nn B's leading dimension is N: 4100 bytes -> 4
    (4096, 4100, 4096, "fp8", "nn", (16, 4, 8)),
    # tf32 (4 bytes): an odd K is still 4-byte aligned
    (4096, 4096, 4095, "tf32", "nn", (4, 16, 16)),
])
def test_operand_alignment_by_hand(m, n, k, dtype, layout, expected):
    assert operand_alignment(m, n, k, dtype, layout) == expected


@pytest.mark.parametrize("m,n,k,dtype,layout,cls", [
    (8192, 14336, 51200, "fp16", "nt", 0),  # all 16-byte aligned
    (8192, 14336, 51208, "fp16", "nt", 0),  # K = 8 * 6401: 16 bytes exactly: still class 0
    (8192, 14336, 51202, "fp16", "nt", 1),  # 4 bytes
    (8192, 14336, 51204, "fp16", "nt", 1),  # 8 bytes: the same narrow class
    (8192, 14336, 51201, "fp16", "nt", 2),  # 2 bytes: no cp.async of that size
    (8192, 14337, 51200, "fp16", "nt", 2),  # odd N: C decides (one alignment per kernel)
    (4097, 4096, 4096, "fp16", "nn", 0),    # M is no operand's leading dimension in nn
    (4097, 4096, 4096, "fp16", "tn", 2),    # ... but A's in tn
    (4096, 4098, 4096, "fp8", "nn", 2),     # fp8 nn: B's rows 4098 bytes -> 2 -> elements
    (4096, 4098, 4096, "fp8", "nt", 1),     # fp8 nt: only C (8196 bytes = 4 x 2049)
    (4096, 4095, 4096, "tf32", "nt", 1),    # tf32 odd: 4 bytes -> narrow
])
def test_load_class_by_hand(m, n, k, dtype, layout, cls):
    assert load_class(m, n, k, dtype, layout) == cls
    assert LOAD_CLASSES[cls]


def test_operand_alignment_rejects_bad_input():
    with pytest.raises(ValueError, match="layout"):
        operand_alignment(4, 4, 4, "fp16", "xx")
    with pytest.raises(ValueError, match="positive"):
        operand_alignment(0, 4, 4, "fp16", "nn")
    with pytest.raises(ValueError):
        operand_alignment(4, 4, 4, "int3", "nn")


def test_load_instructions_per_byte_by_hand():
    from fxshape.cost.gemm import _SCALAR

    # a warp of 32 threads: 16 bytes each -> 512 bytes per instruction; 4 bytes -> 128;
    # element loads of 2 bytes -> 64 bytes per load, plus one shared-memory store each
    assert load_instructions_per_byte(_SCALAR, 0, 2) == pytest.approx(1 / 512)
    assert load_instructions_per_byte(_SCALAR, 1, 2) == pytest.approx(1 / 128)
    assert load_instructions_per_byte(_SCALAR, 2, 2) == pytest.approx(2 / 64)
    assert load_instructions_per_byte(_SCALAR, 2, 1) == pytest.approx(2 / 32)  # fp8


# ---------------------------------------------------------------------------------------
# Properties
# ---------------------------------------------------------------------------------------

_TC = [("a100", "fp16"), ("a100", "bf16"), ("a100", "tf32"), ("h100", "fp8"),
       ("h100", "bf16"), ("v100", "fp16"), ("mi250x", "fp16"), ("l4", "fp8")]


@settings(max_examples=300, deadline=None)
@given(m=st.integers(1, 9000), n=st.integers(1, 9000), k=st.integers(1, 9000),
       gpu_dtype=st.sampled_from(_TC), layout=st.sampled_from(["nn", "nt", "tn", "tt"]),
       dim=st.sampled_from("mnk"), batch=st.sampled_from([1, 3]))
def test_never_faster_than_the_next_16_byte_aligned_size(m, n, k, gpu_dtype, layout, dim,
                                                          batch):
    gpu, dtype = gpu_dtype
    per = 16 // {"fp16": 2, "bf16": 2, "tf32": 4, "fp8": 1}[dtype]  # elements in 16 bytes
    shape = dict(m=m, n=n, k=k)
    up = dict(shape)
    up[dim] = -(-shape[dim] // per) * per
    if dtype == "fp8" and dim == "n":
        # fp8 writes 2-byte outputs: rounding N up to 16 elements can add a 16-byte granule
        # of output per row (N = 1..8 -> 16), which a GEMM bound by writing its output pays;
        # compare only sizes whose output moves the same number of granules
        assume(-(-shape[dim] // 8) == up[dim] // 8)
    t0 = predict_matmul(**shape, batch=batch, dtype=dtype, gpu=gpu, layout=layout).time_s
    t1 = predict_matmul(**up, batch=batch, dtype=dtype, gpu=gpu, layout=layout).time_s
    assert t1 <= t0


def test_class_order_on_the_vocabulary_sweep_shape():
    # The co-design paper's K sweep shape (A100, nt): odd < 2- and 4-aligned < 8-aligned in
    # throughput, and 2- and 4-aligned (one kernel class) within 2% of each other.
    def tf(k):
        return predict_matmul(8192, 14336, k, dtype="fp16", gpu="a100", layout="nt").tflops

    odd, two, four, eight, big = tf(51201), tf(51202), tf(51204), tf(51208), tf(51200)
    assert odd < two and odd < four < eight <= big
    assert abs(two / four - 1) < 0.03


def test_odd_n_and_odd_k_cost_the_same_for_the_same_reason():
    # nt: an odd K makes A and B 2-byte aligned, an odd N only C. Either way the kernel is an
    # element-load one, so both run at about the same rate (the held-out N sweep measured 71.6
    # TFLOP/s, the K sweep 74.1); K also pays sector replays, so it can be a little slower.
    k_odd = predict_matmul(8192, 14336, 51201, dtype="fp16", gpu="a100", layout="nt")
    n_odd = predict_matmul(8192, 14337, 51200, dtype="fp16", gpu="a100", layout="nt")
    assert n_odd.tflops == pytest.approx(k_odd.tflops, rel=0.1)
    aligned = predict_matmul(8192, 14336, 51200, dtype="fp16", gpu="a100", layout="nt")
    assert n_odd.tflops < 0.5 * aligned.tflops


@pytest.mark.parametrize("d,slow", [(64, False), (80, False), (96, False), (65, True),
                                    (129, True), (66, True)])
def test_attention_bmm_with_odd_head_dim(d, slow):
    # Unfused attention at b * heads = 4 * 32, s = 2048: scores = Q @ K^T (nt, K = d) and
    # out = P @ V (nn, N = d). head_dim 80 = 160 bytes and 96 = 192 bytes are 16-byte
    # aligned; 65 and 129 are odd (2 bytes), 66 = 132 bytes is 4-byte aligned.
    def per_flop(dd, lay, mnk):
        p = predict_matmul(*mnk(dd), batch=128, dtype="fp16", gpu="a100", layout=lay)
        return p.time_s / p.flops

    for lay, mnk in (("nt", lambda dd: (2048, 2048, dd)), ("nn", lambda dd: (2048, dd, 2048))):
        # the aligned size up (a multiple of 8 elements) is the fair reference
        up = -(-d // 8) * 8
        ratio = per_flop(d, lay, mnk) / per_flop(up, lay, mnk)
        if slow:
            assert ratio > 1.2, (d, lay, ratio)
        else:
            assert ratio == pytest.approx(1.0)


def test_ld_issue_constant_is_physical_and_simt_pays_none():
    # a few SM clocks per warp-level load instruction on every tensor-core GPU that has it,
    # 0 on the SIMT (fp32 sgemm) side, which has its own fitted model
    for gpu in ("a100-sxm4-40gb", "a100-sxm4-80gb", "h100-sxm", "a40", "v100-sxm2"):
        assert 0.5 < model_params(gpu).ld_issue_clk < 32
    for gpu in ("a100-pcie-40gb", "t4", "p4"):
        assert model_params(gpu, simt=True).ld_issue_clk == 0.0


def test_fp32_simt_ignores_alignment():
    # sgemm loads 4-byte elements whatever the leading dimension: the odd size is never
    # charged a class penalty (its time per FLOP is within tile quantization of the even one)
    a = predict_matmul(4096, 4095, 4096, dtype="fp32", gpu="a100")
    b = predict_matmul(4096, 4096, 4096, dtype="fp32", gpu="a100")
    assert a.time_s <= b.time_s


# ---------------------------------------------------------------------------------------
# The fit recovers the new constant from synthetic measurements
# ---------------------------------------------------------------------------------------

def test_fit_recovers_ld_issue_from_synthetic_sweep():
    pytest.importorskip("scipy")
    import numpy as np

    from fxshape.cost.gemm import predict_times_array
    from fxshape.fit.calibration import CalibrationRow
    from fxshape.fit.fitting import _START, _fit_one, _Problem

    spec = get_gpu("a100-sxm4-40gb")
    truth = dataclasses.replace(model_params(spec), ld_issue_clk=6.5)
    # a step-1 K sweep and an N sweep, as the calibration data has: every class present
    ks = np.arange(4096, 4160)
    ns = np.arange(2048, 2112)
    m = np.concatenate([np.full(len(ks), 4096), np.full(len(ns), 4096)])
    n = np.concatenate([np.full(len(ks), 4096), ns])
    k = np.concatenate([ks, np.full(len(ns), 4096)])
    b = np.ones_like(m)
    lay = np.array(["nt"] * len(m))
    t = predict_times_array(spec, "fp16", b, m, n, k, lay, truth)
    rows = [CalibrationRow("synthetic", "k" if i < len(ks) else "n", "a100", "linear", "nt",
                           "float16", 1, int(m[i]), int(n[i]), int(k[i]), float(t[i]),
                           "median-cuda-timer") for i in range(len(m))]
    fixed = {**_START, **{f: getattr(truth, f) for f in truth.STORED}}
    fixed["ld_issue_clk"] = 2.0  # a wrong start value
    params, _, loss = _fit_one(_Problem(rows, spec), ("ld_issue_clk",), fixed)
    assert params.ld_issue_clk == pytest.approx(6.5, rel=0.01)
    assert loss < 1e-3
    assert math.isfinite(loss)


# ---------------------------------------------------------------------------------------
# fp32 (SIMT sgemm) on GPUs without fp32 data: datapath and power-limited clock
# ---------------------------------------------------------------------------------------

def _hand_gpu(name, arch, sms, tdp, fp32):
    return dataclasses.replace(get_gpu("a100-pcie-40gb"), name=name, arch=arch,
                               sm_count=sms, tdp_w=tdp,
                               peaks=dataclasses.replace(get_gpu("a100-pcie-40gb").peaks,
                                                         fp32=fp32))


def test_sustained_fp32_peak_rule_on_a_gpu_written_by_hand():
    from fxshape.cost.simt import sustained_fp32_peak

    ref = _hand_gpu("ref", "ampere", 100, 250.0, 20.0)  # 2.5 W per SM
    # A 62.5 W card of 50 SMs: 1.25 W per SM, half the reference's: half its clock fraction
    # (power ~ clock at the voltage floor): 40 TFLOP/s on the datasheet -> 20.
    small = _hand_gpu("hand-small", "ada", 50, 62.5, 40.0)
    assert sustained_fp32_peak(small, ref) == pytest.approx(20e12, rel=1e-9)
    # its own constants (no reference, or itself): the datasheet figure
    assert sustained_fp32_peak(small) == pytest.approx(40e12)
    assert sustained_fp32_peak(small, small) == pytest.approx(40e12)
    # a card above 75 W is never scaled (the process, not the watts, decides there), nor one
    # with more power per SM than the reference, nor one without a board power
    big = _hand_gpu("hand-big", "hopper", 100, 700.0, 60.0)
    assert sustained_fp32_peak(big, ref) == pytest.approx(60e12)
    mid = _hand_gpu("hand-mid", "ampere", 100, 150.0, 20.0)  # 1.5 W/SM but 150 W
    assert sustained_fp32_peak(mid, ref) == pytest.approx(20e12)
    rich = _hand_gpu("hand-rich", "ampere", 20, 75.0, 5.0)  # 3.75 W/SM
    assert sustained_fp32_peak(rich, ref) == pytest.approx(5e12)
    unknown = _hand_gpu("hand-unknown", "ampere", 50, None, 10.0)
    assert sustained_fp32_peak(unknown, ref) == pytest.approx(10e12)


def test_sgemm_issue_rule_on_kernels_written_by_hand():
    from fxshape.cost.simt import SimtKernel, sgemm_issue_efficiency

    # 128 x 128 CTA of 256 threads: 64 outputs per thread (8 x 8). Per k step: 64 FFMAs,
    # 8 + 8 fragment floats = 4 LDS.128, and 10/8 loop instructions -> 64 / 69.25.
    k128 = SimtKernel("hand_128x128", 128, 128, 256)
    # 128 x 64 of 256 threads: 32 outputs; sqrt(32)/2 = 2.83 LDS.128 -> 32 / (32 + 4.08)
    k64 = SimtKernel("hand_128x64", 128, 64, 256)
    wide = _hand_gpu("hand-wide", "hopper", 100, 700.0, 2 * 100 * 128 * 2.0e9 / 1e12)
    wide = dataclasses.replace(wide, boost_clock_mhz=2000)  # 128 lanes per SM
    assert wide.fp32_lanes_per_sm == pytest.approx(128)
    assert sgemm_issue_efficiency(wide, k128) == pytest.approx(64 / (64 + 4 + 1.25))
    assert sgemm_issue_efficiency(wide, k64) == pytest.approx(
        32 / (32 + math.sqrt(32) / 2 + 1.25))
    # 64 lanes per SM (16 per partition): the datapath, not the issue, limits: no factor
    narrow = dataclasses.replace(wide, peaks=dataclasses.replace(wide.peaks,
                                                                 fp32=wide.peaks.fp32 / 2))
    assert sgemm_issue_efficiency(narrow, k128) == 1.0
    # Pascal partitions dual-issue (GP104 has 128 lanes per SM): no factor either
    assert sgemm_issue_efficiency(get_gpu("p4"), k128) == 1.0
    assert get_gpu("p4").fp32_lanes_per_sm > 120


def test_l4_sgemm_is_bounded_by_issue_and_power():
    # L4: 30.3 TFLOP/s fp32 on the datasheet (128 lanes per SM), 72 W for 58 SMs. It borrows
    # the A100-PCIe's fitted fp32 constants (250 W, 108 SMs). The clock it sustains:
    # (72/58) / (250/108) = 0.536 of the A100's fraction; the issue rule leaves the best
    # kernel (128 x 128, 8 x 8 per thread) 64 / 69.25 of the slots. No GEMM may beat
    # 30.3 * 0.536 * 0.924 = 15.0 TFLOP/s (the datasheet figure would allow 30.3).
    p = predict_matmul(8192, 8192, 8192, dtype="fp32", gpu="l4", layout="nt")
    bound = 30.3 * ((72 / 58) / (250 / 108)) * 64 / 69.25
    assert p.tflops <= bound
    assert p.tflops > 0.6 * bound  # and a large GEMM gets most of it
    assert p.peak_tflops == pytest.approx(30.3)  # efficiency stays relative to the datasheet
    # a GPU with its own fp32 fit is untouched by the power rule: T4 keeps its fitted clock
    from fxshape.cost.gemm import constants_source

    assert constants_source("t4", simt=True) == "t4"
    assert constants_source("l4", simt=True) == "a100-pcie-40gb"


# ---------------------------------------------------------------------------------------
# The shipped constants on the step-1 K sweep, by divisibility class
# ---------------------------------------------------------------------------------------

_K_SWEEP = os.path.join(calibration_dir(), "step1", "cookbook_vocab_k_sweep.csv")


@pytest.mark.needs_data(_K_SWEEP)
def test_k_sweep_classes_with_the_packaged_constants():
    import csv
    import json
    import statistics

    from fxshape.cost.gemm import resolve_params_path

    wall = json.load(open(resolve_params_path()))["measurement"]["a100-sxm4-40gb"]["mean-wall"]
    by = {}
    with open(_K_SWEEP) as f:
        for r in csv.DictReader(f):
            m, n, k = int(r["m"]), int(r["n"]), int(r["k"])
            p = predict_matmul(m, n, k, dtype="fp16", gpu="a100-sxm4-40gb", layout="nt")
            t = p.time_s * wall["slow_factor"] + wall["overhead_s"]  # as the fit compares
            cls = min(k & -k, 16)
            by.setdefault(cls, []).append(t / float(r["time_s"]) - 1)
    med = {c: statistics.median(abs(x) for x in v) for c, v in by.items()}
    # odd, 2- and 4-aligned within 8%, as issue 20 asks; the 8-aligned class is the known
    # miss (docs/model.md: ~10%), guarded at 12%
    assert med[1] < 0.08 and med[2] < 0.08 and med[4] < 0.08 and med[16] < 0.08, med
    assert med[8] < 0.12, med


def test_parameter_file_from_before_ld_issue_clk_is_refused_with_the_reason(tmp_path):
    import json

    entry = {f: 1.0 for f in model_params("h100").FIELDS if f != "ld_issue_clk"}
    entry["align_eff"] = 0.69  # what fxshape calibrate wrote before issue 20
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"gpus": {"h100-sxm": entry}}))
    with pytest.raises(ValueError, match="align_eff.*rerun fxshape calibrate"):
        predict_matmul(64, 64, 64, gpu="h100", params_path=str(path))
