"""The whole step: every op of the captured graph with its kernels and time, the loss, the
optimizer and the host, summed into one :class:`Step`.

``op_records`` walks the graph in program order. A node with GEMM rows
(``fxshape.analysis.annotate``) gives one record per row (class ``gemm`` or ``attention``);
every other node is asked what it runs (``fxshape.analysis.opcost.node_kernels``) and gives
one record (class ``memory`` with its kernels, ``view`` with none); nodes that run nothing
(tuple indexing, export's asserts) give none; nodes without a cost model are returned apart,
for the report's unsupported list. ``step_of`` adds the optimizer and plays the records on
the eager timeline (``fxshape.cost.host.eager_timeline``).
"""

from __future__ import annotations

import collections
import dataclasses
import operator
from dataclasses import dataclass, field

import torch

from ..config.setup import EXECUTIONS, check_execution
from ..cost.host import eager_timeline, host_params, launch_gap_s
from ..cost.memops import kernel_time, memop_family
from ..cost.optimizer import optimizer_passes
from ..hardware.gpus import get_gpu
from ..hardware.validation import ErrorBand
from ..analysis.opcost import (Kernel, Sizes, dropout_chains, is_view, matmul_copies,
                               node_kernels)
from ..analysis.rows import Unsupported

__all__ = ["OpRecord", "Step", "CLASSES", "EXECUTIONS", "op_records", "step_of", "loss_of",
           "launch_regime", "regime_gaps",
           "check_execution", "model_float_dtype", "run_dtype", "attribute_modules", "phase_of"]

#: the classes a step's time is split into (``Step.by_class``)
CLASSES = ("gemm", "attention", "memory", "optimizer", "communication", "host_idle",
           "pipeline_bubble")


#: GEMMs a kernel runs again rather than keep (FlashAttention's backward recomputes S = QKᵀ):
#: time, not useful work; the model FLOPs leave them out, as MFU conventions do
RECOMPUTED_OPS = frozenset({"sdpa.bwd.qk"})


@dataclass(frozen=True)
class OpRecord:
    """One costed op of the step.

    ``cls``: ``gemm``, ``attention``, ``memory`` (memory-bound kernels), ``view`` (no kernel),
    ``optimizer``, ``communication``; ``kernels``: launches; ``bytes``: read plus written
    (GEMMs: the minimum DRAM traffic; collectives: the bytes sent); ``time_s``: GPU time on
    the critical path; ``host_s``: the CPU time eager PyTorch spends on it;
    ``overlapped_s``: a collective's time hidden under compute (not in ``time_s``).
    """

    node: str
    op: str
    module: str
    phase: str
    cls: str
    kernels: int
    bytes: int
    flops: int
    time_s: float
    host_s: float
    family: str = ""
    note: str = ""
    #: a GEMM's (batch, M, N, K); empty for other ops
    shape: tuple = ()
    overlapped_s: float = 0.0

    def as_dict(self) -> dict:
        d = dict(self.__dict__)
        d["shape"] = list(self.shape)
        return d


@dataclass(frozen=True)
class Step:
    """The predicted step (``report.step``).

    ``time_s`` is the eager timeline's wall time; ``by_class`` splits it (seconds per class
    of :data:`CLASSES`, summing to ``time_s``; ``host_idle`` is the time the GPU waits for
    the host). ``model_flops``: the useful GEMM and attention FLOPs of the step (forward, and
    backward in training; causal attention counts its half; what is computed twice, the
    QKᵀ that FlashAttention's backward recomputes and activation checkpointing's repeated
    forward, is not counted: the convention of PaLM's MFU, Chowdhery et al. 2022, app. B,
    and Megatron-LM's model FLOPs); ``mfu`` = ``model_flops`` over the dtype's dense peak
    times ``time_s``. ``tokens``: tokens the step processes, on one data-parallel replica
    (None when the inputs do not say); ``replicas``: the data-parallel replicas of a
    training step, each processing ``tokens``.
    """

    execution: str
    mode: str
    optimizer: str | None
    time_s: float
    by_class: dict = field(hash=False)
    gpu_s: float
    host_s: float
    kernels: int
    model_flops: int
    peak_tflops: float
    tokens: int | None
    notes: tuple = ()
    #: decode: the physical limit of the step, the bytes it must read (every weight but the
    #: input embedding's, which is gathered a row a token, plus the KV cache) over the GPU's
    #: peak DRAM bandwidth; None for other modes
    floor_s: float | None = None
    replicas: int = 1
    #: the collectives of the step, one per kind and op
    #: (``fxshape.execution.pipeline.Collective``)
    communication: tuple = ()
    #: under a pipeline: each rank's times (``fxshape.execution.pipeline.StageTime``)
    stages: tuple = ()
    #: under a pipeline, the slowest stage (the most compute) and what it holds ("" without)
    critical: str = ""
    #: micro-batches per step (gradient accumulation)
    microbatches: int = 1
    #: the expected error of ``time_s`` from the held-out validation of its GPU and regime
    #: (``fxshape.hardware.validation.ErrorBand``); None where there is none (unvalidated)
    error_band: ErrorBand | None = None
    #: a plan without a pipeline (ZeRO, micro-batches): its one rank's times as ``stages``
    #: holds a pipeline's (``StageTime``: the micro-batches' passes, then the exposed
    #: communication and the optimizer), which ``Report.to_chrome_trace`` draws; not in
    #: ``as_dict``
    timeline: tuple = field(default=(), compare=False)

    @property
    def mfu(self) -> float:
        return self.model_flops / (self.peak_tflops * 1e12 * self.time_s) if self.time_s else 0.0

    @property
    def tokens_per_s(self) -> float | None:
        return None if self.tokens is None or not self.time_s else self.tokens / self.time_s

    @property
    def host_idle_s(self) -> float:
        return self.by_class["host_idle"]

    @property
    def inter_token_latency_s(self) -> float | None:
        """Decode: the time between two tokens of one sequence (a step makes one token of
        each); None for other modes."""
        return self.time_s if self.mode == "decode" else None

    @property
    def time_to_first_token_s(self) -> float | None:
        """Prefill: the time the prompt takes before the first token (the step; queueing and
        sampling not included); None for other modes."""
        return self.time_s if self.mode in ("prefill", "inference") else None

    def as_dict(self) -> dict:
        return {"execution": self.execution, "mode": self.mode, "optimizer": self.optimizer,
                "time_s": self.time_s, "by_class": dict(self.by_class), "gpu_s": self.gpu_s,
                "host_s": self.host_s, "kernels": self.kernels,
                "model_flops": self.model_flops, "peak_tflops": self.peak_tflops,
                "mfu": self.mfu, "tokens": self.tokens, "tokens_per_s": self.tokens_per_s,
                "inter_token_latency_s": self.inter_token_latency_s,
                "time_to_first_token_s": self.time_to_first_token_s,
                "floor_s": self.floor_s, "replicas": self.replicas,
                "microbatches": self.microbatches,
                "communication": [c.as_dict() for c in self.communication],
                "stages": [s.as_dict() for s in self.stages], "critical": self.critical,
                "error_band": None if self.error_band is None else self.error_band.as_dict(),
                "notes": list(self.notes)}

    def describe(self) -> str:
        """``step (eager, train, adamw): 12.3 ms, 41.6k tokens/s, MFU 38.2%; gemm 70.1% ...``"""
        parts = [f"{self.time_s * 1e3:.3f} ms"]
        if self.mode == "decode":
            parts[0] += " per token (inter-token latency)"
        elif self.time_to_first_token_s is not None:
            parts[0] += " (time to first token)"
        if self.tokens_per_s is not None:
            parts.append(f"{self.tokens_per_s:,.0f} tokens/s" + (
                f" per replica ({self.tokens_per_s * self.replicas:,.0f} over {self.replicas} "
                "data-parallel replicas)" if self.replicas > 1 else ""))
        if self.floor_s:
            parts.append(f"bandwidth floor {self.floor_s * 1e3:.3f} ms "
                         f"(x{self.time_s / self.floor_s:.2f})")
        parts.append(f"MFU {100 * self.mfu:.1f}%")
        if self.microbatches > 1:
            parts.append(f"{self.microbatches} micro-batches")
        if self.critical:
            parts.append(f"slowest {self.critical}")
        parts.append(f"{self.kernels} kernels")
        split = ", ".join(f"{c.replace('_', ' ')} {100 * t / self.time_s:.1f}%"
                          for c, t in self.by_class.items() if t > 0) if self.time_s else ""
        opt = f", optimizer {self.optimizer}" if self.mode == "train" else ""
        return (f"step ({self.execution}, {self.mode}{opt}): " + ", ".join(parts)
                + (f"; {split}" if split else ""))


