"""Quantized linear layers on the kernels vLLM 0.24 runs (issue 50): vLLM's CUTLASS FP8
dispatch, the constants bench/fit_quant_aiconfigurator.py fits (and its reproducing them),
which GPUs take them, and the scalar and vectorized pricing agreeing."""

import json
import os

import numpy as np
import pytest

import fxshape
from fxshape.cost.gemm import model_params, predict_matmul
from fxshape.cost.quant import (Quantization, block_scale_bytes, predict_quantized,
                                predict_quantized_times, quantization_of)
from fxshape.cost.quant_kernels import (GEMM_FIELDS, activation_quant_bytes,
                                        quant_kernel_params, quant_kernel_source,
                                        vllm_fp8_tile)
from fxshape.fit.calibration import calibration_dir
from fxshape.hardware.gpus import get_gpu

_DATA = os.path.join(os.path.dirname(__file__), "..", "fxshape", "data", "quant_params.json")


def test_vllms_fp8_dispatch_by_shape():
    # scaled_mm_sm90_fp8_dispatch.cuh: M <= 16 and (16, 64] with N <= 1280 run the swapped
    # 64x16 tile (16 rows of M by 64 of N in fxshape's orientation), (16, 64] with a wider N
    # 64x64, (64, 128] 64x128, 128x128 beyond, and 256x128 (cooperative) for M >= 8192 with
    # K >= 6144
    h = get_gpu("h100")
    assert vllm_fp8_tile(h, 1, 4096, 4096) == (16, 64)
    assert vllm_fp8_tile(h, 33, 1280, 4096) == (16, 64)
    assert vllm_fp8_tile(h, 33, 1281, 4096) == (64, 64)
    assert vllm_fp8_tile(h, 128, 4096, 4096) == (64, 128)
    assert vllm_fp8_tile(h, 129, 4096, 4096) == (128, 128)
    assert vllm_fp8_tile(h, 8192, 4096, 6143) == (128, 128)
    assert vllm_fp8_tile(h, 8192, 4096, 6144) == (256, 128)
    # scaled_mm_sm100_fp8_dispatch.cuh: M <= 16 swapped 128x32, (16, 64] swapped 128x64
    # except M = 64 with K < 4096 (64x64 unswapped), then 128x128 over a 2-SM cluster (64
    # rows a SM) to 256 and 256x128 over a pair (128 rows a SM) beyond
    b = get_gpu("b200")
    assert vllm_fp8_tile(b, 16, 4096, 4096) == (32, 128)
    assert vllm_fp8_tile(b, 64, 4096, 4095) == (64, 64)
    assert vllm_fp8_tile(b, 64, 4096, 4096) == (64, 128)
    assert vllm_fp8_tile(b, 256, 4096, 4096) == (64, 128)
    assert vllm_fp8_tile(b, 257, 4096, 4096) == (128, 128)
    # other architectures run other kernels: no rule here
    for gpu in ("l40s", "a100", "mi300x", "rtx-pro-6000-server"):
        assert vllm_fp8_tile(get_gpu(gpu), 128, 4096, 4096) is None


def test_which_gpus_take_the_fitted_kernels():
    # measured: the H100 SXM (fp8) and the B200 (fp8, nvfp4); Hopper and tcgen05 Blackwell
    # borrow them; the sm120 RTX PRO 6000, Ada and AMD run other kernels
    assert quant_kernel_source("h100", "fp8") == "h100-sxm"
    assert quant_kernel_source("h200", "fp8") == "h100-sxm"
    assert quant_kernel_source("gh200", "fp8") == "h100-sxm"
    assert quant_kernel_source("b200", "nvfp4") == "b200"
    for gpu in ("gb200", "b300", "gb300"):
        assert quant_kernel_source(gpu, "fp8") == "b200"
        assert quant_kernel_source(gpu, "nvfp4") == "b200"
    for gpu in ("rtx-pro-6000-server", "l40s", "mi300x", "a100"):
        assert quant_kernel_source(gpu, "fp8") is None
    assert quant_kernel_source("h100", "nvfp4") is None  # nothing measured: no Blackwell
    # an older library generation prices the kernels as the generic model did
    with fxshape.use_params("2024"):
        assert quant_kernel_params("h100", "fp8") is None
        old = predict_quantized(4096, 4096, 4096, quantization_of("fp8"), gpu="h100")
    assert old.kernels == 2 and "torch._scaled_mm" in old.what


