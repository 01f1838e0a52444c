"""Sustained clocks under the board power limit (fxshape.hardware.power, issue 51 item 1)."""

import dataclasses
import importlib.util
import os

import pytest

import fxshape
from fxshape.execution.step import OpRecord, sustained_records
from fxshape.hardware.gpus import get_gpu
from fxshape.hardware.power import (clock_curve, power_limit_range, sustained_ratio)
from models import tiny_llama

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_reference_gemm_keeps_its_measured_sustained_fraction():
    # the H200's fattest GEMM (MAMF 834 of 989.4 TF) at its 700 W: MSMF / MAMF = 755 / 834
    spec = get_gpu("h200-sxm")
    assert sustained_ratio(spec, 834 / 989.4) == pytest.approx(755 / 834, rel=1e-9)
    # the B200's: 1429 / 1745 at 1000 W
    assert sustained_ratio(get_gpu("b200"), 1745 / 2250) == pytest.approx(1429 / 1745,
                                                                         rel=1e-9)


def test_cube_law_by_hand():
    # P(f) = fixed + D u/u_ref r^3 = limit  =>  r = ((limit - fixed) / (D u / u_ref))^(1/3),
    # D = (700 - fixed) / (755/834)^3 on the H100 SXM (same SMs and peak as the H200)
    spec = get_gpu("h100-sxm@450w")
    c = clock_curve(spec)
    d = (700 - c.fixed_w) / (755 / 834) ** 3
    u = 0.7
    want = ((450 - c.fixed_w) / (d * u / (834 / 989.4))) ** (1 / 3)
    assert want < 1
    assert sustained_ratio(spec, u) == pytest.approx(want, rel=1e-9)


def test_fixed_power_reproduces_the_throttled_board_it_is_derived_from():
    # bench/fit_power.py: the H100 PCIe (350 W) keeps 499.5 / (792.1/989.4 x 756.5) of its
    # boost rate on the GEMM the H100 SXM runs at 792.1 TF: the packaged fixed power must
    # give that back through the same rule
    spec = get_gpu("h100-pcie")
    u = 792.1 / 989.4
    assert sustained_ratio(spec, u) == pytest.approx(499.5 / (u * 756.5), rel=2e-3)


@pytest.mark.parametrize("gpu", ["h100-sxm", "h200-sxm", "b200", "gb200", "h100-nvl"])
def test_lower_limit_is_never_faster(gpu):
    spec = get_gpu(gpu)
    low, high = power_limit_range(spec)
    limits = [low + (high - low) * i / 10 for i in range(11)]
    for u in (0.2, 0.5, 0.7, 0.85, 1.0):
        ratios = [sustained_ratio(spec.with_power_limit(w), u) for w in limits]
        assert all(0 < r <= 1 for r in ratios)
        assert ratios == sorted(ratios), (gpu, u, ratios)
    # and a busier kernel never keeps more of its rate than a lighter one
    full = spec.with_power_limit(low)
    by_u = [sustained_ratio(full, u) for u in (0.1, 0.3, 0.5, 0.7, 0.9)]
    assert by_u == sorted(by_u, reverse=True)


def test_light_kernels_keep_boost():
    # a kernel at a fifth of peak draws well under 700 W at boost
    assert sustained_ratio(get_gpu("h100-sxm"), 0.2) == 1.0
    assert sustained_ratio(get_gpu("h100-sxm"), 0.0) == 1.0


def test_gpus_without_a_curve_keep_their_times():
    for gpu in ("a100-sxm4-80gb", "mi300x", "l40s", "gh200"):
        assert clock_curve(get_gpu(gpu)) is None
        assert sustained_ratio(get_gpu(gpu), 0.9) == 1.0


def test_power_limit_names_and_spec():
    spec = get_gpu("h100-sxm@500w")
    assert spec.power_limit_w == 500.0 and spec.power_w == 500.0
    assert spec.label == "h100-sxm@500w" and spec.name == "h100-sxm"
    assert get_gpu("H100 @ 500 W".replace(" ", "")) == spec  # "H100@500W"
    assert get_gpu("h100-sxm").power_w == 700.0  # the board default
    assert get_gpu("h100-sxm").with_power_limit(None) == get_gpu("h100-sxm")