def model_float_dtype(gm) -> torch.dtype | None:
    """The floating dtype most of the graph's parameters (else placeholders) have."""
    count: collections.Counter = collections.Counter()
    for n in gm.graph.nodes:
        v = n.meta.get("val")
        if n.op in ("placeholder", "get_attr") and isinstance(v, torch.Tensor) and \
                v.is_floating_point():
            count[v.dtype] += v.numel()
    return count.most_common(1)[0][0] if count else None


_RUN_DTYPE = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16,
              "bf16": torch.bfloat16, "fp64": torch.float64}


def run_dtype(dkey: str) -> torch.dtype:
    """The dtype activations are in when GEMMs run in ``dkey``: itself, fp32 for TF32, bf16
    for fp8 (fp8 training and serving keep activations in bf16)."""
    return _RUN_DTYPE.get(dkey, torch.bfloat16)


def _price(k: Kernel, spec, run) -> float:
    family = k.family
    if family == "softmax":
        family = memop_family("softmax", max(k.cols, 1), run)
    return kernel_time(family, k.bytes, gpu=spec).time_s


def attribute_modules(gm, module_of) -> dict:
    """node name -> module, for every node: its own (``nn_module_stack``, the labels a joint
    graph's nodes carry), else the parameter it reads, else that of its latest-computed input
    that has one (an op the autograd engine inserts, such as the sum of two gradients of one
    value, runs right after the gradient that completes it, in that layer's backward), else
    the most common of its users'."""
    nodes = list(gm.graph.nodes)
    index = {n.name: i for i, n in enumerate(nodes)}
    owner = {}
    for n in nodes:
        fqn = module_of(n)[0] if n.op == "call_function" else ""
        if fqn:
            owner[n.name] = fqn
        elif "fxshape_param" in n.meta:
            owner[n.name] = n.meta["fxshape_param"].rsplit(".", 1)[0]

    def vote(others):
        got = [owner[m.name] for m in others if m.name in owner]
        return collections.Counter(got).most_common(1)[0][0] if got else None

    for n in nodes:  # program order: inputs first
        if n.name not in owner and n.op == "call_function":
            known = [m for m in n.all_input_nodes if m.name in owner]
            if known:
                owner[n.name] = owner[max(known, key=lambda m: index[m.name]).name]
    for n in reversed(nodes):  # what has no attributed input: its users'
        if n.name not in owner and n.op == "call_function":
            found = vote(n.users)
            if found is not None:
                owner[n.name] = found
    return owner


def phase_of(gm) -> dict:
    """node name -> ``forward``/``backward``: in a joint graph, the backward is everything
    from the first node that depends on the loss (the output's first value) on, in program
    order (autograd runs there the ops that only read saved values too, like a norm's
    ``pow(rstd, 3)``); everything is forward elsewhere."""
    out = next((n for n in gm.graph.nodes if n.op == "output"), None)
    first = out.args[0][0] if out is not None and isinstance(out.args[0], (tuple, list)) \
        and out.args[0] else None
    if not any("fxshape_phase" in n.meta for n in gm.graph.nodes) or \
            not isinstance(first, torch.fx.Node):
        return {}
    nodes = list(gm.graph.nodes)
    index = {n.name: i for i, n in enumerate(nodes)}
    users = [index[u.name] for u in first.users if u.op != "output"]
    start = min(users) if users else len(nodes)
    return {n.name: "backward" if i >= start else "forward" for i, n in enumerate(nodes)}


def _context(gm, rows, dkey, module_of):
    """What both regimes' walks need: the run dtype, the sizes, the dropout chains, each
    node's phase and module, the GEMM rows by node."""
    run = run_dtype(dkey)
    by_node: dict = {}
    for r in rows:
        by_node.setdefault(r.node, []).append(r)
    return (run, Sizes(model_float_dtype(gm), run), dropout_chains(gm), phase_of(gm),
            attribute_modules(gm, module_of), by_node)


