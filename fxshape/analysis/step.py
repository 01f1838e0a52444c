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
from dataclasses import dataclass, field

import torch

from ..cost.host import eager_timeline, host_params
from ..cost.memops import kernel_time, memop_family
from ..cost.optimizer import optimizer_passes
from ..hardware.gpus import get_gpu
from .opcost import Kernel, Sizes, dropout_chains, node_kernels
from .rows import Unsupported

__all__ = ["OpRecord", "Step", "CLASSES", "EXECUTIONS", "op_records", "step_of",
           "check_execution", "model_float_dtype"]

#: the classes a step's time is split into (``Step.by_class``)
CLASSES = ("gemm", "attention", "memory", "optimizer", "communication", "host_idle")
#: how the model runs: ``"eager"`` (one kernel per aten op, the host dispatching each)
EXECUTIONS = ("eager",)


def check_execution(execution) -> None:
    if execution not in EXECUTIONS:
        raise ValueError(f"unknown execution {execution!r}; accepted: "
                         + ", ".join(repr(e) for e in EXECUTIONS)
                         + " ('compiled', torch.compile's fused kernels, is not modelled yet)")


@dataclass(frozen=True)
class OpRecord:
    """One costed op of the step.

    ``cls``: ``gemm``, ``attention``, ``memory`` (memory-bound kernels), ``view`` (no kernel),
    ``optimizer``; ``kernels``: launches; ``bytes``: read plus written (GEMMs: the minimum
    DRAM traffic); ``time_s``: GPU time; ``host_s``: the CPU time eager PyTorch spends on it.
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

    def as_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Step:
    """The predicted step (``report.step``).

    ``time_s`` is the eager timeline's wall time; ``by_class`` splits it (seconds per class
    of :data:`CLASSES`, summing to ``time_s``; ``host_idle`` is the time the GPU waits for
    the host). ``model_flops``: the useful GEMM and attention FLOPs of the step (forward, and
    backward in training; causal attention counts its half); ``mfu`` = ``model_flops`` over
    the dtype's dense peak times ``time_s``. ``tokens``: tokens the step processes (None when
    the inputs do not say).
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

    @property
    def mfu(self) -> float:
        return self.model_flops / (self.peak_tflops * 1e12 * self.time_s) if self.time_s else 0.0

    @property
    def tokens_per_s(self) -> float | None:
        return None if self.tokens is None or not self.time_s else self.tokens / self.time_s

    @property
    def host_idle_s(self) -> float:
        return self.by_class["host_idle"]

    def as_dict(self) -> dict:
        return {"execution": self.execution, "mode": self.mode, "optimizer": self.optimizer,
                "time_s": self.time_s, "by_class": dict(self.by_class), "gpu_s": self.gpu_s,
                "host_s": self.host_s, "kernels": self.kernels,
                "model_flops": self.model_flops, "peak_tflops": self.peak_tflops,
                "mfu": self.mfu, "tokens": self.tokens, "tokens_per_s": self.tokens_per_s,
                "notes": list(self.notes)}

    def describe(self) -> str:
        """``step (eager, train, adamw): 12.3 ms, 41.6k tokens/s, MFU 38.2%; gemm 70.1% ...``"""
        parts = [f"{self.time_s * 1e3:.3f} ms"]
        if self.tokens_per_s is not None:
            parts.append(f"{self.tokens_per_s:,.0f} tokens/s")
        parts.append(f"MFU {100 * self.mfu:.1f}%")
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


def _attribute(gm, module_of) -> dict:
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


def _phase_of(gm) -> dict:
    """node name -> ``forward``/``backward``: in a joint graph, backward is what depends on
    the loss (the output's first value); everything is forward elsewhere."""
    out = next((n for n in gm.graph.nodes if n.op == "output"), None)
    first = out.args[0][0] if out is not None and isinstance(out.args[0], (tuple, list)) \
        and out.args[0] else None
    if not any("fxshape_phase" in n.meta for n in gm.graph.nodes) or \
            not isinstance(first, torch.fx.Node):
        return {}
    backward, stack = set(), list(first.users)
    while stack:
        n = stack.pop()
        if n.name in backward or n.op == "output":
            continue
        backward.add(n.name)
        stack.extend(n.users)
    return {n.name: "backward" if n.name in backward else "forward" for n in gm.graph.nodes}


