"""GPU specifications: one frozen record per SKU, looked up by name.

Every number is a datasheet or whitepaper figure; the ``# Source:`` line above each entry
names the document. Peaks are *dense* (no 2:4 sparsity) tensor-core TFLOP/s at boost clock;
``fp32`` is the non-tensor (CUDA-core / vector) peak. A ``None`` peak means the GPU has no
tensor-core path for that dtype, and asking the model for it raises ``ValueError``.

Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from .dtypes import DTYPE_KEYS, canonical_dtype, itemsize

__all__ = ["Peaks", "GPUSpec", "get_gpu", "list_gpus", "gpus_of_arch", "ALIASES",
           "DEVICE_NAMES"]


@dataclass(frozen=True)
class Peaks:
    """Dense peak throughput per math mode, in TFLOP/s (``None``: no such path)."""

    fp16: float | None
    bf16: float | None
    tf32: float | None
    fp32: float
    fp8: float | None = None
    #: FP4 (NVFP4/MXFP4 block-scaled e2m1) tensor cores, Blackwell only: not a compute
    #: dtype of its own (``DTYPE_KEYS``), read by the block-format GEMMs of
    #: ``fxshape.cost.quant``.
    fp4: float | None = None
    #: FP32 on matrix cores, where the GEMM library runs fp32 GEMMs there (AMD CDNA2:
    #: rocBLAS's sgemm uses ``v_mfma_f32`` at 256 FLOP per clock per CU, twice the vector
    #: ``fp32``); :meth:`GPUSpec.peak_tflops` gives it for ``"fp32"``. None: ``fp32``.
    fp32_matrix: float | None = None

    def get(self, key: str) -> float | None:
        return getattr(self, key)


@dataclass(frozen=True)
class GPUSpec:
    """One GPU as the performance model sees it.

    Attributes:
        name: canonical lower-case name, e.g. ``"a100-sxm4-80gb"``.
        vendor: ``"nvidia"`` or ``"amd"``.
        arch: architecture family; fitted model constants are shared within a family.
        sm_count: streaming multiprocessors (NVIDIA) or compute units (AMD).
        boost_clock_mhz: boost clock the peaks are quoted at.
        peaks: dense peak TFLOP/s per math mode.
        memory_bandwidth_gbs: DRAM bandwidth in GB/s (10^9 bytes/s).
        l2_mb: last-level on-die cache the GEMM tiles stream through, in MB.
        memory_gb: DRAM capacity in GB.
        align_min_bytes: leading-dimension alignment (bytes) below which the GEMM library
            falls back to narrow-vector kernels (16 bytes on every tensor-core GPU).
        align_best_bytes: alignment for full speed (128 bytes from A100 on, a whole
            cache line per row of a tile).
        tiles: CTA tile shapes (tm, tn) the vendor GEMM library chooses among.
        source: where the numbers come from.
        sfu_per_clk_per_sm: transcendental results (``exp2``) per clock per SM or CU: the
            special-function units a softmax's exponentials run on. 16 everywhere in this
            table: NVIDIA's Volta, Turing, Ampere, Ada and Hopper whitepapers draw 4 SFUs in
            each of an SM's 4 partitions (the FlashAttention-3 paper quotes H100 SXM5 at
            3.9 TFLOP/s of special functions = 16 x 132 SMs x 1.83 GHz); Blackwell
            (B200) keeps 4 per partition; Blackwell Ultra (B300, GB300) doubles the
            ``MUFU.EX2`` rate to 32 (NVIDIA technical blog "Making Softmax More Efficient
            with NVIDIA Blackwell Ultra", 2026); AMD CDNA runs transcendentals at a quarter
            of the 64-lane FP32 rate per CU (CDNA2/CDNA3 ISA guides).
        base_clock_mhz: the base clock (datasheet): what the GPU guarantees under sustained
            load within its board power; ``None`` where not recorded. It bounds the power
            throttle the fp32 fit may attribute to a GPU (``bench/fit_fp32.py``).
        tdp_w: maximum board power in watts (datasheet), or ``None`` where not recorded.
            Used for the sustained clock of fp32 SIMT kernels on a GPU that borrows another
            GPU's fitted fp32 constants (:func:`fxshape.cost.simt.sustained_fp32_peak`).
        tcgen05: datacenter Blackwell's tensor cores (sm100/sm103: ``tcgen05`` MMA into
            tensor memory), which the kernels written for them need (FlashInfer's
            TensorRT-LLM attention, FlashAttention-4); False on the RTX PRO parts (sm120:
            ``mma.sync`` tensor cores) and every older GPU.
        power_limit_w: the board power limit the GPU runs under, in watts, as
            ``nvidia-smi -pl`` sets it; ``None``: the board's default (``tdp_w``). It sets
            the clock dense tensor-core kernels sustain in a long job
            (:mod:`fxshape.hardware.power`). Give it with :meth:`with_power_limit` or as
            ``"h100-sxm@500w"`` wherever a GPU name is accepted; accepted range:
            :func:`fxshape.hardware.power.power_limit_range`.
        constants: the parameter file its predictions take their fitted constants from
            (a path, as ``fxshape.cost.gemm`` resolves it), set by the analysis from its
            setup's ``Machine`` (:meth:`with_constants`), so that every cost model reads
            them from the GPU it is given; ``None``: the file in force
            (``fxshape.use_params``, ``$FXSHAPE_PARAMS``, else the packaged constants).
    """

    name: str
    vendor: str
    arch: str
    sm_count: int
    boost_clock_mhz: int
    peaks: Peaks
    memory_bandwidth_gbs: float
    l2_mb: float
    memory_gb: float
    align_min_bytes: int
    align_best_bytes: int
    tiles: tuple[tuple[int, int], ...]
    source: str = field(default="", compare=False)
    sfu_per_clk_per_sm: int = 16
    tdp_w: float | None = None
    base_clock_mhz: int | None = None
    tcgen05: bool = False
    power_limit_w: float | None = None
    constants: str | None = None

    def __post_init__(self):
        if self.sm_count <= 0 or self.boost_clock_mhz <= 0:
            raise ValueError(f"{self.name}: sm_count and boost_clock_mhz must be positive")
        if self.memory_bandwidth_gbs <= 0 or self.l2_mb <= 0:
            raise ValueError(f"{self.name}: bandwidth and L2 size must be positive")
        if not self.tiles or any(tm <= 0 or tn <= 0 for tm, tn in self.tiles):
            raise ValueError(f"{self.name}: tiles must be a non-empty list of positive shapes")
        if self.align_best_bytes < self.align_min_bytes:
            raise ValueError(f"{self.name}: align_best_bytes < align_min_bytes")
        if self.sfu_per_clk_per_sm <= 0:
            raise ValueError(f"{self.name}: sfu_per_clk_per_sm must be positive")
        if self.power_limit_w is not None:
            from .power import check_power_limit

            check_power_limit(self, self.power_limit_w)

    @property
    def power_w(self) -> float | None:
        """The power limit in force: ``power_limit_w``, else the board's default
        (``tdp_w``); None where neither is known."""
        return self.power_limit_w if self.power_limit_w is not None else self.tdp_w

    @property
    def label(self) -> str:
        """``name``, with the power limit where one was set (``"h100-sxm@500w"``)."""
        if self.power_limit_w is None:
            return self.name
        return f"{self.name}@{self.power_limit_w:g}w"

    def with_power_limit(self, watts) -> "GPUSpec":
        """This GPU under a board power limit (``nvidia-smi -pl watts``); ``None``: the
        board's default. ValueError outside :func:`fxshape.hardware.power.power_limit_range`."""
        if watts is not None:
            if isinstance(watts, bool) or not isinstance(watts, (int, float)):
                raise ValueError(f"power limit must be a number of watts, got {watts!r}")
            watts = float(watts)
        return dataclasses.replace(self, power_limit_w=watts)

    def with_constants(self, path: str | None) -> "GPUSpec":
        """This GPU priced with the fitted constants of the parameter file ``path`` (as
        resolved: ``fxshape.cost.gemm.params_in_force``); ``None``: the file in force."""
        if path is not None and not isinstance(path, str):
            raise ValueError(f"constants must be a parameter file's path, got {path!r}")
        return dataclasses.replace(self, constants=path)

    @property
    def fp32_lanes_per_sm(self) -> float:
        """FP32 FMA lanes per SM (CU), from the non-tensor fp32 peak (2 FLOP per FMA)."""
        return self.peaks.fp32 * 1e12 / (2 * self.sm_count * self.boost_clock_mhz * 1e6)

    def peak_tflops(self, dtype) -> float:
        """Dense peak TFLOP/s for ``dtype``; ValueError if there is no tensor-core path."""
        key = canonical_dtype(dtype)
        peak = self.peaks.get(key)
        if key == "fp32" and self.peaks.fp32_matrix is not None:
            peak = self.peaks.fp32_matrix
        if peak is None:
            have = ", ".join(k for k in DTYPE_KEYS if self.peaks.get(k) is not None)
            raise ValueError(
                f"{self.name} has no tensor-core path for {key}; supported dtypes: {have}"
            )
        return peak

    def alignment_elements(self, dtype, *, best: bool = False) -> int:
        """Elements per leading dimension needed for full-speed kernels (e.g. 8 for fp16)."""
        nbytes = self.align_best_bytes if best else self.align_min_bytes
        return max(1, nbytes // itemsize(canonical_dtype(dtype)))

    def supported_dtypes(self) -> tuple[str, ...]:
        return tuple(k for k in DTYPE_KEYS if self.peaks.get(k) is not None)


# --- CTA tile menus, per architecture (composition, not copies) --------------------------
# Skinny tiles for small M (decode): libraries run these as swap-AB / GEMV-like kernels, so a
# handful of tokens does not pay for a 64- or 128-row tile.
_SKINNY = ((16, 128), (32, 128))
# cuBLAS/CUTLASS sm70 HMMA kernels.
_VOLTA_TILES = ((256, 128), (128, 256), (128, 128), (128, 64), (64, 128), (64, 64)) + _SKINNY
# cuBLAS sm80: large smem (164 KB) allows 256-wide tiles in both orientations.
_AMPERE_TILES = ((256, 128), (128, 256), (256, 64), (64, 256), (128, 128), (128, 64),
                 (64, 128), (64, 64)) + _SKINNY
# sm86/sm89 (A40, A10, L4, RTX 4090): 100 KB smem, no 256x128 at full pipelining depth.
_GA10X_TILES = ((128, 256), (256, 128), (128, 128), (128, 64), (64, 128), (64, 64)) + _SKINNY
# sm90 wgmma kernels (CUTLASS 3 / cuBLAS 12): M per warpgroup 64, N up to 256.
_HOPPER_TILES = ((128, 256), (256, 128), (128, 128), (64, 256), (128, 64), (64, 128),
                 (64, 64)) + _SKINNY
# sm100 tcgen05 kernels: 2-SM 256-wide MMAs in addition to Hopper-like shapes.
_BLACKWELL_TILES = ((256, 256), (256, 128), (128, 256), (128, 128), (128, 64), (64, 128)) + _SKINNY
# rocBLAS / hipBLASLt (Tensile) macro tiles on CDNA.
_CDNA_TILES = ((256, 256), (256, 128), (128, 256), (128, 128), (128, 64), (64, 128),
               (64, 64)) + _SKINNY

_GPUS: dict[str, GPUSpec] = {}


# Maximum board power (W), from the same datasheets as the rest of each entry.
_TDP_W = {"p100-pcie": 250, "p4": 75, "v100-sxm2": 300, "v100-pcie": 250, "t4": 70,
          "a100-sxm4-40gb": 400, "a100-sxm4-80gb": 400, "a100-pcie-40gb": 250,
          "a100-pcie-80gb": 300, "a40": 300, "a10": 150, "l4": 72, "rtx-4090": 450,
          "h100-sxm": 700, "h100-pcie": 350, "h200-sxm": 700, "b200": 1000, "mi210": 300,
          "mi250x-gcd": 280, "mi250-gcd": 250, "mi100": 300}  # MI250X: 560 W, MI250: 500 W
# for two GCDs


# Base clocks (MHz) of the GPUs with fp32 measurements and the low-power parts: NVIDIA
# datasheets (P4: 810 with the 1063 boost above; T4: 585; L4: 795; P100 PCIe: 1126; V100
# PCIe: 1230; A100 PCIe: 765), as also listed by TechPowerUp's GPU database.
_BASE_CLOCK_MHZ = {"p4": 810, "t4": 585, "l4": 795, "p100-pcie": 1126, "v100-pcie": 1230,
                   "a100-pcie-40gb": 765, "a100-pcie-80gb": 1065}


def _add(spec: GPUSpec) -> None:
    if spec.tdp_w is None and spec.name in _TDP_W:
        spec = dataclasses.replace(spec, tdp_w=float(_TDP_W[spec.name]))
    if spec.base_clock_mhz is None and spec.name in _BASE_CLOCK_MHZ:
        spec = dataclasses.replace(spec, base_clock_mhz=_BASE_CLOCK_MHZ[spec.name])
    if spec.name in _GPUS:
        raise ValueError(f"duplicate GPU entry {spec.name}")
    _GPUS[spec.name] = spec


# Pascal has no tensor cores: only the fp32 (SIMT sgemm) path is modelled; the tile menu below
# is unused by it (fxshape.cost.simt holds the sgemm kernels) but a GPUSpec needs one.
# Source: NVIDIA Tesla P100 PCIe datasheet (16 GB: 9.3 TFLOPS fp32 at 1303 MHz boost, 56 SMs x
# 64 FP32 cores, 732 GB/s HBM2); Pascal GP100 whitepaper (4 MB L2).
_add(GPUSpec("p100-pcie", "nvidia", "pascal", 56, 1303, Peaks(None, None, None, 9.3),
             732.0, 4.0, 16.0, 16, 16, _VOLTA_TILES,
             "NVIDIA Tesla P100 PCIe datasheet; GP100 whitepaper"))
# Source: NVIDIA Tesla P4 datasheet (5.5 TFLOPS fp32 at 1063 MHz boost, 2560 CUDA cores = 20
# SMs x 128, 192 GB/s GDDR5, 8 GB, 75 W); GP104 (GTX 1080 whitepaper: 2 MB L2).
_add(GPUSpec("p4", "nvidia", "pascal", 20, 1063, Peaks(None, None, None, 5.5),
             192.0, 2.0, 8.0, 16, 16, _VOLTA_TILES,
             "NVIDIA Tesla P4 datasheet; GTX 1080 (GP104) whitepaper"))
# Source: NVIDIA Tesla V100 datasheet (2018) and Volta architecture whitepaper (WP-08608-001).
_add(GPUSpec("v100-sxm2", "nvidia", "volta", 80, 1530, Peaks(125.0, None, None, 15.7),
             900.0, 6.0, 32.0, 16, 16, _VOLTA_TILES,
             "NVIDIA Tesla V100 datasheet; Volta whitepaper"))
# Source: the same datasheet: the V100 came with 16 or 32 GB of HBM2 at the same 900 GB/s
# (the 16 GB boards are what older cloud instances carry: "Tesla V100-SXM2-16GB").
_add(dataclasses.replace(_GPUS["v100-sxm2"], name="v100-sxm2-16gb", memory_gb=16.0,
                         source="NVIDIA Tesla V100 datasheet (SXM2, 16 GB)"))
# Source: NVIDIA Tesla V100 datasheet (PCIe column).
_add(GPUSpec("v100-pcie", "nvidia", "volta", 80, 1380, Peaks(112.0, None, None, 14.0),
             900.0, 6.0, 32.0, 16, 16, _VOLTA_TILES, "NVIDIA Tesla V100 datasheet (PCIe)"))
_add(dataclasses.replace(_GPUS["v100-pcie"], name="v100-pcie-16gb", memory_gb=16.0,
                         source="NVIDIA Tesla V100 datasheet (PCIe, 16 GB)"))
# Source: NVIDIA Tesla T4 datasheet; Turing architecture whitepaper.
_add(GPUSpec("t4", "nvidia", "turing", 40, 1590, Peaks(65.0, None, None, 8.1),
             320.0, 4.0, 16.0, 16, 16, _VOLTA_TILES, "NVIDIA T4 datasheet; Turing whitepaper"))
# Source: NVIDIA A100 datasheet (2021, SXM4 40GB column); Ampere GA100 whitepaper.
_add(GPUSpec("a100-sxm4-40gb", "nvidia", "ampere", 108, 1410,
             Peaks(312.0, 312.0, 156.0, 19.5), 1555.0, 40.0, 40.0, 16, 128, _AMPERE_TILES,
             "NVIDIA A100 datasheet (SXM4 40GB); GA100 whitepaper"))
# Source: NVIDIA A100 datasheet (2021, SXM4 80GB column).
_add(GPUSpec("a100-sxm4-80gb", "nvidia", "ampere", 108, 1410,
             Peaks(312.0, 312.0, 156.0, 19.5), 2039.0, 40.0, 80.0, 16, 128, _AMPERE_TILES,
             "NVIDIA A100 datasheet (SXM4 80GB)"))
# Source: NVIDIA A100 datasheet (2021, PCIe 40GB column).
_add(GPUSpec("a100-pcie-40gb", "nvidia", "ampere", 108, 1410,
             Peaks(312.0, 312.0, 156.0, 19.5), 1555.0, 40.0, 40.0, 16, 128, _AMPERE_TILES,
             "NVIDIA A100 datasheet (PCIe 40GB)"))
# Source: NVIDIA A100 datasheet (2021, PCIe 80GB column).
_add(GPUSpec("a100-pcie-80gb", "nvidia", "ampere", 108, 1410,
             Peaks(312.0, 312.0, 156.0, 19.5), 1935.0, 40.0, 80.0, 16, 128, _AMPERE_TILES,
             "NVIDIA A100 datasheet (PCIe 80GB)"))
# Source: NVIDIA A40 datasheet (dense tensor figures); Ampere GA102 whitepaper.
_add(GPUSpec("a40", "nvidia", "ampere-ga10x", 84, 1740, Peaks(149.7, 149.7, 74.8, 37.4),
             696.0, 6.0, 48.0, 16, 128, _GA10X_TILES, "NVIDIA A40 datasheet; GA102 whitepaper"))
# Source: NVIDIA A10 datasheet (dense tensor figures).
_add(GPUSpec("a10", "nvidia", "ampere-ga10x", 72, 1695, Peaks(125.0, 125.0, 62.5, 31.2),
             600.0, 6.0, 24.0, 16, 128, _GA10X_TILES, "NVIDIA A10 datasheet"))
# Source: NVIDIA L4 datasheet (dense figures = half the sparse ones); Ada whitepaper.
_add(GPUSpec("l4", "nvidia", "ada", 58, 2040, Peaks(121.0, 121.0, 60.0, 30.3, 242.5),
             300.0, 48.0, 24.0, 16, 128, _GA10X_TILES, "NVIDIA L4 datasheet; Ada whitepaper"))
# Source: NVIDIA Ada Lovelace whitepaper (RTX 4090: FP16/FP8 tensor with FP32 accumulate).
_add(GPUSpec("rtx-4090", "nvidia", "ada", 128, 2520, Peaks(165.2, 165.2, 82.6, 82.6, 330.3),
             1008.0, 72.0, 24.0, 16, 128, _GA10X_TILES,
             "NVIDIA Ada Lovelace architecture whitepaper, RTX 4090 column"))
# Source: NVIDIA H100 datasheet (SXM5 column, dense = half the sparse figures); Hopper whitepaper.
_add(GPUSpec("h100-sxm", "nvidia", "hopper", 132, 1980,
             Peaks(989.4, 989.4, 494.7, 66.9, 1978.9), 3350.0, 50.0, 80.0, 16, 128,
             _HOPPER_TILES, "NVIDIA H100 datasheet (SXM); Hopper whitepaper"))
# Source: NVIDIA H100 datasheet (PCIe column, dense figures).
_add(GPUSpec("h100-pcie", "nvidia", "hopper", 114, 1755,
             Peaks(756.5, 756.5, 378.0, 51.2, 1513.0), 2000.0, 50.0, 80.0, 16, 128,
             _HOPPER_TILES, "NVIDIA H100 datasheet (PCIe)"))
# Source: NVIDIA H800 product brief: the H100's GH100 configurations (SXM5: the H100 SXM's
# tensor peaks, 80 GB HBM3 at 3.35 TB/s, 700 W; PCIe: the H100 PCIe's, 350 W) with NVLink
# cut to 400 GB/s (8 links; the hgx-h800 and pairwise-h800 topologies) and FP64 to 1 TFLOPS
# (not modelled). The H100's constants: no H800 measurement here.
_add(dataclasses.replace(_GPUS["h100-sxm"], name="h800-sxm",
                         source="NVIDIA H800 product brief (SXM5: H100 SXM compute and "
                                "memory, NVLink 400 GB/s)"))
_add(dataclasses.replace(_GPUS["h100-pcie"], name="h800-pcie",
                         source="NVIDIA H800 product brief (PCIe: H100 PCIe compute and "
                                "memory, NVLink bridge 400 GB/s)"))
# Source: torchtitan, benchmarks/llama3_h100_202412_torchtitan.md ("Hardware"): Meta's Grand
# Teton H100s, "96GB HBM2e with 2.4 TB/sec peak memory bandwidth", run at "the default 500W
# power limit, although tuning it up to 700W TDP can potentially provide further speedups";
# the H100 SXM's SMs and tensor peaks (the same GH100 SXM5 part, footnote 2 there).
_add(dataclasses.replace(_GPUS["h100-sxm"], name="h100-sxm-hbm2e", memory_bandwidth_gbs=2400.0,
                         memory_gb=96.0, tdp_w=700.0, power_limit_w=500.0,
                         source="torchtitan benchmarks/llama3_h100_202412_torchtitan.md: H100 "
                                "SXM with 96 GB HBM2e at 2.4 TB/s, 500 W default limit "
                                "(700 W TDP)"))
# Source: NVIDIA H200 datasheet (SXM: H100 compute with 141 GB HBM3e at 4.8 TB/s).
_add(GPUSpec("h200-sxm", "nvidia", "hopper", 132, 1980,
             Peaks(989.4, 989.4, 494.7, 66.9, 1978.9), 4800.0, 50.0, 141.0, 16, 128,
             _HOPPER_TILES, "NVIDIA H200 datasheet (SXM)"))
# Source: NVIDIA HGX B200 / DGX B200 datasheets (per-GPU dense figures: half the sparse
# ones; HGX B200: FP4 144 PFLOPS and FP8 72 PFLOPS sparse for 8 GPUs); Blackwell whitepaper.
_add(GPUSpec("b200", "nvidia", "blackwell", 148, 1965,
             Peaks(2250.0, 2250.0, 1100.0, 75.0, 4500.0, 9000.0), 8000.0, 126.0, 180.0, 16,
             128, _BLACKWELL_TILES, "NVIDIA HGX B200 datasheet; Blackwell architecture whitepaper",
             tcgen05=True))
# --- GPUs users pick today (issue 50). Tensor peaks are dense (half the sparse figures NVIDIA
# quotes first). Where NVIDIA publishes no clock, ``boost_clock_mhz`` is the clock at which
# the SMs' dense tensor rate gives the bf16 peak (Hopper 4096, Blackwell 8192 FLOP per clock
# per SM: B200's 2250 TF at 148 SMs is 1856 MHz), said in the entry. None of these GPUs has
# a measurement here: each takes its family's fitted constants (``fxshape gpus`` says which).
# Source: NVIDIA H100 datasheet (NVL column: FP16/BF16 1,671, FP8 3,341, TF32 835 TFLOPS
# sparse; FP32 60 TFLOPS; 94 GB HBM3 at 3.9 TB/s; 350-400 W); 132 SMs as the SXM5 (Hopper
# whitepaper); 1785 MHz boost as TechPowerUp's GPU database lists it (60 TF FP32 = 132 x 256
# x 1776 MHz).
_add(GPUSpec("h100-nvl", "nvidia", "hopper", 132, 1785,
             Peaks(835.5, 835.5, 417.5, 60.0, 1670.5), 3900.0, 50.0, 94.0, 16, 128,
             _HOPPER_TILES, "NVIDIA H100 datasheet (NVL)", tdp_w=400.0))
# Source: NVIDIA H200 datasheet (NVL column: FP16/BF16 1,671, FP8 3,341, TF32 835 TFLOPS
# sparse; FP32 60 TFLOPS; 141 GB HBM3e at 4.8 TB/s; up to 600 W); the H100 NVL's SMs and
# clock (same GH100 configuration and peaks).
_add(dataclasses.replace(_GPUS["h100-nvl"], name="h200-nvl", memory_bandwidth_gbs=4800.0,
                         memory_gb=141.0, tdp_w=600.0, source="NVIDIA H200 datasheet (NVL)"))
# Source: NVIDIA GH200 Grace Hopper Superchip datasheet (GPU: FP16/BF16 1,979, FP8 3,958,
# TF32 989 TFLOPS sparse, FP32 67 TFLOPS; 96 GB HBM3 at 4 TB/s, or 144 GB HBM3e at 4.9 TB/s;
# module power 450-1000 W, shared with the Grace CPU: no GPU figure); the H100 SXM5's SMs,
# clock and L2. "NVIDIA GH200 480GB" (96 GB HBM3 + 480 GB LPDDR5X) is the first.
_add(GPUSpec("gh200", "nvidia", "hopper", 132, 1980,
             Peaks(989.4, 989.4, 494.7, 66.9, 1978.9), 4000.0, 50.0, 96.0, 16, 128,
             _HOPPER_TILES, "NVIDIA GH200 Grace Hopper Superchip datasheet (96 GB HBM3)"))
_add(dataclasses.replace(_GPUS["gh200"], name="gh200-144gb", memory_bandwidth_gbs=4900.0,
                         memory_gb=144.0, source="NVIDIA GH200 Grace Hopper Superchip "
                                                 "datasheet (144 GB HBM3e)"))
# Source: NVIDIA GB200 NVL72 datasheet per GPU (rack: FP4 1,440, FP8 720, FP16/BF16 360,
# TF32 180 PFLOPS sparse for 72 GPUs; up to 13.4 TB HBM3e at 576 TB/s; 1,200 W per GPU), FP32
# 80 TFLOPS as Verda's per-GPU table quotes NVIDIA (verda.com/blog/gb300-nvl72-architecture);
# the B200's 148 SMs and L2; clock: 2,500 TF bf16 / (148 SMs x 8192) = 2062 MHz (derived).
_add(GPUSpec("gb200", "nvidia", "blackwell", 148, 2062,
             Peaks(2500.0, 2500.0, 1250.0, 80.0, 5000.0, 10000.0), 8000.0, 126.0, 186.0, 16,
             128, _BLACKWELL_TILES, "NVIDIA GB200 NVL72 datasheet (per GPU)", tdp_w=1200.0,
             tcgen05=True))
# Source: NVIDIA HGX B300 figures per GPU as Verda's table quotes them (FP8 4.5, FP16/BF16
# 2.25, TF32 1.1 PFLOPS dense; FP32 75 TFLOPS; 7.7 TB/s; 1.1 kW; FP4 rounded to 14: 13.5 is
# HGX B300's 108 PFLOPS dense for 8 GPUs, three times FP8); 288 GB HBM3e and
# 160 SMs from NVIDIA's Blackwell Ultra technical blog (Hot Chips 2025: 160 SMs, 640 tensor
# cores, up to 288 GB); the B200's L2; clock: 2,250 TF / (160 x 8192) = 1717 MHz (derived).
# Blackwell Ultra's tensor cores run NVFP4 at three times FP8, not twice.
_add(GPUSpec("b300", "nvidia", "blackwell", 160, 1717,
             Peaks(2250.0, 2250.0, 1100.0, 75.0, 4500.0, 13500.0), 7700.0, 126.0, 288.0, 16,
             128, _BLACKWELL_TILES, "NVIDIA HGX B300 (per GPU, as Verda quotes it); Blackwell "
             "Ultra technical blog", tdp_w=1100.0, sfu_per_clk_per_sm=32, tcgen05=True))
# Source: NVIDIA GB300 NVL72 per GPU as Verda's table quotes it (FP4 15, FP8 5, FP16/BF16
# 2.5, TF32 1.25 PFLOPS dense; FP32 80 TFLOPS; 8 TB/s; 1.4 kW); 288 GB HBM3e and 160 SMs
# (Blackwell Ultra technical blog); clock: 2,500 TF / (160 x 8192) = 1907 MHz (derived).
_add(GPUSpec("gb300", "nvidia", "blackwell", 160, 1907,
             Peaks(2500.0, 2500.0, 1250.0, 80.0, 5000.0, 15000.0), 8000.0, 126.0, 288.0, 16,
             128, _BLACKWELL_TILES, "NVIDIA GB300 NVL72 (per GPU, as Verda quotes it); "
             "Blackwell Ultra technical blog", tdp_w=1400.0, sfu_per_clk_per_sm=32,
             tcgen05=True))
# Source: NVIDIA L40S datasheet (FP16/BF16 362.05, TF32 183, FP8 733 TFLOPS dense; FP32 91.6
# TFLOPS; 48 GB GDDR6 at 864 GB/s; 350 W); 142 SMs (18,176 CUDA cores / 128) at 1110 MHz base
# and 2520 MHz boost (TechPowerUp's GPU database); 96 MiB of L2 as measured on the L40, the
# same AD102 configuration (arXiv 2606.22588).
_add(GPUSpec("l40s", "nvidia", "ada", 142, 2520, Peaks(362.05, 362.05, 183.0, 91.6, 733.0),
             864.0, 96.0, 48.0, 16, 128, _GA10X_TILES, "NVIDIA L40S datasheet",
             tdp_w=350.0, base_clock_mhz=1110))
# sm120 (GB202): Blackwell's block-scaled formats on mma.sync tensor cores, no tcgen05 and no
# 2-SM tiles, 128 KB of shared memory per SM: Ada's tile menu. Family: the B200's constants
# (tcgen05 kernels; unvalidated here).
# Source: NVIDIA RTX PRO 6000 Blackwell Server Edition: 188 SMs (24,064 CUDA cores), 96 GB
# GDDR7 on a 512-bit bus at 28 Gbps (1,792 GB/s, the same memory on all three editions), 128 MB
# L2, 600 W, FP32 120 TFLOPS for the Server Edition (NVIDIA's figure: 2493 MHz = 120 TF / (188
# x 256)); tensor peaks derived at that clock from the 4,000 FP4 TOPS (sparse) NVIDIA quotes
# at about 2.6 GHz: 4096 dense FP4, 2048 FP8, 1024 FP16/BF16 (FP32 accumulate on RTX PRO)
# and 512 TF32 FLOP per clock per SM.
_add(GPUSpec("rtx-pro-6000-server", "nvidia", "blackwell", 188, 2493,
             Peaks(480.0, 480.0, 240.0, 120.0, 960.0, 1920.0), 1792.0, 128.0, 96.0, 16, 128,
             _GA10X_TILES, "NVIDIA RTX PRO 6000 Blackwell Server Edition (derived peaks)",
             tdp_w=600.0))
# Source: AMD Instinct MI100 datasheet (CDNA, the first generation: 120 CUs at 1502 MHz; FP16
# matrix 184.6, bf16 92.3 (half the fp16 rate on CDNA1), FP32 vector 23.1 and matrix 46.1
# TFLOPS; 32 GB HBM2 at 1.2288 TB/s; 8 MB L2; 300 W), as AMD's launch material and the ROCm
# documentation's MI100 hardware page quote it.
_add(GPUSpec("mi100", "amd", "cdna1", 120, 1502,
             Peaks(184.6, 92.3, None, 23.1, fp32_matrix=46.1),
             1228.8, 8.0, 32.0, 16, 128, _CDNA_TILES, "AMD Instinct MI100 datasheet"))
# Source: AMD Instinct MI210 datasheet (CDNA2: FP32 vector 22.6, FP32 matrix 45.3 TFLOPS).
_add(GPUSpec("mi210", "amd", "cdna2", 104, 1700,
             Peaks(181.0, 181.0, None, 22.6, fp32_matrix=45.3),
             1638.0, 8.0, 64.0, 16, 128, _CDNA_TILES, "AMD Instinct MI210 datasheet"))
# Source: AMD Instinct MI250X datasheet, halved: PyTorch sees each of the two GCDs as a device
# (220 CUs, FP16 383, FP32 vector 47.9 and matrix 95.7 TFLOPS, 3.2 TB/s for two GCDs).
_add(GPUSpec("mi250x-gcd", "amd", "cdna2", 110, 1700,
             Peaks(191.5, 191.5, None, 23.9, fp32_matrix=47.9),
             1638.0, 8.0, 64.0, 16, 128, _CDNA_TILES,
             "AMD Instinct MI250X datasheet, per GCD (383 TF fp16 / 3.2 TB/s for two GCDs)"))
# Source: AMD Instinct MI250 datasheet, halved as the MI250X's (208 CUs, FP16 362.1, FP32
# vector 45.3 and matrix 90.5 TFLOPS, 128 GB HBM2e at 3.2 TB/s, 500 W for two GCDs): the
# MI250X's package with 104 CUs a GCD, the MI210's count.
_add(GPUSpec("mi250-gcd", "amd", "cdna2", 104, 1700,
             Peaks(181.0, 181.0, None, 22.6, fp32_matrix=45.3),
             1638.0, 8.0, 64.0, 16, 128, _CDNA_TILES,
             "AMD Instinct MI250 datasheet, per GCD (362 TF fp16 / 3.2 TB/s for two GCDs)"))
# Source: AMD Instinct MI300X datasheet (dense figures); CDNA3 whitepaper (4 MB L2 per XCD x 8).
_add(GPUSpec("mi300x", "amd", "cdna3", 304, 2100,
             Peaks(1307.4, 1307.4, 653.7, 163.4, 2614.9), 5300.0, 32.0, 192.0, 16, 128,
             _CDNA_TILES, "AMD Instinct MI300X datasheet; CDNA3 whitepaper"))

# Source: AMD Instinct MI325X datasheet (CDNA3: the MI300X's 304 CUs at 2100 MHz and peaks,
# FP16/BF16 1307.4 and FP8 2614.9 TFLOPS dense; 256 GB HBM3E at 6 TB/s; 1000 W).
_add(GPUSpec("mi325x", "amd", "cdna3", 304, 2100,
             Peaks(1307.4, 1307.4, 653.7, 163.4, 2614.9), 6000.0, 32.0, 256.0, 16, 128,
             _CDNA_TILES, "AMD Instinct MI325X datasheet", tdp_w=1000.0))
# CDNA4, priced with the CDNA3 family's rules and the family's constants (the MI250X fit).
# Source: AMD Instinct MI355X (ISSCC 2026 and Hot Chips 2025: 8 XCDs x 32 CUs at up to 2400
# MHz, 8192 dense FP8 FLOP per clock per CU = 5.03 PFLOPS, FP16/BF16 half, MXFP4/MXFP6 twice;
# 288 GB HBM3E at 8 TB/s; 1400 W); FP32 vector 157.3 TFLOPS = 256 CUs x 256 x 2.4 GHz, as for
# CDNA3 (MI300X: 163.4 = 304 x 256 x 2.1 GHz); 4 MB L2 per XCD; no TF32 in AMD's figures.
_add(GPUSpec("mi355x", "amd", "cdna3", 256, 2400,
             Peaks(2516.6, 2516.6, None, 157.3, 5033.2, 10066.3), 8000.0, 32.0, 288.0, 16,
             128, _CDNA_TILES, "AMD Instinct MI355X (ISSCC 2026; Hot Chips 2025)",
             tdp_w=1400.0))

#: Short names and the SKU each resolves to (documented in docs/model.md).
ALIASES = {
    "p100": "p100-pcie",
    "p4": "p4",
    "v100": "v100-sxm2",
    "t4": "t4",
    "a100": "a100-sxm4-80gb",
    "a100-40gb": "a100-sxm4-40gb",
    "a100-80gb": "a100-sxm4-80gb",
    "a100-sxm": "a100-sxm4-80gb",
    "a100-pcie": "a100-pcie-80gb",
    "a40": "a40",
    "a10": "a10",
    "l4": "l4",
    "4090": "rtx-4090",
    "rtx4090": "rtx-4090",
    "h100": "h100-sxm",
    "h800": "h800-sxm",
    "h200": "h200-sxm",
    "b200": "b200",
    "gb200": "gb200",
    "b300": "b300",
    "gb300": "gb300",
    "gh200": "gh200",
    "l40s": "l40s",
    "rtx-pro-6000": "rtx-pro-6000-server",
    "mi325x": "mi325x",
    "mi355x": "mi355x",
    "mi100": "mi100",
    "mi210": "mi210",
    "mi250x": "mi250x-gcd",
    "mi250": "mi250-gcd",
    "mi300x": "mi300x",
}


#: Device names as drivers print them (``torch.cuda.get_device_name()``, ``nvidia-smi``,
#: ``rocm-smi``, a Kineto trace's ``deviceProperties``), matched exactly after
#: :func:`_device_key` (lower case, runs of spaces as one), never by substring: a GH200 is
#: not an H200 and the 40 GB ``A100-PG509-200`` is not the 80 GB A100.
DEVICE_NAMES = {
    "tesla p100-pcie-16gb": "p100-pcie",
    "tesla p4": "p4",
    "tesla v100-sxm2-32gb": "v100-sxm2",
    "tesla v100-sxm2-16gb": "v100-sxm2-16gb",
    "tesla v100-pcie-32gb": "v100-pcie",
    "tesla v100-pcie-16gb": "v100-pcie-16gb",
    "tesla t4": "t4",
    "nvidia a100-sxm4-40gb": "a100-sxm4-40gb",
    # the SXM4 40 GB board as AWS's p4d instances report it (PG509-200)
    "nvidia a100-pg509-200": "a100-sxm4-40gb",
    "nvidia a100-sxm4-80gb": "a100-sxm4-80gb",
    "nvidia a100-pcie-40gb": "a100-pcie-40gb",
    "nvidia a100 80gb pcie": "a100-pcie-80gb",
    "nvidia a40": "a40",
    "nvidia a10": "a10",
    "nvidia l4": "l4",
    "nvidia geforce rtx 4090": "rtx-4090",
    "nvidia h100 80gb hbm3": "h100-sxm",
    "nvidia h100 pcie": "h100-pcie",
    "nvidia h200": "h200-sxm",
    "nvidia b200": "b200",
    "nvidia h100 nvl": "h100-nvl",
    "nvidia h200 nvl": "h200-nvl",
    "nvidia gh200 480gb": "gh200",
    "nvidia gh200 144g hbm3e": "gh200-144gb",
    "nvidia gb200": "gb200",
    "nvidia b300 sxm6 ac": "b300",
    "nvidia gb300": "gb300",
    "nvidia l40s": "l40s",
    "nvidia rtx pro 6000 blackwell server edition": "rtx-pro-6000-server",
    "amd instinct mi325x": "mi325x",
    "amd instinct mi355x": "mi355x",
    "amd instinct mi100": "mi100",
    "amd instinct mi210": "mi210",
    "amd instinct mi250x": "mi250x-gcd",
    "amd instinct mi250": "mi250-gcd",
    "amd instinct mi300x": "mi300x",
    # SR-IOV virtual functions (cloud VMs) are the same GPU
    "amd instinct mi300x vf": "mi300x",
}
#: Device names drivers print for GPUs the table does not have (yet), or for more than one
#: entry: the reason, said in the error instead of a guess.
UNRESOLVED_DEVICE_NAMES = {
    "amd instinct mi250x/mi250": "ROCm prints this for both the MI250X and the MI250: "
                                 "pass mi250x or mi250",
    "nvidia a10g": "the A10G (AWS) is another GA102 configuration than the A10: no entry",
    "nvidia h800": "the name the driver prints for each H800 board is not recorded here: "
                   "pass h800-sxm or h800-pcie",
    "nvidia h20": "no entry: NVIDIA publishes no SM count or clock for the H20, whose "
                  "tensor rate (148 TFLOPS bf16 on a GH100) is capped by more than its "
                  "clock, so no per-clock entry can be derived",
    "nvidia rtx pro 6000 blackwell workstation edition": "the Workstation Edition clocks "
                                                         "higher than the Server Edition "
                                                         "(rtx-pro-6000-server): no entry",
}


def _device_key(name: str) -> str:
    return " ".join(name.strip().lower().split())


def list_gpus() -> list[str]:
    """Canonical names of every GPU in the table, sorted."""
    return sorted(_GPUS)


def gpus_of_arch(arch: str) -> str:
    """The table's GPUs of architecture family ``arch``, joined for an error message
    (``"b200, b300, gb200, ..."``): what a kernel or format that needs it can run on."""
    return ", ".join(n for n in sorted(_GPUS) if _GPUS[n].arch == arch)


def get_gpu(name) -> GPUSpec:
    """Look up a GPU by canonical name or alias (case-insensitive).

    Args:
        name: e.g. ``"h100"``, ``"A100-SXM4-40GB"``, ``"mi250x"``, or a ``GPUSpec`` (returned as is);
            ``"h100-sxm@500w"``: the GPU under a 500 W power limit
            (:meth:`GPUSpec.with_power_limit`).

    Raises:
        ValueError: unknown name; the message lists the known names and aliases.
    """
    if isinstance(name, GPUSpec):
        return name
    if not isinstance(name, str):
        raise ValueError(f"GPU name must be a string, got {name!r}")
    if "@" in name:  # "h100-sxm@500w": the GPU under a power limit
        base, _, limit = name.rpartition("@")
        watts = limit.strip().lower().removesuffix("w").strip()
        try:
            value = float(watts)
        except ValueError:
            raise ValueError(f"GPU {name!r}: the power limit after '@' must be watts, e.g. "
                             f"'{base.strip()}@500w'") from None
        return get_gpu(base).with_power_limit(value)
    dev = _device_key(name)
    if dev in DEVICE_NAMES:
        return _GPUS[DEVICE_NAMES[dev]]
    key = name.strip().lower().replace("_", "-").replace(" ", "-")
    key = ALIASES.get(key, key)
    if key in _GPUS:
        return _GPUS[key]
    why = UNRESOLVED_DEVICE_NAMES.get(dev)
    raise ValueError(f"unknown GPU {name!r}" + (f" ({why})" if why else "") + "; "
                     + _close_matches(name) + " (fxshape gpus lists them all)")


def _close_matches(name: str) -> str:
    """'close matches: ...': the entries whose names, aliases or device names are nearest
    ``name`` (difflib), or every entry's name."""
    import difflib

    target = {**{n: n for n in _GPUS}, **ALIASES, **DEVICE_NAMES}
    low = _device_key(name)
    close = []
    for query in (low, low.replace(" ", "-")):  # as a device string, as a model number
        for c in difflib.get_close_matches(query, sorted(target), n=8, cutoff=0.5):
            if target[c] not in close:
                close.append(target[c])
    if not close:
        return "known GPUs: " + ", ".join(list_gpus())
    return "close matches: " + ", ".join(close[:5])