def op_records(gm, rows, *, spec, dkey, module_of, vocab_size=None, execution="eager"):
    """``(records, unsupported, notes)`` for every node of ``gm`` in program order (see the
    module docstring); ``rows``: the GEMM rows of ``gm``'s nodes. In a joint graph the
    synthetic loss (a sum of the first output) is priced as a cross-entropy over
    ``vocab_size`` classes when the output's last dimension is that. ``execution``
    ``"compiled"`` or ``"cudagraphs"``: the memory-bound ops as Inductor's fused kernels
    (:func:`compiled_records`)."""
    if execution != "eager":
        records, unsupported, notes = compiled_records(
            gm, rows, spec=spec, dkey=dkey, module_of=module_of, vocab_size=vocab_size,
            cuda_graphs=execution == "cudagraphs")
        return launch_regime(records, execution, spec), unsupported, notes
    records, unsupported, notes = _eager_records(gm, rows, spec=spec, dkey=dkey,
                                                 module_of=module_of, vocab_size=vocab_size)
    return launch_regime(records, execution, spec), unsupported, notes


#: record classes whose kernels the GEMM fit's constants price (their fixed cost per kernel
#: is that fit's ``launch_s``, measured in its timing regime); the others (memory-bound
#: kernels: ``fxshape.cost.memops``) were timed as single eager launches
_GEMM_TIMED = ("gemm", "attention")


def regime_gaps(execution: str, spec) -> dict:
    """``{record class: seconds per kernel}`` that :func:`launch_regime` adds under
    ``execution`` on ``spec`` (what a re-pricing of the same kernels adds too:
    ``fxshape.serving.batch``); classes not in it add nothing (their constants were timed
    as single eager launches)."""
    from ..cost.gemm import CURRENT_LIBRARY, constants_library

    gap = launch_gap_s(execution, constants_library(spec) == CURRENT_LIBRARY, host_params())
    return {cls: gap for cls in _GEMM_TIMED}


def launch_regime(records, execution: str, spec) -> list:
    """``records`` with each kernel's time in ``execution``'s launch regime
    (:func:`fxshape.cost.host.launch_gap_s`): a host-launched kernel priced with constants
    fitted on CUDA-graph replays (today's H100 and B200 GEMMs and attention) pays the gap
    between queued eager launches; the others keep their fitted time."""
    gaps = regime_gaps(execution, spec)
    out = []
    for r in records:
        gap = gaps.get(r.cls, 0.0)
        if gap and r.kernels and r.time_s > 0:
            r = dataclasses.replace(r, time_s=r.time_s + gap * r.kernels)
        out.append(r)
    return out


def _eager_records(gm, rows, *, spec, dkey, module_of, vocab_size=None):
    hp = host_params()
    run, sizes, roles, phases, owner, by_node = _context(gm, rows, dkey, module_of)
    loss_nodes, loss_records, notes = _loss(gm, sizes, spec, run, hp, vocab_size, owner)
    notes = list(notes)
    records, unsupported = [], []
    for n in gm.graph.nodes:
        if n.op != "call_function":
            continue
        phase = phases.get(n.name, "forward")
        if n.name in by_node:
            records.extend(_copy_record(n, sizes, spec, run, owner, phase,
                                        hp.op_s("view", phase)))
            records.extend(_gemm_records(by_node[n.name], lambda r: hp.op_s("gemm", r.phase)))
            continue
        if n.name in loss_nodes:
            if loss_nodes[n.name]:
                records.extend(loss_records[loss_nodes[n.name]])
            continue
        got = node_kernels(n, sizes, roles.get(n.name, ""))
        fqn = owner.get(n.name, "")
        op = str(n.target).replace("aten.", "")
        if got.kind == "skip":
            continue
        if got.kind == "unsupported":
            unsupported.append(Unsupported(n.name, str(n.target), fqn,
                                           "no cost model: " + got.reason))
            continue
        if got.kind == "view":
            records.append(OpRecord(n.name, op, fqn, phase, "view", 0, 0, 0, 0.0,
                                    hp.op_s("view", phase), note=got.reason))
            continue
        t = sum(_price(k, spec, run) for k in got.kernels)
        fam = "+".join(dict.fromkeys(k.family for k in got.kernels))
        records.append(OpRecord(n.name, op, fqn, phase, "memory", len(got.kernels),
                                sum(k.bytes for k in got.kernels), 0, t,
                                hp.op_s("kernel", phase), family=fam, note=got.reason))
    return records, unsupported, tuple(notes)


def _gemm_records(rows, host_of) -> list:
    """The records of one node's GEMM rows: a GEMM each, or one fused attention kernel for
    all the rows of an attention call (the unfused math path is a kernel per row); the
    node's host time (``host_of(first row)``) on its first record."""
    out = []
    for i, r in enumerate(rows):
        first = i == 0
        fused = r.kernel not in ("", "math")
        # a fused call launches its kernel(s) once (2 for split-KV decode: split + combine)
        launches = getattr(r.attention, "kernels", 1) if fused else 1
        decode = getattr(r.attention, "decode", None) if fused else None
        nbytes = r.prediction.bytes if decode is None else (decode.bytes if first else 0)
        out.append(OpRecord(
            node=r.node, op=r.op, module=r.module, phase=r.phase,
            cls="attention" if r.kernel else "gemm",
            kernels=(launches if (first or not fused) else 0) * r.kernels, bytes=nbytes,
            flops=r.flops, time_s=r.time_s,
            # a quantized layer's conversion or quantization kernel is an op of its own
            host_s=host_of(r) * r.kernels if first else 0.0,
            family=r.kernel or "gemm", note=r.note, shape=(r.batch, r.m, r.n, r.k)))
    return out


def _copy_record(n, sizes, spec, run, owner, phase, host_per_copy) -> list:
    """The contiguous copies ``aten.matmul`` makes of operands it cannot fold as views
    (``fxshape.analysis.opcost.matmul_copies``), as one record (none when there are none)."""
    ks = matmul_copies(n, sizes)
    if not ks:
        return []
    return [OpRecord(f"{n.name}.copies", "matmul operand copy", owner.get(n.name, ""), phase,
                     "memory", len(ks), sum(k.bytes for k in ks), 0,
                     sum(_price(k, spec, run) for k in ks), host_per_copy * len(ks),
                     family="copy", note="operands whose batch dimensions are not one view, "
                                         "copied contiguous before the batched GEMM")]


