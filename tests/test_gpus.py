import dataclasses

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
        # one line: the nearest entries (or, with none near, every name) and where all are
        msg = str(exc.value)
        assert "\n" not in msg and "fxshape gpus" in msg
        assert "close matches: " in msg or "known GPUs: " in msg
        assert any(name in msg for name in list_gpus())


@pytest.mark.parametrize("name", REQUIRED)
def test_plausibility(name):
    g = get_gpu(name)
    assert isinstance(g, GPUSpec)
    assert g.vendor in ("nvidia", "amd")
    assert 20 <= g.sm_count <= 400
    assert 1000 <= g.boost_clock_mhz <= 3000
    assert 250 <= g.memory_bandwidth_gbs <= 10000
    assert 2 <= g.l2_mb <= 256
    assert 8 <= g.memory_gb <= 320  # up to B300's and MI355X's 288 GB
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
    assert 512 <= per_clk <= 8192 * 1.001  # clocks derived from a peak are rounded to MHz
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


# --- issue 50: today's GPUs, names as drivers print them --------------------------------

#: every GPU added for issue 50, with the FLOP per clock per SM (CU) its tensor peak is quoted
#: at: Hopper 4096 dense bf16 FLOP/clk/SM (H100 SXM5: 132 x 4096 x 1830 MHz = 989.4 TF),
#: datacenter Blackwell 8192, RTX Blackwell (sm120) 1024 at FP32 accumulate, Ada (L40S)
#: 1024, CDNA3 2048 bf16 (MI300X: 304 x 2048 x 2100 MHz = 1307.4 TF), CDNA4 4096.
NEW_GPUS = {
    "gb200": 8192, "b300": 8192, "gb300": 8192, "l40s": 1024, "rtx-pro-6000-server": 1024,
    "mi325x": 2048, "mi355x": 4096,
    # tensor peaks quoted below the boost clock: GH200 at the H100 SXM5's 1830 MHz, the NVL
    # boards at their power-limited clock
    "gh200": None, "gh200-144gb": None, "h100-nvl": None, "h200-nvl": None,
    # the H800 boards: the H100's configurations (their own tests cover the peaks)
    "h800-sxm": None, "h800-pcie": None,
}


@pytest.mark.parametrize("name", sorted(NEW_GPUS))
def test_new_gpus_plausible_and_sourced(name):
    test_plausibility(name)
    g = get_gpu(name)
    assert g.tdp_w is None or 300 <= g.tdp_w <= 1500
    assert g.peaks.fp8 is not None  # every GPU of today has FP8 tensor cores


@pytest.mark.parametrize("name,per_clk", [(n, c) for n, c in sorted(NEW_GPUS.items()) if c])
def test_datasheet_peaks_match_per_clock_arithmetic(name, per_clk):
    g = get_gpu(name)
    # peak = SMs x FLOP per clock per SM x clock; e.g. GB300: 160 x 8192 x 1907 MHz = 2500 TF
    arithmetic = g.sm_count * per_clk * g.boost_clock_mhz * 1e6 / 1e12
    assert g.peaks.bf16 == pytest.approx(arithmetic, rel=0.015)
    # FP8 at twice bf16 (the L40S datasheet's own figures, 733 and 362.05, differ by 1.2%)
    assert g.peaks.fp8 == pytest.approx(2 * g.peaks.bf16, rel=0.015)


@pytest.mark.parametrize("name", ["h100-nvl", "h200-nvl", "gh200", "l40s",
                                  "rtx-pro-6000-server", "mi355x"])
def test_fp32_peak_is_lanes_times_clock(name):
    # non-tensor FP32: 128 FMA lanes per SM (Hopper, Ada, Blackwell) or 128 per CU on CDNA
    # (as MI300X: 163.4 TF = 304 x 256 x 2.1 GHz), 2 FLOP each: 256 FLOP/clk/SM
    g = get_gpu(name)
    assert g.peaks.fp32 == pytest.approx(g.sm_count * 256 * g.boost_clock_mhz / 1e6, rel=0.015)


def test_fp4_rates():
    # B200 and GB200: FP4 twice FP8; Blackwell Ultra (B300, GB300): three times (its tensor
    # cores run NVFP4 at 1.5x B200's); MI355X: MXFP4 twice FP8
    for name, ratio in (("b200", 2), ("gb200", 2), ("b300", 3), ("gb300", 3), ("mi355x", 2)):
        pk = get_gpu(name).peaks
        assert pk.fp4 == pytest.approx(ratio * pk.fp8, rel=0.01), name
    for name in ("h100-sxm", "gh200", "l40s", "mi325x"):
        assert get_gpu(name).peaks.fp4 is None, name