def op_records(gm, rows, *, spec, dkey, module_of, vocab_size=None):
    """``(records, unsupported, notes)`` for every node of ``gm`` in program order (see the
    module docstring); ``rows``: the GEMM rows of ``gm``'s nodes. In a joint graph the
    synthetic loss (a sum of the first output) is priced as a cross-entropy over
    ``vocab_size`` classes when the output's last dimension is that."""
    hp = host_params()
    run = run_dtype(dkey)
    sizes = Sizes(model_float_dtype(gm), run)
    roles = dropout_chains(gm)
    phases = _phase_of(gm)
    owner = _attribute(gm, module_of)
    by_node: dict = {}
    for r in rows:
        by_node.setdefault(r.node, []).append(r)
    loss_nodes, loss_records, notes = _loss(gm, sizes, spec, run, hp, vocab_size, owner)
    notes = list(notes)
    records, unsupported = [], []
    for n in gm.graph.nodes:
        if n.op != "call_function":
            continue
        phase = phases.get(n.name, "forward")
        if n.name in by_node:
            for i, r in enumerate(by_node[n.name]):
                fused = r.kernel not in ("", "math")
                first = i == 0
                nbytes = r.prediction.bytes
                records.append(OpRecord(
                    node=r.node, op=r.op, module=r.module, phase=r.phase,
                    cls="attention" if r.kernel else "gemm",
                    kernels=1 if (first or not fused) else 0, bytes=nbytes, flops=r.flops,
                    time_s=r.time_s, host_s=hp.op_s("gemm", r.phase) if first else 0.0,
                    family=r.kernel or "gemm", note=r.note))
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


def _loss(gm, sizes, spec, run, hp, vocab_size, owner):
    """The joint graph's synthetic loss priced as PyTorch's cross-entropy: ``({node: key},
    {key: records}, notes)``; the nodes mapped to "" are dropped (their work is in the
    records)."""
    out = next((n for n in gm.graph.nodes if n.op == "output"), None)
    if out is None or not any("fxshape_phase" in n.meta for n in gm.graph.nodes):
        return {}, {}, ()
    loss = out.args[0][0] if isinstance(out.args[0], (tuple, list)) and out.args[0] else None
    if not isinstance(loss, torch.fx.Node) or "sum" not in str(loss.target):
        return {}, {}, ()
    x = loss.args[0].meta.get("val") if isinstance(loss.args[0], torch.fx.Node) else None
    if x is None or not vocab_size or x.dim() < 2 or int(x.shape[-1]) != int(vocab_size):
        return {}, {}, ("loss: the sum of the model's first output (it is not logits over the "
                        "vocabulary), priced as that sum",)
    seeds = [u for u in loss.users if "ones_like" in str(u.target)]
    v = int(vocab_size)
    rows = x.numel() // v
    e = sizes.itemsize(x)
    n = rows * v
    fqn = owner.get(loss.name, "")

    def rec(name, phase, kernels):
        t = sum(_price(k, spec, run) for k in kernels)
        return OpRecord(f"{loss.name}.{name}", name, fqn, phase, "memory", len(kernels),
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
    mapping = {loss.name: "forward"}
    mapping.update({s.name: "backward" for s in seeds})
    return mapping, {"forward": fwd, "backward": bwd}, (
        f"loss: cross-entropy over the {v}-word vocabulary ({rows} rows, fp32), in place of "
        "the capture's sum",)


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
    flops = sum(r.flops for r in records if r.cls in ("gemm", "attention"))
    return Step(execution=execution, mode=mode, optimizer=optimizer if mode == "train" else None,
                time_s=tl.wall_s, by_class=by, gpu_s=tl.gpu_s, host_s=tl.host_s,
                kernels=sum(r.kernels for r in records), model_flops=flops,
                peak_tflops=get_gpu(spec).peak_tflops(dkey), tokens=tokens, notes=tuple(notes))
