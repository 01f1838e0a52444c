"""Per-GPU validation in the product (issue 33): the held-out records of
``fxshape/data/validation.json``, the error band they give a step, what ``fxshape gpus`` and
the report say of a GPU without any, and the GPU-table figures the records rest on."""

import json

import pytest

import fxshape
from fxshape.hardware.gpus import get_gpu, list_gpus
from fxshape.hardware.validation import (REGIMES, error_band, step_regime, validations)

transformers = pytest.importorskip("transformers")


def _gpt2(n_embd=64):
    import torch

    cfg = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=n_embd, vocab_size=256,
                                  n_positions=64)
    with torch.device("meta"):
        return transformers.GPT2LMHeadModel(cfg)


def test_every_record_is_consistent_and_its_band_is_at_least_its_median():
    seen = 0
    for gpu in list_gpus():
        for regime, v in validations(gpu).items():
            seen += 1
            assert regime in REGIMES and v.n > 0 and v.gpu == gpu
            assert 0 <= v.median <= v.p90 <= v.max
            band = error_band(gpu, regime)
            # the band bounds about nine runs in ten: never below the median it comes from
            assert band.fraction >= v.median
            assert band.fraction == (v.p90 if v.n >= 10 else v.max)
    assert seen >= 10  # the ten GPUs of the whole-model runs alone


def test_an_unvalidated_gpu_says_so_in_gpus_and_in_the_report(capsys):
    from fxshape import cli

    assert validations("a10") == {}  # no published measurement of an A10 is in bench/
    assert cli.main(["gpus"]) == 0
    out = capsys.readouterr().out
    (line,) = [x for x in out.splitlines() if x.startswith("a10 ") and "unvalidated" in x]
    r = fxshape.analyze(_gpt2(), gpu="a10", seq_len=16, provenance=None)
    assert r.step.error_band is None
    assert any(n.startswith("unvalidated:") and "a10" in n for n in r.notes)
    assert json.loads(r.to_json())["step"]["error_band"] is None


def test_a_validated_gpu_and_regime_give_the_step_its_band():
    import torch

    # fp32 whole models on a V100 PCIe are in the NeuSight runs (step-fp32)
    v = validations("v100-pcie")["step-fp32"]
    r = fxshape.analyze(_gpt2(), gpu="v100-pcie", dtype=torch.float32, seq_len=16,
                        provenance=None)
    band = r.step.error_band
    assert band is not None and band.validation == v and band.fraction >= v.median
    assert any(n.startswith("step expected error ±") for n in r.notes)
    d = json.loads(r.to_json())["step"]["error_band"]
    assert d["regime"] == "step-fp32" and d["rows"] == v.n
    # the same model in bf16 inference is another regime, which the V100 PCIe lacks
    r16 = fxshape.analyze(_gpt2(), gpu="v100-pcie", dtype="fp16", seq_len=16,
                          provenance=None)
    assert r16.step.error_band is None


def test_a_quantized_step_has_no_band():
    r = fxshape.analyze(_gpt2(), gpu="h100", seq_len=16, provenance=None, quantize="int8")
    assert r.step.error_band is None
    assert any("quantized or FP8 runs" in n for n in r.notes)


def test_step_regimes():
    assert step_regime("train", "fp32") == "step-fp32"
    assert step_regime("inference", "float32") == "step-fp32"
    assert step_regime("train", "bf16") == "step-train"
    assert step_regime("decode", "fp16") == "serving"
    assert step_regime("prefill", "bf16") == "step-inference"
    # fp32 under torch.compile is its own regime (Inductor's kernels, validated apart)
    assert step_regime("inference", "fp32", "compiled") == "step-fp32-compiled"
    assert step_regime("inference", "fp32", "cudagraphs") == "step-fp32-compiled"
    assert step_regime("train", "bf16", "compiled") == "step-train"


def test_a_compiled_fp32_step_takes_the_compiled_band():
    import torch

    # the A100 PCIe 40GB has both: NeuSight's eager runs and its torch.compile runs
    got = validations("a100-pcie-40gb")
    assert {"step-fp32", "step-fp32-compiled"} <= set(got)
    r = fxshape.analyze(_gpt2(), gpu="a100-pcie-40gb", dtype=torch.float32, seq_len=16,
                        provenance=None, execution="compiled")
    assert r.step.error_band.validation == got["step-fp32-compiled"]
    # a GPU with eager fp32 runs only: the compiled step is unvalidated, not given the
    # eager band
    assert "step-fp32-compiled" not in validations("v100-pcie")
    r = fxshape.analyze(_gpt2(), gpu="v100-pcie", dtype=torch.float32, seq_len=16,
                        provenance=None, execution="compiled")
    assert r.step.error_band is None
    assert any(n.startswith("unvalidated:") and "torch.compile" in n for n in r.notes)


def test_bad_input(tmp_path):
    with pytest.raises(ValueError, match="unknown regime 'gemm16'; accepted: gemm, "):
        error_band("h100", "gemm16")
    bad = tmp_path / "v.json"
    bad.write_text(json.dumps({"rows": []}))
    with pytest.raises(ValueError, match="no 'gpus' object"):
        validations("h100", str(bad))


