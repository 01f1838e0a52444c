"""The scripts in bench/: fitting, validation and measurement plumbing, on CPU."""

import dataclasses
import math

import pytest

np = pytest.importorskip("numpy")
pytest.importorskip("scipy")

import fit_model  # noqa: E402  (bench/ is put on sys.path by conftest.py)
import measure_gemm  # noqa: E402
import validate_model  # noqa: E402

from fxshape import get_gpu, predict_matmul  # noqa: E402
from fxshape.cost.gemm import model_params, predict_times_array  # noqa: E402
from fxshape.fit.calibration import (COLUMNS, GEMM_SUBDIRS, CalibrationRow,  # noqa: E402
                                     calibration_dir, calibration_sku, read_dir, read_rows,
                                     write_rows)


def test_percentile_and_spearman_by_hand():
    # percentile with linear interpolation: [1, 2, 3, 4] at 50% -> 2.5; at 90% -> 3.7
    assert validate_model.percentile([4, 1, 3, 2], 50) == 2.5
    assert validate_model.percentile([1, 2, 3, 4], 90) == pytest.approx(3.7)
    # identical order -> 1; reversed -> -1; one swap of 4 items: 1 - 6*(1+1)/(4*15) = 0.8
    assert validate_model.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == 1.0
    assert validate_model.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == -1.0
    assert validate_model.spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    assert math.isnan(validate_model.spearman([1, 1, 1], [1, 2, 3]))


def test_write_read_roundtrip(tmp_path):
    rows = [CalibrationRow("src", "sw", "a100", "mm", "nn", "float16", 1, 64, 128, 256,
                           1.25e-5, "median-cuda-timer")]
    path = tmp_path / "x.csv"
    write_rows(str(path), rows)
    assert path.read_text().splitlines()[0] == ",".join(COLUMNS)
    back = read_rows(str(path))
    assert back == rows