def _loss(gm, sizes, spec, run, hp, vocab_size, owner):
    """The joint graph's synthetic loss priced as PyTorch's cross-entropy: ``({node: key},
    {key: records}, notes)``; the nodes mapped to "" are dropped (their work is in the
    records)."""
    mapping, loss_fx, notes = _loss_nodes(gm, vocab_size, sizes)
    if loss_fx is None:
        return {}, {}, notes
    name, x, v = loss_fx
    rows = x.numel() // v
    e = sizes.itemsize(x)
    n = rows * v
    fqn = owner.get(name, "")

    def rec(op, phase, kernels):
        t = sum(_price(k, spec, run) for k in kernels)
        return OpRecord(f"{name}.{op}", op, fqn, phase, "memory", len(kernels),
                        sum(k.bytes for k in kernels), 0, t, hp.op_s("kernel", phase),
                        family="+".join(dict.fromkeys(k.family for k in kernels)),
                        note=f"cross-entropy over {v} classes, {rows} rows, in fp32")
    fwd, bwd = [], []
    if e != 4:  # the logits upcast to fp32 first, as Hugging Face's loss does
        fwd.append(rec("to_fp32", "forward", [Kernel("copy", n * (e + 4))]))
        bwd.append(rec("to_fp32_backward", "backward", [Kernel("copy", n * (4 + e))]))
    fwd.append(rec("log_softmax", "forward", [Kernel("softmax", 8 * n, rows, v)]))
    fwd.append(rec("nll_loss", "forward", [Kernel("reduction", rows * 12 + 4)]))
    bwd[:0] = [rec("nll_loss_backward", "backward",
                   [Kernel("fill", 4 * n), Kernel("scatter", rows * 12)]),
               rec("log_softmax_backward", "backward", [Kernel("softmax", 12 * n, rows, v)])]
    return mapping, {"forward": fwd, "backward": bwd}, notes


#: ops Inductor runs as library fallbacks or as kernels nothing fuses into
_EXTERN_OPS = {"sort", "topk", "argsort", "nonzero", "embedding_dense_backward",
               "index_put", "index_put_", "scatter", "scatter_", "scatter_add", "scatter_add_",
               "index_add", "index_add_", "index_copy", "index_copy_", "scatter_reduce",
               "masked_scatter", "nll_loss_backward", "nll_loss2d_backward", "cumsum",
               "cumprod", "logcumsumexp", "randperm", "histc", "bincount", "bucketize",
               "searchsorted"}


def compiled_records(gm, rows, *, spec, dkey, module_of, vocab_size=None, cuda_graphs=False):
    """The records of ``gm`` as ``torch.compile`` runs it: GEMMs and attention as library
    calls, the memory-bound ops in Inductor's fusion groups (``fxshape.execution.fusion``),
    each group one kernel, launched by Inductor's wrapper (per kernel, and per compiled
    graph; with CUDA graphs, per graph only). The loss's cross-entropy is two fused kernels
    (the forward's looped log-softmax with the upcast and the gather; the backward's
    softmax gradient recomputed from the logits)."""
    from .fusion import fusion_groups

    hp = host_params()
    per_kernel = 0.0 if cuda_graphs else hp.compiled_kernel_s
    run, sizes, roles, phases, owner, by_node = _context(gm, rows, dkey, module_of)
    loss_nodes, loss_fx, loss_notes = _loss_nodes(gm, vocab_size, sizes)
    notes = list(loss_notes)
    category, eager, unsupported = compiled_categories(gm, by_node, loss_nodes, sizes, roles,
                                                       owner)
    groups = fusion_groups(gm, category, sizes, phases)
    node_by_name = {n.name: n for n in gm.graph.nodes}
    anchored: dict = {}
    for g in groups:
        anchored.setdefault(g.nodes[0], []).append(g)
    records = []
    graphs = sorted(set(phases.values())) if phases else ["forward"]
    for phase in graphs:  # Inductor's per-graph launch: the forward's and the backward's
        records_phase = OpRecord(f"graph.{phase}", "compiled graph call", "", phase, "view",
                                 0, 0, 0, 0.0, hp.compiled_graph_s,
                                 note="the compiled graph's guards and wrapper")
        if phase == "forward":
            records.append(records_phase)
        else:
            backward_call = records_phase
    backward_started = False
    for n in gm.graph.nodes:
        if n.op != "call_function":
            continue
        phase = phases.get(n.name, "forward")
        if phase == "backward" and not backward_started and "backward" in graphs:
            records.append(backward_call)
            backward_started = True
        if n.name in by_node:
            records.extend(_copy_record(n, sizes, spec, run, owner, phase, per_kernel))
            records.extend(_gemm_records(by_node[n.name], lambda r: per_kernel))
            continue
        if n.name in loss_nodes and loss_nodes[n.name]:
            records.append(_compiled_loss(loss_fx, loss_nodes[n.name], spec, sizes, per_kernel,
                                          owner))
            continue
        if n.name in eager:
            ks = eager[n.name]
            records.append(OpRecord(n.name, str(n.target).replace("aten.", ""),
                                    owner.get(n.name, ""), phase, "memory", len(ks),
                                    sum(k.bytes for k in ks), 0,
                                    sum(_price(k, spec, run) for k in ks),
                                    per_kernel * len(ks),
                                    family="+".join(dict.fromkeys(k.family for k in ks)),
                                    note="a library kernel in the compiled graph"))
        for g in anchored.get(n.name, ()):
            members = [x for x in g.nodes]
            # the first member's module: a kernel that starts in a layer and runs on into
            # the next (its residual add fused with the next LayerNorm) is the layer's, so
            # a deduplicated trace repeats it once per layer
            module = owner.get(members[0], "")
            ops = list(dict.fromkeys(_short(x, node_by_name) for x in members))
            label = "+".join(ops[:4]) + (f"+{len(ops) - 4} more" if len(ops) > 4 else "")
            records.append(OpRecord(
                f"fused.{members[0]}", f"fused({label})", module, phase, "memory", 1,
                g.bytes, 0, kernel_time("elementwise", g.bytes, gpu=spec).time_s,
                per_kernel, family="triton_reduction" if g.reduction else "triton",
                note=f"{len(members)} ops in one generated kernel"
                     + (f", {g.passes} read passes (looped reduction)" if g.passes > 1
                        else "")))
    if "backward" in graphs and not backward_started:
        records.append(backward_call)
    notes.append("compiled: memory-bound ops in Inductor's fusion groups (docs/step.md)"
                 + ("; CUDA graphs: one launch per graph" if cuda_graphs else ""))
    return records, unsupported, tuple(notes)


