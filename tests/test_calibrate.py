"""fxshape calibrate (fitting half on CPU), parameter files, and the fp32 SIMT path."""

import dataclasses
import json
import math
import os
import random

import pytest

np = pytest.importorskip("numpy")
pytest.importorskip("scipy")

from fxshape import analyze, get_gpu, predict_matmul, use_params  # noqa: E402
from fxshape.fit.calibrate import calibration_sweep, detect_gpu, fit_rows, write_params  # noqa: E402
from fxshape.fit.calibration import CalibrationRow, calibration_dir  # noqa: E402
from fxshape.cli import main as cli_main  # noqa: E402
from fxshape.fit.measure import default_sweep  # noqa: E402
from fxshape.cost.gemm import model_params, predict_times_array  # noqa: E402
from fxshape.cost.simt import parse_kernel_name, simt_menu, tile_fma_efficiency  # noqa: E402


def _synthetic(shapes, spec, params, noise, seed):
    """Rows 'measured' on a GPU whose true constants are ``params``: the model's times times
    a seeded log-normal noise factor."""
    b, m, n, k = (np.array([s[i] for s in shapes]) for i in (3, 4, 5, 6))
    lay = np.array([s[2] for s in shapes])
    t = predict_times_array(spec, "bf16", b, m, n, k, lay, params)
    rng = random.Random(seed)
    return [CalibrationRow("synthetic", s[0], spec.name, s[1], s[2], "bfloat16", *s[3:],
                           float(ti) * math.exp(rng.gauss(0.0, noise)), "cuda-event-median")
            for s, ti in zip(shapes, t)]


def test_calibrate_recovers_known_constants_from_noisy_measurements():
    spec = get_gpu("h100")
    # a GPU unlike the packaged H100: slower tensor cores, less DRAM bandwidth, slower launch
    # and strided-batched kernels 20% slower than single GEMMs (the V100's are 23% slower)
    truth = dataclasses.replace(model_params(spec), e_max=0.7, dram_eff=0.7, launch_s=4e-6,
                                power_eff=0.6, batched_eff=0.8)
    rows = _synthetic(calibration_sweep(quick=True), spec, truth, noise=0.02, seed=1)
    fitted, summary = fit_rows(rows, spec)
    # the packaged constants are off by tens of percent on this GPU; the fit is not
    assert summary["median_before"] > 0.08
    assert summary["median_after"] < 0.025  # 2% noise: the median |error| is ~1.35% of it
    assert fitted.dram_eff == pytest.approx(0.7, rel=0.05)
    assert fitted.launch_s == pytest.approx(4e-6, rel=0.25)
    assert fitted.batched_eff == pytest.approx(0.8, rel=0.1)  # the bmm/square shapes tell it
    # judged on shapes it did not measure: the full sweep minus the quick one, noise-free
    quick = set(calibration_sweep(quick=True))
    held = [s for s in default_sweep(quick=False) if s not in quick]
    b, m, n, k = (np.array([s[i] for s in held]) for i in (3, 4, 5, 6))
    lay = np.array([s[2] for s in held])
    want = predict_times_array(spec, "bf16", b, m, n, k, lay, truth)
    got = predict_times_array(spec, "bf16", b, m, n, k, lay, fitted)
    err = np.abs(got / want - 1)
    assert len(held) > 300 and np.median(err) < 0.02 and np.percentile(err, 90) < 0.06


def test_fit_rows_rejects_bad_input():
    with pytest.raises(ValueError, match="no measurements"):
        fit_rows([], "h100")
    r = CalibrationRow("s", "w", "h100", "mm", "nn", "float32", 1, 64, 64, 64, 1e-5,
                       "cuda-event-median")
    with pytest.raises(ValueError, match="SIMT kernels"):
        fit_rows([r], "h100")
    r16 = dataclasses.replace(r, dtype="float16")
    with pytest.raises(ValueError, match="mix dtypes"):
        fit_rows([r, r16], "h100")


