"""One registry of per-op handlers: an FX node -> the GEMMs it runs.

A handler receives the node and returns a list of :class:`Gemm` records in the project's
convention ``C[batch, M, N] = A[batch, M, K] @ B[batch, K, N]`` (K is the reduction). Handlers
read shapes from ``node.meta["val"]`` of the node's tensor arguments, never run anything, and
are pure. Register your own with :func:`register_gemm_handler`::

    @fxshape.register_gemm_handler(torch.ops.mylib.my_mm.default)
    def _my_mm(node):
        a, b = input_shapes(node)[:2]
        return [Gemm("my_mm", 1, a[0], b[1], a[1], "nn")]

A node without a handler is reported as unsupported by the analysis, never silently dropped,
when torch's own FLOP registry (``torch.utils.flop_counter``) counts its op, when it is one of
the vector and contraction products that registry leaves out (``mv``, ``dot``, ``outer``,
``tensordot``, ``linalg_multi_dot``, ``bilinear``, ...), or, outside aten, when its name says it
multiplies matrices (mm, matmul, linear, conv, einsum, attention, grouped).
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from typing import Callable

import torch

from ..cost.attention import FLASH_HEAD_DIMS, AttentionShape, flash_head_dim
from ..tracing.attnops import ATTENTION_OPS
from ..tracing.export import set_labelled_ops

__all__ = ["Gemm", "AttentionCall", "register_gemm_handler", "flash_head_dim",
           "FLASH_HEAD_DIMS", "gemm_handler", "gemms_for_node", "input_shapes",
           "looks_like_matmul", "does_flops", "registered_targets"]

aten = torch.ops.aten


@dataclass(frozen=True)
class AttentionCall:
    """The fused attention call a GEMM belongs to (all GEMMs of one call share it).

    ``masked``: an ``attn_mask`` tensor was passed (Hugging Face decoders pass their causal
    mask that way; the analysis decides whether it is causal).
    """

    shape: AttentionShape
    direction: str  # "forward" or "backward"
    masked: bool = False


@dataclass(frozen=True)
class Gemm:
    """One GEMM a node runs.

    Attributes:
        op: short name of the operation (``linear``, ``mm``, ``sdpa.qk``, ...).
        batch, m, n, k: sizes, ``C[batch, M, N] = A[batch, M, K] @ B[batch, K, N]``.
        layout: operand storage (``nn``: both row-major; ``nt``: B stored (N, K) as in F.linear).
        work: fraction of the full GEMM actually computed (0.5 for causal attention).
        note: why the shape is what it is, when that is not obvious (e.g. MoE routing).
        attn: for the GEMMs of a fused attention call, the call (predicted as one kernel by
            ``fxshape.cost.attention``); None for ordinary GEMMs.
    """

    op: str
    batch: int
    m: int
    n: int
    k: int
    layout: str = "nn"
    work: float = 1.0
    note: str = ""
    attn: AttentionCall | None = None


Handler = Callable[[torch.fx.Node], "list[Gemm]"]
_HANDLERS: dict[object, Handler] = {}


def _key(target):
    # handlers registered on an OpOverloadPacket match every overload of it
    return getattr(target, "overloadpacket", target)


def register_gemm_handler(*targets, override: bool = False):
    """Decorator registering a handler for one or more op targets.

    Raises:
        ValueError: a target already has a handler (pass ``override=True`` to replace it).
    """

    def deco(fn: Handler) -> Handler:
        for t in targets:
            key = _key(t)
            if key in _HANDLERS and not override:
                raise ValueError(f"a GEMM handler for {t} is already registered")
            _HANDLERS[key] = fn
        return fn

    return deco


def gemm_handler(target):
    """The handler for ``target``, or None."""
    return _HANDLERS.get(target) or _HANDLERS.get(_key(target))


def registered_targets() -> list[str]:
    return sorted(str(t) for t in _HANDLERS)


_MATMUL_NAME = re.compile(r"(^|[._])(mm|bmm|addmm|matmul|linear|conv|convolution|einsum|"
                          r"baddbmm|addbmm|attention|grouped|_mm|gemm)", re.IGNORECASE)
# aten ops that multiply matrices or vectors but that torch.utils.flop_counter does not count
# (it counts mm, addmm, bmm, baddbmm, _scaled_mm, convolutions and fused attention)
_PRODUCT_OPS = ("mv", "addmv", "dot", "vdot", "inner", "outer", "ger", "addr", "addbmm",
                "tensordot", "linalg_multi_dot", "chain_matmul", "bilinear", "_trilinear",
                "kron", "linalg_vecdot", "matmul", "einsum", "linear")


@functools.lru_cache(maxsize=1)
def _flop_packets() -> frozenset:
    """The aten op packets whose FLOPs torch counts (``torch.utils.flop_counter``), plus the
    vector and contraction products it leaves out."""
    from torch.utils.flop_counter import flop_registry

    names = set(_PRODUCT_OPS)
    for op in flop_registry:
        names.add(getattr(op, "__name__", str(op)).split(".")[0])
    return frozenset(names)


def does_flops(target) -> bool:
    """Does the op multiply matrices or vectors, by torch's own FLOP registry or by being one
    of the products it leaves out (``mv``, ``dot``, ``outer``, ``tensordot``, ...)? A node
    doing FLOPs without a handler is reported as unsupported."""
    if not isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return False
    if getattr(target, "namespace", "aten") != "aten":
        return False
    packet = target.overloadpacket if isinstance(target, torch._ops.OpOverload) else target
    return packet.__name__ in _flop_packets()


def looks_like_matmul(target) -> bool:
    """Should an op without a handler be reported as unsupported? Yes when torch counts its
    FLOPs (:func:`does_flops`: the structural rule) or, for ops outside aten (custom ops,
    other namespaces), when its name says it multiplies matrices."""
    if does_flops(target):
        return True
    name = str(target).split("::")[-1]
    return bool(_MATMUL_NAME.search(name)) or "mm" in name.split(".")[-2:-1]


def gemms_for_node(node: torch.fx.Node):
    """GEMMs a node runs: a list, or None when the node has no handler."""
    if node.op != "call_function":
        return None
    h = gemm_handler(node.target)
    if h is None:
        return None
    gemms = h(node)
    if _has_symbolic(node):  # sizes are hints (example values): mark the rows
        import dataclasses

        gemms = [dataclasses.replace(g, note=(g.note + "; " if g.note else "")
                                     + "symbolic sizes: hint values used") for g in gemms]
    return gemms


# ---------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------

def _size(d) -> int:
    """A concrete size: the hint of a symbolic one (its example value)."""
    if isinstance(d, torch.SymInt):
        hint = getattr(d.node, "hint", None)
        if hint is None:
            raise ValueError(f"symbolic size {d} has no hint value")
        return int(hint)
    return int(d)


def _shape(arg):
    val = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None
    if val is None or not hasattr(val, "shape"):
        return None
    return tuple(_size(d) for d in val.shape)


def _has_symbolic(node) -> bool:
    vals = [a.meta.get("val") for a in node.all_input_nodes]
    return any(isinstance(d, torch.SymInt) for v in vals if hasattr(v, "shape") for d in v.shape)


def input_shapes(node: torch.fx.Node):
    """Shapes of the node's positional tensor arguments (None for non-tensors)."""
    return [_shape(a) for a in node.args]


