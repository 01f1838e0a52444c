"""The kernels every non-GEMM node of a captured graph runs: a registry of per-op handlers.

A handler receives an FX node and returns the memory-bound kernels PyTorch's eager mode
launches for it, as :class:`Kernel` records (a family and the bytes it moves). The bytes are
what the kernel must read and write: each full-size tensor input read once, each output
written once; a broadcast operand moves its own elements only (stride-0 dimensions move
nothing) and a Python scalar nothing. Register your own with
:func:`register_memop_handler`.

:func:`node_kernels` decides, for every ``call_function`` node:

- a node the GEMM registry handles (``fxshape.analysis.ops``) is not costed here;
- ``"skip"``: no op runs (``operator.getitem`` on a tuple, symbolic-size arithmetic,
  ``aten._assert_*`` checks that export inserts);
- ``"view"``: no kernel (views, reshapes of contiguous tensors, allocations without a fill,
  a ``to`` that changes nothing, dropout in eval mode);
- ``"kernels"``: a registered handler's kernels, else a ``pointwise``-tagged op as one
  elementwise kernel, else a ``reduction``-tagged op as one reduction;
- ``"unsupported"``: anything else, with the reason (listed in the report, never zero).

Float tensors of the captured model's dtype (fp32 on a meta model) are counted at the
analysis dtype's size: the model run in ``dtype``, as ``model.to(dtype)`` runs it.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Callable

import torch

from .ops import _size

__all__ = ["Kernel", "NodeKernels", "register_memop_handler", "memop_handler", "node_kernels",
           "tensor_bytes", "dropout_chains", "matmul_copies"]

aten = torch.ops.aten


@dataclass(frozen=True)
class Kernel:
    """One memory-bound kernel: its family (``fxshape.cost.memops.KERNEL_FAMILIES``) and the
    bytes it reads plus writes. ``rows``/``cols``: the row layout of a softmax (the family
    depends on the row length)."""

    family: str
    bytes: int
    rows: int = 0
    cols: int = 0


@dataclass(frozen=True)
class NodeKernels:
    """What one node runs: ``kind`` is ``"kernels"``, ``"view"``, ``"skip"`` or
    ``"unsupported"`` (then ``reason`` says why)."""

    kind: str
    kernels: tuple = ()
    reason: str = ""


Handler = Callable[[torch.fx.Node, "Sizes"], "list[Kernel] | None"]
_HANDLERS: dict[str, Handler] = {}


def register_memop_handler(*names: str, override: bool = False):
    """Decorator registering a handler for aten ops by their packet name (``"cat"``,
    ``"native_layer_norm"``). The handler gets ``(node, sizes)`` and returns a list of
    :class:`Kernel`, or ``[]`` for an op that launches nothing.

    Raises:
        ValueError: a name already has a handler (pass ``override=True`` to replace it).
    """

    def deco(fn: Handler) -> Handler:
        for name in names:
            if name in _HANDLERS and not override:
                raise ValueError(f"a memory-op handler for {name!r} is already registered")
            _HANDLERS[name] = fn
        return fn

    return deco


def memop_handler(name: str):
    return _HANDLERS.get(name)


def _packet_name(target) -> str:
    if isinstance(target, torch._ops.OpOverload):
        return target.overloadpacket.__name__
    if isinstance(target, torch._ops.OpOverloadPacket):
        return target.__name__
    return getattr(target, "__name__", str(target))


# ---------------------------------------------------------------------------------------
# sizes of the values a node reads and writes
# ---------------------------------------------------------------------------------------

class Sizes:
    """Bytes of the tensors a graph holds, the model's float dtype (``model_dtype``, fp32 on
    a meta model) counted as ``run_dtype``: the model run in the analysis dtype."""

    def __init__(self, model_dtype: torch.dtype | None, run_dtype: torch.dtype):
        self.model_dtype = model_dtype
        self.run_dtype = run_dtype

    def dtype(self, t: torch.Tensor) -> torch.dtype:
        return self.run_dtype if t.dtype == self.model_dtype else t.dtype

    def itemsize(self, t: torch.Tensor) -> int:
        return self.dtype(t).itemsize

    def bytes(self, v) -> int:
        """Bytes a kernel touches reading or writing ``v``: its elements along dimensions
        with a non-zero stride (a broadcast moves its own elements only); 0 for non-tensors."""
        return tensor_bytes(v, self.itemsize(v)) if isinstance(v, torch.Tensor) else 0

    def numel(self, v) -> int:
        return math.prod(_size(d) for d in v.shape) if isinstance(v, torch.Tensor) else 0


def tensor_bytes(t: torch.Tensor, item: int) -> int:
    """Distinct bytes of ``t``: the product of its sizes along dimensions whose stride is not
    0 (an ``expand``ed dimension repeats the same elements), times ``item``."""
    try:
        strides = t.stride()
    except RuntimeError:  # sparse / nested: every element
        strides = (1,) * t.dim()
    n = 1
    for d, s in zip(t.shape, strides):
        d = _size(d)
        if d == 0:
            return 0
        if _size(s) != 0:
            n *= d
    return n * item


def _val(a):
    return a.meta.get("val") if isinstance(a, torch.fx.Node) else None


def _tensors(obj):
    """The tensors among a node's arguments (nested lists included), in order."""
    if isinstance(obj, torch.fx.Node):
        v = _val(obj)
        if isinstance(v, torch.Tensor):
            return [v]
        if isinstance(v, (list, tuple)):
            return [x for x in v if isinstance(x, torch.Tensor)]
        return []
    if isinstance(obj, (list, tuple)):
        return [t for a in obj for t in _tensors(a)]
    if isinstance(obj, dict):
        return [t for a in obj.values() for t in _tensors(a)]
    return []