def test_calibrate_without_cuda_says_what_it_needs(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert cli_main(["calibrate", "--quick", "--out", os.devnull]) == 2
    err = capsys.readouterr().err
    assert "needs one visible to PyTorch" in err and "torch.cuda.is_available() is False" in err


@pytest.mark.parametrize("device,name", [
    ("NVIDIA H100 80GB HBM3", "h100-sxm"), ("NVIDIA H100 PCIe", "h100-pcie"),
    ("NVIDIA A100-SXM4-40GB", "a100-sxm4-40gb"), ("NVIDIA A100 80GB PCIe", "a100-pcie-80gb"),
    ("Tesla V100-PCIE-32GB", "v100-pcie"), ("Tesla T4", "t4"), ("NVIDIA L4", "l4"),
    ("NVIDIA GeForce RTX 4090", "rtx-4090"), ("Tesla P100-PCIE-16GB", "p100-pcie"),
])
def test_detect_gpu(device, name):
    assert detect_gpu(device) == name


def test_detect_gpu_unknown():
    with pytest.raises(ValueError, match="pass --gpu"):
        detect_gpu("Intel Arc A770")


def _calibrated_file(tmp_path, e_max):
    spec = get_gpu("h100")
    p = dataclasses.replace(model_params(spec), e_max=e_max, power_eff=e_max)
    path = tmp_path / "cal.json"
    write_params(str(path), p, dict(gpu=spec.name, rows=1, dtype="bf16", median_before=0.1,
                                    median_after=0.01))
    return str(path)


def test_a_tf32_fit_is_stored_so_predictions_reproduce_it(tmp_path, monkeypatch):
    from fxshape.cost.gemm import dtype_params, tf32_issue_ratio, tf32_mainloop_eff

    monkeypatch.delenv("FXSHAPE_PARAMS", raising=False)
    spec = get_gpu("a100")
    assert tf32_issue_ratio(spec) != 1 and tf32_mainloop_eff(spec) != 1  # sm80 has both
    # what a TF32 fit returns: the constants its rows were priced with, TF32's own
    # narrow-load and mainloop constants included (fit_rows starts from those)
    fitted = dataclasses.replace(dtype_params(model_params(spec), spec, "tf32"), e_max=0.6,
                                 ld_issue_clk=9.0)
    path = tmp_path / "tf32.json"
    write_params(str(path), fitted, dict(gpu=spec.name, rows=1, dtype="tf32",
                                         median_before=0.1, median_after=0.01))
    # an aligned GEMM and one whose N * 4 bytes is only 8-byte aligned (narrow loads)
    for n in (2048, 2050):
        want = predict_times_array(spec, "tf32", [1], [2048], [n], [2048], ["nt"], fitted)[0]
        got = predict_matmul(2048, n, 2048, dtype="tf32", gpu=spec, layout="nt",
                             params=str(path)).time_s
        assert got == pytest.approx(want, rel=1e-4)  # the file keeps 5 significant digits


def test_parameter_file_is_used_when_asked_and_only_then(tmp_path, monkeypatch):
    monkeypatch.delenv("FXSHAPE_PARAMS", raising=False)
    path = _calibrated_file(tmp_path, 0.5)
    base = predict_matmul(8192, 8192, 8192, gpu="h100")
    # the file sustains 50% of peak where the packaged H100 sustains power_eff: a
    # compute-bound GEMM takes power_eff / 0.5 times as long (within the smooth maximum)
    slow = predict_matmul(8192, 8192, 8192, gpu="h100", params=path)
    expect = model_params("h100").power_eff / 0.5
    assert slow.time_s / base.time_s == pytest.approx(expect, rel=0.08)
    with use_params(path):
        assert predict_matmul(8192, 8192, 8192, gpu="h100").time_s == slow.time_s
    assert predict_matmul(8192, 8192, 8192, gpu="h100").time_s == base.time_s
    monkeypatch.setenv("FXSHAPE_PARAMS", path)
    assert predict_matmul(8192, 8192, 8192, gpu="h100").time_s == slow.time_s
    # the file holds only H100: every other GPU keeps its packaged constants (an overlay)
    monkeypatch.delenv("FXSHAPE_PARAMS")
    a100 = predict_matmul(4096, 4096, 4096, gpu="a100").time_s
    assert predict_matmul(4096, 4096, 4096, gpu="a100", params=path).time_s == a100


def test_analyze_names_the_parameter_file(tmp_path, monkeypatch):
    import torch

    monkeypatch.delenv("FXSHAPE_PARAMS", raising=False)
    path = _calibrated_file(tmp_path, 0.5)
    model = torch.nn.Linear(4096, 4096, device="meta")
    x = torch.randn(2048, 4096, device="meta")
    plain = analyze(model, (x,), gpu="h100")
    cal = analyze(model, (x,), gpu="h100", params=path)
    assert not any("constants from" in n for n in plain.notes)
    assert any(os.path.abspath(path) in n for n in cal.notes)
    assert cal.rows[0].time_s > 1.3 * plain.rows[0].time_s


def test_bad_parameter_files_get_one_line_errors(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="is not JSON"):
        predict_matmul(64, 64, 64, params=str(bad))
    bad.write_text(json.dumps({"hello": 1}))
    with pytest.raises(ValueError, match="not an fxshape parameter file"):
        predict_matmul(64, 64, 64, params=str(bad))
    bad.write_text(json.dumps({"gpus": {"h100-sxm": {"e_max": 0.9}}}))
    with pytest.raises(ValueError, match="lacks"):
        predict_matmul(64, 64, 64, params=str(bad))
    with pytest.raises(ValueError, match="cannot read"):
        predict_matmul(64, 64, 64, params=str(tmp_path / "missing.json"))
    # the CLI turns it into one line and status 2, no traceback
    assert cli_main(["predict", "--m", "64", "--n", "64", "--k", "64", "--params",
                     str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "lacks" in err


# --- fp32: SIMT sgemm kernels ------------------------------------------------------------

def test_kernel_names_parse_in_fxshape_orientation():
    # cuBLAS is column-major: sgemm_AxB tiles N by A and M by B. NeuSight's first A100 row,
    # F.linear M=58, N=141, K=13, ran ampere_sgemm_32x128_tn on a 5x1 grid:
    # ceil(141 / 32) = 5 CTAs along N, ceil(58 / 128) = 1 along M.
    tm, tn, slices = parse_kernel_name("ampere_sgemm_32x128_tn")
    assert (math.ceil(141 / tn), math.ceil(58 / tm), slices) == (5, 1, 1)
    assert parse_kernel_name("volta_sgemm_64x32_sliced1x4_nn") == (32, 64, 4)
    assert parse_kernel_name("sgemm_32x32x32_NN_vec") == (32, 32, 1)
    with pytest.raises(ValueError, match="not a cuBLAS sgemm kernel"):
        parse_kernel_name("sm80_xmma_gemm_f16f16")


def test_simt_menus_and_efficiency():
    # every menu kernel's register tile: 128x128 over 256 threads is 8x8 = 64 outputs
    big = [kk for kk in simt_menu("ampere", False) if kk.name == "ampere_sgemm_128x128"][0]
    assert big.outputs_per_thread == 64
    sliced = [kk for kk in simt_menu("ampere", False) if kk.slices == 4][0]
    assert sliced.outputs_per_thread == sliced.tm * sliced.tn * 4 / sliced.threads
    # more outputs per thread, fewer operand loads per FMA: efficiency rises, below 1
    effs = [tile_fma_efficiency(dataclasses.replace(big, threads=t), 1.0)
            for t in (1024, 256, 64)]
    assert effs == sorted(effs) and effs[-1] < 1
    assert simt_menu("hopper", True) == simt_menu("ampere", True)
    with pytest.raises(ValueError, match="no SIMT sgemm kernel menu"):
        simt_menu("cdna2", False)


def test_fp32_runs_simt_and_tf32_runs_tensor_cores():
    fp32 = predict_matmul(4096, 4096, 4096, dtype="fp32", gpu="a100", layout="nt")
    tf32 = predict_matmul(4096, 4096, 4096, dtype="tf32", gpu="a100", layout="nt")
    assert fp32.kernel.startswith("ampere_sgemm_") and fp32.kernel.endswith("_tn")
    assert tf32.kernel == ""
    # A100: 19.5 TFLOP/s of FMA, 156 of TF32 tensor cores; each stays below its own peak
    assert 0.6 * 19.5 < fp32.tflops < 19.5
    assert tf32.tflops > 3 * fp32.tflops
    # batched fp32 on A100 runs the one batched kernel the data shows (128x128)
    b = predict_matmul(300, 200, 64, batch=16, dtype="fp32", gpu="a100")
    assert b.tile == (128, 128) and b.kernel == "ampere_sgemm_128x128_nn"
    # GPUs without tensor cores take fp32 and refuse fp16
    assert predict_matmul(1024, 1024, 1024, dtype="fp32", gpu="p100").time_s > 0
    with pytest.raises(ValueError, match="no tensor-core path"):
        predict_matmul(1024, 1024, 1024, dtype="fp16", gpu="p100")


def test_fp32_is_monotone_in_work():
    rng = random.Random(3)
    for _ in range(200):
        m, n, k = (rng.randint(1, 3000) for _ in range(3))
        b = rng.choice((1, 1, 4))
        t = predict_matmul(m, n, k, batch=b, dtype="fp32", gpu="v100", layout="nt").time_s
        assert predict_matmul(m, n, 2 * k, batch=b, dtype="fp32", gpu="v100",
                              layout="nt").time_s >= t


def test_gpu_check_plumbing_with_fake_timers(tmp_path):
    import gpu_check  # bench/, on sys.path via conftest.py

    calls = []

    def gemm_timer(dt):
        def t(op, lay, b, m, n, k):
            calls.append((op, dt))
            return 2.0 * b * m * n * k / 100e12 + 5e-6  # a 100 TFLOP/s GPU
        return t

    def sdpa_timer(b, h, kvh, s, d, causal):
        return 1e-3, 2.5e-3

    def memop_timer(name, kind, r, c):
        calls.append((kind, "bf16"))
        return r * c * 2 * 2 / 2e12  # 2 TB/s

    rows, skipped = gpu_check.run("h100", str(tmp_path), 600, gemm_timer, sdpa_timer,
                                  step_fn=None, memop_timer=memop_timer)
    # every GEMM shape, both directions of every SDPA shape and every memory-bound kernel
    n_gemm, n_sdpa = len(gpu_check.gemm_shapes()), 2 * len(gpu_check.sdpa_shapes())
    n_mem = len(gpu_check.memop_shapes())
    assert len(rows) == n_gemm + n_sdpa + n_mem and len(calls) == n_gemm + n_mem
    assert {dt for _, dt in calls} == {"bf16", "fp32", "tf32"}
    # attention's scores bmm (B transposed) is among the shapes, at an odd head_dim too
    assert any(s[2] == "bmm" and s[3] == "nt" and s[7] == 65 for s in gpu_check.gemm_shapes())
    lines = (tmp_path / "gpu_check.csv").read_text().splitlines()
    assert lines[0] == ",".join(gpu_check.COLUMNS) and len(lines) == len(rows) + 1
    md = (tmp_path / "gpu_check.md").read_text()
    for sec in ("align", "llama", "fp32", "sdpa", "lm_head", "memops"):
        assert f"### {sec}" in md
    assert skipped == ["gpt2_step"] and "skipped (time budget): gpt2_step" in md
    # without a memory-op timer the section is listed as skipped
    _, skipped = gpu_check.run("h100", str(tmp_path), 600, gemm_timer, sdpa_timer,
                               step_fn=None)
    assert "memops (no timer)" in skipped
    # a budget already spent measures nothing more and says so
    rows, skipped = gpu_check.run("h100", str(tmp_path), 0, gemm_timer, sdpa_timer,
                                  step_fn=None)
    assert rows == [] and "part of the GEMM sections" in skipped


@pytest.mark.needs_data(os.path.join(calibration_dir(), "neusight", "fp32_train.csv"))
def test_packaged_fp32_constants_on_held_out_neusight_rows():
    import fit_fp32  # bench/

    path = fit_fp32.data_path()
    data = fit_fp32.read(path)
    section = json.load(open(os.path.join(os.path.dirname(__file__), "..", "fxshape",
                                          "data", "perf_params.json")))["fp32"]
    # the half of the rows the fit never saw (hash of the shape), every 4th row for speed;
    # targets from the issue: median <= 8%, p90 <= 25% (met by these two GPUs; docs/model.md)
    for gpu, med_max, p90_max in (("a100-pcie-40gb", 0.05, 0.15), ("v100-pcie", 0.08, 0.25)):
        rows = data[gpu]
        held = rows.take(fit_fp32.held_out_mask(rows))
        held = held.take(np.arange(0, len(held), 4))
        over = section["measurement"][gpu]["overhead_s"]
        pred = held.predict(fit_fp32.params_of(section, gpu)) + \
            np.array([over[o] for o in held.op])
        err = np.abs(pred / held.t - 1)
        assert np.median(err) <= med_max and np.percentile(err, 90) <= p90_max, gpu


def test_parameter_file_with_a_family_pointing_nowhere_gets_a_one_line_error(tmp_path):
    path = tmp_path / "bad_family.json"
    path.write_text(json.dumps({"gpus": {}, "families": {"hopper": {"from": "h900"}}}))
    with pytest.raises(ValueError, match="family 'hopper' takes its constants from"):
        predict_matmul(4096, 4096, 4096, gpu="h100-pcie", params=str(path))