def _prod(xs):
    return math.prod(xs) if xs else 1


def _require(shapes, n, node):
    if len(shapes) < n or any(s is None for s in shapes[:n]):
        raise ValueError(f"{node.target}: missing shape metadata on its inputs")
    return shapes[:n]


# ---------------------------------------------------------------------------------------
# handlers
# ---------------------------------------------------------------------------------------

@register_gemm_handler(aten.linear)
def _linear(node):
    x, w = _require(input_shapes(node), 2, node)
    # x[..., K] @ w[N, K]^T: every leading dimension of x is a token
    return [Gemm("linear", 1, _prod(x[:-1]), w[0], w[1], "nt")]


@register_gemm_handler(aten.mm)
def _mm(node):
    a, b = _require(input_shapes(node), 2, node)
    return [Gemm("mm", 1, a[0], b[1], a[1], "nn")]


@register_gemm_handler(aten.addmm)
def _addmm(node):
    _, a, b = _require(input_shapes(node), 3, node)
    return [Gemm("addmm", 1, a[0], b[1], a[1], "nn")]


@register_gemm_handler(aten.bmm)
def _bmm(node):
    a, b = _require(input_shapes(node), 2, node)
    return [Gemm("bmm", a[0], a[1], b[2], a[2], "nn")]


@register_gemm_handler(aten.baddbmm)
def _baddbmm(node):
    _, a, b = _require(input_shapes(node), 3, node)
    return [Gemm("baddbmm", a[0], a[1], b[2], a[2], "nn")]