def compiled_categories(gm, by_node, loss_nodes, sizes, roles, owner):
    """What each node is to Inductor's scheduler: ``(category, eager kernels of the library
    calls among the memory ops, unsupported)``; ``category``: node name -> ``"extern"``
    (GEMMs, attention, scatters, fallbacks), ``"view"``, ``"pointwise"``, ``"reduction"`` or
    ``"loss"``."""
    category, eager, unsupported = {}, {}, []
    for n in gm.graph.nodes:
        if n.op != "call_function":
            continue
        if n.name in by_node:
            category[n.name] = "extern"
            continue
        if n.name in loss_nodes:
            category[n.name] = "loss"
            continue
        got = node_kernels(n, sizes, roles.get(n.name, ""))
        if got.kind in ("skip", "view") or _inlined_constant(n, got, by_node):
            category[n.name] = "view"
        elif got.kind == "unsupported":
            category[n.name] = "extern"
            unsupported.append(Unsupported(n.name, str(n.target), owner.get(n.name, ""),
                                           "no cost model: " + got.reason))
        else:
            fams = {k.family for k in got.kernels}
            name = _op_packet(n)
            if name in _EXTERN_OPS or "scatter" in fams:
                category[n.name] = "extern"
                eager[n.name] = got.kernels
            elif fams & {"layer_norm", "softmax", "reduction"}:
                category[n.name] = "col_reduction" if _column_reduction(n) else "reduction"
            else:
                category[n.name] = "pointwise"
    return category, eager, unsupported


def _inlined_constant(n, got, by_node) -> bool:
    """A fill that reads no tensor (``ones_like`` of the loss's gradient, ``arange``, a mask's
    ``ones``) is computed inside every kernel that reads it, unless a library call or the
    graph's output needs it in memory."""
    if not got.kernels or {k.family for k in got.kernels} != {"fill"}:
        return False
    if any(isinstance(m.meta.get("val"), torch.Tensor) and m.meta["val"].numel() > 1
           for m in n.all_input_nodes):
        return False
    stack, seen = list(n.users), set()
    while stack:
        u = stack.pop()
        if u.name in seen:
            continue
        seen.add(u.name)
        if u.op == "output" or u.name in by_node:
            return False
        if u.target is operator.getitem or is_view(u.target):
            stack.extend(u.users)
    return True


def _column_reduction(n) -> bool:
    """Does a reduction keep its input's last dimension (a sum over the tokens, as a bias
    gradient is)? Inductor's loop over it runs across rows, not along them."""
    ins = [m.meta.get("val") for m in n.all_input_nodes]
    ins = [t for t in ins if isinstance(t, torch.Tensor) and t.dim() >= 2]
    out = n.meta.get("val")
    if not ins or not isinstance(out, torch.Tensor) or out.dim() == 0:
        return False
    x = ins[0]
    return out.shape[-1] == x.shape[-1] and out.numel() < x.numel() and x.shape[-1] > 1


def _op_packet(n) -> str:
    t = n.target
    return t.overloadpacket.__name__ if isinstance(t, torch._ops.OpOverload) else str(t)


def _short(name, nodes) -> str:
    """A member's op name (``native_layer_norm``, ``add``)."""
    return _op_packet(nodes[name]) if name in nodes else name


def _loss_nodes(gm, vocab_size, sizes):
    """The synthetic loss's nodes (``{name: "forward" | "backward"}``: the sum and its
    gradient seed), ``(loss node name, logits value, vocabulary)`` (None when the loss is not
    over logits) and notes."""
    out = next((n for n in gm.graph.nodes if n.op == "output"), None)
    if out is None or not any("fxshape_phase" in n.meta for n in gm.graph.nodes):
        return {}, None, ()
    loss = out.args[0][0] if isinstance(out.args[0], (tuple, list)) and out.args[0] else None
    if not isinstance(loss, torch.fx.Node) or "sum" not in str(loss.target):
        return {}, None, ()
    x = loss.args[0].meta.get("val") if isinstance(loss.args[0], torch.fx.Node) else None
    if x is None or not vocab_size or x.dim() < 2 or int(x.shape[-1]) != int(vocab_size):
        return {}, None, ("loss: the sum of the model's first output (it is not logits over "
                          "the vocabulary), priced as that sum",)
    mapping = {loss.name: "forward"}
    mapping.update({u.name: "backward" for u in loss.users if "ones_like" in str(u.target)})
    v = int(vocab_size)
    return mapping, (loss.name, x, v), (
        f"loss: cross-entropy over the {v}-word vocabulary ({x.numel() // v} rows, fp32), in "
        "place of the capture's sum",)


def loss_of(gm, vocab_size, sizes):
    """``(loss node name, logits value, vocabulary)`` of the joint graph's synthetic loss
    when it is priced as a cross-entropy over the vocabulary, else None."""
    return _loss_nodes(gm, vocab_size, sizes)[1]


def _compiled_loss(loss_fx, phase, spec, sizes, per_kernel, owner) -> OpRecord:
    name, x, v = loss_fx
    rows = x.numel() // v
    e = sizes.itemsize(x)
    n = rows * v
    if phase == "forward":
        # the looped log-softmax reads the logits twice (max and sum, then the gather);
        # writes each row's log-sum-exp and the loss
        nbytes = 2 * n * e + rows * 8 + 8
    else:
        # the gradient softmax(x) - onehot, recomputed from the logits and the saved
        # log-sum-exp: reads the logits, writes the gradient
        nbytes = 2 * n * e + rows * 12
    return OpRecord(f"{name}.{phase}", f"fused(cross_entropy{'_backward' * (phase != 'forward')})",
                    owner.get(name, ""), phase, "memory", 1, nbytes, 0,
                    kernel_time("elementwise", nbytes, gpu=spec).time_s, per_kernel,
                    family="triton_reduction",
                    note=f"cross-entropy over {v} classes, {rows} rows, one generated kernel")


