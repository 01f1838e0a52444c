"""Memory per GPU: parameters, gradients, optimizer state, activations, the eager peak and
whether it fits (``report.memory``).

The activations come from an eager liveness walk over the captured graph
(:func:`liveness`). Each value's storage is allocated when the first node producing it runs
(views share their base's storage) and freed after its last reader. Values the graph returns
(the parameters' gradients) stay alive to the end. In a joint graph, the activations are
what is alive when the backward starts: what the backward saved. The persistent part is
counted from the model's parameters:

- inference: the weights in the analysis dtype (the model run as ``model.to(dtype)``);
- training: fp32 master weights and fp32 gradients; the optimizer's fp32 state
  (``fxshape.cost.optimizer``); under bf16/fp16 autocast, the half-precision copy of every
  weight the forward casts, held until its backward.

In training the walk also holds what the capture does not show: the training loss's
cross-entropy (its fp32 log-probabilities saved, its two logits-sized gradients at the start
of the backward: :func:`loss_saved`), and, where the attention runs unfused
(``attention="math"``), each call's probabilities and dropout mask
(:func:`unfused_attention_saved`).

The peak is the larger of two moments. One is the forward and backward walk on top of the
weights and the optimizer state (there from the first step on: a step's peak is any later
step's, as torch's ``MemTracker`` measures the second). The other is the optimizer step:
weights, gradients and state, plus the foreach AdamW's temporary square roots (4 bytes per
parameter). The caching allocator's rounding and
fragmentation, and the CUDA context (several hundred MiB), are not counted.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..parallelism.state import training_state
from ..analysis.opcost import Sizes

__all__ = ["Memory", "liveness", "memory_of", "SavedBytes", "unfused_attention_saved",
           "loss_saved"]

_GIB = 1024 ** 3


@dataclass(frozen=True)
class Memory:
    """Bytes per GPU (see the module docstring). ``fits``: ``peak <= capacity``."""

    parameters: int
    gradients: int
    optimizer_state: int
    activations: int
    peak: int
    capacity: int
    notes: tuple = ()
    #: decode: the static KV cache's keys and values (included in ``peak``)
    kv_cache: int = 0

    @property
    def fits(self) -> bool:
        return self.peak <= self.capacity

    def as_dict(self) -> dict:
        return {"parameters": self.parameters, "gradients": self.gradients,
                "optimizer_state": self.optimizer_state, "activations": self.activations,
                "kv_cache": self.kv_cache, "peak": self.peak, "capacity": self.capacity,
                "fits": self.fits,
                "notes": list(self.notes)}

    def describe(self) -> str:
        """``memory per GPU: parameters 0.23 GiB, ..., peak 5.1 of 80.0 GiB (fits)``."""
        parts = [f"parameters {self.parameters / _GIB:.2f}"]
        if self.gradients:
            parts.append(f"gradients {self.gradients / _GIB:.2f}")
        if self.optimizer_state:
            parts.append(f"optimizer state {self.optimizer_state / _GIB:.2f}")
        parts.append(f"activations {self.activations / _GIB:.2f}")
        if self.kv_cache:
            parts.append(f"KV cache {self.kv_cache / _GIB:.2f}")
        verdict = "fits" if self.fits else "does NOT fit"
        return ("memory per GPU (GiB): " + ", ".join(parts)
                + f"; peak {self.peak / _GIB:.2f} of {self.capacity / _GIB:.1f} ({verdict})")


@dataclass(frozen=True)
class SavedBytes:
    """Bytes alive at the start of the backward, by the node (and module) that made them:
    what a deduplicated trace multiplies by the layers it stands for."""

    node: str
    module: str
    phase: str
    bytes: int


def unfused_attention_saved(gm, owner: dict, run_item: int, share=None) -> list:
    """What an attention call run unfused saves for its backward, beyond what the fused
    custom op (``fxshape::attention``) shows: the probabilities (softmax's output, read by
    its backward and by the product with V's) and, with dropout, its mask (1 byte) and the
    dropped probabilities: ``b·h·sq·sk × (item + (1 + item) if dropout)`` bytes, the
    ``2as²b + as²b + 2as²b`` of Korthikanti et al. 2022 in fp16. One record per forward
    call of the graph, named ``node + PROBS`` (selective recomputation frees it);
    ``share``: node -> the GPUs its output is split over."""
    from ..tracing.attnops import ATTENTION_OPS
    from .step import PROBS

    out = []
    for n in gm.graph.nodes:
        if n.op != "call_function" or \
                getattr(n.target, "overloadpacket", None) is not ATTENTION_OPS[0]:
            continue
        q, k = n.args[0].meta.get("val"), n.args[1].meta.get("val")
        if q is None or k is None:
            continue
        dropout_p = n.args[4] if len(n.args) > 4 else n.kwargs.get("dropout_p", 0.0)
        scores = q.numel() // max(q.shape[-1], 1) * k.shape[-2]  # b·h·sq·sk
        per = run_item + ((1 + run_item) if dropout_p else 0)
        nbytes = scores * per // (share or {}).get(n.name, 1)
        out.append(SavedBytes(n.name + PROBS, owner.get(n.name, ""), "forward", nbytes))
    return out


def loss_saved(logits: int, tp: int = 1) -> tuple:
    """``(saved, backward)`` bytes of the training loss's cross-entropy over ``logits``
    elements, as Hugging Face's loss runs it in fp32: the log-probabilities it saves for
    its backward, and the two logits-sized fp32 gradients alive together at the start of
    the backward (the log-probabilities' and the logits'). Megatron's vocabulary-parallel
    cross-entropy splits them over ``tp``."""
    part = 4 * logits // max(tp, 1)
    return part, 2 * part


def _key(t: torch.Tensor):
    try:
        return t.untyped_storage()._cdata
    except (AttributeError, RuntimeError, NotImplementedError):
        return id(t)


def _values(v):
    if isinstance(v, torch.Tensor):
        return [v]
    if isinstance(v, (list, tuple)):
        return [x for x in v if isinstance(x, torch.Tensor)]
    return []


def _writes_in_place(n) -> bool:
    """Does ``n``'s op return its (mutated) input, allocating nothing (an in-place aten op:
    the static KV cache's ``index_copy_``)?"""
    schema = getattr(n.target, "_schema", None)
    rets = getattr(schema, "returns", ())
    return bool(rets) and all(r.alias_info is not None and r.alias_info.is_write
                              for r in rets)


@dataclass(frozen=True)
class Liveness:
    """What the liveness walk of a captured step found: the peak live bytes, the live bytes
    when the backward starts (None without a backward) and what the forward saves for it
    (:class:`SavedBytes`, in program order)."""

    peak: int
    at_backward: int | None
    saved: tuple

    def with_saved(self, extra: tuple, *, peak: int, at_backward: int | None) -> "Liveness":
        """The walk with ``extra`` saved too, at the peak and backward start given."""
        return Liveness(peak, at_backward, self.saved + tuple(extra))


def liveness(gm, sizes: Sizes, *, owner=None, grad_itemsize=None, share=None) -> Liveness:
    """Walk ``gm`` in program order: its :class:`Liveness`. Parameters, buffers and user
    inputs (placeholders and attributes) are not counted. ``grad_itemsize``: the bytes per
    element of the values the graph returns after its first (the gradients), when they are
    kept in another dtype than the activations (fp32 under autocast). ``share``: node ->
    the ways its outputs are split across GPUs (tensor parallelism); each GPU holds that
    fraction."""
    nodes = list(gm.graph.nodes)
    out = next((n for n in nodes if n.op == "output"), None)
    persistent = set()
    for n in nodes:
        if n.op in ("placeholder", "get_attr"):
            persistent.update(_key(t) for t in _values(n.meta.get("val")))
    last = {}
    for i, n in enumerate(nodes):
        for m in n.all_input_nodes:
            for t in _values(m.meta.get("val")):
                last[_key(t)] = i
    frees: dict = {}
    for k, i in last.items():
        frees.setdefault(i, []).append(k)
    returned = set()
    grads = set()
    if out is not None:
        flat = out.args[0] if isinstance(out.args[0], (tuple, list)) else (out.args[0],)
        for j, a in enumerate(flat):
            if isinstance(a, torch.fx.Node):
                for t in _values(a.meta.get("val")):
                    returned.add(_key(t))
                    if j > 0:
                        grads.add(_key(t))
    backward = _backward_nodes(gm)
    owner = owner or {}
    live: dict = {}  # storage -> (bytes, node that made it)
    size_of = 0
    peak = 0
    at_backward = None
    saved = []
    for i, n in enumerate(nodes):
        if n.op != "call_function":
            continue
        if at_backward is None and n.name in backward:
            at_backward = size_of
            by_node: dict = {}
            for b, maker in live.values():
                by_node[maker] = by_node.get(maker, 0) + b
            saved = [SavedBytes(m, owner.get(m, ""), "forward", b) for m, b in by_node.items()]
        if _writes_in_place(n):  # index_copy_, add_ ...: the result is its input's memory
            continue
        for t in _values(n.meta.get("val")):
            k = _key(t)
            if k in persistent or k in live:
                continue
            elems = t.untyped_storage().nbytes() // max(t.element_size(), 1) \
                if hasattr(t, "untyped_storage") else t.numel()
            item = grad_itemsize if (k in grads and grad_itemsize) else sizes.itemsize(t)
            nbytes = elems * item // (share or {}).get(n.name, 1)
            live[k] = (nbytes, n.name)
            size_of += nbytes
        peak = max(peak, size_of)
        for k in frees.get(i, ()):
            if k in live and k not in returned:
                size_of -= live.pop(k)[0]
    order = {n.name: i for i, n in enumerate(nodes)}
    saved.sort(key=lambda s: order.get(s.node, 0))
    return Liveness(peak, at_backward, tuple(saved))


def _backward_nodes(gm) -> set:
    """The nodes of a joint graph's backward (``fxshape.execution.step.phase_of``)."""
    from .step import phase_of

    return {name for name, ph in phase_of(gm).items() if ph == "backward"}


def memory_of(*, numels, mode, dkey, optimizer, run_item, capacity, peak_walk,
              activations, gemm_weight_numel=0, notes=(), grad_bytes=4) -> Memory:
    """The memory record from the parameter sizes (per GPU) and the liveness walk's
    results (``peak_walk``: its peak; ``activations``: saved bytes in training, the peak in
    inference); ``grad_bytes``: a gradient element's (``Parallel.grad_dtype``)."""
    total = sum(numels)
    notes = list(notes)
    if mode == "train":
        st = training_state(lambda by: total, optimizer=optimizer, grad_bytes=grad_bytes)
        params, grads, state, opt_temp = st.master, st.grads, st.state, st.temp
        mixed = run_item < 4
        copies = run_item * gemm_weight_numel if mixed else 0
        if copies:
            notes.append("autocast: a half-precision copy of each GEMM weight is held from "
                         "its cast in the forward to its backward")
        # the optimizer's state is there from the first step on: under the forward and
        # backward of every later step too
        peak = max(params + state + copies + peak_walk, params + grads + state + opt_temp)
    else:
        params = run_item * total
        grads = state = 0
        peak = params + peak_walk
    return Memory(parameters=params, gradients=grads, optimizer_state=state,
                  activations=activations, peak=peak, capacity=capacity, notes=tuple(notes))