def _inputs(node):
    return _tensors(list(node.args)) + _tensors(dict(node.kwargs))


def _outputs(node):
    v = node.meta.get("val")
    if isinstance(v, torch.Tensor):
        return [v]
    if isinstance(v, (list, tuple)):
        return [x for x in v if isinstance(x, torch.Tensor)]
    return []


def _read(node, sz, inputs=None):
    return sum(sz.bytes(t) for t in (_inputs(node) if inputs is None else inputs))


def _written(node, sz):
    return sum(sz.bytes(t) for t in _outputs(node))


def _one(family, node, sz, inputs=None) -> list:
    return [Kernel(family, _read(node, sz, inputs) + _written(node, sz))]


# ---------------------------------------------------------------------------------------
# what runs no op, and what launches no kernel
# ---------------------------------------------------------------------------------------

#: aten ops export inserts that run no kernel and dispatch nothing on the GPU
_SKIP = {"_assert_tensor_metadata", "_assert_async", "_assert_scalar", "sym_constrain_range",
         "sym_constrain_range_for_size", "_functional_assert_async", "sym_size", "sym_numel",
         "sym_stride", "sym_storage_offset", "_local_scalar_dense"}
#: allocations: memory is handed out, nothing is written
_ALLOC = {"empty", "empty_like", "empty_permuted", "empty_strided", "new_empty",
          "new_empty_strided"}


def is_view(target) -> bool:
    """Does the op return an alias of its input (a view, never a write)?"""
    try:
        rets = target._schema.returns
    except AttributeError:
        return False
    alias = [r.alias_info for r in rets]
    return bool(alias) and all(a is not None and not a.is_write for a in alias)


# ---------------------------------------------------------------------------------------
# handlers
# ---------------------------------------------------------------------------------------

@register_memop_handler("reshape", "_reshape_alias", "_unsafe_view", "flatten", "unflatten",
                        "view_as",
                        "reshape_as")
def _reshape(node, sz):
    x = _inputs(node)[:1]
    # a reshape copies only when the input's strides cannot be viewed at the new shape
    out = _outputs(node)
    if not x or not out or x[0].is_contiguous() or _same_storage(x[0], out[0]):
        return []
    return _one("copy", node, sz, x)


def _same_storage(a, b) -> bool:
    try:
        return a.untyped_storage()._cdata == b.untyped_storage()._cdata
    except (AttributeError, RuntimeError, NotImplementedError):
        return False


@register_memop_handler("contiguous")
def _contiguous(node, sz):
    x = _inputs(node)[:1]
    if not x or x[0].is_contiguous():
        return []
    return _one("copy", node, sz, x)


@register_memop_handler("clone", "copy", "lift_fresh_copy", "repeat", "roll", "flip",
                        "expand_copy", "permute_copy", "transpose_copy", "view_copy",
                        "t_copy", "tile", "repeat_interleave", "_unsafe_index")
def _copy(node, sz):
    return _one("copy", node, sz, _inputs(node)[:1])


@register_memop_handler("slice_scatter", "select_scatter", "diagonal_scatter",
                        "as_strided_scatter")
def _view_scatter(node, sz):
    # a copy of the input with a slice of it replaced: reads both, writes the whole
    return _one("copy", node, sz)


@register_memop_handler("copy_")
def _copy_(node, sz):
    src = _inputs(node)[1:2]
    return [Kernel("copy", _read(node, sz, src) + _written(node, sz))]