def optimizer_records(optimizer, numels, *, spec, mixed: bool):
    """Records of the optimizer step (and, under mixed precision, the casts autocast runs:
    each fp32 weight to the GEMM dtype in the forward, its gradient back in the backward)."""
    hp = host_params()
    out = []
    total = sum(numels)
    if mixed and total:
        k = kernel_time("copy", 6 * total, gpu=spec)
        for phase in ("forward", "backward"):
            out.append(OpRecord(f"autocast.{phase}", "autocast weight casts", "", phase,
                                "memory", len(numels), 6 * total, 0,
                                k.time_s + (len(numels) - 1) * _launch(spec),
                                len(numels) * hp.op_s("kernel", phase), family="copy",
                                note="fp32 master weights cast to the GEMM dtype (forward) "
                                     "and their gradients back to fp32 (backward)"))
    for p in optimizer_passes(optimizer, numels):
        t = kernel_time("elementwise", p.bytes, gpu=spec).time_s + (p.launches - 1) * \
            _launch(spec)
        out.append(OpRecord(f"optimizer.{p.op}", f"{optimizer}.{p.op}", "", "optimizer",
                            "optimizer", p.launches, p.bytes, 0, t,
                            hp.kernel_s + p.launches * hp.view_s, family="elementwise",
                            note=f"multi-tensor {p.op} over {len(numels)} parameters"))
    return out


def _tp_collective(r, kind: str, nbytes: int, *, tp, topology, allreduce, async_tp,
                   spec) -> OpRecord:
    """The record of one tensor-parallel collective of ``kind`` after the GEMM record ``r``
    (:func:`comm_records`)."""
    from ..cost.allreduce import predict_allreduce
    from ..cost.comm import predict_collective

    if allreduce is not None and kind == "all_reduce":
        a = predict_allreduce(nbytes, tp, algorithm=allreduce, topology=topology)
        t, family = a.time_s, a.algorithm
        note = f"{nbytes / 2**10:.1f} KiB over {tp} GPUs ({a.link}): {a.why}"
    else:
        p = predict_collective(kind, nbytes, tp, topology=topology, per_node=tp)
        t, family = p.time_s, p.link_class
        note = (f"{nbytes / 2**20:.2f} MiB over {tp} GPUs "
                f"({p.link}, {p.busbw_gbs:.0f} GB/s bus)")
    hidden = 0.0
    if async_tp:  # the first of tp chunks exposed, the rest under the GEMM
        first = t / tp
        hidden = min(t - first, r.time_s)
        note += f"; async TP: {hidden / t:.0%} under the GEMM"
        if kind == "reduce_scatter" and spec is not None:
            # the tp partial outputs copied in are summed by one kernel after the last
            # chunk: it reads them all, writes the rank's shard
            red = kernel_time("reduction", int(nbytes * (1 + 1 / tp)), gpu=spec).time_s
            t += red
            note += f", then the partials summed ({red * 1e6:.0f} us)"
    return OpRecord(f"{r.node}.{kind}", f"tp {kind}", r.module, r.phase, "communication", 1,
                    nbytes, 0, t - hidden, 0.0, family=family, note=note,
                    overlapped_s=hidden)


def comm_records(records, *, tp, dp, topology, item, grad_bytes, sequence_parallel=False,
                 allreduce=None, spec=None, async_tp=False):
    """``(records, notes, dp_total_s)``: ``records`` with the collectives of tensor and data
    parallelism added (``fxshape.cost.comm``), notes, and the data-parallel all-reduce's
    whole time (its record holds the exposed part; 0 without one).

    Tensor parallelism (Megatron): after each row-parallel GEMM of the forward (attention's
    output projection, the MLP's down projection), an all-reduce of its output (tokens x
    hidden); in the backward one more per row-parallel layer, for the input gradient of the
    column-parallel layers feeding it. With ``sequence_parallel`` each all-reduce is a
    reduce-scatter and an all-gather of the same buffer. These sit on the critical path.
    ``async_tp`` (``Parallel.async_tp``; torch.compile's micro-pipeline TP, torchtitan's
    async TP): each of them is decomposed into ``tp`` chunks run beside the ``tp`` chunks of
    the GEMM it is fused with (the row-parallel GEMM for its reduce-scatter, the
    column-parallel GEMMs after it for its all-gather, at least as long), by symmetric
    memory's copies (copy engines: no SMs taken): the first chunk's copy is exposed, the
    rest hides under the GEMM as far as it lasts (``overlapped_s``); a reduce-scatter then
    sums the ``tp`` partial outputs copied to the rank (a memory-bound kernel reading them
    all, on the critical path). The chunked GEMMs are priced whole.
    ``allreduce`` (``fxshape.cost.allreduce``: ``"auto"``, ``"nccl"``, ``"one-shot"``,
    ``"two-shot"``, ``"multimem"``): the all-reduces run as a serving engine runs them under
    CUDA graphs (inside one node); None: NCCL as measured from eager PyTorch
    (``fxshape.cost.comm``).

    Data parallelism (DDP): the gradients, ``grad_bytes`` per GPU, all-reduced in 25 MiB
    buckets (DDP's ``bucket_cap_mb``) as the backward produces them, on a stream of their
    own. A bucket is ready when the backward has done its share of the work (the gradients
    are taken to appear in proportion to the backward's GPU time); only what runs past the
    backward's end is exposed. While a bucket is reduced its NCCL CTAs hold SMs of ``spec``
    (``fxshape.parallelism.overlap.sm_share``) and the backward beside it runs slower: the
    record's time is the exposed part plus that stretch (``overlapped_s``: the hidden part)."""
    from ..analysis.parallel import layer_kind

    notes = []
    out = []
    if tp > 1:
        # the forward output of each row-parallel layer: tokens x hidden
        sizes = {}
        for r in records:
            if r.cls == "gemm" and r.phase == "forward" and r.shape and \
                    layer_kind(r.module, r.op) == "row":
                b, m, n, _ = r.shape
                sizes.setdefault(r.module, b * m * n * item)
        placed = set()
        kinds = ("reduce_scatter", "all_gather") if sequence_parallel else ("all_reduce",)
        for r in records:
            out.append(r)
            if r.cls != "gemm" or r.module not in sizes:
                continue
            if r.phase == "forward":
                pass
            elif r.module in placed:
                continue  # one backward all-reduce per row-parallel layer
            else:
                placed.add(r.module)
            out.extend(_tp_collective(r, kind, sizes[r.module], tp=tp, topology=topology,
                                      allreduce=allreduce, async_tp=async_tp, spec=spec)
                       for kind in kinds)
        both = any(r.phase == "backward" for r in records)
        notes.append(f"tp {tp}: Megatron all-reduces after each row-parallel GEMM"
                     + (", forward and backward" if both else "")
                     + (" (sequence parallel: reduce-scatter + all-gather)"
                        if sequence_parallel else "")
                     + ("; async TP: each fused with its GEMM in tp chunks, the first "
                        "chunk's copy exposed" if async_tp else "")
                     + f", on {topology.name}"
                     + (f"; all-reduce {allreduce!r} under CUDA graphs "
                        "(fxshape.cost.allreduce)" if allreduce is not None else ""))
    else:
        out = list(records)
    dp_total = 0.0
    if dp > 1 and grad_bytes > 0:
        out, note, dp_total = _dp_allreduce(out, dp=dp, tp=tp, topology=topology,
                                            grad_bytes=grad_bytes, spec=spec)
        notes.append(note)
    return out, notes, dp_total


