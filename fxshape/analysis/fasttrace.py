"""The GEMMs a model runs, recorded by running it on fake tensors (no graph capture).

``gemm_graph(model, args, kwargs)`` runs the model's forward (and, with ``train=True``, the
backward of a scalar loss on its first floating output, as ``fxshape.capture`` does) on the
meta device when the model and its inputs are there (else, or where a meta run fails, under
``FakeTensorMode``), with a dispatch mode that records every aten call the op registry
(``fxshape.analysis.ops``) has a handler for. Each call becomes a node of a flat FX graph — its
tensor arguments placeholders carrying their fake values, its output in ``meta["val"]`` — which
the handlers and ``fxshape.analysis.annotate`` read like a captured graph. Nothing is computed
and no memory is spent on weights.

This is several times cheaper than ``torch.export`` and is what provenance
(``fxshape.analysis.perturb``) re-measures changed models with; it is trusted only after it
reproduces the captured graph's GEMMs exactly (:func:`aligned`), and the export path is used
otherwise. Calls run at dispatch level, where composite ops are already decomposed (``linear``
is ``mm`` or ``addmm``), so its nodes are matched to the captured graph's by position and
sizes, not by op.
"""

from __future__ import annotations

import contextlib

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map

from ..tracing.attnops import keep_attention_fused
from .ops import gemm_handler, gemms_for_node

__all__ = ["gemm_graph", "gemm_nodes", "aligned"]


class _Recorder(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls = []
        self.phase = "forward"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if gemm_handler(func) is not None:
            self.calls.append((func, args, kwargs, out, self.phase))
        return out


def gemm_graph(model, args=(), kwargs=None, *, train: bool = False) -> torch.fx.GraphModule:
    """A flat graph of the GEMM calls ``model(*args, **kwargs)`` makes (forward, then the
    backward of the scalar loss with ``train``); nodes carry ``meta["fxshape_phase"]``."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from ..tracing.export import quiet_loggers

    args = (args,) if isinstance(args, torch.Tensor) else tuple(args or ())
    kwargs = dict(kwargs or {})
    tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    tensors += list(model.parameters()) + list(model.buffers())
    if all(t.device.type == "meta" for t in tensors):
        try:  # meta tensors alone: several times cheaper per op than fake ones
            return _run(model, args, kwargs, train, contextlib.nullcontext())
        except Exception:  # noqa: BLE001 - a data-dependent op: fake tensors handle it
            pass
    with quiet_loggers("torch._subclasses.fake_tensor"):
        return _run(model, args, kwargs, train, FakeTensorMode(allow_non_fake_inputs=True))


def _run(model, args, kwargs, train, mode) -> torch.fx.GraphModule:
    from ..tracing.export import float_outputs, preserve_training_flags

    rec = _Recorder()
    grad = torch.enable_grad() if train else torch.no_grad()
    with _as_exported(), preserve_training_flags(model, train), keep_attention_fused(), \
            grad, mode, rec:
        out = model(*args, **kwargs)
        if train:
            outs = float_outputs(out)
            if not outs:
                raise ValueError("the model returned no floating-point tensor to put a "
                                 "loss on")
            loss = outs[0].float().sum()
            params = [p for p in model.parameters() if p.requires_grad]
            rec.phase = "backward"
            torch.autograd.grad(loss, params, allow_unused=True)
    return _graph(rec.calls)


@contextlib.contextmanager
def _as_exported():
    """Models take the code paths they take under ``torch.export`` (the capture this trace
    stands in for): ``torch.compiler.is_compiling()`` and ``is_exporting()`` say True.
    (Transformers' MoE layers, for one, pick their grouped-matmul kernel by it.)"""
    saved = torch.compiler.is_compiling, torch.compiler.is_exporting
    torch.compiler.is_compiling = torch.compiler.is_exporting = lambda: True
    try:
        yield
    finally:
        torch.compiler.is_compiling, torch.compiler.is_exporting = saved


def _graph(calls) -> torch.fx.GraphModule:
    g = torch.fx.Graph()
    count = [0]

    def placeholder(x):
        if not isinstance(x, torch.Tensor):
            return x
        count[0] += 1
        p = g.placeholder(f"t{count[0]}")
        p.meta["val"] = x
        return p

    for func, args, kwargs, out, phase in calls:
        node = g.call_function(func, tree_map(placeholder, tuple(args)),
                               tree_map(placeholder, dict(kwargs)))
        node.meta["val"] = out[0] if isinstance(out, (tuple, list)) else out
        node.meta["fxshape_phase"] = phase
    g.output(None)
    return torch.fx.GraphModule(torch.nn.Module(), g)


def gemm_nodes(gm: torch.fx.GraphModule) -> list:
    """The nodes of ``gm`` the op registry has a handler for, in graph order."""
    return [n for n in gm.graph.nodes
            if n.op == "call_function" and gemm_handler(n.target) is not None]


def _sizes(node):
    try:
        return [(g.batch, g.m, g.n, g.k) for g in gemms_for_node(node)]
    except ValueError as exc:
        return ("unsupported", str(exc))


def aligned(captured: torch.fx.GraphModule, recorded: torch.fx.GraphModule,
            sizes: bool = True) -> bool:
    """Do the two graphs run the same GEMMs in the same order (one node for one node, each
    with the same number of GEMMs, and with ``sizes`` the same sizes)?"""
    a, b = gemm_nodes(captured), gemm_nodes(recorded)
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        sx, sy = _sizes(x), _sizes(y)
        if (sx != sy) if sizes else (len(sx) != len(sy)):
            return False
        if x.meta.get("fxshape_phase", "forward") != y.meta.get("fxshape_phase", "forward"):
            return False
    return True