@register_gemm_handler(aten.matmul)
def _matmul(node):
    a, b = _require(input_shapes(node), 2, node)
    if len(a) == 1 and len(b) == 1:  # dot product
        return [Gemm("matmul", 1, 1, 1, a[0], "nn")]
    if len(b) == 1:  # matrix-vector: A[..., M, K] @ v[K]
        return [Gemm("matmul", 1, _prod(a[:-1]), 1, a[-1], "nn")]
    if len(a) == 1:  # vector-matrix: v[K] @ B[..., K, N]
        return [Gemm("matmul", _prod(b[:-2]), 1, b[-1], b[-2], "nn")]
    if len(b) == 2:  # batch dims of A fold into M
        return [Gemm("matmul", 1, _prod(a[:-1]), b[1], a[-1], "nn")]
    batch = torch.broadcast_shapes(tuple(a[:-2]), tuple(b[:-2]))
    return [Gemm("matmul", _prod(batch), a[-2], b[-1], a[-1], "nn")]


# --- vector products and contractions: GEMV (N = 1), dot (M = N = 1), outer (K = 1) ------

@register_gemm_handler(aten.mv)
def _mv(node):
    a, x = _require(input_shapes(node), 2, node)
    # A[M, K] @ x[K]: a GEMM with one output column (cuBLAS runs it as gemv)
    return [Gemm("mv", 1, a[0], 1, a[1], "nn", note="matrix-vector (N = 1)")]


@register_gemm_handler(aten.addmv)
def _addmv(node):
    _, a, x = _require(input_shapes(node), 3, node)
    return [Gemm("addmv", 1, a[0], 1, a[1], "nn", note="matrix-vector (N = 1)")]


@register_gemm_handler(aten.dot, aten.vdot)
def _dot(node):
    x, _ = _require(input_shapes(node), 2, node)
    return [Gemm(str(node.target).split(".")[1], 1, 1, 1, x[0], "nn",
                 note="dot product (M = N = 1)")]


@register_gemm_handler(aten.outer, aten.ger)
def _outer(node):
    x, y = _require(input_shapes(node), 2, node)
    return [Gemm("outer", 1, x[0], y[0], 1, "nn", note="outer product (K = 1)")]


@register_gemm_handler(aten.addr)
def _addr(node):
    _, x, y = _require(input_shapes(node), 3, node)
    return [Gemm("addr", 1, x[0], y[0], 1, "nn", note="outer product (K = 1)")]


def _dims_arg(node, i, name):
    v = node.args[i] if len(node.args) > i else node.kwargs.get(name)
    return [int(d) for d in v]


@register_gemm_handler(aten.tensordot)
def _tensordot(node):
    # tensordot(a, b, dims_a, dims_b): ATen permutes the contracted dimensions together and
    # runs one mm: M = a's free dimensions, N = b's, K = the contracted ones
    a, b = _require(input_shapes(node), 2, node)
    da = [d % len(a) for d in _dims_arg(node, 2, "dims_self")]
    db = [d % len(b) for d in _dims_arg(node, 3, "dims_other")]
    k = _prod([a[d] for d in da])
    m = _prod([a[d] for d in range(len(a)) if d not in da])
    n = _prod([b[d] for d in range(len(b)) if d not in db])
    return [Gemm("tensordot", 1, m, n, k, "nn", note="tensordot as one mm")]