def recompute_records(records, layers, select=None):
    """``records`` with activation checkpointing (``gradient_checkpointing_enable()``): each
    layer of ``layers`` (module prefixes, ``model.layers.3``) runs its forward again in the
    backward, right before its own backward; ``select`` (record -> bool): only the forward
    records it picks (selective recomputation). The copies keep their time and host cost,
    but not their FLOPs: the recomputation is not useful work (MFU leaves it out)."""
    from ..tracing.dedup import renamed

    layer_of = _layer_of(layers)
    forward: dict = {}
    for r in records:
        lay = layer_of(r.module)
        if lay is not None and r.phase == "forward" and (select is None or select(r)):
            forward.setdefault(lay, []).append(r)
    what = "activation checkpointing" if select is None else "selective recomputation"
    out, done = [], set()
    for r in records:
        lay = layer_of(r.module) if r.phase == "backward" else None
        if lay is not None and lay not in done and lay in forward:
            done.add(lay)
            out.extend(renamed(
                f, node=f"{f.node}@recompute", phase="backward", flops=0,
                note=(f.note + "; " if f.note else "") + f"recomputed ({what})")
                for f in forward[lay])
        out.append(r)
    return out


def _layer_of(layers):
    """``module -> the prefix of it among layers`` (module prefixes, ``model.layers.3``), or
    None: one dict probe per path part, memoised."""
    wanted = set(layers)
    found: dict = {}

    def layer_of(module):
        if module not in found:
            parts = module.split(".")
            found[module] = next((p for p in (".".join(parts[:k])
                                              for k in range(1, len(parts) + 1))
                                  if p in wanted), None)
        return found[module]

    return layer_of


def op_checkpoint_nodes(records, layers) -> dict:
    """torchtitan's op-level selective checkpointing (``selective_ac_option = 'op'``,
    ``torchtitan/distributed/activation_checkpoint.py``): in each checkpointed layer its
    policy saves the output of every ``aten.mm`` but the second, fourth ... of the layer's
    forward, of the fused attention kernel and of the reduce-scatter, and prefers to
    recompute everything else. ``{"all": the forward records run again, "dropped": their
    graph nodes, whose saved outputs are freed, "rerun": True (a layer holds them again while
    its backward recomputes them)}`` (a deduplicated layer's copies, ``x@7``, share their
    representative's node)."""
    layer_of = _layer_of(layers)
    count: dict = {}
    again = set()
    for r in records:
        if r.phase != "forward":
            continue
        lay = layer_of(r.module)
        if lay is None:
            continue
        if r.cls == "gemm" and r.op == "mm":
            count[lay] = count.get(lay, 0) + 1
            if count[lay] % 2 == 0:
                again.add(r.node)
        elif r.cls in ("memory", "gemm"):  # addmm, bmm: not in the save list
            again.add(r.node)
    return {"all": frozenset(again),
            "dropped": frozenset(n.split("@", 1)[0] for n in again), "rerun": True}


#: the suffix of the name under which an unfused attention call's probabilities are saved
PROBS = "#probs"


def selective_nodes(records, gm) -> dict:
    """The attention core Megatron's selective recomputation re-runs: ``{"all": nodes,
    "dropped": nodes whose saved outputs it frees}``. The core is the attention calls (a
    fused kernel, or the unfused path's QKᵀ and PV GEMMs) and the softmax and dropout
    between them; what it frees is what of it only the core reads (the scores, the
    probabilities), not the output the projection after it saves; by graph node name (a
    deduplicated layer's copies, ``x@7``, share their representative's). A fused
    attention kernel is its own core: it saves only its output and log-sum-exp, and
    nothing more is freed, unless it runs unfused (``attention="math"``): then its saved
    probabilities (``node + PROBS``, fxshape.execution.memory.unfused_attention_saved)
    are freed."""
    from ..analysis.parallel import layer_kind

    core = set()
    attn_modules = set()
    for r in records:
        if r.phase != "forward":
            continue
        if r.cls == "attention" or (r.cls == "gemm" and r.shape and
                                    layer_kind(r.module, r.op) == "attention"):
            core.add(r.node)
            attn_modules.add(r.module)
    for r in records:
        if r.phase == "forward" and r.cls == "memory" and r.module in attn_modules and \
                any(w in r.op for w in ("softmax", "dropout", "native_dropout")):
            core.add(r.node)
    # what the core saves: every node from its first GEMM (QKᵀ) up to, not including, its
    # last (the product with V, whose output the projection after it keeps): the scores,
    # their scaling and mask, the probabilities and their dropout
    names = [n.name for n in gm.graph.nodes]
    index = {name: k for k, name in enumerate(names)}
    by_module: dict = {}
    for r in records:
        if r.node in core:
            base = r.node.split("@", 1)[0]  # a deduplicated layer's copies: x@7
            if base in index:
                by_module.setdefault(r.module, set()).add(index[base])
    # an unfused attention call's probabilities (PROBS)
    dropped = {r.node.split("@", 1)[0] + PROBS for r in records
               if r.node in core and r.cls == "attention"}
    for found in by_module.values():
        first, last = min(found), max(found)
        dropped.update(names[first:last])
    return {"all": frozenset(core), "dropped": frozenset(dropped)}


