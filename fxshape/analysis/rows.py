"""The records a GEMM analysis produces, and the kernel figures read off a row.

:class:`GemmRow` is one GEMM of one graph node with its prediction (a tuple of them sits on
``node.meta["fxshape"]``); :class:`Unsupported` is a node that does FLOPs but has no handler.
:func:`misaligned` and :func:`kernel_figures` are what the tables, exports and plots show of
a row beyond its fields.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..cost.gemm import MatmulPrediction
from ..cost.gemv import GEMV_KERNEL

__all__ = ["GemmRow", "Unsupported", "WorkloadRecord", "misaligned", "kernel_figures"]


@dataclass(frozen=True)
class GemmRow:
    """One GEMM of one graph node, with its prediction.

    ``flops`` counts the work actually done (``2·batch·M·N·K`` times ``work``, e.g. one half
    for causal attention) and ``time_s`` is the prediction scaled the same way.
    """

    node: str
    module: str
    module_type: str
    op: str
    phase: str
    batch: int
    m: int
    n: int
    k: int
    dtype: str
    layout: str
    work: float
    note: str
    flops: int
    time_s: float
    prediction: MatmulPrediction
    #: what sets (M, N, K): a hyperparameter, an input size or a parameter axis
    #: (``fxshape.analysis.provenance``); empty when not traced
    set_by: tuple = ()
    #: the knobs whose change changes (M, N, K): a tuple of labels per dimension, when
    #: provenance was traced by cause (``analyze(provenance="traced")``); empty otherwise
    causes: tuple = ()
    #: the kernel an attention GEMM was predicted as ("fa2", "fa3", "mem_efficient",
    #: "math"); empty for ordinary GEMMs
    kernel: str = ""
    #: the whole attention call's prediction (``fxshape.cost.attention.AttentionPrediction``),
    #: shared by the rows of one call; None for ordinary GEMMs
    attention: object = None
    #: a quantized linear layer: its method (``"int4 g128"``, ``"int8"``, ``"fp8"``;
    #: ``fxshape.cost.quant``) and the kernels it launches (a conversion or an activation
    #: quantization kernel besides the GEMM); empty and 1 otherwise
    quant: str = ""
    kernels: int = 1

    @property
    def tflops(self) -> float:
        """Useful TFLOP/s: this row's FLOPs over its predicted time (padding not counted)."""
        return self.flops / self.time_s / 1e12 if self.time_s > 0 else 0.0

    @property
    def efficiency(self) -> float:
        """Useful TFLOP/s over the dtype's dense peak."""
        return self.tflops / self.prediction.peak_tflops


@dataclass(frozen=True)
class Unsupported:
    """A node that looks like a matmul but has no handler (reported, never counted as zero)."""

    node: str
    target: str
    module: str
    reason: str