@register_memop_handler("_to_copy", "to", "type_as")
def _to(node, sz):
    x, out = _inputs(node)[:1], _outputs(node)
    if not x or not out:
        return []
    if x[0].device != out[0].device:
        return _one("copy", node, sz, x)
    if sz.dtype(x[0]) == sz.dtype(out[0]):
        # ``to`` returns its input; ``_to_copy`` (an explicit copy, or a cast between the
        # model's dtype and the one it runs in) copies only when asked for a layout change
        explicit = _packet_name(node.target) == "_to_copy" and x[0].dtype == out[0].dtype
        return _one("copy", node, sz, x) if explicit else []
    return _one("copy", node, sz, x)


@register_memop_handler("cat", "stack", "concat", "concatenate", "hstack", "vstack")
def _cat(node, sz):
    return _one("copy", node, sz)


@register_memop_handler("zeros", "ones", "full", "zeros_like", "ones_like", "full_like",
                        "new_zeros", "new_ones", "new_full", "fill", "fill_", "zero_",
                        "scalar_tensor", "arange", "linspace", "tril_indices", "eye")
def _fill(node, sz):
    if not node.users:
        return []  # a value nothing reads (autograd's zero gradient of an unused output)
    return [Kernel("fill", _written(node, sz))]


@register_memop_handler("bernoulli", "bernoulli_", "rand", "randn", "rand_like", "randn_like",
                        "uniform_", "normal_", "randint", "randint_like", "randperm")
def _rng(node, sz):
    return [Kernel("rng", _written(node, sz))]


@register_memop_handler("native_dropout")
def _native_dropout(node, sz):
    # one fused kernel: reads x, writes y and the boolean mask
    x = _inputs(node)[:1]
    return [Kernel("rng", _read(node, sz, x) + _written(node, sz))]


@register_memop_handler("dropout", "feature_dropout", "alpha_dropout")
def _dropout(node, sz):
    train = node.args[2] if len(node.args) > 2 else node.kwargs.get("train", True)
    p = node.args[1] if len(node.args) > 1 else node.kwargs.get("p", 0.5)
    if not train or p == 0:
        return []  # eval mode (or p = 0): returns its input
    x = _inputs(node)[:1]
    # as native_dropout: reads x, writes y and a one-byte mask per element
    return [Kernel("rng", _read(node, sz, x) + _written(node, sz) + sz.numel(x[0]))]


@register_memop_handler("tril", "triu", "diff", "masked_fill", "masked_fill_", "where",
                        "__and__", "__or__", "__xor__", "__iand__", "__ior__", "__ixor__",
                        "__lshift__", "__rshift__", "clamp", "clamp_min", "clamp_max",
                        "floor_divide", "remainder", "fmod", "one_hot")
def _pointwise(node, sz):
    return _one("elementwise", node, sz)


@register_memop_handler("cumsum", "cumprod", "logcumsumexp", "topk", "sort", "argsort",
                        "logsumexp", "norm", "linalg_vector_norm", "var_mean", "std_mean",
                        "histc", "bincount", "bucketize", "searchsorted", "argmax", "argmin")
def _reduce(node, sz):
    return _one("reduction", node, sz)


@register_memop_handler("embedding", "index_select", "gather", "take_along_dim", "index")
def _gather(node, sz):
    # reads the gathered elements (as many as it writes) and the indices, writes the output
    src, idx = _inputs(node)[:1], _inputs(node)[1:]
    out = _written(node, sz)
    return [Kernel("gather", min(out, _read(node, sz, src)) + _read(node, sz, idx) + out)]


@register_memop_handler("index_put", "index_put_", "scatter", "scatter_", "scatter_add",
                        "scatter_add_", "index_add", "index_add_", "index_copy",
                        "index_copy_", "scatter_reduce", "masked_scatter")
def _scatter(node, sz):
    ins = _inputs(node)
    self_, rest = ins[:1], ins[1:]
    kernels = []
    if not _packet_name(node.target).endswith("_"):
        kernels.append(Kernel("copy", 2 * _read(node, sz, self_)))  # out-of-place: a copy
    # reads the values and indices, writes as many elements as it reads values
    vals = sum(sz.bytes(t) for t in rest if t.is_floating_point() or t.dtype == torch.bool)
    kernels.append(Kernel("scatter", _read(node, sz, rest) + vals))
    return kernels


@register_memop_handler("slice_backward", "select_backward", "diagonal_backward",
                        "as_strided_backward", "unfold_backward")
def _view_backward(node, sz):
    # the gradient of a view: zeros of the input's size, the incoming gradient copied in
    grad = _inputs(node)[:1]
    return [Kernel("fill", _written(node, sz)), Kernel("copy", 2 * _read(node, sz, grad))]