def test_the_fp8_layer_is_its_quantization_and_the_dispatched_gemm():
    # H100, M = 8, N = 1024, K = 16384: vLLM's 64x16 tile (16 rows of M) and no split-K,
    # where the generic model splits K across CTAs
    q = quant_kernel_params("h100", "fp8")
    spec = get_gpu("h100")
    dyn = predict_quantized(8, 1024, 16384, quantization_of("fp8"), gpu="h100")
    sta = predict_quantized(8, 1024, 16384, Quantization("fp8", activations="static"),
                            gpu="h100")
    assert sta.prediction.tile == (16, 64) and sta.prediction.split_k == 1
    assert predict_matmul(8, 1024, 16384, dtype="fp8", gpu="h100",
                          layout="nt").split_k > 1
    # the GEMM is the GEMM model with the kernel's constants in place of the bf16 fit's
    p = model_params("h100")
    c = q.constants("h100")
    for f in GEMM_FIELDS:
        assert getattr(c, f) == dict(q.gemm)[f]
    assert c.l2_bytes_per_clk_per_sm == p.l2_bytes_per_clk_per_sm
    # dynamic adds the quantization: 3 kernels each costing quant_launch_s, the activation
    # read twice and written once (8 x 16384 x (2 + 2 + 1) bytes) at quant_bw_eff of the
    # datasheet bandwidth, and quant_row_s per token row
    quant = (3 * q.quant_launch_s + 8 * 16384 * 5 / (spec.memory_bandwidth_gbs * 1e9
                                                     * q.quant_bw_eff) + 8 * q.quant_row_s)
    assert dyn.prediction.time_s - sta.prediction.time_s == pytest.approx(quant, rel=1e-9)
    assert (dyn.kernels, sta.kernels) == (4, 1)
    assert "cutlass_scaled_mm" in dyn.what and "fitted" in dyn.what
    # a borrowed entry says whose it is
    assert "constants of the h100-sxm" in predict_quantized(
        8, 1024, 16384, quantization_of("fp8"), gpu="h200").what


def test_the_nvfp4_activation_bytes():
    # 4 x 64 bf16 in (512 B), e2m1 out (128 B) and an e4m3 scale per 16 (16 B)
    assert activation_quant_bytes(4, 64, "nvfp4") == 512 + 128 + 16
    # fp8 per-tensor: read twice, write once: 4 x 64 x 5
    assert activation_quant_bytes(4, 64, "fp8") == 1280
    # the swizzled scale layout the GEMM reads: 128-row by 4-column tiles
    assert block_scale_bytes(4, 64, "nvfp4") == 128 * 4


@pytest.mark.parametrize("gpu,method", [("h100", "fp8"), ("b200", "fp8"), ("b200", "nvfp4"),
                                        ("gb200", "nvfp4")])
def test_the_vectorized_pricing_is_the_scalar_one(gpu, method):
    # what the fit script fits is what analyze prices: the same numbers, row by row
    m = np.array([1, 17, 64, 100, 300, 4096, 9000])
    n = np.array([4096, 2048, 1024, 4096, 16384, 4096, 4096])
    k = np.array([4096, 8192, 512, 4096, 4096, 4096, 8192])
    vec = predict_quantized_times(gpu, method, m, n, k)
    one = [predict_quantized(int(a), int(b), int(c), quantization_of(method), gpu=gpu,
                             layout="nt").prediction.time_s for a, b, c in zip(m, n, k)]
    assert vec == pytest.approx(one, rel=1e-9)


