import pytest

from fxshape import GPUSpec, get_gpu, list_gpus
from fxshape.hardware.gpus import ALIASES

REQUIRED = ["v100-sxm2", "v100-pcie", "a100-sxm4-40gb", "a100-sxm4-80gb", "a100-pcie-40gb",
            "a100-pcie-80gb", "a40", "a10", "l4", "t4", "h100-sxm", "h100-pcie", "h200-sxm",
            "b200", "rtx-4090", "mi210", "mi250x-gcd", "mi300x"]


def test_required_gpus_present():
    assert set(REQUIRED) <= set(list_gpus())
    assert list_gpus() == sorted(list_gpus())


@pytest.mark.parametrize("alias,name", [
    ("v100", "v100-sxm2"), ("a100", "a100-sxm4-80gb"), ("a40", "a40"), ("l4", "l4"),
    ("h100", "h100-sxm"), ("h200", "h200-sxm"), ("mi210", "mi210"), ("mi250x", "mi250x-gcd"),
])
def test_aliases(alias, name):
    assert get_gpu(alias).name == name
    assert get_gpu(alias.upper()).name == name  # case-insensitive
    assert get_gpu(f"  {alias} ").name == name


def test_every_alias_resolves():
    for alias, name in ALIASES.items():
        assert get_gpu(alias).name == name


def test_case_insensitive_canonical_and_spec_passthrough():
    spec = get_gpu("A100-SXM4-40GB")
    assert spec.name == "a100-sxm4-40gb"
    assert get_gpu(spec) is spec


@pytest.mark.parametrize("bad", ["h300", "", "a100x", 100, None])
def test_unknown_gpu_lists_known_names(bad):
    with pytest.raises(ValueError) as exc:
        get_gpu(bad)
    if isinstance(bad, str):
        assert "h100-sxm" in str(exc.value) and "mi250x" in str(exc.value)


@pytest.mark.parametrize("name", REQUIRED)
def test_plausibility(name):
    g = get_gpu(name)
    assert isinstance(g, GPUSpec)
    assert g.vendor in ("nvidia", "amd")
    assert 20 <= g.sm_count <= 400
    assert 1000 <= g.boost_clock_mhz <= 3000
    assert 250 <= g.memory_bandwidth_gbs <= 10000
    assert 2 <= g.l2_mb <= 256
    assert 8 <= g.memory_gb <= 256
    pk = g.peaks
    assert pk.fp16 is not None and 50 <= pk.fp16 <= 5000
    assert 5 <= pk.fp32 <= 200
    # tensor-core fp16 is several times the non-tensor fp32 rate on every GPU listed
    assert pk.fp16 / pk.fp32 >= 2
    if pk.bf16 is not None:
        assert pk.bf16 == pk.fp16  # bf16 and fp16 share the tensor-core rate everywhere
    if pk.tf32 is not None:
        assert pk.tf32 == pytest.approx(pk.fp16 / 2, rel=0.03)  # tf32 is half-rate (B200: 1.1 of 2.25 PF, rounded)
    if pk.fp8 is not None:
        assert pk.fp8 == pytest.approx(2 * pk.fp16, rel=0.02)  # fp8 is double-rate
    # ridge point (FLOP per DRAM byte at fp16 peak) between 50 and 600 for every GPU
    ridge = pk.fp16 * 1e12 / (g.memory_bandwidth_gbs * 1e9)
    assert 50 <= ridge <= 600
    # peak per SM per clock: an SM does 512..8192 fp16 FLOP per clock at dense peak
    per_clk = pk.fp16 * 1e12 / (g.sm_count * g.boost_clock_mhz * 1e6)
    assert 512 <= per_clk <= 8192
    assert g.tiles and all(tm % 16 == 0 and tn % 16 == 0 for tm, tn in g.tiles)
    assert g.source


def test_alignment_rule():
    a100 = get_gpu("a100")
    # 16 bytes minimum: 8 fp16 elements, 4 fp32, 16 fp8; 128 bytes best from A100 on
    assert a100.alignment_elements("fp16") == 8
    assert a100.alignment_elements("tf32") == 4
    assert a100.alignment_elements("fp16", best=True) == 64
    assert get_gpu("h100").alignment_elements("fp8") == 16
    assert get_gpu("v100").align_best_bytes == 16


def test_missing_tensor_core_paths():
    with pytest.raises(ValueError, match="no tensor-core path for fp8"):
        get_gpu("a100").peak_tflops("fp8")
    with pytest.raises(ValueError, match="no tensor-core path for bf16"):
        get_gpu("v100").peak_tflops("bf16")
    assert "fp8" in get_gpu("h100").supported_dtypes()


def test_known_datasheet_values():
    # spot checks against the datasheets named in the Source lines
    assert get_gpu("a100").peaks.fp16 == 312.0
    assert get_gpu("h100").peaks.bf16 == 989.4
    assert get_gpu("h100").sm_count == 132
    assert get_gpu("a100-sxm4-40gb").memory_bandwidth_gbs == 1555.0
    assert get_gpu("v100").sm_count == 80


def test_spec_validation():
    g = get_gpu("a100")
    with pytest.raises(ValueError):
        GPUSpec("x", "nvidia", "ampere", 0, 1410, g.peaks, 1, 1, 1, 16, 128, g.tiles)
    with pytest.raises(ValueError):
        GPUSpec("x", "nvidia", "ampere", 108, 1410, g.peaks, 1555, 40, 40, 16, 128, ())
