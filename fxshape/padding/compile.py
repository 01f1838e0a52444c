"""``torch.compile(model, backend="fxshape")``: pad GEMMs in the compiled graphs.

The backend pads the aten-level forward and backward graphs that AOTAutograd produces: every
``mm`` / ``addmm`` / ``bmm`` whose padded version the plan (``fxshape.padding.plan.best_padding``)
predicts at least ``min_gain`` faster becomes pad -> GEMM -> slice (a contiguous copy), then
the graph goes on to the inner backend. With ``inner="inductor"`` (the default) the pass runs
as Inductor's ``post_grad_custom_pre_pass``, after Inductor's own ``pad_mm`` (which pads only
on GPUs, to 16 bytes): a GEMM it already padded is aligned, so fxshape only pads it further if
that is predicted to pay. With ``inner="eager"`` the padded graphs run as they are (for tests
and debugging).

Registered through the ``torch_dynamo_backends`` entry point, so it works right after
``pip install``. Options go through ``torch.compile(..., options={...})`` (``gpu``, ``dtype``,
``min_gain``, ``multiples``, ``inner``) or :func:`make_backend`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from ..cost.gemm import model_params, predict_matmul
from ..hardware.dtypes import canonical_dtype
from ..hardware.gpus import get_gpu
from .plan import DEFAULT_MIN_GAIN, DEFAULT_MULTIPLES, _check_multiple, best_padding, check_min_gain

__all__ = ["fxshape_backend", "make_backend", "pad_graph"]

aten = torch.ops.aten
_TORCH_DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}


@dataclass(frozen=True)
class _Row:
    op: str
    module: str
    batch: int
    m: int
    n: int
    k: int
    layout: str = "nn"


def _static(shape) -> bool:
    return all(isinstance(d, int) for d in shape)


def pad_graph(graph: torch.fx.Graph, *, gpu="h100", dtype=None,
              min_gain: float = DEFAULT_MIN_GAIN, multiples=DEFAULT_MULTIPLES) -> list:
    """Rewrite mm/addmm/bmm nodes of an aten graph to run at planned padded sizes.

    Returns one ``(node name, (m, n, k), (pad_m, pad_n, pad_k))`` per padded GEMM.
    ``dtype``: the dtype to plan for (default: each GEMM's own; fp32 plans as fp32).
    """
    spec = get_gpu(gpu)
    bw = spec.memory_bandwidth_gbs * 1e9 * model_params(spec).dram_eff
    done = []
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in (aten.mm.default,
                                                              aten.addmm.default,
                                                              aten.bmm.default):
            continue
        args = list(node.args)
        a, b = (args[1], args[2]) if node.target is aten.addmm.default else (args[0], args[1])
        va, vb = a.meta.get("val"), b.meta.get("val")
        if va is None or vb is None or not (_static(va.shape) and _static(vb.shape)):
            continue  # symbolic sizes stay unpadded
        if not va.is_floating_point():
            continue
        dkey = canonical_dtype(dtype) if dtype is not None else _TORCH_DTYPES.get(va.dtype)
        if dkey is None or spec.peaks.get(dkey) is None:
            continue
        bmm = node.target is aten.bmm.default
        batch = va.shape[0] if bmm else 1
        m, k = va.shape[-2], va.shape[-1]
        n = vb.shape[-1]
        row = _Row("bmm" if bmm else "mm", "", batch, m, n, k)
        t0 = predict_matmul(m, n, k, batch=batch, dtype=dkey, gpu=spec).time_s
        t, pm, pn, pk, _, _ = best_padding(row, t0, dkey, spec, multiples, bw)
        if (pm, pn, pk) == (m, n, k) or 1 - t / t0 < min_gain:
            continue
        fake_mode = getattr(va, "fake_mode", None)
        with graph.inserting_before(node):
            ap = _call(graph, aten.constant_pad_nd.default, (a, [0, pk - k, 0, pm - m]),
                       fake_mode) if (pm, pk) != (m, k) else a
            bp = _call(graph, aten.constant_pad_nd.default, (b, [0, pn - n, 0, pk - k]),
                       fake_mode) if (pk, pn) != (k, n) else b
            if node.target is aten.addmm.default:
                bias = args[0]
                vbias = bias.meta.get("val")
                pads = [0, pn - n] + ([0, pm - m] if vbias.dim() == 2 and vbias.shape[0] == m
                                      else [])
                if any(pads) and vbias.shape[-1] == n:
                    bias = _call(graph, aten.constant_pad_nd.default, (bias, pads), fake_mode)
                new = _call(graph, node.target, (bias, ap, bp), fake_mode, node.kwargs)
            else:
                new = _call(graph, node.target, (ap, bp), fake_mode)
            out = new
            if pm != m:
                out = _call(graph, aten.slice.Tensor, (out, va.dim() - 2, 0, m), fake_mode)
            if pn != n:
                out = _call(graph, aten.slice.Tensor, (out, va.dim() - 1, 0, n), fake_mode)
            out = _call(graph, aten.clone.default, (out,), fake_mode,
                        {"memory_format": torch.contiguous_format})
        node.replace_all_uses_with(out)
        graph.erase_node(node)
        done.append((node.name, (m, n, k), (pm, pn, pk)))
    graph.lint()
    return done


def _call(graph, target, args, fake_mode, kwargs=None):
    node = graph.call_function(target, tuple(args), dict(kwargs or {}))
    vals = [a.meta["val"] if isinstance(a, torch.fx.Node) else a for a in args]
    if fake_mode is not None:
        with fake_mode:
            node.meta["val"] = target(*vals, **(kwargs or {}))
    return node


def _options(options) -> dict:
    opts = dict(options or {})
    unknown = set(opts) - {"gpu", "dtype", "min_gain", "multiples", "inner"}
    if unknown:
        raise ValueError(f"unknown fxshape backend option(s) {sorted(unknown)}; accepted: gpu, "
                         "dtype, min_gain, multiples, inner")
    get_gpu(opts.get("gpu", "h100"))
    if opts.get("dtype") is not None:
        canonical_dtype(opts["dtype"])
    check_min_gain(opts.get("min_gain", DEFAULT_MIN_GAIN))
    multiples = opts.get("multiples", DEFAULT_MULTIPLES)
    if not isinstance(multiples, (tuple, list)) or not multiples:
        raise ValueError(f"multiples must be a non-empty tuple of powers of two, got "
                         f"{multiples!r}")
    for m in multiples:
        _check_multiple(m)
    if opts.get("inner", "inductor") not in ("inductor", "eager"):
        raise ValueError(f"inner backend must be 'inductor' or 'eager', got {opts['inner']!r}")
    return opts


def make_backend(**options):
    """A backend callable with fixed options, e.g.
    ``torch.compile(model, backend=make_backend(gpu="a100", inner="eager"))``
    (``fxshape.padding.compile.make_backend``)."""
    opts = _options(options)
    padded: list = []  # (node, sizes, padded sizes) of every graph this backend compiled

    def backend(gm, example_inputs):
        return fxshape_backend(gm, example_inputs, options=opts, _sink=padded)

    backend.padded = padded
    backend.options = opts
    return backend


class _PadPass:
    """Inductor post-grad custom pass (with a stable uuid for Inductor's cache)."""

    def __init__(self, opts, sink):
        self.opts, self.sink = opts, sink

    def __call__(self, graph: torch.fx.Graph) -> None:
        self.sink.extend(pad_graph(graph, **{k: v for k, v in self.opts.items()
                                             if k != "inner"}))

    def uuid(self):
        key = repr(sorted((k, str(v)) for k, v in self.opts.items())) + "fxshape-pad-v1"
        return hashlib.sha256(key.encode()).hexdigest()


def fxshape_backend(gm, example_inputs, options=None, _sink=None):
    """The ``torch.compile`` backend (``backend="fxshape"``)."""
    opts = _options(options)
    sink = [] if _sink is None else _sink
    plan_opts = {k: v for k, v in opts.items() if k != "inner"}
    if opts.get("inner", "inductor") == "eager":
        from functorch.compile import make_boxed_func
        from torch._dynamo.backends.common import aot_autograd

        def compiler(g, _inputs):
            sink.extend(pad_graph(g.graph, **plan_opts))
            g.recompile()
            return make_boxed_func(g.forward)

        return aot_autograd(fw_compiler=compiler, bw_compiler=compiler)(gm, example_inputs)
    from torch._inductor.compile_fx import compile_fx

    return compile_fx(gm, example_inputs,
                      config_patches={"post_grad_custom_pre_pass": _PadPass(opts, sink)})