@pytest.mark.parametrize("gpu, cus, vector, matrix", [
    # CDNA2 (AMD CDNA 2 whitepaper): 128 FP32 FLOP per clock per CU on the vector units,
    # 256 on the matrix cores (v_mfma_f32), at 1700 MHz: 104 CUs -> 22.6 / 45.3 TFLOP/s
    # (MI210; an MI250 GCD is the same count), 110 -> 23.9 / 47.9 (an MI250X GCD)
    ("mi210", 104, 22.6, 45.3), ("mi250-gcd", 104, 22.6, 45.3), ("mi250x-gcd", 110, 23.9, 47.9),
])
def test_cdna2_fp32_peaks_against_their_per_clock_figures(gpu, cus, vector, matrix):
    spec = get_gpu(gpu)
    assert spec.sm_count == cus and spec.boost_clock_mhz == 1700
    assert spec.peaks.fp32 == pytest.approx(cus * 1.7e9 * 128 / 1e12, abs=0.05) == vector
    assert spec.peaks.fp32_matrix == pytest.approx(cus * 1.7e9 * 256 / 1e12, abs=0.05)
    assert spec.peaks.fp32_matrix == matrix
    # fp32 GEMMs are priced at the matrix figure; the vector lanes stay the vector ones
    assert spec.peak_tflops("fp32") == matrix
    assert spec.fp32_lanes_per_sm == pytest.approx(64, rel=0.01)


def test_mi100_against_its_per_clock_figures():
    # CDNA (first generation; AMD CDNA whitepaper): per CU and clock, 128 FP32 FLOP on the
    # vector units, 256 on the matrix cores, 1024 FP16 and 512 bf16 (half the fp16 rate, as
    # CDNA2 later doubled); 120 CUs at 1502 MHz -> 23.07, 46.1, 184.6 and 92.3 TFLOP/s, the
    # datasheet's figures
    spec = get_gpu("mi100")
    assert (spec.vendor, spec.arch, spec.sm_count, spec.boost_clock_mhz) == (
        "amd", "cdna1", 120, 1502)
    for got, per_clk in ((spec.peaks.fp32, 128), (spec.peaks.fp32_matrix, 256),
                         (spec.peaks.fp16, 1024), (spec.peaks.bf16, 512)):
        assert got == pytest.approx(120 * 1.502e9 * per_clk / 1e12, abs=0.05)
    # 4096-bit HBM2 at 2.4 GT/s (1.2 GHz, double data rate): 1228.8 GB/s
    assert spec.memory_bandwidth_gbs == pytest.approx(4096 / 8 * 2.4, rel=1e-9)
    assert spec.memory_gb == 32 and spec.tdp_w == 300
    from fxshape.fit.calibrate import detect_gpu

    assert detect_gpu("AMD Instinct MI100") == "mi100" and get_gpu("MI100") is spec


def test_the_mi250_is_its_own_gpu():
    # the published MI250 runs are an MI250 (104 CUs a GCD), not an MI250X (110)
    assert get_gpu("mi250").name == "mi250-gcd" and get_gpu("mi250x").name == "mi250x-gcd"
    from fxshape.fit.calibrate import detect_gpu

    assert detect_gpu("AMD Instinct MI250X") == "mi250x-gcd"
    assert detect_gpu("AMD Instinct MI250") == "mi250-gcd"


def test_the_docs_table_is_the_data():
    # docs/validation.md shows every record of fxshape/data/validation.json as it is
    import os

    path = os.path.join(os.path.dirname(__file__), "..", "docs", "validation.md")
    with open(path) as f:
        rows = {tuple(c.strip() for c in x.strip().strip("|").split("|")) for x in f
                if x.startswith("| ")}
    for gpu in list_gpus():
        got = validations(gpu)
        if not got:
            assert (gpu, "unvalidated", "", "", "", "") in rows
        for regime, v in got.items():
            sign = "" if v.signed_median is None else f"{100 * v.signed_median:+.1f}%"
            assert (gpu, regime, str(v.n), f"{100 * v.median:.1f}%", f"{100 * v.p90:.1f}%",
                    sign) in rows


def test_the_gemm_rows_band():
    import torch

    # the H100's bf16 GEMMs are validated (the held-out calibration folds: regime gemm)
    r = fxshape.analyze(_gpt2(), gpu="h100", seq_len=16, provenance=None)
    band = r.gemm_error_band
    v = validations("h100")["gemm"]
    assert band.validation == v and band.fraction == v.p90 >= v.median
    assert json.loads(r.to_json())["gemm_error_band"]["regime"] == "gemm"
    # an A10 has no GEMM measurement; fp32 (SIMT) rows are not the gemm regime
    assert fxshape.analyze(_gpt2(), gpu="a10", seq_len=16,
                           provenance=None).gemm_error_band is None
    r32 = fxshape.analyze(_gpt2(), gpu="h100", dtype=torch.float32, seq_len=16,
                          provenance=None)
    assert r32.gemm_error_band is None and json.loads(r32.to_json())["gemm_error_band"] is None