@register_memop_handler("embedding_dense_backward")
def _embedding_backward(node, sz):
    grad, idx = _inputs(node)[:2]
    out = _written(node, sz)
    # zero the (vocab, hidden) gradient, then add each token's row into it (PyTorch sorts
    # the indices and reduces segments: a few small kernels more, not counted)
    return [Kernel("fill", out), Kernel("scatter", 2 * sz.bytes(grad) + sz.bytes(idx))]


@register_memop_handler("layer_norm", "native_layer_norm", "rms_norm", "_fused_rms_norm",
                        "group_norm", "native_group_norm")
def _layer_norm(node, sz):
    return [Kernel("layer_norm", _read(node, sz) + _written(node, sz))]


@register_memop_handler("native_layer_norm_backward", "native_group_norm_backward",
                        "_fused_rms_norm_backward")
def _layer_norm_backward(node, sz):
    ins = _inputs(node)
    grad, x = ins[0], ins[1]
    outs = _outputs(node)
    small = sum(sz.bytes(t) for t in ins[2:]) + sum(sz.bytes(t) for t in outs[1:])
    # two kernels: the input gradient (reads dy, x, mean, rstd, weight; writes dx) and the
    # weight and bias gradients (reads dy and x again, column-wise)
    k1 = sz.bytes(grad) + sz.bytes(x) + (sz.bytes(outs[0]) if outs else 0)
    kernels = [Kernel("layer_norm", k1 + small)]
    if len(outs) > 1:
        kernels.append(Kernel("layer_norm", sz.bytes(grad) + sz.bytes(x)))
    return kernels


