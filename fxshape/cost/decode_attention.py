"""The decode attention model: one step of a few query tokens per sequence over a KV cache.

A decode step's attention is memory-bound: each sequence's new query reads every key and
value in its cache once, and does four FLOPs per byte or so. What sets its time is how much
of the GPU's bandwidth the kernel can pull at the parallelism it has, and the fixed costs of
its launches. The model follows what FlashAttention's split-KV path (``flash_attn_with_kvcache``
and ``scaled_dot_product_attention``'s flash backend at small ``seq_q``, "flash-decoding"),
FlashInfer's decode kernels and vLLM's paged attention v2 do:

- **GQA packing.** The query heads that share a KV head run in one CTA (FlashAttention's
  ``seqlenq_ngroups_swapped``, FlashInfer's GQA decode): a CTA holds ``group × seq_q`` query
  rows, padded to 64-row blocks, and reads its KV head once. Units of work: ``batch × KV heads
  × ceil(group × seq_q / 64)``.
- **Split-KV.** When the units cannot fill the GPU, the cache is split along its length over
  more CTAs, with FlashAttention-2's heuristic (``num_splits_heuristic`` in
  ``csrc/flash_attn/flash_api.cpp``: no split once the units fill 80% of two CTAs per SM;
  otherwise the fewest splits whose wave efficiency is within 85% of the best, over KV
  blocks of 256 / 128 / 64 keys for head_dim ≤ 64 / ≤ 128 / larger). Each split writes its
  partial output and log-sum-exp in fp32, and a second kernel combines them.
- **Bandwidth at that parallelism.** A CTA streams its share of the cache at no more than
  ``cta_bytes_per_clk`` bytes per SM clock (the loads one CTA keeps in flight), and all CTAs
  together at no more than ``dram_efficiency`` of the DRAM bandwidth. CTAs run in waves of
  two per SM.
- **Paged KV.** A paged cache (vLLM's 16-token blocks, FlashInfer's pages) costs
  ``page_s`` per page a CTA visits: the page-table lookup and a new address stream.
- **Fixed costs.** ``fixed_s`` per main kernel (launch, prologue, the query load and output
  store of the last wave), ``combine_s`` for the combine kernel when there is one.

Today's kernels have constants of their own (``kernel=``: vLLM 0.24's FlashAttention-3 on
Hopper, FlashInfer's TensorRT-LLM decode on datacenter Blackwell), fitted by
``bench/fit_attention_aiconfigurator.py`` with four more (a fixed cost per CTA, the CTAs an SM
holds, the split cap, an fp8 element's cost); the default ones below price every other kernel.

Five constants, the same on every GPU, fitted by ``bench/fit_decode_attention.py`` to
published kernel timings (``bench/decode_attention_published.csv``: FlashAttention-2 and -3,
FlashInfer, TensorRT-LLM's kernels on H100, H200 and B200; part held out) and read from
``fxshape/data/decode_attention_params.json``. The GPU enters through its SM count, clock,
DRAM bandwidth and tensor-core peak. Compute is a bound, never the answer in practice (the
score and value products at the padded 64 rows, at the dense peak).
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import asdict, dataclass

from ..hardware.gpus import GPUSpec, get_gpu
from .paramfile import read_json

__all__ = ["DecodeAttentionParams", "DecodeAttentionPrediction", "decode_attention_params",
           "predict_decode", "predict_decode_ragged", "num_splits", "kv_block_tokens",
           "check_page_size", "is_decode_shape", "DECODE_MAX_SEQ_Q"]

#: attention calls with at most this many query tokens per sequence run the decode path
#: (decode, and the few tokens of speculative decoding's verification)
DECODE_MAX_SEQ_Q = 16
_BLOCK_M = 64  # query rows per CTA (FlashAttention's split-KV kernel, FlashInfer's decode)
_DEFAULT_PATH = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data",
                             "decode_attention_params.json")


@dataclass(frozen=True)
class DecodeAttentionParams:
    """The fitted constants (``fxshape/data/decode_attention_params.json``)."""

    fixed_s: float
    combine_s: float
    dram_efficiency: float
    cta_bytes_per_clk: float
    page_s: float
    source: str = ""
    #: fixed seconds per CTA (its prologue: the query load, the page table, the first
    #: fetch's latency); 0 in the packaged FlashAttention-2 fit
    cta_s: float = 0.0
    #: CTAs an SM holds at once (the kernel's occupancy): the waves, and the slots the
    #: split heuristic fills; FlashAttention-2's heuristic assumes 2
    ctas_per_sm: float = 2.0
    #: time to stream one fp8 cache byte relative to a 16-bit one's: an fp8 cache halves
    #: the bytes, but the kernel converts each element (1: no cost)
    fp8_kv_cost: float = 1.0
    #: the most KV splits the kernel makes (FlashAttention-2's heuristic: 128)
    max_splits: int = 128

    FIELDS = ("fixed_s", "combine_s", "dram_efficiency", "cta_bytes_per_clk", "page_s")


@dataclass(frozen=True)
class DecodeAttentionPrediction:
    """One decode attention call as the model sees it. Times in seconds; ``bytes``: the DRAM
    traffic (the cache read once, the queries and outputs, the split partials)."""

    time_s: float
    splits: int
    ctas: int
    waves: int
    kernels: int
    bytes: int
    kv_bytes: int
    bandwidth_fraction: float  # bytes / time over the GPU's DRAM bandwidth
    bound: str  # "bandwidth", "parallelism" (too few CTAs to pull it) or "latency"

    def to_dict(self) -> dict:
        return asdict(self)


#: constants an entry may leave out (the packaged FlashAttention-2 fit predates them)
_OPTIONAL = ("cta_s", "ctas_per_sm", "fp8_kv_cost", "max_splits")


def _entry(d: dict, path: str, what: str) -> DecodeAttentionParams:
    try:
        return DecodeAttentionParams(**{k: float(d[k]) for k in DecodeAttentionParams.FIELDS},
                                     source=str(d.get("source", "")),
                                     **{k: (int if k == "max_splits" else float)(d[k])
                                        for k in _OPTIONAL if k in d})
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"decode attention parameter file {path!r} ({what}) lacks or "
                         f"mangles {exc}: it needs "
                         + ", ".join(DecodeAttentionParams.FIELDS)) from None


@functools.lru_cache(maxsize=None)
def _load(path: str) -> tuple:
    """(the default constants, ``{kernel: constants}`` of the ``kernels`` section)."""
    d = read_json(path, "decode attention parameter file")
    kernels = d.get("kernels") or {}
    if not isinstance(kernels, dict):
        raise ValueError(f"decode attention parameter file {path!r}: 'kernels' must map "
                         "kernel names to constants")
    return _entry(d, path, "top level"), {k: _entry(v, path, f"kernel {k!r}")
                                          for k, v in sorted(kernels.items())}


def decode_attention_params(path: str | None = None,
                            kernel: str | None = None) -> DecodeAttentionParams:
    """The packaged constants, or those of ``path``. With ``kernel``: that kernel's own
    constants where the file has them (``bench/fit_attention_aiconfigurator.py`` fits vLLM's
    FlashAttention-3 decode on H100 and FlashInfer's TensorRT-LLM decode on B200), else the
    default ones (fitted on FlashAttention-2's split-KV path)."""
    default, kernels = _load(path or _DEFAULT_PATH)
    return kernels.get(kernel, default) if kernel else default


def is_decode_shape(seq_q: int, seq_k: int) -> bool:
    """Does an attention call of ``seq_q`` query over ``seq_k`` key tokens run the decode
    path (a few new tokens over a longer cache)?"""
    return seq_q <= DECODE_MAX_SEQ_Q and seq_k > seq_q


def num_splits(units: int, slots: int, n_blocks: int, max_splits: int = 128) -> int:
    """FlashAttention-2's split-KV heuristic (``num_splits_heuristic``): ``units`` CTAs of
    work, ``slots`` CTAs the GPU runs at once, ``n_blocks`` KV blocks per unit."""
    if units >= 0.8 * slots:
        return 1
    top = min(max_splits, slots, n_blocks)

    def eligible(s):
        return s == 1 or -(-n_blocks // s) != -(-n_blocks // (s - 1))

    eff = {}
    for s in range(1, top + 1):
        if eligible(s):
            waves = units * s / slots
            eff[s] = waves / math.ceil(waves)
    best = max(eff.values())
    return next(s for s in sorted(eff) if eff[s] >= 0.85 * best)


def check_page_size(page_size) -> None:
    """A one-line ``ValueError`` unless ``page_size`` is a positive integer (tokens per KV
    page) or None (a contiguous cache)."""
    if page_size is not None and (isinstance(page_size, bool) or not isinstance(page_size, int)
                                  or page_size <= 0):
        raise ValueError(f"page_size must be a positive integer or None (tokens per KV page; "
                         f"None: a contiguous cache), got {page_size!r}")


def kv_block_tokens(head_dim: int) -> int:
    """Keys per KV block of the split-KV kernel (FlashAttention-2's ``block_n``)."""
    return 256 if head_dim <= 64 else 128 if head_dim <= 128 else 64


def _check_call(page_size, **sizes) -> None:
    """A one-line ``ValueError`` unless every size is a positive integer, the KV heads divide
    the heads and the page size is one :func:`check_page_size` takes."""
    for name, v in sizes.items():
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ValueError(f"decode attention {name} must be a positive integer, got {v!r}")
    heads, kv_heads = sizes["heads"], sizes["kv_heads"]
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads cannot share {kv_heads} KV heads (kv_heads must "
                         "divide heads)")
    check_page_size(page_size)


def predict_decode(batch: int, heads: int, kv_heads: int, seq_q: int, context: int,
                   head_dim: int, *, gpu="h100", itemsize: int = 2, kv_itemsize: int | None = None,
                   page_size: int | None = None, head_dim_v: int | None = None,
                   peak_tflops: float | None = None,
                   params: DecodeAttentionParams | None = None,
                   kernel: str | None = None) -> DecodeAttentionPrediction:
    """Predict one decode attention call: ``batch`` sequences, each ``seq_q`` new query tokens
    of ``heads`` heads over a cache of ``context`` tokens of ``kv_heads`` heads.

    Args:
        itemsize: bytes per element of the queries and outputs; ``kv_itemsize`` of the cache
            (default the same: 1 for an fp8 cache).
        page_size: tokens per KV page (``None``: a contiguous cache).
        peak_tflops: the tensor-core peak of the dtype (default the GPU's bf16 peak).
        params: other constants (``bench/fit_decode_attention.py`` fits through this).
        kernel: the fused kernel (``"fa2"``, ``"fa3"``, ``"trtllm"`` ...): its own constants
            where it has them (:func:`decode_attention_params`).

    Raises:
        ValueError: a size that is not a positive integer, heads that do not share KV heads.
    """
    _check_call(page_size, batch=batch, heads=heads, kv_heads=kv_heads, seq_q=seq_q,
                context=context, head_dim=head_dim, itemsize=itemsize)
    spec = get_gpu(gpu)
    p = params or decode_attention_params(kernel=kernel)
    kv_item = kv_itemsize or itemsize
    dv = head_dim_v or head_dim
    peak = (peak_tflops or spec.peak_tflops("bf16")) * 1e12
    return _predict(batch, heads, kv_heads, seq_q, context, head_dim, dv, itemsize, kv_item,
                    page_size, peak, spec, p)


@functools.lru_cache(maxsize=1 << 14)
def _predict(b, h, hk, sq, sk, d, dv, item, kv_item, page, peak, spec: GPUSpec,
             p: DecodeAttentionParams) -> DecodeAttentionPrediction:
    group = h // hk
    m_blocks = -(-(group * sq) // _BLOCK_M)
    units = b * hk * m_blocks
    slots = max(1, round(p.ctas_per_sm * spec.sm_count))
    bn = kv_block_tokens(max(d, dv))
    n_blocks = -(-sk // bn)
    splits = num_splits(units, slots, n_blocks, p.max_splits)
    ctas = units * splits
    waves = -(-ctas // slots)
    concurrent = min(ctas, slots)
    bw = spec.memory_bandwidth_gbs * 1e9
    clock = spec.boost_clock_mhz * 1e6
    # one CTA's share: whole KV blocks (the last split may hold fewer; the longest sets the
    # wave's time)
    tokens = min(sk, -(-n_blocks // splits) * bn)
    cta_bytes = tokens * (d + dv) * kv_item * (p.fp8_kv_cost if kv_item == 1 else 1.0)
    rate = min(p.cta_bytes_per_clk * clock, p.dram_efficiency * bw / concurrent)
    pages = -(-tokens // page) if page else 0
    t_cta = cta_bytes / rate + pages * p.page_s + p.cta_s
    # compute bound of the CTA: QKᵀ and PV at the padded rows, at its SM's share of the peak
    t_cta = max(t_cta, 2 * _BLOCK_M * tokens * (d + dv) / (peak / spec.sm_count))
    kv_bytes = b * hk * sk * (d + dv) * kv_item
    qo_bytes = b * h * sq * (d + dv) * item
    return _finish(p, waves * t_cta, kv_bytes, qo_bytes, b * h * sq, dv, splits, ctas, waves,
                   rate, concurrent, slots, bw)


def _finish(p, main, kv_bytes, qo_bytes, rows, dv, splits, ctas, waves, rate, concurrent,
            slots, bw) -> DecodeAttentionPrediction:
    """The call from its main kernel's time: the fixed cost, the queries and outputs, the
    split partials and the combine kernel; ``rows``: query rows (sequences x heads x
    tokens)."""
    t = p.fixed_s + main + qo_bytes / (p.dram_efficiency * bw)
    kernels, partial = 1, 0
    if splits > 1:
        partial = 2 * rows * splits * (dv + 1) * 4  # written, then read back
        t += p.combine_s + partial / (p.dram_efficiency * bw)
        kernels = 2
    total = kv_bytes + qo_bytes + partial
    if p.fixed_s >= 0.5 * t:
        bound = "latency"
    elif rate < p.dram_efficiency * bw / concurrent * 0.999 or concurrent < slots // 2:
        bound = "parallelism"
    else:
        bound = "bandwidth"
    return DecodeAttentionPrediction(
        time_s=float(t), splits=splits, ctas=ctas, waves=waves, kernels=kernels,
        bytes=int(total), kv_bytes=int(kv_bytes), bandwidth_fraction=total / t / bw,
        bound=bound)


def predict_decode_ragged(contexts, heads: int, kv_heads: int, seq_q: int, head_dim: int, *,
                          gpu="h100", itemsize: int = 2, kv_itemsize: int | None = None,
                          page_size: int | None = None, head_dim_v: int | None = None,
                          peak_tflops: float | None = None,
                          params: DecodeAttentionParams | None = None,
                          kernel: str | None = None) -> DecodeAttentionPrediction:
    """One decode attention call over sequences of different lengths (a serving engine's
    batch: ``contexts[i]`` cached tokens for sequence ``i``), as a varlen split-KV kernel
    runs it (FlashAttention's ``flash_attn_varlen_func`` with a paged cache, FlashInfer's
    batch decode): the model of :func:`predict_decode` with each sequence's CTAs streaming
    its own cache. The split count follows the longest sequence (the kernel's
    ``max_seqlen_k``); the main kernel takes its waves times the mean CTA time, and never
    less than the longest CTA. With every context equal it is :func:`predict_decode`
    exactly.

    Raises:
        ValueError: no contexts, a context or size that is not a positive integer.
    """
    contexts = list(contexts) if not isinstance(contexts, list) else contexts
    if not contexts:
        raise ValueError("decode attention needs at least one sequence's context")
    total_ctx = sum(contexts)  # an int only if every context is one (checked in one pass)
    if type(total_ctx) is not int or min(contexts) <= 0:
        bad = next(c for c in contexts if type(c) is not int or c <= 0)
        raise ValueError(f"decode attention contexts must be positive integers, got {bad!r}")
    _check_call(page_size, heads=heads, kv_heads=kv_heads, seq_q=seq_q, head_dim=head_dim,
                itemsize=itemsize)
    spec = get_gpu(gpu)
    p = params or decode_attention_params(kernel=kernel)
    kv_item = kv_itemsize or itemsize
    d, dv = head_dim, head_dim_v or head_dim
    peak = (peak_tflops or spec.peak_tflops("bf16")) * 1e12
    n = len(contexts)
    m_blocks = -(-(heads // kv_heads * seq_q) // _BLOCK_M)
    units = n * kv_heads * m_blocks
    slots = max(1, round(p.ctas_per_sm * spec.sm_count))
    bn = kv_block_tokens(max(d, dv))
    longest = max(contexts)
    splits = num_splits(units, slots, -(-longest // bn), p.max_splits)
    ctas = units * splits
    waves = -(-ctas // slots)
    concurrent = min(ctas, slots)
    bw = spec.memory_bandwidth_gbs * 1e9
    rate = min(p.cta_bytes_per_clk * spec.boost_clock_mhz * 1e6,
               p.dram_efficiency * bw / concurrent)
    per_token = (d + dv) * kv_item * (p.fp8_kv_cost if kv_item == 1 else 1.0) / rate
    compute_token = 2 * _BLOCK_M * (d + dv) / (peak / spec.sm_count)
    # one CTA's share of each sequence: whole KV blocks of its split
    tokens = contexts if splits == 1 else [min(c, -(-(-(-c // bn)) // splits) * bn)
                                           for c in contexts]

    def cta_s(t):
        pages = -(-t // page_size) if page_size else 0
        return max(t * per_token + pages * p.page_s + p.cta_s, t * compute_token)

    if compute_token <= per_token:  # the memory side is the CTA's time at every length
        total = per_token * (total_ctx if splits == 1 else sum(tokens)) + p.cta_s * len(tokens)
        if page_size:
            total += p.page_s * sum(-(-t // page_size) for t in tokens)
        longest_cta = cta_s(max(tokens))
    else:
        times = [cta_s(t) for t in tokens]
        total, longest_cta = sum(times), max(times)
    main = max(waves * total / n, longest_cta)
    kv_bytes = kv_heads * (d + dv) * kv_item * total_ctx
    qo_bytes = n * heads * seq_q * (d + dv) * itemsize
    return _finish(p, main, kv_bytes, qo_bytes, n * heads * seq_q, dv, splits, ctas, waves,
                   rate, concurrent, slots, bw)