def test_read_rejects_bad_rows(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text(",".join(COLUMNS) + "\nsrc,sw,a100,mm,nn,float16,1,0,8,8,1e-5,t\n")
    with pytest.raises(ValueError, match="bad.csv:2: sizes and time_s must be positive"):
        read_rows(str(path))
    path.write_text(",".join(COLUMNS) + "\nsrc,sw,a100,mm,nn,int8,1,8,8,8,1e-5,t\n")
    with pytest.raises(ValueError, match="unknown dtype"):
        read_rows(str(path))
    with pytest.raises(FileNotFoundError, match="no calibration CSVs"):
        read_dir(str(tmp_path / "empty"))


def test_calibration_sku_mapping():
    assert calibration_sku("microsoft-vidur", "a100") == "a100-sxm4-80gb"
    assert calibration_sku("eleutherai-cookbook", "a100") == "a100-sxm4-40gb"
    assert calibration_sku("fxshape-measure", "L4") == "l4"  # any fxshape name works
    with pytest.raises(ValueError):
        calibration_sku("x", "z999")


def test_measure_writes_schema_rows_with_a_fake_timer(tmp_path):
    calls = []

    def fake_timer(op, layout, b, m, n, k):
        calls.append((op, layout, b, m, n, k))
        return 1e-12 * b * m * n * k + 3e-6  # deterministic, positive

    shapes = measure_gemm.default_sweep(quick=True)
    rows = measure_gemm.measure(shapes, fake_timer, gpu_label="h100", dtype="bf16")
    assert len(rows) == len(shapes) == len(calls)
    path = tmp_path / "m.csv"
    write_rows(str(path), rows)
    back = read_rows(str(path))
    assert len(back) == len(shapes)
    first = back[0]
    assert first.gpu == "h100" and first.dtype == "bfloat16"
    assert first.timing == "cuda-event-median"
    assert first.time_s == pytest.approx(1e-12 * first.m * first.n * first.k + 3e-6, rel=1e-6)
    assert {r.op for r in back} == {"mm", "linear", "bmm"}
    # the sweep has step-1 alignment sizes (odd ones included) in the full version
    full = measure_gemm.default_sweep()
    assert any(s[5] % 2 == 1 for s in full if s[0] == "align/n_step1")


def test_measure_rejects_nonpositive_times():
    with pytest.raises(ValueError, match="timer returned"):
        measure_gemm.measure([("s", "mm", "nn", 1, 8, 8, 8)], lambda *a: 0.0,
                             gpu_label="a100", dtype="fp16")


def test_measure_without_cuda_exits_cleanly(tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert measure_gemm.main(["--gpu-label", "h100", "--out", str(tmp_path / "o.csv")]) == 2
    err = capsys.readouterr().err
    assert "CUDA is not available" in err
    assert not (tmp_path / "o.csv").exists()


def test_vectorized_model_equals_scalar_model():
    spec = get_gpu("a100")
    p = model_params(spec)
    shapes = [(1, 1, 4096, 4096, "nt"), (1, 27648, 130, 4096, "nn"), (8, 512, 512, 64, "nn"),
              (1, 8192, 50257, 768, "nt"), (3, 17, 33, 65, "tn")]
    b, m, n, k, lay = (np.array(x) for x in zip(*shapes))
    vec = predict_times_array(spec, "fp16", b, m, n, k, lay, p)
    for i, (bb, mm, nn, kk, ll) in enumerate(shapes):
        assert vec[i] == pytest.approx(
            predict_matmul(mm, nn, kk, batch=bb, dtype="fp16", gpu=spec, layout=ll).time_s,
            rel=1e-12)


def _synthetic_rows(spec, params, overhead=0.0):
    """Rows whose 'measured' times are the model's own, at params, plus a wall overhead."""
    shapes = []
    for m in (1, 16, 128, 512, 2048, 8192):
        for n, k in ((4096, 4096), (11008, 4096), (4096, 1376), (130, 4096), (1600, 4096)):
            shapes.append((m, n, k))
    b = np.ones(len(shapes), dtype=np.int64)
    m, n, k = (np.array(x) for x in zip(*shapes))
    t = predict_times_array(spec, "fp16", b, m, n, k, np.array(["nn"] * len(shapes)), params)
    timing = "mean-wall" if overhead else "median-cuda-timer"
    return [CalibrationRow("synthetic", "s", spec.name, "mm", "nn", "float16", 1, int(mm),
                           int(nn), int(kk), float(tt) + overhead, timing)
            for mm, nn, kk, tt in zip(m, n, k, t)]


def test_fit_recovers_synthetic_data():
    spec = get_gpu("a100-sxm4-40gb")
    truth = dataclasses.replace(model_params(spec), e_max=0.8, dram_eff=0.7, launch_s=3e-6)
    rows = _synthetic_rows(spec, truth)
    prob = fit_model._Problem(rows, spec)
    free = ("e_max", "dram_eff", "launch_s")
    start = dataclasses.asdict(truth)
    params, _, loss = fit_model._fit_one(prob, free, start,
                                         starts=[dict(e_max=0.6, dram_eff=0.9, launch_s=8e-6)])
    # the model generated the data, so the fit must reproduce it almost exactly
    assert loss < 0.01
    assert params.e_max == pytest.approx(0.8, rel=0.05)
    assert params.dram_eff == pytest.approx(0.7, rel=0.05)


def test_fit_transform_roundtrip():
    for name, (lo, hi) in fit_model._BOUNDS.items():
        for v in (lo + (hi - lo) * 0.3, lo + (hi - lo) * 0.9):
            assert fit_model._from_unbounded(name, fit_model._to_unbounded(name, v)) == \
                pytest.approx(v, rel=1e-6)


def test_validate_on_synthetic_folder(tmp_path):
    spec = get_gpu("a100-sxm4-80gb")
    rows = _synthetic_rows(spec, model_params(spec))
    rows = [dataclasses.replace(r, gpu="a100", source="microsoft-vidur") for r in rows]
    write_rows(str(tmp_path / "syn.csv"), rows)
    groups = validate_model.validate(str(tmp_path))
    assert len(groups) == 1
    g = groups[0]
    assert g["rows"] == len(rows)
    # predictions are the data: zero error (times are written with 7 significant digits)
    assert g["median"] < 1e-6 and g["p90"] < 1e-6 and g["spearman"] == pytest.approx(1.0)


def test_validate_main_prints_table(tmp_path, capsys):
    spec = get_gpu("h100")
    rows = [dataclasses.replace(r, gpu="h100") for r in _synthetic_rows(spec, model_params(spec))]
    write_rows(str(tmp_path / "syn.csv"), rows)
    assert validate_model.main(["--calibration-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "synthetic" in out and "spearman" in out
    assert validate_model.main(["--calibration-dir", str(tmp_path / "none")]) == 2


SHARED = calibration_dir()
needs_shared = pytest.mark.needs_data(SHARED)


@needs_shared
def test_validation_on_shared_data_runs_and_is_sane():
    groups = validate_model.validate()
    rows = sum(g["rows"] for g in groups)
    assert rows == len(read_dir(None, GEMM_SUBDIRS))  # the step-1 sweep too
    big = [g for g in groups if g["rows"] >= validate_model.MIN_ROWS]
    assert len(big) >= 50
    for g in big:
        assert math.isfinite(g["median"])
        # rank order within a group; not for the step-1 K sweep, whose times scatter by +-5%
        # inside each divisibility class (its classes are checked in test_alignment_classes)
        assert g["spearman"] > (0.8 if g["sweep"] == "vocab_k_sweep" else 0.9), g
    # a regression guard well above the targets: no group's median error beyond 15%
    assert max(g["median"] for g in big) < 0.15


@needs_shared
def test_fit_is_reproducible_for_the_cookbook_a100():
    # Rerunning the fit on the shared data must give the packaged constants (5 significant
    # digits, as written). One GPU keeps this to seconds; bench/fit_model.py does them all.
    import json

    from fxshape.cost.gemm import _DEFAULT_PARAMS_PATH

    result = fit_model.fit(only=["a100-sxm4-40gb"])
    with open(_DEFAULT_PARAMS_PATH) as f:
        packaged = json.load(f)
    assert result["gpus"]["a100-sxm4-40gb"] == packaged["gpus"]["a100-sxm4-40gb"]
    assert result["measurement"]["a100-sxm4-40gb"] == packaged["measurement"]["a100-sxm4-40gb"]


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=200, deadline=None)
@given(m=st.integers(1, 20000), n=st.integers(1, 20000), k=st.integers(1, 20000),
       b=st.integers(1, 8), gpu=st.sampled_from(["a100", "h100", "v100", "mi250x", "a40"]),
       layout=st.sampled_from(["nn", "nt", "tn", "tt"]))
def test_vectorized_equals_scalar_property(m, n, k, b, gpu, layout):
    # the fit evaluates the numpy path; predict_matmul the scalar path with its shortcuts
    spec = get_gpu(gpu)
    vec = predict_times_array(spec, "fp16", np.array([b]), np.array([m]), np.array([n]),
                              np.array([k]), np.array([layout]), model_params(spec))
    one = predict_matmul(m, n, k, batch=b, dtype="fp16", gpu=spec, layout=layout).time_s
    assert vec[0] == pytest.approx(one, rel=1e-12)


@needs_shared
def test_leave_the_gpu_out_transfer(monkeypatch):
    import validate_heldout

    # a GPU lent its own constants predicts exactly as its own fit: the borrowed columns
    # equal the own ones; lent the A100's, the A40 (same rows) predicts differently
    monkeypatch.setattr(validate_heldout, "TRANSFER", (("a40", "a40"),
                                                       ("a40", "a100-sxm4-80gb")))
    same, lent = validate_heldout.transfer()
    assert same[:4] == ("a40", "a40", "microsoft-vidur", lent[3]) and lent[3] > 1000
    assert same[4:6] == same[6:8]  # own median/p90 == borrowed median/p90
    assert lent[4:6] == same[4:6] and lent[6:8] != same[6:8]


def test_published_training_runs_load_and_derive_the_step():
    # bench/training_published.csv: every row has a positive measured step; llm-foundry's
    # MPT-7B on 8 A100s at 2k tokens: micro-batch 6 x 2 accumulation steps x 2048 tokens on
    # each of 8 GPUs at 4,641 tokens/s per GPU -> 6 * 2 * 2048 / 4641 = 5.2954 s
    import validate_training as vt

    rows = vt.rows()
    assert len(rows) >= 80 and all(vt.measured_step(r) > 0 for r in rows)
    mpt = next(r for r in rows if r["model"] == "MPT-7b seq2048 8xa100")
    assert vt.measured_step(mpt) == pytest.approx(6 * 2 * 2048 / 4641)
    with pytest.raises(ValueError, match="unit"):
        vt.measured_step(dict(mpt, unit="ms"))