def test_more_bandwidth_is_never_slower():
    # the H200 is the H100's compute with 4.8 TB/s instead of 3.35 and the same kernels
    for m, n, k in ((1, 4096, 4096), (64, 14336, 4096), (4096, 4096, 4096),
                    (16384, 1024, 8192)):
        for act in ("dynamic", "static"):
            q = quantization_of("fp8", activations=act)
            h100 = predict_quantized(m, n, k, q, gpu="h100").prediction.time_s
            h200 = predict_quantized(m, n, k, q, gpu="h200").prediction.time_s
            assert h200 <= h100 * (1 + 1e-12), (m, n, k, act)


def test_bad_input_is_refused_in_one_line(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="no fitted fp8 kernels for l40s; fitted: fp8 on "
                                         "Hopper"):
        predict_quantized_times("l40s", "fp8", [1], [4096], [4096])
    bad = tmp_path / "q.json"
    bad.write_text(json.dumps({"gpus": {"h100-sxm": {"fp8": {"gemm": {"e_max": 0.9}}}}}))
    monkeypatch.setenv("FXSHAPE_QUANT_PARAMS", str(bad))
    with pytest.raises(ValueError, match="h100-sxm fp8 lacks or mangles"):
        quant_kernel_params("h100", "fp8")
    bad.write_text(json.dumps({"gpus": {"h100-sxm": {"int4": {}}}}))
    with pytest.raises(ValueError, match="names method 'int4'; accepted: fp8, nvfp4"):
        quant_kernel_params("h100", "fp8")
    bad.write_text(json.dumps({"kernels": {}}))
    with pytest.raises(ValueError, match="no 'gpus' section"):
        quant_kernel_params("h100", "fp8")
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="is not JSON"):
        quant_kernel_params("h100", "fp8")


@pytest.mark.needs_data(os.path.join(calibration_dir(), "aiconfigurator"))
def test_the_held_out_weight_shapes_are_never_fitted():
    # bench/fit_quant_aiconfigurator.py holds out the bf16 fit's weight shapes (a quarter,
    # by a hash of N and K) and fits TRAIN_ROWS of the others; that it reproduces the
    # packaged file is docs/quantization.md's output block (its --check), run by test_docs
    import fit_quant_aiconfigurator as f

    m, n, k, _ = f.read_rows("h100_sxm", "fp8", "CutlassFP8ScaledMMLinearKernel")
    train, held = f.split(m, n, k)
    assert {(n[i], k[i]) for i in train}.isdisjoint({(n[i], k[i]) for i in held})
    assert len(train) == f.TRAIN_ROWS and 0.2 < len(held) / len(m) < 0.3
    with open(_DATA) as fh:
        entry = json.load(fh)["gpus"]["h100-sxm"]["fp8"]
    assert sum(v["n"] for v in entry["held_out"].values()) == len(held)
    assert entry["rows"] == f.TRAIN_ROWS


@pytest.mark.needs_data(os.path.join(calibration_dir(), "aiconfigurator"))
def test_the_b200_held_out_figures_follow_from_the_packaged_constants():
    # the figures the file (and the docs) quote are the packaged constants' on the held-out
    # rows, recomputed here without fitting
    import fit_quant_aiconfigurator as f
    from fit_aiconfigurator import summary

    with open(_DATA) as fh:
        data = json.load(fh)["gpus"]["b200"]
    for method, kernel in (("fp8", "CutlassFP8ScaledMMLinearKernel"),
                           ("nvfp4", "FlashInferCuteDslNvFp4LinearKernel")):
        m, n, k, t = f.read_rows("b200_sxm", method, kernel)
        _, held = f.split(m, n, k)
        err = predict_quantized_times("b200", method, m[held], n[held], k[held]) / t[held] - 1
        assert summary(err, m[held]) == data[method]["held_out"]