def _chain_order(dims):
    """Optimal parenthesization of a matrix chain (the classic dynamic programme that
    ``torch.linalg.multi_dot`` uses): the (M, N, K) of each mm in execution order."""
    n = len(dims) - 1
    cost = [[0] * n for _ in range(n)]
    split = [[0] * n for _ in range(n)]
    for length in range(1, n):
        for i in range(n - length):
            j = i + length
            cost[i][j] = math.inf
            for s in range(i, j):
                c = cost[i][s] + cost[s + 1][j] + dims[i] * dims[s + 1] * dims[j + 1]
                if c < cost[i][j]:
                    cost[i][j], split[i][j] = c, s
    out = []

    def walk(i, j):
        if i == j:
            return
        s = split[i][j]
        walk(i, s)
        walk(s + 1, j)
        out.append((dims[i], dims[j + 1], dims[s + 1]))

    walk(0, n - 1)
    return out


@register_gemm_handler(aten.linalg_multi_dot, aten.chain_matmul)
def _multi_dot(node):
    tensors = node.args[0]
    shapes = [_shape(t) for t in tensors]
    if any(s is None for s in shapes):
        raise ValueError(f"{node.target}: missing shape metadata on its inputs")
    # a 1-D first operand is a row vector, a 1-D last one a column vector
    mats = [(1, s[0]) if (i == 0 and len(s) == 1) else
            (s[0], 1) if (i == len(shapes) - 1 and len(s) == 1) else tuple(s)
            for i, s in enumerate(shapes)]
    dims = [mats[0][0]] + [m[1] for m in mats]
    return [Gemm("multi_dot", 1, m, n, k, "nn", note="matrix chain, optimal order")
            for m, n, k in _chain_order(dims)]


@register_gemm_handler(aten.bilinear)
def _bilinear(node):
    # y[b, o] = x1[b, i] W[o, i, j] x2[b, j] (+ bias): ATen's _trilinear contracts i first
    # (one mm over the flattened rows of x1 against W as (i, o*j)), then j per row (a bmm
    # with one output column)
    x1, x2, w = _require(input_shapes(node), 3, node)
    rows = _prod(x1[:-1])
    o, i, j = w
    return [Gemm("bilinear", 1, rows, o * j, i, "nn", note="bilinear: x1 against W"),
            Gemm("bilinear", rows, o, 1, j, "nn", note="bilinear: then against x2")]


def _attention(q, k, v, *, causal: bool, masked: bool, gqa: bool, direction: str):
    """The GEMMs of one attention call, per (batch, query head): forward S = QKᵀ and O = PV;
    backward (FlashAttention-2's algorithm) the recomputed S = QKᵀ, dV = Pᵀ·dO, dP = dO·Vᵀ,
    dQ = dS·K and dK = dSᵀ·Q. A causal mask keeps half the blocks (the papers' convention).
    Grouped-query K/V heads (``enable_gqa``) are shared by the query heads: the GEMMs run per
    query head either way."""
    if len(q) < 2 or len(k) < 2 or len(v) < 2:
        raise ValueError(f"attention needs [..., seq, head_dim] inputs, got q{q} k{k} v{v}")
    lead = q[:-2]
    heads = lead[-1] if len(lead) >= 2 else 1
    batch = _prod(lead) // heads
    kv_heads = k[-3] if (gqa and len(k) >= 3 and k[-3] != heads and heads % k[-3] == 0) \
        else heads
    sq, d, sk, dv = q[-2], q[-1], k[-2], v[-1]
    shape = AttentionShape(batch, heads, kv_heads, sq, sk, d, dv, causal)
    call = AttentionCall(shape, direction, masked)
    bh, w = batch * heads, shape.causal_fraction
    note = ("causal: half the blocks" if w == 0.5 else f"causal: {w:.1%} of the scores") \
        if causal else ""

    def g(op, m, n, kk, layout):
        return Gemm(op, bh, m, n, kk, layout, w, note, attn=call)

    if direction == "forward":
        return [g("sdpa.qk", sq, sk, d, "nt"), g("sdpa.pv", sq, dv, sk, "nn")]
    return [g("sdpa.bwd.qk", sq, sk, d, "nt"),   # recompute S = Q Kᵀ
            g("sdpa.bwd.dv", sk, dv, sq, "tn"),  # dV = Pᵀ dO
            g("sdpa.bwd.dp", sq, sk, dv, "nt"),  # dP = dO Vᵀ
            g("sdpa.bwd.dq", sq, d, sk, "nn"),   # dQ = dS K
            g("sdpa.bwd.dk", sk, d, sq, "tn")]   # dK = dSᵀ Q


