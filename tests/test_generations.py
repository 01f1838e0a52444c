"""Library generations of the GEMM constants (issue 50): the H100 SXM and B200 fitted to
today's libraries (bench/fit_aiconfigurator.py), the 2022-2024 fits reachable as
``params="2024"``, and the fit script reproducing the packaged constants."""

import dataclasses
import json
import os

import pytest

import fxshape
from fxshape import get_gpu, predict_matmul
from fxshape.cost.gemm import (CURRENT_LIBRARY, LIBRARY_GENERATIONS, ModelParams,
                               constants_library, constants_source, model_params)
from fxshape.fit.calibration import calibration_dir

DATA = os.path.join(os.path.dirname(fxshape.__file__), "data")


def _file(name):
    with open(os.path.join(DATA, name)) as f:
        return json.load(f)


def test_current_and_2024_constants_are_the_files_entries():
    now, old = _file("perf_params.json")["gpus"], _file("perf_params_2024.json")["gpus"]
    for gpu in ("h100-sxm", "b200"):
        assert model_params(gpu) == ModelParams(**{f: now[gpu][f] for f in ModelParams.STORED})
        assert model_params(gpu, "2024") == ModelParams(
            **{f: old[gpu][f] for f in ModelParams.STORED})
        assert model_params(gpu) != model_params(gpu, "2024")
        assert constants_library(gpu) == CURRENT_LIBRARY == now[gpu]["library"]
        assert constants_library(gpu, "2024").startswith("2022-2024")
    # the B200 had no measurement of its own in 2024: it borrowed the H100's fit
    assert model_params("b200", "2024") == model_params("h100", "2024")
    # a GPU not refitted keeps one fit in both generations
    assert model_params("a100", "2024") == model_params("a100")
    assert constants_library("a100").startswith("2022-2024")


def test_family_members_take_the_current_fit():
    # GPUs without measurements take their family's constants: Hopper the H100 SXM's,
    # Blackwell the B200's (the H100's, in 2024)
    for gpu, src in (("h200", "h100-sxm"), ("gh200", "h100-sxm"), ("h100-nvl", "h100-sxm"),
                     ("gb200", "b200"), ("b300", "b200"), ("gb300", "b200")):
        assert constants_source(gpu) == src and model_params(gpu) == model_params(src)
    assert constants_source("gb200", "2024") == "h100-sxm"


def test_the_2024_generation_reaches_predictions():
    kw = dict(gpu="h100", dtype="bf16", layout="nt")
    now = predict_matmul(4096, 4096, 4096, **kw).time_s
    old = predict_matmul(4096, 4096, 4096, params_path="2024", **kw).time_s
    with fxshape.use_params("2024"):
        assert predict_matmul(4096, 4096, 4096, **kw).time_s == old
    assert now != old
    assert os.path.exists(LIBRARY_GENERATIONS["2024"])


def test_unknown_generation_is_refused_in_one_line():
    with pytest.raises(ValueError) as exc:
        predict_matmul(64, 64, 64, gpu="h100", params_path="2023")
    msg = str(exc.value)
    assert "2024" in msg and "\n" not in msg and "'2023'" in msg


@pytest.mark.parametrize("gpu", ["h100", "b200", "a100"])
def test_more_bandwidth_is_never_slower(gpu):
    # the same GPU with 1.5x the DRAM bandwidth (the constants stay the GPU's: same name)
    spec = get_gpu(gpu)
    fast = dataclasses.replace(spec, memory_bandwidth_gbs=spec.memory_bandwidth_gbs * 1.5)
    for m in (1, 16, 128, 1024, 8192):
        for n, k in ((4096, 4096), (14336, 4096), (4096, 14336), (128256, 4096)):
            slow_t = predict_matmul(m, n, k, gpu=spec, dtype="bf16", layout="nt").time_s
            fast_t = predict_matmul(m, n, k, gpu=fast, dtype="bf16", layout="nt").time_s
            assert fast_t <= slow_t * (1 + 1e-12), (gpu, m, n, k)


@pytest.mark.needs_data(os.path.join(calibration_dir(), "aiconfigurator"))
def test_the_packaged_h100_constants_give_their_held_out_figures():
    # bench/fit_aiconfigurator.py's held-out rows priced with the packaged constants give
    # the figures the file records (that the fit reproduces the file is docs/model.md's
    # output block, its --check for both GPUs, which test_docs runs)
    import fit_aiconfigurator

    entry = _file("perf_params.json")["gpus"]["h100-sxm"]
    # a quarter of the weight shapes held out, by a hash of (N, K): none shares a weight
    # with a fitted row
    rows = fit_aiconfigurator.read_gemm_table("h100_sxm")
    train, held = fit_aiconfigurator.split(rows)
    assert {(r.n, r.k) for r in train}.isdisjoint({(r.n, r.k) for r in held})
    assert entry["rows"] == len(train) == fit_aiconfigurator.TRAIN_ROWS
    spec = get_gpu("h100-sxm")
    assert fit_aiconfigurator.summary(*fit_aiconfigurator.errors(
        spec, model_params(spec), held)) == entry["held_out"]