def sustained_records(records, rows, spec, dkey):
    """The records of a long job (training): each GEMM and attention kernel at the clock
    the GPU sustains under its power limit (``fxshape.hardware.power``), from its FLOP rate
    at boost over the dense peak of the format it runs in (``rows``' dtype, else ``dkey``).
    Returns (records, note); the note says what was slowed, or that the GPU has no
    sustained-clock curve and its kernels keep their burst-clock times."""
    from ..hardware.power import clock_curve, sustained_ratio

    curve = clock_curve(spec)
    if curve is None:
        why = ("no board power is recorded for it" if spec.power_w is None else
               f"no sustained-clock measurement for {spec.arch} GPUs")
        return records, (f"clocks: kernels at their burst clock ({why}); a long job's dense "
                         "GEMMs may run slower under the power limit")
    dtypes = {r.node: r.dtype for r in rows}
    out, before, after = [], 0.0, 0.0
    for r in records:
        if r.cls in ("gemm", "attention") and r.flops and r.time_s > 0:
            try:
                peak = spec.peak_tflops(dtypes.get(r.node, dkey))
            except ValueError:  # a format with no peak of its own (int4 weights): the run's
                peak = spec.peak_tflops(dkey)
            ratio = sustained_ratio(spec, r.flops / (r.time_s * peak * 1e12), curve)
            before += r.time_s
            if ratio < 1.0:
                r = dataclasses.replace(r, time_s=r.time_s / ratio)
            after += r.time_s
        out.append(r)
    share = 100 * (after / before - 1) if before else 0.0
    return out, (f"clocks: {spec.label} at {spec.power_w:g} W in a long job: the GEMM and "
                 f"attention kernels that draw more than the limit at boost run at the clock "
                 f"it sustains (+{share:.1f}% on their time; a dense bf16 GEMM at "
                 f"{curve.burst_fraction:.0%} of peak keeps "
                 f"{sustained_ratio(spec, curve.burst_fraction, curve):.1%} of its rate; "
                 f"fxshape.hardware.power, from {curve.reference}'s measured sustained rate)")


def shard_memory_records(records, tp, spec, sequence_parallel=False):
    """Memory-bound records of a model at ``tp`` > 1, each GPU's share: an op inside a
    block whose projections are tensor-parallel (the block is the parent module of a
    column- or row-parallel GEMM: ``...self_attn``, ``...mlp``) works on that GPU's heads
    or MLP columns, so it moves ``1 / tp`` of its bytes; everything else (norms, residual
    adds, embeddings, the loss) is replicated, unless ``sequence_parallel``: then the ops
    between the blocks run on ``1 / tp`` of the tokens too."""
    from ..analysis.parallel import in_blocks, sharded_modules, tp_blocks

    blocks = tp_blocks(sharded_modules([r for r in records if r.cls == "gemm"]))
    launch = _launch(spec)
    out = []
    for r in records:
        inside = sequence_parallel or in_blocks(r.module, blocks)
        if r.cls == "memory" and inside and r.bytes:
            fixed = launch * r.kernels
            t = fixed + max(0.0, r.time_s - fixed) / tp
            r = dataclasses.replace(r, bytes=r.bytes // tp, time_s=t,
                                    note=(r.note + "; " if r.note else "") + f"1/{tp} per GPU")
        out.append(r)
    return out


def _dp_allreduce(records, *, dp, tp, topology, grad_bytes, spec=None):
    from ..cost.comm import predict_collective
    from ..parallelism.overlap import bucketed, buckets, sm_share
    from ..parallelism.placement import per_node as per_node_of

    per_node = per_node_of(dp, tp, topology.gpus_per_node)
    link = topology.link_class(dp, per_node)
    sizes = buckets(grad_bytes)
    times = [predict_collective("all_reduce", b, dp, topology=topology,
                                per_node=per_node).time_s for b in sizes]
    duration = sum(r.time_s for r in records if r.phase == "backward")
    ov = bucketed(duration, sizes, times, slow=0.0 if spec is None else sm_share(spec, link))
    exposed, total, stretch = ov.exposed, ov.comm, ov.stretch
    rec = OpRecord("dp.all_reduce", "dp gradient all-reduce", "", "backward", "communication",
                   len(sizes), grad_bytes, 0, exposed + stretch, 0.0, family=link,
                   overlapped_s=max(0.0, total - exposed),
                   note=f"{len(sizes)} buckets, {grad_bytes / 2**20:.1f} MiB over {dp} GPUs: "
                        f"{total * 1e3:.3f} ms, {exposed * 1e3:.3f} ms not hidden by the "
                        f"backward, {stretch * 1e3:.3f} ms added to it (its SMs)")
    idx = max((i for i, r in enumerate(records) if r.phase == "backward"), default=len(records))
    out = list(records[:idx + 1]) + [rec] + list(records[idx + 1:])
    return out, (f"dp {dp}: gradient all-reduce in 25 MiB buckets overlapped with the "
                 f"backward ({total * 1e3:.3f} ms, {exposed * 1e3:.3f} ms exposed, "
                 f"{stretch * 1e3:.3f} ms of backward slowed by its SMs), on "
                 f"{topology.name}"), total


def _launch(spec) -> float:
    return kernel_time("elementwise", 0, gpu=spec).time_s


def step_of(records, *, execution, mode, optimizer, spec, dkey, tokens, notes=()) -> Step:
    """Sum ``records`` (program order) into a :class:`Step` on the eager timeline."""
    tl = eager_timeline((r.host_s, r.time_s) for r in records)
    by = {c: 0.0 for c in CLASSES}
    for r in records:
        if r.cls in by:
            by[r.cls] += r.time_s
    by["host_idle"] = tl.idle_s
    flops = sum(r.flops for r in records if r.cls in ("gemm", "attention")
                and r.op not in RECOMPUTED_OPS)
    return Step(execution=execution, mode=mode, optimizer=optimizer if mode == "train" else None,
                time_s=tl.wall_s, by_class=by, gpu_s=tl.gpu_s, host_s=tl.host_s,
                kernels=sum(r.kernels for r in records), model_flops=flops,
                peak_tflops=get_gpu(spec).peak_tflops(dkey), tokens=tokens, notes=tuple(notes))