@dataclass(frozen=True)
class WorkloadRecord:
    """What a report describes: the mode, the inputs, the parallelism and the attention
    kernel, as the analysis resolved them (what was asked is the setup's
    ``fxshape.config.setup.Workload``). Every view of a report states it."""

    mode: str  # "inference", "prefill", "train" or "decode"
    #: the forward's tensor inputs as captured: (name, shape, dtype) each
    inputs: tuple = ()
    #: sizes of synthesized inputs (None when the user gave the inputs)
    batch_size: int | None = None
    seq_len: int | None = None
    #: seq_len was not given: the default (1024, capped at the model's positions) was used
    seq_len_default: bool = False
    tp: int = 1
    attention: str = "flash"  # the choice; ``kernels``: what the attention rows ran as
    kernels: tuple = ()
    #: decode: the tokens in the KV cache (None for other modes)
    context_len: int | None = None
    #: decode: the KV cache's dtype when it is not the analysis dtype, its page size
    kv_dtype: str | None = None
    page_size: int | None = None
    #: how matrix-vector products run (``fxshape.cost.gemv``: "library" or "inductor")
    gemv: str = "library"
    #: the mode was not given: analyze's default (inference; advise's is train)
    mode_default: bool = False
    #: the parallel plan (``fxshape.Parallel.describe()``) when it is more than tp/dp/SP
    parallel: str = ""
    #: micro-batches per step and data-parallel ranks: the global batch is
    #: ``batch_size × microbatches × dp``
    microbatches: int = 1
    dp: int = 1
    #: quantized linear layers (``fxshape.cost.quant.Quantization.label``); empty: none
    quantize: str = ""
    #: decode with sliding-window layers: ``((window, bytes), ...)``, the bytes a token of
    #: one sequence holds on one GPU in the layers of each window (0: the whole context), so
    #: that what fits follows the windows (``fxshape.execution.serving``); empty otherwise
    kv_layout: tuple = ()

    @property
    def global_batch(self) -> int | None:
        """Sequences per optimizer step over all data-parallel ranks (training)."""
        if self.batch_size is None or self.mode != "train":
            return None
        return self.batch_size * self.microbatches * self.dp

    def describe(self) -> str:
        """``inference, batch 1 x seq_len 64, tp 1, attention flash (runs fa2); inputs:
        input_ids 1x64 int64``."""
        parts = [self.mode + (" (the default mode)" if self.mode_default else "")]
        if self.context_len is not None:
            parts.append(f"batch {self.batch_size}, one new token each, KV cache of "
                         f"{self.context_len} tokens")
        elif self.batch_size is not None:
            size = f"batch {self.batch_size}"
            if self.seq_len is not None:
                size += f" x seq_len {self.seq_len}"
                if self.seq_len_default:
                    size += " (default: 1024, capped at the model's positions)"
            parts.append(size)
        else:
            parts.append("inputs given")
        parts.append(f"tp {self.tp}")
        if self.parallel:
            parts.append(f"plan {self.parallel}")
        if self.global_batch is not None and (self.microbatches > 1 or self.dp > 1):
            parts.append(f"global batch {self.global_batch} (batch {self.batch_size} x "
                         f"{self.microbatches} micro-batches x dp {self.dp})")
        ran = (f" (runs {', '.join(self.kernels)})" if self.kernels else
               "" if self.attention == "math" else
               " (no fused attention call captured: any attention runs as the graph's own "
               "matmuls)")
        parts.append(f"attention {self.attention}{ran}")
        if self.gemv != "library":
            parts.append(f"matrix-vector products as {self.gemv} runs them")
        if self.quantize:
            parts.append(f"linear layers {self.quantize}")
        text = ", ".join(parts)
        if self.inputs:
            text += "; inputs: " + ", ".join(
                f"{name} {'x'.join(map(str, shape)) or 'scalar'} {dtype}"
                for name, shape, dtype in self.inputs)
        return text

    def as_dict(self) -> dict:
        return {"mode": self.mode, "mode_default": self.mode_default, "batch_size": self.batch_size, "seq_len": self.seq_len,
                "context_len": self.context_len, "kv_dtype": self.kv_dtype,
                "page_size": self.page_size,
                "seq_len_default": self.seq_len_default, "tp": self.tp,
                "parallel": self.parallel, "microbatches": self.microbatches, "dp": self.dp,
                "global_batch": self.global_batch,
                "attention": self.attention, "attention_kernels": list(self.kernels),
                "gemv": self.gemv,
                "inputs": [{"name": n, "shape": list(s), "dtype": d} for n, s, d in self.inputs],
                **({"quantize": self.quantize} if self.quantize else {})}


def misaligned(row) -> str:
    """``N=50257->50264``: each misaligned leading dimension of a row and its next aligned
    size (empty for fused attention kernels and aligned GEMMs)."""
    if row.kernel not in ("", "math"):
        # a fused attention kernel handles any sequence length (predicated tail blocks);
        # its head-dimension padding shows as tile efficiency and in the note
        return ""
    bad = [a for a in row.prediction.alignment if a.status == "misaligned" and a.leading]
    return ", ".join(f"{a.dim}={a.size}->{a.next_aligned}" for a in bad)


def kernel_figures(r) -> dict:
    """Tile, tile/wave efficiency, waves and bound of the kernel a row runs in: a fused
    attention kernel's own (its Br x Bc tile over the padded head dimension), else the
    GEMM's."""
    a, p = r.attention, r.prediction
    if p.kernel == GEMV_KERNEL or p.kernel.startswith(("inductor reduction", "tinygemm")):
        # Inductor's reduction (over a bf16 or an int8 weight), tinygemm: no GEMM tile
        return dict(tile="reduction" if p.kernel.startswith("inductor") else "tinygemm",
                    tile_efficiency=1.0, waves=1, wave_efficiency=1.0, bound=p.bound)
    if a is not None and r.kernel != "math":
        s = a.shape
        dims = max(s.head_dim, s.head_dim_v)
        return dict(tile=f"{a.tile[0]}x{a.tile[1]}", tile_efficiency=dims / a.run_head_dim,
                    waves=a.waves, wave_efficiency=a.wave_efficiency, bound=a.bound)
    return dict(tile=f"{p.tile[0]}x{p.tile[1]}" + (f"/s{p.split_k}" if p.split_k > 1 else ""),
                tile_efficiency=p.tile_efficiency, waves=p.waves,
                wave_efficiency=p.wave_efficiency, bound=p.bound)