def _rows_cols(v):
    cols = _size(v.shape[-1]) if v.dim() else 1
    rows = max(1, math.prod(_size(d) for d in v.shape) // max(cols, 1))
    return rows, cols


def _softmax_dim_last(node) -> bool:
    x = _inputs(node)[0]
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", -1)
    return dim in (-1, x.dim() - 1)


@register_memop_handler("_softmax", "softmax", "_log_softmax", "log_softmax",
                        "_safe_softmax", "_softmax_backward_data", "_log_softmax_backward_data")
def _softmax(node, sz):
    ins = _inputs(node)
    x = ins[0]
    rows, cols = _rows_cols(x)
    if not _softmax_dim_last(node):  # a softmax over an inner dimension: block kernel
        cols = max(cols, 1025)
    backward = _packet_name(node.target).endswith("_backward_data")
    nbytes = _read(node, sz, ins[:2] if backward else ins[:1]) + _written(node, sz)
    return [Kernel("softmax", nbytes, rows, cols)]


@register_memop_handler("cross_entropy_loss")
def _cross_entropy(node, sz):
    x, target = _inputs(node)[:2]
    rows, cols = _rows_cols(x)
    # log_softmax over the classes (reads the logits, writes log-probabilities), then the
    # loss gathers one per row and averages
    return [Kernel("softmax", 2 * sz.bytes(x), rows, cols),
            Kernel("reduction", sz.bytes(target) + rows * sz.itemsize(x) + _written(node, sz))]


@register_memop_handler("nll_loss_forward", "nll_loss", "nll_loss_nd", "nll_loss2d_forward")
def _nll(node, sz):
    x, target = _inputs(node)[:2]
    rows, _ = _rows_cols(x)
    return [Kernel("reduction", sz.bytes(target) + rows * sz.itemsize(x) + _written(node, sz))]


@register_memop_handler("nll_loss_backward", "nll_loss2d_backward")
def _nll_backward(node, sz):
    out = _written(node, sz)
    # the gradient is zero but at each row's target: a fill, then a scatter
    return [Kernel("fill", out), Kernel("scatter", sz.bytes(_inputs(node)[2]))]


def _foldable(t: torch.Tensor) -> bool:
    """Can ``t``'s leading (batch) dimensions be merged into one as a view, with the last two
    a matrix cuBLAS reads in place (one of them unit-stride)?"""
    shape = [_size(d) for d in t.shape]
    stride = [_size(x) for x in t.stride()]
    if len(shape) >= 2 and 1 not in (stride[-1], stride[-2]) and shape[-1] > 1 and \
            shape[-2] > 1:
        return False
    batch = [(d, st) for d, st in zip(shape[:-2], stride[:-2]) if d != 1]
    return all(st == nxt_st * nxt_d for (d, st), (nxt_d, nxt_st) in zip(batch, batch[1:])) \
        and all(st != 0 for _, st in batch)


def matmul_copies(node, sizes: Sizes) -> list:
    """The copies ``aten.matmul`` makes before its GEMM: an operand of three or more
    dimensions whose batch dimensions cannot be merged as a view (a head-split
    ``transpose(1, 2)`` of a projection's output; a broadcast batch) is copied contiguous
    (``expand(...).reshape(...)`` in ATen's ``_matmul_impl``). One copy kernel each."""
    if _packet_name(node.target) != "matmul":
        return []
    out = []
    for t in _inputs(node)[:2]:
        if t.dim() >= 3 and not _foldable(t):
            n = math.prod(_size(d) for d in t.shape)
            out.append(Kernel("copy", 2 * n * sizes.itemsize(t)))
    return out


# ---------------------------------------------------------------------------------------
# the walk
# ---------------------------------------------------------------------------------------

def dropout_chains(gm) -> dict:
    """Decomposed dropout (``empty_like`` -> ``bernoulli_`` -> ``div_`` -> ``mul``, how a
    dropout on fake tensors reaches a joint graph) folded into the one kernel eager CUDA
    runs (``native_dropout``: reads x, writes y and a one-byte mask): ``{node name: role}``
    with role ``"dropout"`` for the ``mul`` that applies it and ``"fold"`` for the nodes
    folded into it."""
    out = {}
    for n in gm.graph.nodes:
        if n.op != "call_function" or _packet_name(n.target) != "bernoulli_":
            continue
        src = n.args[0] if n.args else None
        if not isinstance(src, torch.fx.Node) or _packet_name(src.target) not in _ALLOC:
            continue
        divs = [u for u in n.users if _packet_name(u.target) in ("div_", "div", "mul_", "mul")]
        if len(divs) != 1:
            continue
        mask = divs[0]
        apply = [u for u in mask.users if _packet_name(u.target) == "mul"
                 and all(isinstance(a, torch.fx.Node) for a in u.args[:2])]
        forward = [u for u in apply if u.args[0] is not mask and u.args[1] is mask
                   or u.args[0] is mask and u.args[1] is not mask]
        if not forward:
            continue
        out[src.name] = out[n.name] = out[mask.name] = "fold"
        out[forward[0].name] = "dropout"
    return out


def node_kernels(node: torch.fx.Node, sizes: Sizes, role: str = "") -> NodeKernels:
    """What ``node`` runs (see the module docstring). ``role``: from :func:`dropout_chains`."""
    target = node.target
    if role == "fold":
        return NodeKernels("view", reason="folded into the dropout kernel that applies it")
    if role == "dropout":
        x = _inputs(node)[0] if _inputs(node) else None
        nbytes = sizes.bytes(x) + _written(node, sizes) + (sizes.numel(x) if x is not None
                                                            else 0)
        return NodeKernels("kernels", (Kernel("rng", nbytes),),
                           reason="dropout (native_dropout: one kernel)")
    if not isinstance(target, torch._ops.OpOverload):
        if target in (operator.getitem,) or getattr(target, "__module__", "") in (
                "_operator", "operator", "math", "builtins", "torch._sym_node",
                "torch.fx.experimental.sym_node"):
            return NodeKernels("skip")
        if isinstance(target, torch._ops.OpOverloadPacket):
            target = target.default
        else:
            return NodeKernels("unsupported", reason=f"{target}: not an aten op; no cost "
                               "model")
    name = _packet_name(target)
    if name in _SKIP or name.startswith("_assert"):
        return NodeKernels("skip")
    if name in _ALLOC:
        return NodeKernels("view", reason="allocation (no kernel)")
    handler = _HANDLERS.get(name)
    if handler is not None:
        try:
            ks = handler(node, sizes)
        except (IndexError, AttributeError, TypeError) as exc:
            return NodeKernels("unsupported", reason=f"{name}: its arguments do not match the "
                               f"cost handler ({type(exc).__name__}: {exc})")
        return NodeKernels("kernels", tuple(ks)) if ks else NodeKernels("view")
    if is_view(target):
        return NodeKernels("view")
    tags = getattr(target, "tags", ())
    if torch.Tag.pointwise in tags:
        return NodeKernels("kernels", tuple(_one("elementwise", node, sizes)))
    if torch.Tag.reduction in tags:
        return NodeKernels("kernels", tuple(_one("reduction", node, sizes)))
    if getattr(target, "namespace", "aten") != "aten":
        return NodeKernels("unsupported", reason=f"{target}: custom op without a cost model "
                           "(register one with fxshape.register_memop_handler)")
    return NodeKernels("unsupported", reason=f"{target}: no cost model for this op")