@pytest.mark.parametrize("bad, match", [
    ("h100-sxm@900w", "outside the range it accepts, 200 to 700 W"),
    ("h100-sxm@100w", "outside the range it accepts, 200 to 700 W"),
    ("b200@200w", "outside the range it accepts, 300 to 1000 W"),
    ("h100-sxm@fast", "must be watts"),
    ("gh200@400w", "no board power is recorded"),
    ("nosuchgpu@400w", "unknown GPU"),
])
def test_bad_power_limits(bad, match):
    with pytest.raises(ValueError, match=match) as e:
        get_gpu(bad)
    assert "\n" not in str(e.value)


def test_bad_power_limit_types():
    with pytest.raises(ValueError, match="number of watts"):
        get_gpu("h100-sxm").with_power_limit("500")
    with pytest.raises(ValueError, match="number of watts"):
        get_gpu("h100-sxm").with_power_limit(True)


def _record(flops, time_s, cls="gemm", node="mm"):
    return OpRecord(node, "mm", "", "forward", cls, 1, 0, flops, time_s, 0.0)


def test_sustained_records_slow_only_the_heavy_kernels():
    spec = get_gpu("h100-sxm")
    # 0.85 x 989.4 TF for 1 ms, 0.2 x peak for 1 ms, and a memory-bound op
    heavy = _record(int(0.85 * 989.4e12 * 1e-3), 1e-3)
    light = _record(int(0.2 * 989.4e12 * 1e-3), 1e-3, node="light")
    mem = OpRecord("add", "add", "", "forward", "memory", 1, 10 ** 9, 0, 1e-3, 0.0)
    out, note = sustained_records([heavy, light, mem], [], spec, "bf16")
    r = sustained_ratio(spec, 0.85)
    assert r < 1
    assert out[0].time_s == pytest.approx(1e-3 / r)
    assert out[1] == light and out[2] == mem
    # the slowed kernels' time: 2 ms before, 1 ms / r + 1 ms after
    assert f"+{100 * (1 / r + 1 - 2) / 2:.1f}% on their time" in note and "700 W" in note


def test_sustained_records_without_curve_say_so():
    recs = [_record(10 ** 12, 1e-3)]
    out, note = sustained_records(recs, [], get_gpu("a100-sxm4-80gb"), "bf16")
    assert out == recs
    assert "burst clock" in note and "ampere" in note


def _tiny():
    return tiny_llama(positions=4096, hidden_size=512, intermediate_size=2048,
                      vocab_size=4096, num_key_value_heads=8)


def test_training_step_under_a_lower_limit_is_slower():
    model = _tiny()
    steps = {}
    for gpu in ("h100-sxm@300w", "h100-sxm@500w", "h100-sxm"):
        rep = fxshape.analyze(model, gpu=gpu, mode="train", batch_size=8, seq_len=4096,
                              provenance=None)
        steps[gpu] = rep.step
    assert steps["h100-sxm@300w"].time_s > steps["h100-sxm@500w"].time_s \
        > steps["h100-sxm"].time_s
    assert any(n.startswith("clocks: h100-sxm@500w at 500 W") for n in
               steps["h100-sxm@500w"].notes)
    # inference is priced at the burst clock: no clock note, same time under any limit
    a = fxshape.analyze(model, gpu="h100-sxm@300w", batch_size=8, seq_len=4096,
                        provenance=None)
    b = fxshape.analyze(model, gpu="h100-sxm", batch_size=8, seq_len=4096, provenance=None)
    assert a.step.time_s == b.step.time_s
    assert not any(n.startswith("clocks") for n in a.step.notes)


def test_fit_script_reproduces_the_packaged_file():
    spec = importlib.util.spec_from_file_location(
        "fit_power", os.path.join(ROOT, "bench", "fit_power.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--check"]) == 0
    assert dataclasses.is_dataclass(clock_curve(get_gpu("h100-sxm")))