def test_fxshape_gpus_says_whose_constants_each_gpu_takes(capsys):
    from fxshape.cli import main

    assert main(["gpus"]) == 0
    out = capsys.readouterr().out
    table = out[out.index("tensor-core GEMM constants"):out.index("held-out validation")]
    lines = {line.split()[0]: line for line in table.splitlines() if line.strip()}
    assert "own fit" in lines["h100-sxm"] and CURRENT_LIBRARY in lines["h100-sxm"]
    assert "b200's (blackwell family; no measurement of its own)" in lines["gb200"]
    assert "2022-2024" in lines["a40"]


def test_a_calibration_file_is_named_as_the_source(tmp_path):
    # constants from the user's own parameter file (fxshape calibrate) are said to be the
    # file's, not a library generation's; a GPU the file lacks keeps its packaged fit's
    path = tmp_path / "my_h100.json"
    p = model_params("h100")
    path.write_text(json.dumps({"gpus": {"h100-sxm": {f: getattr(p, f)
                                                      for f in ModelParams.STORED}}}))
    assert constants_library("h100", str(path)) == \
        "the parameter file my_h100.json (fxshape calibrate)"
    assert constants_library("a100", str(path)).startswith("2022-2024")
    assert constants_library("b200", str(path)) == CURRENT_LIBRARY


def test_a_refit_matches_its_entry_to_a_thousandth():
    # bench/fit_aiconfigurator.py --check: another CPU's refit moves the 5th digit of a
    # constant (121.09 -> 121.08: 1 part in 12,109), which still matches; a constant 1% off,
    # a changed text, or a missing key does not
    from fit_aiconfigurator import same_entry

    entry = {"l2_bytes_per_clk_per_sm": 121.09, "rows": 100, "library": "cuBLAS 13",
             "held_out": {"M<=128": {"median": 0.063}}}
    assert same_entry(entry, dict(entry, l2_bytes_per_clk_per_sm=121.08))
    assert not same_entry(entry, dict(entry, l2_bytes_per_clk_per_sm=121.09 * 1.01))
    assert not same_entry(entry, dict(entry, library="cuBLAS 12"))
    assert not same_entry(entry, dict(entry, rows=101))
    assert not same_entry({k: v for k, v in entry.items() if k != "rows"}, entry)
    assert not same_entry(dict(entry, held_out={"M<=128": {"median": 0.07}}), entry)
    assert not same_entry(None, entry)


def test_an_analysis_takes_its_constants_from_its_machine_not_the_context():
    # params= reaches every cost model through the machine's GPU (GPUSpec.constants), so an
    # analysis under a poisoned use_params context (a file that cannot be read) prices
    # exactly as one under use_params("2024") with no params=: prefill, training, decode,
    # and what re-prices a decode report (DecodeSteps, BatchStep) and plans its padding
    from fxshape.cost.gemm import _ACTIVE_PARAMS, use_params
    from fxshape.padding.plan import plan_padding
    from fxshape.serving.batch import BatchStep
    from fxshape.serving.steps import DecodeSteps

    from models import tiny_llama

    model = tiny_llama()
    runs = (dict(mode="inference", seq_len=128), dict(mode="train", seq_len=128),
            dict(mode="decode", context_len=256, batch_size=4))

    def outputs(**params):
        out = []
        for kw in runs:
            rep = fxshape.analyze(model, gpu="h100", **kw, **params)
            out.append(([r.time_s for r in rep.rows], rep.step.time_s))
            if kw["mode"] == "decode":
                out.append((DecodeSteps(rep).attention_s(1024),
                            BatchStep(rep).time_s([512] * 4)))
            else:
                out.append(plan_padding(rep).to_dict())
        return out

    with use_params("2024"):
        from_context = outputs()
    token = _ACTIVE_PARAMS.set("/nonexistent/poison.json")
    try:
        from_machine = outputs(params="2024")
        with pytest.raises(ValueError, match="poison"):  # the poison is read when asked
            model_params("h100")
    finally:
        _ACTIVE_PARAMS.reset(token)
    assert from_machine == from_context
    # and the 2024 constants are not today's: the comparison can tell them apart
    assert outputs() != from_context