def _arg(node, i, name, default):
    return node.args[i] if len(node.args) > i else node.kwargs.get(name, default)


@register_gemm_handler(aten.scaled_dot_product_attention)
def _sdpa(node):
    q, k, v = _require(input_shapes(node), 3, node)
    return _attention(q, k, v, causal=bool(_arg(node, 5, "is_causal", False)),
                      masked=_arg(node, 3, "attn_mask", None) is not None,
                      gqa=bool(_arg(node, 7, "enable_gqa", False)), direction="forward")


@register_gemm_handler(ATTENTION_OPS[0])
def _fused_attention(node):
    # fxshape::attention(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    q, k, v = _require(input_shapes(node), 3, node)
    return _attention(q, k, v, causal=bool(node.args[5]), masked=node.args[3] is not None,
                      gqa=bool(node.args[7]), direction="forward")


@register_gemm_handler(ATTENTION_OPS[1])
def _fused_attention_backward(node):
    # fxshape::attention_backward(grad_out, q, k, v, out, lse, attn_mask, dropout_p,
    #                             is_causal, scale, enable_gqa, mask_grad)
    _, q, k, v = _require(input_shapes(node), 4, node)
    return _attention(q, k, v, causal=bool(node.args[8]), masked=node.args[6] is not None,
                      gqa=bool(node.args[10]), direction="backward")


@register_gemm_handler(aten.convolution, aten.conv1d, aten.conv2d, aten.conv3d)
def _conv(node):
    shapes = input_shapes(node)
    x, w = _require(shapes, 2, node)
    out = tuple(node.meta["val"].shape)
    if node.target in (aten.convolution.default,):
        groups = node.args[8] if len(node.args) > 8 else 1
        transposed = bool(node.args[6]) if len(node.args) > 6 else False
    else:
        groups = node.args[6] if len(node.args) > 6 else node.kwargs.get("groups", 1)
        transposed = False
    if transposed:
        raise ValueError(f"{node.target}: transposed convolutions are not supported")
    # implicit GEMM: M = batch x output pixels, N = out channels / groups,
    # K = in channels / groups x kernel elements; one GEMM per group
    m = out[0] * _prod(out[2:])
    n = w[0] // groups
    k = w[1] * _prod(w[2:])
    return [Gemm("conv", groups, m, n, k, "nt")]


@register_gemm_handler(aten.convolution_backward)
def _conv_backward(node):
    # convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation,
    #                      transposed, output_padding, groups, output_mask)
    dy, x, w = _require(input_shapes(node), 3, node)
    if node.args[7]:
        raise ValueError(f"{node.target}: transposed convolutions are not supported")
    groups, mask = node.args[9], node.args[10]
    out_px, in_px, kernel = _prod(dy[2:]), _prod(x[2:]), _prod(w[2:])
    c_out, c_in = w[0] // groups, w[1]
    gemms = []
    if mask[0]:  # input gradient: an implicit GEMM over the input pixels
        gemms.append(Gemm("conv.dgrad", groups, x[0] * in_px, c_in, c_out * kernel, "nn"))
    if mask[1]:  # weight gradient: reduces over every output pixel of the batch
        gemms.append(Gemm("conv.wgrad", groups, c_out, c_in * kernel, dy[0] * out_px, "tn"))
    return gemms