@pytest.mark.parametrize("device,name", [
    # torch.cuda.get_device_name() / nvidia-smi / a Kineto trace's deviceProperties
    ("NVIDIA GH200 480GB", "gh200"),            # not the H200 by substring
    ("NVIDIA A100-PG509-200", "a100-sxm4-40gb"),  # AWS p4d's 40 GB board, not the 80 GB
    ("NVIDIA H100 80GB HBM3", "h100-sxm"),
    ("NVIDIA H100 NVL", "h100-nvl"),
    ("NVIDIA H200", "h200-sxm"),
    ("NVIDIA H200 NVL", "h200-nvl"),
    ("NVIDIA B200", "b200"),
    ("NVIDIA B300 SXM6 AC", "b300"),
    ("NVIDIA GB200", "gb200"),
    ("NVIDIA L40S", "l40s"),
    ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "rtx-pro-6000-server"),
    ("AMD Instinct MI300X VF", "mi300x"),        # SR-IOV virtual function
    ("AMD Instinct MI300X", "mi300x"),
    ("AMD Instinct MI355X", "mi355x"),
    ("Tesla V100-SXM2-16GB", "v100-sxm2-16gb"),
    ("  nvidia   h100 80gb hbm3 ", "h100-sxm"),  # case and runs of spaces
])
def test_device_names_resolve_exactly(device, name):
    assert get_gpu(device).name == name


@pytest.mark.parametrize("device", ["NVIDIA GH200 480GB extra", "NVIDIA H200 SXM 141GB X",
                                    "NVIDIA H100", "NVIDIA B200 foo"])
def test_device_names_never_match_by_substring(device):
    # a name that only contains a known one is refused, not guessed
    with pytest.raises(ValueError, match="unknown GPU"):
        get_gpu(device)


@pytest.mark.parametrize("device,why", [
    ("NVIDIA H800", "pass h800-sxm or h800-pcie"), ("AMD Instinct MI250X/MI250", "pass mi250x or mi250"),
    ("NVIDIA A10G", "GA102"),
])
def test_device_names_without_entry_say_why(device, why):
    with pytest.raises(ValueError) as exc:
        get_gpu(device)
    msg = str(exc.value)
    assert why in msg and "\n" not in msg


def test_unknown_name_lists_close_matches():
    with pytest.raises(ValueError) as exc:
        get_gpu("gb-200")
    msg = str(exc.value)
    assert "close matches:" in msg and "gb200" in msg and "\n" not in msg


def test_kernel_for_the_wrong_gpu_names_the_ones_that_can():
    from fxshape.cost.attention import resolve_kernel
    from fxshape.cost.quant import predict_block_gemm

    with pytest.raises(ValueError) as exc:
        resolve_kernel("fa3", "a100", "bf16", 128)
    assert "gh200" in str(exc.value) and "h100-sxm" in str(exc.value)  # every Hopper
    with pytest.raises(ValueError) as exc:
        predict_block_gemm(256, 256, 256, "nvfp4", gpu="h100")
    assert "b300" in str(exc.value) and "gb200" in str(exc.value)  # every Blackwell


def test_h800_is_an_h100_with_less_nvlink():
    from fxshape.hardware.topology import LINKS, default_topology, get_topology

    for h800, h100 in (("h800-sxm", "h100-sxm"), ("h800-pcie", "h100-pcie")):
        a, b = get_gpu(h800), get_gpu(h100)
        assert dataclasses.replace(a, name=b.name, source=b.source) == b
    # 400 GB/s of NVLink in all (8 links of 25 GB/s a direction): 200 GB/s a direction,
    # 4/9 of the H100's 18 links
    assert LINKS["nvlink4-8"] == 200.0 == LINKS["nvlink4"] * 8 / 18
    assert default_topology("h800-sxm") == get_topology("hgx-h800")
    assert default_topology("h800-pcie").pair == "nvlink4-8"
    # the switch still reduces (NVLink SHARP is the NVSwitch's): the same class as DGX H100
    assert get_topology("hgx-h800").link_class(8, 8) == "nvswitch_nvls"


def test_an_h800_node_all_reduces_slower_than_an_h100_node():
    from fxshape.cost.comm import predict_collective

    big = 2 ** 28  # 256 MiB: bandwidth-bound
    h100 = predict_collective("all_reduce", big, 8, topology="dgx-h100").time_s
    h800 = predict_collective("all_reduce", big, 8, topology="hgx-h800").time_s
    assert h800 > 1.5 * h100


def test_a_gb200_nvl72_domain_takes_the_dgx_b200s_nccl_constants():
    # the same NVLink 5 switch and NCCL: within one domain of 8 GPUs the NVL72 prices a
    # collective as the measured DGX B200 does; across 72 GPUs it stays on NVLink, where
    # 9 DGX B200 nodes go over InfiniBand (slower)
    from fxshape.cost.comm import predict_collective
    from fxshape.hardware.topology import get_topology

    assert get_topology("gb200-nvl72").constants_from == "dgx-b200"
    big = 2 ** 28
    nvl = predict_collective("all_reduce", big, 8, topology="gb200-nvl72").time_s
    dgx = predict_collective("all_reduce", big, 8, topology="dgx-b200").time_s
    assert nvl == dgx
    assert predict_collective("all_reduce", big, 72, topology="gb200-nvl72").time_s < \
        predict_collective("all_reduce", big, 72, topology="dgx-b200").time_s
    # the 2024 generation keeps the shared class constants
    old = predict_collective("all_reduce", big, 8, topology="gb200-nvl72",
                             params_path="2024").time_s
    assert old != nvl
