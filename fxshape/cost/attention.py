"""The attention performance model: predicted time of one fused attention call on a GPU.

Pure functions of (batch, heads, kv heads, seq_q, seq_k, head_dim, causal, dtype, direction,
kernel, GPU). The model, in one paragraph (docs/attention.md has the long version):

A flash kernel (FlashAttention-2, the kernel PyTorch's ``scaled_dot_product_attention`` runs
on Ampere and Hopper; FlashAttention-3 on Hopper) gives one CTA a tile of ``Br`` query rows
(forward) or ``Bc`` key rows (backward) of one (batch, head) and loops over the other sequence
in blocks. Each block costs, in SM clocks: the tensor-core work of its GEMMs at the rate the
kernel's MMA instructions sustain (FA2's ``mma.sync`` also bounded by the shared-memory
stream its warps load their operands from, 128 bytes per clock per SM: on Hopper that, not
the tensor cores, sets its pace), the softmax's exponentials on the special-function units
(16 per clock per SM) or its other FP32 work, whichever is longer, the online-softmax
rescale of the output tile, and a fixed cost per block and warp; FA2 runs these one after
the other, FA3 overlaps the softmax with the GEMMs. The K/V (forward) or Q/dO (backward)
tile loads from L2 bound a block from below. A CTA adds a fixed cost and the load and store
of its own tiles at one SM's streaming rate. CTAs are scheduled over the SMs in waves; a
causal mask skips the blocks above the diagonal, and the uneven CTAs that leaves cost
``(longest - mean) / waves`` over the mean. The backward runs its five GEMMs at a fitted
fraction of the forward's rate. The chip's power limit (the GEMM fit's ``power_eff``), the
DRAM traffic (Q, K, V, O, and the backward's fp32 dQ accumulator) and the launch latencies
come from the GEMM model's constants for the same GPU. The unfused ``math`` path
(``attn_implementation="eager"``) is the GEMM model's two batched GEMMs (four in the
backward) plus elementwise kernels streaming the score matrix (softmax, mask, casts) and
layout copies of Q, K, V and O, at fitted bytes per score.

Constants are fitted by ``bench/fit_attention.py`` to ``../shared/calibration/attention/``
(H100, FA2 and unfused, forward) and to the FlashAttention-3 paper's other H100 figures
(``bench/attention_published.csv``: backward, FA3, head_dim 256), and read from
``fxshape/data/attention_params.json``. They are algorithm constants (fractions of an
instruction's rate, clocks per block), so other GPUs get predictions from their own SM
count, clocks, tensor-core and FP32 rates, SFUs, L2 and DRAM bandwidth; those predictions
are not validated against measurements (``AttentionPrediction.validated`` says which are).

Today's kernels (issue 50) have forward constants of their own (:class:`KernelParams`, the
``kernels`` section of the same file), fitted by ``bench/fit_attention_aiconfigurator.py`` on
vLLM 0.24's attention layer as aiconfigurator timed it: FlashAttention-3 on the H100 and
FlashInfer's TensorRT-LLM kernels (``"trtllm"``, tcgen05, datacenter Blackwell) on the B200.
``attention="vllm"`` runs what vLLM picks on the GPU. ``AttentionShape.window`` prices a
sliding window by the K/V blocks inside its band.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import asdict, dataclass, replace

from ..hardware.dtypes import canonical_dtype, itemsize, kv_format
from ..hardware.gpus import GPUSpec, get_gpu, gpus_of_arch

__all__ = ["AttentionShape", "AttentionParams", "AttentionPrediction", "KernelParams",
           "predict_attention", "resolve_kernel", "attention_params", "kernel_params",
           "ATTENTION_CHOICES", "KERNELS", "FLASH_HEAD_DIMS", "FA3_HEAD_DIMS",
           "TRTLLM_HEAD_DIMS", "flash_head_dim", "DIRECTIONS", "forget_params_files"]

#: what ``analyze(..., attention=)`` accepts: ``"flash"`` is what PyTorch's
#: ``scaled_dot_product_attention`` runs on the GPU; the others name a kernel.
#: ``"cudnn"``: cuDNN's fused attention (SDPA's cuDNN backend); ``"trtllm"``: FlashInfer's
#: TensorRT-LLM kernels (datacenter Blackwell); ``"vllm"``: the kernel vLLM picks on the GPU
#: (:func:`resolve_kernel` says which).
ATTENTION_CHOICES = ("flash", "fa2", "fa3", "cudnn", "trtllm", "vllm", "math")
#: kernels the model predicts (``mem_efficient``: PyTorch's flash backend is sm80+, so Volta
#: and Turing run the CUTLASS memory-efficient kernel, the same algorithm)
KERNELS = ("fa2", "fa3", "cudnn", "trtllm", "mem_efficient", "math")
#: kernels priced with another's constants, and why: cuDNN's Hopper attention runs the
#: same warp-specialized wgmma pipeline as FlashAttention-3 and measures the same forward
#: throughput (631.3 and 631.8 TFLOP/s at batch 1, 24 heads, 4608 tokens, head_dim 128 on an
#: H100: Tritonbench, pytorch/pytorch#142132); its backward is taken as FA3's too (not
#: measured here). A decode-shaped call of such a kernel takes the shared split-KV decode
#: constants (``fxshape.cost.decode_attention``), not the other kernel's own.
PRICED_AS = {"cudnn": "fa3"}
DIRECTIONS = ("forward", "backward")
#: head dimensions FlashAttention-2 is compiled for; others run padded up to the next
FLASH_HEAD_DIMS = (32, 64, 96, 128, 160, 192, 224, 256)
#: head dimensions FlashAttention-3 is compiled for
FA3_HEAD_DIMS = (64, 96, 128, 192, 256)
#: head dimensions FlashInfer's TensorRT-LLM (trtllm-gen) attention kernels take, as vLLM
#: 0.24 runs them (aiconfigurator's B200 tables: 64, 128, 256 and 512; vLLM sends 192 to
#: its Triton kernel)
TRTLLM_HEAD_DIMS = (64, 128, 256, 512)
_FUSED_DTYPES = {"fa2": ("fp16", "bf16"), "mem_efficient": ("fp16", "bf16", "fp32"),
                 "fa3": ("fp16", "bf16", "fp8"), "trtllm": ("fp16", "bf16", "fp8"),
                 "cudnn": ("fp16", "bf16")}
# kernels whose forward has constants of its own, fitted on today's library
# (bench/fit_attention_aiconfigurator.py; the ``kernels`` section of attention_params.json)
_KERNEL_TABLE_KERNELS = ("fa3", "trtllm")
# architectures whose native tensor-core instruction is not Ampere's mma.sync (FA2 and the
# memory-efficient kernel use mma.sync there, at a fraction of the dense peak)
NEWER_MMA = ("hopper", "blackwell")
# the data in ../shared/calibration/attention/: (kernel, architecture) pairs measured
# Shared-memory bandwidth per SM (CU): 32 banks x 4 bytes per clock on every NVIDIA SM since
# Volta (CUDA C++ Programming Guide, "Shared Memory"); AMD CDNA's LDS also serves 128 bytes
# per clock per CU (CDNA ISA guides).
_SMEM_BYTES_PER_CLK = 128
_MEASURED = {(k, "hopper", d) for k in ("fa2", "fa3", "math") for d in DIRECTIONS} | \
    {("trtllm", "blackwell", "forward")}
_DEFAULT_PARAMS_PATH = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data",
                                    "attention_params.json")


def flash_head_dim(d: int, dims=FLASH_HEAD_DIMS) -> int:
    """The head dimension a flash kernel runs ``d`` at (80 -> 96, 100 -> 128); beyond the
    largest, the next multiple of 64 (reported, never silently)."""
    for h in dims:
        if d <= h:
            return h
    return -(-d // 64) * 64


@dataclass(frozen=True)
class AttentionShape:
    """One attention call: ``softmax(Q Kᵀ · scale + mask) V`` per (batch, head).

    ``heads`` query heads share ``kv_heads`` K/V heads (grouped-query attention; equal for
    multi-head attention). ``head_dim_v`` is V's head dimension (usually ``head_dim``).
    """

    batch: int
    heads: int
    kv_heads: int
    seq_q: int
    seq_k: int
    head_dim: int
    head_dim_v: int
    causal: bool = False
    #: sliding-window attention (Mistral, Gemma, gpt-oss): each query sees at most the
    #: ``window`` keys ending at its own position (causal); 0: no window
    window: int = 0

    def __post_init__(self):
        for name in ("batch", "heads", "kv_heads", "seq_q", "seq_k", "head_dim", "head_dim_v"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"attention {name} must be a positive integer, got {v!r}")
        if self.heads % self.kv_heads:
            raise ValueError(f"{self.heads} query heads cannot share {self.kv_heads} K/V heads "
                             "(kv_heads must divide heads)")
        w = self.window
        if isinstance(w, bool) or not isinstance(w, int) or w < 0:
            raise ValueError(f"attention window must be a non-negative integer (0: none), "
                             f"got {w!r}")
        if w and not self.causal:
            raise ValueError("a sliding window (window > 0) needs causal=True: the window "
                             "ends at each query's own position")

    @property
    def causal_fraction(self) -> float:
        """Fraction of the score matrix a causal mask keeps: 1/2 when ``seq_q == seq_k``
        (the papers' convention), else the exact top-left-aligned share, as
        ``F.scaled_dot_product_attention(is_causal=True)`` masks. With a sliding window,
        the exact share of the band it keeps."""
        if not self.causal:
            return 1.0
        sq, sk, w = self.seq_q, self.seq_k, self.window
        if sq == sk and (not w or w >= sq):
            return 0.5

        def kept(rows):  # keys kept by the first ``rows`` query rows under a causal mask
            m = min(rows, sk)
            return m * (m + 1) // 2 + max(0, rows - sk) * sk

        # row i keeps keys (i - w, i]: its causal count less the causal count of row i - w
        k = kept(sq) - (kept(sq - w) if w and sq > w else 0)
        return k / (sq * sk)

    def flops(self, direction: str = "forward") -> int:
        """The papers' FLOP count: forward ``2·b·h·sq·sk·(d + dv)`` (= 4·b·h·s²·d), backward
        ``2·b·h·sq·sk·(3d + 2dv)`` (= 2.5 × forward when d = dv), times the causal share."""
        per = (self.head_dim + self.head_dim_v) if direction == "forward" else \
            (3 * self.head_dim + 2 * self.head_dim_v)
        return int(round(2 * self.batch * self.heads * self.seq_q * self.seq_k * per
                         * self.causal_fraction))


@dataclass(frozen=True)
class AttentionParams:
    """Fitted algorithm constants of the attention model (see the module docstring).

    Attributes:
        sync_mma_frac: fraction of the GEMM model's large-tile rate (``e_max`` of the dense
            peak) that FA2's ``mma.sync`` reaches on GPUs with a newer MMA (Hopper).
        fp32_ops_per_score: FP32 operations per score element (max, scale, subtract, sum,
            convert) in the softmax: counted from the kernel's instructions, not fitted.
        block_cycles: fixed SM clocks per K/V block of a CTA's loop (barriers, pipeline).
        cta_cycles: fixed SM clocks per CTA (Q load, prologue, epilogue, O store).
        bwd_mma_frac: the backward kernel's tensor-core rate as a fraction of its forward's
            (five dependent GEMMs per block with barriers between them, operands and the
            P and dS tiles through shared memory, twice the warps and registers).
        bwd_cta_cycles: fixed SM clocks per backward CTA (beside its tile loads and stores).
        fa3_mma_frac: fraction of the GEMM model's large-tile rate FA3's ``wgmma`` reaches
            inside the attention pipeline.
        fa3_bwd_mma_frac: ``bwd_mma_frac`` for FA3's backward.
        math_bytes_per_score: DRAM bytes per score element moved by the unfused path's
            elementwise kernels (scale, mask, softmax, dropout, casts) between its GEMMs.
        math_copy_passes: read+write passes over a Q-sized tensor the unfused path spends
            on layout copies (heads to the batch dimension and back, for ``bmm``).
        math_bwd_bytes_per_score: the same per score for the unfused backward (softmax
            backward, dropout backward, casts).
    """

    sync_mma_frac: float
    fp32_ops_per_score: float
    block_cycles: float
    cta_cycles: float
    bwd_mma_frac: float
    bwd_cta_cycles: float
    fa3_mma_frac: float
    fa3_bwd_mma_frac: float
    math_bytes_per_score: float
    math_copy_passes: float
    math_bwd_bytes_per_score: float

    FIELDS = ("sync_mma_frac", "fp32_ops_per_score", "block_cycles", "cta_cycles",
              "bwd_mma_frac", "bwd_cta_cycles", "fa3_mma_frac", "fa3_bwd_mma_frac",
              "math_bytes_per_score",
              "math_copy_passes", "math_bwd_bytes_per_score")


@dataclass(frozen=True)
class KernelParams:
    """Constants of one library's forward kernel as it runs today, fitted on that library's
    own measurements (``bench/fit_attention_aiconfigurator.py``: vLLM 0.24's FlashAttention-3
    on H100, FlashInfer's TensorRT-LLM kernels on B200) and read from the ``kernels`` section
    of ``attention_params.json``. They replace :class:`AttentionParams`' shared per-block
    and per-CTA constants for that kernel's forward; its backward (FA3) keeps the older fit.

    Attributes:
        mma_frac: fraction of the GEMM model's large-tile rate the kernel's MMAs reach.
        block_cycles: fixed SM clocks per K/V block of a CTA's loop.
        cta_cycles: fixed SM clocks per CTA (prologue, Q load, epilogue).
        call_s: fixed seconds per call beside the launch (the small kernels a serving
            engine's attention layer runs with it: scheduler metadata, sequence offsets).
        row_cycles: fixed SM clocks per query row of a CTA's tile, beside ``cta_cycles``:
            what a tile costs that is not in its K/V loop (normalizing and storing each
            row's output; in vLLM, reading the paged cache through its block table). It
            shows where a CTA runs few K/V blocks (sliding windows, prompts of a few hundred
            tokens): vLLM's FA3 on the H100 spends ~10 µs per 128-row tile there.
        layer_kv_bytes: DRAM bytes per new key or value element that the serving engine's
            attention layer moves beside the kernel (vLLM: writing the paged KV cache and
            the copies around it). Not part of :func:`predict_attention` (fxshape prices a
            cache write where the captured graph has one); the fit and the validation of
            vLLM's layer add it (``bench/fit_attention_aiconfigurator.py``).
        source: what the constants were fitted on.
    """

    mma_frac: float
    block_cycles: float
    cta_cycles: float
    call_s: float
    row_cycles: float = 0.0
    layer_kv_bytes: float = 0.0
    source: str = ""

    FIELDS = ("mma_frac", "block_cycles", "cta_cycles", "call_s", "row_cycles",
              "layer_kv_bytes")


@dataclass(frozen=True)
class AttentionPrediction:
    """What the model predicts for one attention call. Times in seconds."""

    gpu: str
    dtype: str
    kernel: str
    direction: str
    shape: AttentionShape
    flops: int  # the papers' convention (causal halved)
    time_s: float
    tflops: float
    efficiency: float  # of the dtype's dense peak
    peak_tflops: float
    tile: tuple[int, int]  # (Br, Bc) for fused kernels; the largest GEMM's tile for math
    run_head_dim: int  # head_dim the kernel runs at (padded up)
    ctas: int
    waves: int
    wave_efficiency: float  # CTA work / (waves x SMs x the longest CTA's work)
    compute_time_s: float
    memory_time_s: float
    bound: str  # "compute", "memory" or "latency"
    validated: bool  # measured data for this GPU architecture, kernel and direction exist
    note: str = ""
    #: launches: 2 for a split-KV decode call (the split kernel and the combine kernel)
    kernels: int = 1
    #: the decode path's prediction (``fxshape.cost.decode_attention``), else None
    decode: object = None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["tile"] = list(self.tile)
        return d


# ---------------------------------------------------------------------------------------
# Parameters
# ---------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _load(path: str) -> AttentionParams:
    with open(path) as f:
        data = json.load(f)
    return AttentionParams(**{k: float(data["params"][k]) for k in AttentionParams.FIELDS})


@functools.lru_cache(maxsize=None)
def _kernel_table(path: str) -> dict:
    """``{kernel: KernelParams}`` from the ``kernels`` section of an attention parameter
    file (empty where it has none)."""
    with open(path) as f:
        data = json.load(f)
    out = {}
    for name, entry in (data.get("kernels") or {}).items():
        if name not in _KERNEL_TABLE_KERNELS:
            raise ValueError(f"{path!r}: the kernels section names {name!r}; accepted: "
                             f"{', '.join(_KERNEL_TABLE_KERNELS)}")
        try:
            out[name] = KernelParams(**{k: float(entry[k]) for k in KernelParams.FIELDS},
                                     source=str(entry.get("source", "")))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{path!r}: kernel {name!r} lacks or mangles {exc}; it needs "
                             + ", ".join(KernelParams.FIELDS)) from None
    return out


def kernel_params(kernel: str, params_path: str | None = None) -> KernelParams | None:
    """The fitted constants of ``kernel``'s forward as today's library runs it, or None
    where the kernel shares :class:`AttentionParams`' constants."""
    return _kernel_table(_params_path(params_path)).get(kernel)


def _params_path(params_path: str | None) -> str:
    return params_path or os.environ.get("FXSHAPE_ATTENTION_PARAMS") or _DEFAULT_PARAMS_PATH


def attention_params(params_path: str | None = None, gpu=None) -> AttentionParams:
    """The fitted constants (``bench/fit_attention.py``; ``$FXSHAPE_ATTENTION_PARAMS``
    overrides the packaged file). With ``gpu``: overlaid with that GPU's entry in the
    ``attention`` section of the GEMM parameter file the GPU is priced with (its
    ``constants``, else ``use_params``, ``$FXSHAPE_PARAMS``), which ``fxshape calibrate
    --trace`` writes from a trace's SDPA kernels."""
    ap = _load(_params_path(params_path))
    if gpu is None:
        return ap
    from .gemm import is_default_params, resolve_params_path

    path = resolve_params_path(None, gpu)
    if is_default_params(path):
        return ap
    entry = (_overlay(path) or {}).get(get_gpu(gpu).name)
    return replace(ap, **entry) if entry else ap


@functools.lru_cache(maxsize=None)
def _overlay(path: str) -> dict | None:
    """The ``attention`` section of a GEMM parameter file (``{gpu: {constant: value}}``),
    checked, or None."""
    from .paramfile import gpu_section

    def check(name, entry):
        bad = sorted(set(entry) - set(AttentionParams.FIELDS))
        if bad:
            raise ValueError(f"{path!r}: attention entry for GPU {name!r} has unknown "
                             f"constants {', '.join(bad)}; accepted: "
                             f"{', '.join(AttentionParams.FIELDS)}")
        for k, v in entry.items():
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not v > 0:
                raise ValueError(f"{path!r}: attention constant {k} for GPU {name!r} must "
                                 f"be a positive number, got {v!r}")

    sec = gpu_section(path, "attention", check)
    return None if sec is None else {name: {k: float(v) for k, v in entry.items()}
                                     for name, entry in sec.items()}


def forget_params_files() -> None:
    """Drop the cached reading of parameter files (after one is rewritten)."""
    _load.cache_clear()
    _kernel_table.cache_clear()
    _overlay.cache_clear()
    _predict_cached.cache_clear()


# ---------------------------------------------------------------------------------------
# Which kernel
# ---------------------------------------------------------------------------------------

def resolve_kernel(attention: str, gpu, dtype, head_dim: int) -> tuple[str, str]:
    """``(kernel, note)``: the kernel an ``attention=`` choice runs on ``gpu`` for this dtype
    and head dimension.

    ``"flash"`` is what PyTorch 2.13's ``scaled_dot_product_attention`` picks: on sm90 and
    sm100 (Hopper, datacenter Blackwell) cuDNN's fused attention for fp16/bf16 at head_dim
    <= 256 (a multiple of 8): ``check_prefer_cudnn_attention`` in ``sdp_utils.cpp`` puts the
    cuDNN backend first there when the cuDNN is newer than 9.15, as the wheels bundle from
    PyTorch 2.11 on (2.5.0 preferred it too; 2.5.1 to 2.10 and older ran FlashAttention-2:
    give ``"fa2"`` for a run on those). FlashAttention-2 on the other sm80+ NVIDIA GPUs and
    AMD (the ROCm flash backend), the memory-efficient kernel on Volta and Turing, the math
    path where no fused kernel takes the dtype or head dimension (fp32 on sm80+, head_dim >
    256), said in the note. cuDNN's kernel is priced with FlashAttention-3's constants on
    Hopper (:data:`PRICED_AS`); on Blackwell it is not modelled: ``"flash"`` prices FA2 there
    and says so.

    ``"cudnn"`` names cuDNN's kernel (Hopper only, as above).

    ``"vllm"`` is what vLLM 0.24 runs (its attention backend's default): FlashAttention-3 on
    Hopper, FlashInfer's TensorRT-LLM kernels (``"trtllm"``) on datacenter Blackwell,
    FlashAttention-2 elsewhere. Where vLLM runs a kernel the model does not have (Triton
    attention for head_dim 192 on Blackwell, FlashAttention-4 for head_dim 512 on Hopper,
    ROCm's kernels on AMD), the nearest modelled kernel prices it and the note says so.

    Raises:
        ValueError: an unknown choice; ``"fa3"`` on a GPU that is not Hopper, ``"trtllm"``
            on one that is not datacenter Blackwell, or either with a dtype or head
            dimension the kernel does not take; ``"fa2"`` with a dtype or head dimension
            FA2 does not take.
    """
    if attention not in ATTENTION_CHOICES:
        raise ValueError(f"unknown attention kernel {attention!r}; accepted: "
                         f"{', '.join(repr(a) for a in ATTENTION_CHOICES)}")
    spec = get_gpu(gpu)
    dkey = canonical_dtype(dtype)
    if attention == "math":
        return "math", ""
    if attention == "vllm":
        return _vllm_kernel(spec, dkey, head_dim)
    if attention == "fa3":
        if spec.arch != "hopper":
            raise ValueError(f"attention='fa3' (FlashAttention-3) runs on Hopper GPUs only "
                             f"({gpus_of_arch('hopper')}); {spec.name} is {spec.arch}. Use "
                             "'flash' or 'math'.")
        if dkey not in _FUSED_DTYPES["fa3"] or head_dim > FA3_HEAD_DIMS[-1]:
            raise ValueError(f"FlashAttention-3 takes fp16/bf16/fp8 and head_dim <= 256; got "
                             f"{dkey}, head_dim {head_dim}")
        return "fa3", ""
    if attention == "cudnn":
        if spec.arch != "hopper":
            raise ValueError(f"attention='cudnn' (cuDNN's fused attention) is modelled on "
                             f"Hopper GPUs only ({gpus_of_arch('hopper')}); {spec.name} is "
                             f"{spec.arch}. Use 'flash', 'fa2' or 'math'.")
        if not _cudnn_takes(dkey, head_dim):
            raise ValueError(f"cuDNN's fused attention takes fp16/bf16 and head_dim <= 256, a "
                             f"multiple of 8; got {dkey}, head_dim {head_dim}")
        return "cudnn", ""
    if attention == "trtllm":
        if not spec.tcgen05:
            from ..hardware.gpus import list_gpus

            able = ", ".join(n for n in list_gpus() if get_gpu(n).tcgen05)
            raise ValueError(f"attention='trtllm' (FlashInfer's TensorRT-LLM kernels) runs on "
                             f"datacenter Blackwell GPUs only ({able}); {spec.name} is not "
                             "one. Use 'flash', 'vllm' or 'math'.")
        if dkey not in _FUSED_DTYPES["trtllm"] or head_dim > TRTLLM_HEAD_DIMS[-1]:
            raise ValueError(f"the TensorRT-LLM attention kernels take fp16/bf16/fp8 and "
                             f"head_dim <= {TRTLLM_HEAD_DIMS[-1]}; got {dkey}, head_dim "
                             f"{head_dim}")
        return "trtllm", ""
    fused = "mem_efficient" if spec.arch in ("volta", "turing") else "fa2"
    ok = dkey in _FUSED_DTYPES[fused] and head_dim <= FLASH_HEAD_DIMS[-1]
    if attention == "fa2":
        if spec.arch in ("volta", "turing"):
            raise ValueError(f"FlashAttention-2 needs sm80 or newer; {spec.name} is "
                             f"{spec.arch}. Use 'flash' (its memory-efficient kernel) or 'math'.")
        if not ok:
            raise ValueError(f"FlashAttention-2 takes fp16/bf16 and head_dim <= 256; got "
                             f"{dkey}, head_dim {head_dim}")
        return "fa2", ""
    if (spec.arch == "hopper" or spec.tcgen05) and _cudnn_takes(dkey, head_dim):  # sm90, sm100
        if spec.arch == "hopper":
            return "cudnn", _CUDNN_DEFAULT
        return fused, ("PyTorch 2.13's SDPA runs cuDNN's fused attention on sm100; not "
                       "modelled: priced as FlashAttention-2, slower than it")
    if not ok:
        why = (f"head_dim {head_dim} > 256" if head_dim > FLASH_HEAD_DIMS[-1]
               else f"{dkey} inputs")
        return "math", f"no flash kernel for {why}: PyTorch falls back to the math path"
    return fused, ""


#: the note of ``attention="flash"`` on Hopper
_CUDNN_DEFAULT = ("PyTorch 2.13's SDPA runs cuDNN's fused attention on sm90 (its cuDNN > "
                  "9.15: check_prefer_cudnn_attention); priced with FlashAttention-3's "
                  "constants (equal forward throughput measured); a run on PyTorch 2.5.1-2.10 "
                  "ran FlashAttention-2: attention='fa2'")


def _cudnn_takes(dkey: str, head_dim: int) -> bool:
    """Does cuDNN's fused attention take this (``sdp_utils.cpp``'s cuDNN checks)?"""
    return dkey in _FUSED_DTYPES["cudnn"] and head_dim <= 256 and head_dim % 8 == 0


def _vllm_kernel(spec: GPUSpec, dkey: str, head_dim: int) -> tuple[str, str]:
    """``attention="vllm"``: the kernel vLLM 0.24's default attention backend runs (as
    aiconfigurator's vLLM tables record it on H100 and B200), with a note where the model
    prices it as another kernel."""
    if dkey not in ("fp16", "bf16", "fp8"):
        raise ValueError(f"vLLM's attention kernels take fp16/bf16/fp8 inputs; got {dkey}")
    if spec.tcgen05:
        if head_dim in (160, 192):
            return "trtllm", ("vLLM runs its Triton attention kernel for head_dim "
                              f"{head_dim} on {spec.name}: priced as the TensorRT-LLM kernel "
                              "at head_dim 256, not validated (on the B200 the Triton kernel "
                              "measures ~3.5x slower in prefill, ~1.5x in decode: "
                              "bench/fit_attention_aiconfigurator.py)")
        if head_dim > TRTLLM_HEAD_DIMS[-1]:
            raise ValueError(f"vLLM has no attention kernel for head_dim {head_dim} on "
                             f"{spec.name} (at most {TRTLLM_HEAD_DIMS[-1]})")
        return "trtllm", ""
    if spec.arch == "hopper":
        if head_dim > FA3_HEAD_DIMS[-1]:
            if head_dim > 512:
                raise ValueError(f"vLLM has no attention kernel for head_dim {head_dim} on "
                                 f"{spec.name} (at most 512)")
            return "fa3", (f"vLLM runs FlashAttention-4 for head_dim {head_dim} on Hopper: "
                           "priced as FlashAttention-3 at that head_dim, not validated (on "
                           "the H100 FA4 measures ~1.3x slower in prefill, ~1.8x in decode: "
                           "bench/fit_attention_aiconfigurator.py)")
        return "fa3", ""
    if spec.arch in ("volta", "turing"):
        raise ValueError(f"vLLM 0.24 needs compute capability 8.0 or newer; {spec.name} is "
                         f"{spec.arch}")
    if dkey == "fp8" or head_dim > FLASH_HEAD_DIMS[-1]:
        raise ValueError(f"vLLM's FlashAttention-2 path on {spec.name} takes fp16/bf16 and "
                         f"head_dim <= 256; got {dkey}, head_dim {head_dim}")
    note = "" if spec.vendor == "nvidia" else \
        (f"vLLM runs ROCm's attention kernels on {spec.name}: priced as FlashAttention-2 "
         "(not validated)")
    return "fa2", note


# ---------------------------------------------------------------------------------------
# Tiles
# ---------------------------------------------------------------------------------------

def _tile(kernel: str, arch: str, direction: str, d: int) -> tuple[int, int]:
    """(Br, Bc): query rows x key rows per block, from the kernels' launch templates
    (flash-attention ``flash_fwd_launch_template.h`` / ``flash_bwd_launch_template.h`` for
    sm80/sm90, FA3's ``hopper/`` templates, PyTorch's CUTLASS memory-efficient kernel)."""
    if kernel == "mem_efficient":
        return (64, 64)
    if kernel == "trtllm":
        # tcgen05 kernels (trtllm-gen, as FlashAttention-4): two 128-row Q tiles per CTA
        # ping-pong their softmax against the MMAs in tensor memory; one above head_dim 128
        return (256, 128) if d <= 128 else (128, 128) if d <= 256 else (128, 64)
    if kernel == "fa3":
        if direction == "forward":
            return (192, 128) if d <= 64 else (128, 128) if d <= 128 else (128, 80)
        return (128, 128) if d <= 64 else (64, 128) if d <= 128 else (64, 64)
    if direction == "forward":
        if d <= 64:
            return (128, 128)
        if arch in ("ampere-ga10x", "ada") and d <= 128:
            return (128, 32)  # sm86/sm89: 100 KB of shared memory
        return (128, 64)
    return (128, 128) if d <= 64 else (64, 128) if d <= 128 else (64, 64)


# ---------------------------------------------------------------------------------------
# The core
# ---------------------------------------------------------------------------------------

def _smooth_max(a: float, b: float, q: float) -> float:
    return (a ** q + b ** q) ** (1.0 / q)


def _imbalance(blocks: list[int], per_cta: int, sms: int) -> tuple[float, float, int]:
    """(mean blocks per CTA, longest, waves) for ``per_cta`` repeats of the CTAs whose K/V
    (or Q) block counts are ``blocks``."""
    n = len(blocks) * per_cta
    mean = sum(blocks) / len(blocks)
    return mean, max(blocks), -(-n // sms)


def _fused(shape: AttentionShape, direction: str, kernel: str, spec: GPUSpec, dkey: str,
           gp, ap: AttentionParams, kp: KernelParams | None = None, kv_key: str | None = None):
    """Figures of a fused kernel: (time, tile, run_d, ctas, waves, wave_eff, t_comp, t_mem).
    ``kp``: the kernel's own forward constants (today's library), else the shared ones;
    ``kv_key``: an fp8 KV cache, whose prefill quantizes Q, K and V first."""
    fa3 = kernel == "fa3"
    dims = FA3_HEAD_DIMS if fa3 else TRTLLM_HEAD_DIMS if kernel == "trtllm" else \
        FLASH_HEAD_DIMS
    d = flash_head_dim(shape.head_dim, dims)
    dv = flash_head_dim(shape.head_dim_v, dims)
    run_d = max(d, dv)
    br, bc = _tile(kernel, spec.arch, direction, run_d)
    e = itemsize(dkey)
    clock = spec.boost_clock_mhz * 1e6
    sms = spec.sm_count
    peak = spec.peak_tflops(dkey) * 1e12
    group = _packed_group(shape, direction, fa3, br)
    own = kp if (kp is not None and direction == "forward") else None
    block, cta = _block_cycles(shape, direction, kernel, spec, dkey, gp, ap, own, d, dv,
                               (br, bc), group)
    blocks, per_cta = _grid(shape, direction, br, bc, group)
    mean, longest, waves = _imbalance(blocks, per_cta, sms)
    ctas = len(blocks) * per_cta
    t_mean = (mean * block + cta) / clock
    t_long = (longest * block + cta) / clock
    t_waves = waves * t_mean + (t_long - t_mean) / waves
    # the power limit: the whole chip cannot sustain more than power_eff of the peak
    scores = br * bc
    mma_flops = ctas * mean * 2.0 * scores * ((d + dv) if direction == "forward"
                                              else (3 * d + 2 * dv))
    t_comp = max(t_waves, mma_flops / (peak * gp.power_eff))
    bw = spec.memory_bandwidth_gbs * 1e9 * gp.dram_eff
    nbytes, launches = _fused_bytes(shape, direction, e)
    t_mem = nbytes / bw
    t = _smooth_max(t_comp, t_mem, gp.smooth_q) + launches * gp.launch_s
    if own:
        t += own.call_s
    if kv_key == "fp8" and direction == "forward" and e > 1:
        # an fp8 KV cache: the kernel reads K and V from it in fp8, so Q is quantized to
        # fp8 first (read at e bytes, written at 1), one more launch
        q_rows = shape.batch * shape.heads * shape.seq_q
        t += (e + 1) * q_rows * shape.head_dim / bw + gp.launch_s
    wave_eff = ctas * mean / (waves * sms * longest)
    return t, (br, bc), run_d, ctas, waves, wave_eff, t_comp, t_mem


def _packed_group(shape: AttentionShape, direction: str, fa3: bool, br: int) -> int:
    """The query heads FA3 packs into one tile's rows (they share a K/V head) where that
    fills the tile better (its should_pack_gqa); 1 otherwise."""
    group = shape.heads // shape.kv_heads if direction == "forward" and fa3 else 1
    if group > 1:
        def fill(rows):
            return rows / (-(-rows // br) * br)
        if not fill(shape.seq_q) < 0.9 * fill(shape.seq_q * group):
            group = 1
    return group


def _block_cycles(shape: AttentionShape, direction: str, kernel: str, spec: GPUSpec,
                  dkey: str, gp, ap: AttentionParams, own, d: int, dv: int, tile,
                  group: int) -> tuple:
    """``(cycles per K/V block, cycles per CTA)`` of a fused kernel on one SM: the MMAs,
    the softmax (overlapped with them by FA3's and the tcgen05 kernels' warpgroups), the
    next tiles' loads, the fixed per-block cost; a CTA's own loads and stores."""
    fa3 = kernel == "fa3"
    overlapped = fa3 or kernel == "trtllm"  # warp-specialized: the softmax overlaps the MMAs
    br, bc = tile
    e = itemsize(dkey)
    block_cycles = own.block_cycles if own else ap.block_cycles
    if own:
        mma_eff = gp.e_max * own.mma_frac
    elif fa3:
        mma_eff = gp.e_max * ap.fa3_mma_frac
    else:  # mma.sync: the native instruction before Hopper, a fraction of wgmma's rate after
        mma_eff = gp.e_max * (ap.sync_mma_frac if spec.arch in NEWER_MMA else 1.0)
    if direction == "backward":
        mma_eff *= ap.fa3_bwd_mma_frac if fa3 else ap.bwd_mma_frac
    # FLOP per clock per SM
    rate = spec.peak_tflops(dkey) * 1e12 / spec.sm_count / (spec.boost_clock_mhz * 1e6) \
        * mma_eff
    lanes = spec.fp32_lanes_per_sm
    l2 = gp.l2_bytes_per_clk_per_sm
    scores = br * bc
    warps = 8 if (max(d, dv) > 128 and not overlapped) else 4
    exp = scores / spec.sfu_per_clk_per_sm
    if direction == "forward":
        mma = 2.0 * scores * (d + dv) / rate
        fp32 = scores * ap.fp32_ops_per_score / lanes
        other = br * dv / lanes  # online softmax: rescale the output tile each block
        load = bc * (d + dv) * e / l2  # the next K and V tiles
        if not overlapped:
            # mma.sync takes its operands from registers that each warp loads from shared
            # memory: the Q rows it owns and the whole K and V tiles (FA2 splits Q over its
            # warps: 4, or 8 above head_dim 128). Hopper's tensor cores outrun that stream.
            smem = 2.0 * (d * (br + warps * bc) + warps * bc * dv) / _SMEM_BYTES_PER_CLK
            mma = max(mma, smem)
        # a CTA loads its Q tile and stores its O tile at what one SM streams alone
        cta = (own.cta_cycles + min(br, shape.seq_q * group) * own.row_cycles if own
               else ap.cta_cycles) + br * (d + dv) * e * 2 / gp.sm_stream_bytes_per_clk
    else:
        # recompute S = QKᵀ, dP = dO·Vᵀ, dV += Pᵀ·dO, dK += dSᵀ·Q, dQ += dS·K
        mma = 2.0 * scores * (3 * d + 2 * dv) / rate
        # recompute the softmax (P = exp(S - lse)) and dS = P ∘ (dP - D)
        fp32 = scores * (ap.fp32_ops_per_score + 2.0) / lanes
        other = 0.0
        load = (br * (d + dv) * e + br * d * 4) / l2  # Q and dO tiles; dQ fp32 atomics
        # a CTA loads its K and V tiles and stores dK and dV
        cta = ap.bwd_cta_cycles + bc * (d + dv) * e * 2 / gp.sm_stream_bytes_per_clk
    soft = max(exp, fp32) + other
    # FA2 runs the softmax between its GEMMs; FA3's (and the tcgen05 kernels') ping-pong
    # warpgroups overlap the two, as imperfectly as the GEMM fit says compute and memory
    # overlap on this GPU (smooth_q)
    block = _smooth_max(mma, soft, gp.smooth_q) if overlapped else mma + soft
    # the fixed per-block cost (barriers, pipeline waits) is paid per warp: FA2 runs 4
    # warps per CTA, 8 above head_dim 128 (FA3's warpgroups: counted as 4)
    return max(block, load) + block_cycles * warps / 4, cta


def _grid(shape: AttentionShape, direction: str, br: int, bc: int, group: int) -> tuple:
    """``(K/V blocks (forward) or query blocks (backward) each CTA loops over, CTAs per
    entry)``: one entry per CTA row of a causal mask, one for all otherwise."""
    b, h = shape.batch, shape.heads
    sq, sk, w = shape.seq_q, shape.seq_k, shape.window
    if direction == "forward":
        # one CTA per (batch, head, block of Br query rows), looping over K/V blocks; packed:
        # per (batch, K/V head, block of Br rows of (query, head) pairs)
        rows = sq * group
        nq = -(-rows // br)
        if shape.causal:
            # query block i sees keys up to its last row, and from (its first row - w) on
            blocks = [-(-min(sk, (min(rows, (i + 1) * br) - 1) // group + 1) // bc)
                      - (max(0, (i * br) // group - w + 1) // bc if w else 0)
                      for i in range(nq)]
        else:
            blocks = [-(-sk // bc)]
        return blocks, b * (h // group) * (nq if not shape.causal else 1)
    # one CTA per (batch, head, block of Bc key rows), looping over query blocks
    nk = -(-sk // bc)
    if shape.causal:
        # key block j is seen by the queries from its first row (to its last + w)
        blocks = [max(1, -(-((min(sq, (j + 1) * bc + w - 1) if w else sq) - j * bc)
                           // br)) for j in range(nk)]
    else:
        blocks = [-(-sq // br)]
    return blocks, b * h * (nk if not shape.causal else 1)


def _fused_bytes(shape: AttentionShape, direction: str, e: int) -> tuple:
    """``(bytes from and to memory, launches)`` of a fused kernel: memory holds the
    unpadded head dimension."""
    b, h, sq, sk = shape.batch, shape.heads, shape.seq_q, shape.seq_k
    q_rows, kv_rows = b * h * sq, b * shape.kv_heads * sk
    d, dv = shape.head_dim, shape.head_dim_v
    if direction == "forward":
        return e * (q_rows * (d + dv) + kv_rows * (d + dv)) + 4 * q_rows, 1
    # preprocess D = rowsum(dO ∘ O); main kernel; dQ fp32 accumulator -> dQ
    nbytes = (e * (2 * q_rows * dv)  # preprocess reads O and dO
              + e * (q_rows * (d + dv) + kv_rows * (d + dv)) + 8 * q_rows  # Q dO K V lse D
              + e * b * h * sk * (d + dv)  # dK, dV per query head (summed for GQA)
              + 4 * q_rows * d * 2 + e * q_rows * d)  # dQ accumulator and dQ
    return nbytes, 3


def _math(shape: AttentionShape, direction: str, spec: GPUSpec, dkey: str, gp,
          ap: AttentionParams, gemm_times):
    """The unfused path: its GEMMs (``gemm_times``: their predicted times), the elementwise
    kernels streaming the score matrix and the layout copies of Q, K, V and O. Returns
    (time, time of the non-GEMM part)."""
    bw = spec.memory_bandwidth_gbs * 1e9 * gp.dram_eff
    scores = shape.batch * shape.heads * shape.seq_q * shape.seq_k
    per_score = ap.math_bytes_per_score if direction == "forward" \
        else ap.math_bwd_bytes_per_score
    if shape.causal and direction == "forward":
        # adding the mask: the scores read and written again, and the mask read with them
        # once it no longer fits in L2 (it is broadcast over batch and heads)
        e = itemsize(dkey)
        per_score += 2 * e + (e if shape.seq_q * shape.seq_k * e > spec.l2_mb * 1e6 else 0)
    copies = 2 * itemsize(dkey) * shape.batch * shape.heads * shape.seq_q * shape.head_dim
    t_other = (per_score * scores + ap.math_copy_passes * copies) / bw + 3 * gp.launch_s
    return sum(gemm_times) + t_other, t_other


def math_gemms(shape: AttentionShape, direction: str):
    """The unfused path's batched GEMMs as ``(name, batch, M, N, K, layout)``: forward
    S = QKᵀ and O = PV; backward dV = Pᵀ·dO, dP = dO·Vᵀ, dQ = dS·K, dK = dSᵀ·Q."""
    bh, sq, sk = shape.batch * shape.heads, shape.seq_q, shape.seq_k
    d, dv = shape.head_dim, shape.head_dim_v
    if direction == "forward":
        return [("qk", bh, sq, sk, d, "nt"), ("pv", bh, sq, dv, sk, "nn")]
    return [("dv", bh, sk, dv, sq, "tn"), ("dp", bh, sq, sk, dv, "nt"),
            ("dq", bh, sq, d, sk, "nn"), ("dk", bh, sk, d, sq, "tn")]


def predict_attention(shape: AttentionShape, *, direction: str = "forward",
                      attention: str = "flash", dtype="bf16", gpu="h100",
                      params_path: str | None = None, kv_dtype=None,
                      page_size: int | None = None) -> AttentionPrediction:
    """Predict one attention call (forward, or its backward) on ``gpu``.

    Args:
        shape: the :class:`AttentionShape`.
        direction: ``"forward"`` or ``"backward"``.
        attention: ``"flash"`` (what PyTorch's SDPA runs there), ``"fa2"``, ``"fa3"``
            (Hopper only) or ``"math"`` (unfused); see :func:`resolve_kernel`.
        dtype: the dtype of Q, K and V.
        gpu: name, alias or ``GPUSpec``.
        params_path: another ``attention_params.json`` (``bench/fit_attention.py --out``).
        kv_dtype: the dtype of K and V when it differs (an fp8 KV cache); decode path only.
        page_size: tokens per page of a paged KV cache (``None``: contiguous); decode path.

    A forward call of at most ``DECODE_MAX_SEQ_Q`` query tokens over a longer key sequence
    (decode) runs a fused kernel's split-KV decode path, predicted by
    :func:`fxshape.cost.decode_attention.predict_decode`.

    Raises:
        ValueError: unknown direction, kernel, dtype or GPU; a kernel that cannot run this.

    Example:
        >>> s = AttentionShape(4, 16, 16, 4096, 4096, 128, 128)
        >>> predict_attention(s, gpu="h100").tflops  # doctest: +SKIP
    """
    if not isinstance(shape, AttentionShape):
        raise ValueError(f"shape must be an AttentionShape, got {type(shape).__name__}")
    if direction not in DIRECTIONS:
        raise ValueError(f"unknown direction {direction!r}; accepted: 'forward', 'backward'")
    from .decode_attention import check_page_size

    spec = get_gpu(gpu)
    dkey = canonical_dtype(dtype)
    spec.peak_tflops(dkey)
    kv_key = kv_format(kv_dtype)[0] if kv_dtype is not None else None
    check_page_size(page_size)
    from .gemm import resolve_params_path

    # the constants, and the GEMM parameter file in force (predict_with reads its GEMM
    # constants from it), key the cache
    return _predict_cached(shape, direction, attention, dkey, spec,
                           attention_params(params_path, spec),
                           resolve_params_path(None, spec), kv_key, page_size,
                           _params_path(params_path))


@functools.lru_cache(maxsize=1 << 14)
def _predict_cached(shape, direction, attention, dkey, spec, ap, gemm_path, kv_key=None,
                    page_size=None, path=None) -> AttentionPrediction:
    from .decode_attention import is_decode_shape

    from .gemm import LIBRARY_GENERATIONS

    # an older library generation in force (params="2024") prices the kernels as they were
    # then: the shared constants, without today's per-kernel ones
    kernels = {} if gemm_path in LIBRARY_GENERATIONS.values() else \
        _kernel_table(path or _params_path(None))
    if direction == "forward" and attention != "math" and \
            is_decode_shape(shape.seq_q, shape.seq_k):
        pred = predict_with(ap, shape, direction, attention, dkey, spec, kernels=kernels)
        if pred.kernel != "math":
            return _decode(pred, shape, dkey, kv_key, page_size, spec,
                           today=bool(kernels))
        return pred
    return predict_with(ap, shape, direction, attention, dkey, spec, kernels=kernels,
                        kv_key=kv_key)


def _decode(pred: AttentionPrediction, shape: AttentionShape, dkey: str, kv_key, page_size,
            spec: GPUSpec, today: bool = True) -> AttentionPrediction:
    """``pred`` (the fused kernel chosen) re-predicted on its split-KV decode path (with the
    kernel's own decode constants, unless ``today`` is False: an older generation)."""
    from .decode_attention import kv_block_tokens, predict_decode
    from .notes import join_notes

    item = itemsize(dkey)
    # a sliding window reads only the window's keys
    context = min(shape.seq_k, shape.window) if shape.window else shape.seq_k
    dp = predict_decode(shape.batch, shape.heads, shape.kv_heads, shape.seq_q, context,
                        shape.head_dim, gpu=spec, itemsize=item,
                        kv_itemsize=kv_format(kv_key)[1] if kv_key else item,
                        page_size=page_size,
                        head_dim_v=shape.head_dim_v, peak_tflops=spec.peak_tflops(dkey),
                        kernel=pred.kernel if today and pred.kernel not in PRICED_AS
                        else None)
    split = (f"split-KV over {dp.splits} splits and a combine kernel" if dp.splits > 1
             else "one CTA per KV head and query block, no split")
    kv = f"; {kv_key} KV cache" if kv_key and kv_key != dkey else ""
    paged = f"; paged KV, {page_size} tokens a page" if page_size else ""
    note = join_notes(pred.note, f"decode path: {split}, {dp.bandwidth_fraction:.0%} of DRAM "
                                 f"bandwidth{kv}{paged}")
    t = dp.time_s
    return replace(pred, time_s=t, tflops=pred.flops / t / 1e12,
                   efficiency=pred.flops / t / (spec.peak_tflops(dkey) * 1e12),
                   tile=(64, kv_block_tokens(max(shape.head_dim, shape.head_dim_v))), ctas=dp.ctas,
                   waves=dp.waves, wave_efficiency=1.0, compute_time_s=0.0,
                   memory_time_s=dp.bytes / (spec.memory_bandwidth_gbs * 1e9),
                   bound="latency" if dp.bound == "latency" else "memory",
                   validated=spec.arch in ("hopper", "blackwell"), note=note,
                   kernels=dp.kernels, decode=dp)


def predict_with(ap: AttentionParams, shape: AttentionShape, direction: str, attention: str,
                 dkey: str, spec: GPUSpec, *, kernels: dict | None = None,
                 kv_key: str | None = None) -> AttentionPrediction:
    """The model with the given constants (``bench/fit_attention.py`` and
    ``bench/fit_attention_aiconfigurator.py`` fit through this, so the model that is fitted
    is the model that ships). ``kernels``: ``{kernel: KernelParams}`` (default: the
    packaged file's); ``kv_key``: the KV cache's dtype key where it differs (fp8)."""
    from .gemm import model_params, predict_matmul
    from .notes import join_notes

    kernel, note = resolve_kernel(attention, spec, dkey, max(shape.head_dim, shape.head_dim_v))
    if kernel == "trtllm" and direction == "backward":
        raise ValueError("the TensorRT-LLM attention kernels are inference kernels (forward "
                         "only); price a training step's attention with 'flash' (PyTorch's "
                         "SDPA), 'fa2' or 'math'")
    if kernels is None:
        kernels = _kernel_table(_params_path(None))
    gp = model_params(spec)
    peak = spec.peak_tflops(dkey) * 1e12
    flops = shape.flops(direction)
    if kernel == "math":
        preds = [predict_matmul(m, n, k, batch=b, dtype=dkey, gpu=spec, layout=lay)
                 for _, b, m, n, k, lay in math_gemms(shape, direction)]
        t, t_elem = _math(shape, direction, spec, dkey, gp, ap, [p.time_s for p in preds])
        big = max(preds, key=lambda p: p.time_s)
        tile, run_d, ctas, waves, wave_eff = (big.tile, max(shape.head_dim, shape.head_dim_v),
                                              big.ctas, big.waves, big.wave_efficiency)
        t_comp = sum(p.compute_time_s for p in preds)
        t_mem = sum(p.memory_time_s for p in preds) + t_elem
        if shape.causal:
            note = join_notes(note, "causal mask applied to the full score matrix (no blocks "
                                    "skipped)")
            flops = replace(shape, causal=False, window=0).flops(direction)
    else:
        priced = PRICED_AS.get(kernel, kernel)
        t, tile, run_d, ctas, waves, wave_eff, t_comp, t_mem = _fused(
            shape, direction, priced, spec, dkey, gp, ap, kernels.get(priced), kv_key)
        if run_d != max(shape.head_dim, shape.head_dim_v):
            note = join_notes(note, f"{kernel} runs head_dim "
                                    f"{max(shape.head_dim, shape.head_dim_v)} as {run_d}")
    if gp.launch_s >= max(t_comp, t_mem):
        bound = "latency"
    else:
        bound = "memory" if t_mem > t_comp else "compute"
    validated = (kernel, spec.arch, direction) in _MEASURED
    tflops = flops / t / 1e12
    return AttentionPrediction(
        gpu=spec.name, dtype=dkey, kernel=kernel, direction=direction, shape=shape,
        flops=flops, time_s=float(t), tflops=tflops, efficiency=tflops * 1e12 / peak,
        peak_tflops=peak / 1e12, tile=tuple(tile), run_head_dim=int(run_d), ctas=int(ctas),
        waves=int(waves), wave_efficiency=float(wave_eff), compute_time_s=float(t_comp),
        memory_time_s=float(t_mem), bound=bound, validated=validated, note=note)