_EINSUM_TERM = re.compile(r"^[a-zA-Z]*$")


@register_gemm_handler(aten.einsum)
def _einsum(node):
    eq = node.args[0].replace(" ", "")
    operands = node.args[1]
    shapes = [_shape(o) for o in operands]
    if "->" not in eq or len(shapes) != 2 or any(s is None for s in shapes):
        raise ValueError(f"einsum {eq!r}: only two-operand equations with '->' are supported")
    lhs, out = eq.split("->")
    ta, tb = lhs.split(",")
    if not all(_EINSUM_TERM.match(t) for t in (ta, tb, out)) or "." in eq:
        raise ValueError(f"einsum {eq!r}: ellipsis is not supported")
    size = {}
    for term, shape in ((ta, shapes[0]), (tb, shapes[1])):
        for ch, s in zip(term, shape):
            size[ch] = max(size.get(ch, 1), s)
    batch = [c for c in out if c in ta and c in tb]
    m = [c for c in out if c in ta and c not in tb]
    n = [c for c in out if c in tb and c not in ta]
    k = [c for c in ta if c in tb and c not in out]
    return [Gemm("einsum", _prod([size[c] for c in batch]), _prod([size[c] for c in m]),
                 _prod([size[c] for c in n]), _prod([size[c] for c in k]), "nn",
                 note=f"einsum {eq}")]


def _grouped(node, name):
    x, w = _require(input_shapes(node), 2, node)
    m, work, note = _balanced(x[0], w[0])
    return [Gemm(name, w[0], m, w[2], w[1], "nn", work=work, note=note)]


def _balanced(rows, experts):
    """Routing decides each expert's rows at run time; assume balanced routing: at most
    ``m = ceil(rows / experts)`` each, with ``work`` keeping the total at exactly ``rows``.
    Returns ``(m, work, note)``."""
    m = max(1, -(-rows // experts))
    note = f"MoE: {rows} routed rows over {experts} experts, balanced routing assumed"
    if rows != experts * m:
        note += f" (at most {m} per expert; FLOPs count the {rows} rows exactly)"
    return m, rows / (experts * m), note


if hasattr(aten, "_grouped_mm"):
    @register_gemm_handler(aten._grouped_mm)
    def _aten_grouped_mm(node):
        return _grouped(node, "grouped_mm")


def _grouped_backward(node):
    """``transformers::grouped_mm_fallback_backward(input, weight, offs, grad_output)``: per
    expert dX = dY·Wᵀ (M = its rows, N = in, K = out) and dW = Xᵀ·dY (M = in, N = out, K = its
    rows), balanced routing assumed."""
    x, w = _require(input_shapes(node), 2, node)
    experts, k_in, n_out = w
    m, work, note = _balanced(x[0], experts)
    return [Gemm("grouped_mm.dx", experts, m, k_in, n_out, "nt", work=work, note=note),
            Gemm("grouped_mm.dw", experts, k_in, n_out, m, "tn", work=work, note=note)]


def register_transformers_ops() -> None:
    """Handlers for ops that the ``transformers`` package registers (if it is imported)."""
    ns = getattr(torch.ops, "transformers", None)
    if ns is None:
        return
    for name, handler in (("grouped_mm_fallback", lambda node: _grouped(node, "grouped_mm")),
                          ("grouped_mm_fallback_backward", _grouped_backward)):
        op = getattr(ns, name, None)
        if op is not None and gemm_handler(op) is None:
            register_gemm_handler(op)(handler)


# capture labels the phase and owning module of every node this registry has a handler for,
# and registers transformers' ops first (fxshape.tracing cannot import the registry)
set_labelled_ops(lambda target: gemm_handler(target) is not None,
                 before_capture=register_transformers_ops)
