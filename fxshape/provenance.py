"""Which hyperparameter sets each GEMM dimension ("lm_head N <- vocab_size").

Two steps, per GEMM dimension:

1. Dataflow (networkx over the captured graph): which operand carries the dimension (M: the
   left operand, N: the right, K: both), and whether that operand is a parameter — reached
   through view-like ops (transpose, reshape, dtype casts) from a ``get_attr`` node or a
   parameter placeholder — or an activation, computed from the user's inputs (``nx.ancestors``).
2. Naming: a dimension carried by a weight is matched against the model's config
   (``vocab_size``, ``hidden_size``, ``intermediate_size``, fused ``3 × hidden_size``,
   ``num_key_value_heads × head_dim``, … and ``/ tp`` when sharded); one carried by activations
   against the input sizes as well (``batch_size × seq_len``, ``seq_len``, ``head_dim``,
   ``batch_size × num_attention_heads``). Without a config (a plain module) the answer is the
   parameter and axis (``fc1.weight[0]``) or the input (``input x[0] × x[1]``).

Pure functions over a graph and a config; deterministic (fixed preference order).
"""

from __future__ import annotations

import math

import networkx as nx
import torch

from .capture import _VIEW_OPS, _op_name

__all__ = ["hyperparameters", "expressions", "dimension_sources", "input_sizes"]

#: canonical hyperparameter -> config attribute names that hold it, first found wins
_FIELDS = {
    "vocab_size": ("vocab_size",),
    "hidden_size": ("hidden_size", "n_embd", "d_model"),
    "num_attention_heads": ("num_attention_heads", "n_head", "num_heads"),
    "num_key_value_heads": ("num_key_value_heads",),
    "head_dim": ("head_dim", "d_kv"),
    "intermediate_size": ("intermediate_size", "n_inner", "d_ff", "ffn_dim"),
    "num_local_experts": ("num_local_experts", "num_experts"),
}

def _field(config, canonical):
    for name in _FIELDS[canonical]:
        v = getattr(config, name, None)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return name, v
    return None


def hyperparameters(config) -> dict:
    """canonical name -> (label as the user writes it, value), with derived defaults:
    ``head_dim = hidden_size / num_attention_heads`` and GPT-2's unset ``n_inner = 4 × n_embd``.
    """
    out = {}
    for canonical in _FIELDS:
        f = _field(config, canonical)
        if f is not None:
            out[canonical] = f
    h, a = out.get("hidden_size"), out.get("num_attention_heads")
    if "head_dim" not in out and h and a and h[1] % a[1] == 0:
        out["head_dim"] = (f"{h[0]} / {a[0]}", h[1] // a[1])
    if "intermediate_size" not in out and h and hasattr(config, "n_inner"):
        out["intermediate_size"] = (f"4 × {h[0]} (n_inner unset)", 4 * h[1])
    if "num_key_value_heads" in out and a and out["num_key_value_heads"][1] == a[1]:
        del out["num_key_value_heads"]  # plain multi-head attention: say num_attention_heads
    return out


def expressions(config, *, batch_size=None, seq_len=None, tp: int = 1):
    """(weight expressions, activation expressions): ordered lists of (label, value)."""
    g = hyperparameters(config) if config is not None else {}

    def lab(k):
        return g[k][0]

    weight = []
    for k in ("vocab_size", "hidden_size", "intermediate_size"):
        if k in g:
            weight.append((lab(k), g[k][1]))
    if "intermediate_size" in g:
        weight.append((f"2 × {lab('intermediate_size')}", 2 * g["intermediate_size"][1]))
    if "hidden_size" in g:
        weight.append((f"3 × {lab('hidden_size')}", 3 * g["hidden_size"][1]))
    if "head_dim" in g:
        hd = g["head_dim"][1]
        if "num_attention_heads" in g:
            a = g["num_attention_heads"][1]
            weight.append((f"{lab('num_attention_heads')} × head_dim", a * hd))
            if "num_key_value_heads" in g:
                kv = g["num_key_value_heads"][1]
                weight.append((f"{lab('num_key_value_heads')} × head_dim", kv * hd))
                weight.append((f"({lab('num_attention_heads')} + 2 × "
                               f"{lab('num_key_value_heads')}) × head_dim", (a + 2 * kv) * hd))
            else:
                weight.append((f"3 × {lab('num_attention_heads')} × head_dim", 3 * a * hd))
    if "num_local_experts" in g:
        weight.append((lab("num_local_experts"), g["num_local_experts"][1]))
    if tp > 1:
        weight = [(f"{lbl} / tp", v // tp) for lbl, v in weight if v % tp == 0] + weight

    act = []
    if batch_size and seq_len:
        act.append(("batch_size × seq_len", batch_size * seq_len))
    if seq_len:
        act.append(("seq_len", seq_len))
    if "head_dim" in g:
        hd_label = "head_dim" if g["head_dim"][0] in ("head_dim", "d_kv") else \
            f"head_dim = {g['head_dim'][0]}"
        act.append((hd_label, g["head_dim"][1]))
    for k in ("num_attention_heads", "num_key_value_heads"):
        if batch_size and k in g:
            v = batch_size * g[k][1]
            if tp > 1 and v % tp == 0:
                act.append((f"batch_size × {lab(k)} / tp", v // tp))
            act.append((f"batch_size × {lab(k)}", v))
    if batch_size:
        act.append(("batch_size", batch_size))
    img, patch = getattr(config, "image_size", None), getattr(config, "patch_size", None)
    if batch_size and isinstance(img, int) and isinstance(patch, int) and patch > 0:
        act.append(("batch_size × (image_size / patch_size)²", batch_size * (img // patch) ** 2))
    return weight, act + weight


def _conv_k(config):
    """ViT's patch embedding reduces over channels × patch²."""
    c, patch = getattr(config, "num_channels", None), getattr(config, "patch_size", None)
    if isinstance(c, int) and isinstance(patch, int):
        return [("num_channels × patch_size²", c * patch * patch)]
    return []


def _param_name(node) -> str | None:
    if node.op == "get_attr":
        return str(node.target)
    if node.op == "placeholder":
        return node.meta.get("fxshape_param")
    return None


def _weight_of(node) -> tuple[str, tuple] | None:
    """(parameter name, shape) if ``node`` is a parameter seen through view-like ops."""
    seen = 0
    while isinstance(node, torch.fx.Node) and seen < 12:
        name = _param_name(node)
        if name is not None:
            val = node.meta.get("val")
            return name, tuple(val.shape) if val is not None else ()
        if node.op != "call_function" or _op_name(node) not in _VIEW_OPS:
            return None
        tensors = [a for a in node.args if isinstance(a, torch.fx.Node)]
        if len(tensors) != 1:
            return None
        node, seen = tensors[0], seen + 1
    return None


def _operands(node, op: str):
    """(left operand, right operand, operands carrying K) of a GEMM row of this node."""
    args = [a if isinstance(a, torch.fx.Node) else None for a in node.args]
    args += [None] * (3 - len(args))
    if op in ("addmm", "baddbmm"):
        return args[1], args[2], (args[1], args[2])
    if op == "sdpa.pv":  # P[M, seq_k] @ V[seq_k, N]: M from q, N from v, K from k
        return args[0], args[2], (args[1], args[2])
    if op == "grouped_mm.dx":  # dY[rows, out] @ W[e]ᵀ: M from dY, N and K from the weight
        return args[3] if len(args) > 3 else None, args[1], (args[1],)
    if op == "grouped_mm.dw":  # X[rows, in]ᵀ @ dY[rows, out]: M and N from the weight
        return args[1], args[1], (args[0],)
    if op == "einsum" and isinstance(node.args[1], (list, tuple)):
        a, b = (list(node.args[1]) + [None, None])[:2]
        return a, b, (a, b)
    return args[0], args[1], (args[0], args[1])


def _user_inputs(graph: torch.fx.Graph):
    """Placeholders that are the user's inputs (not parameters, buffers or gradients)."""
    out = []
    for n in graph.nodes:
        if n.op != "placeholder" or n.meta.get("fxshape_param") or \
                n.meta.get("fxshape_buffer"):
            continue
        if n.name.startswith(("p_", "b_", "c_", "tangents")):
            continue
        val = n.meta.get("val")
        if isinstance(val, torch.Tensor):
            out.append(n)
    return out


def input_sizes(graph: torch.fx.Graph, config=None) -> tuple[int | None, int | None]:
    """(batch_size, seq_len) read off the user's inputs: token ids ``[batch, seq]``, or
    images ``[batch, C, H, W]`` with ``seq = (image_size / patch_size)² + 1`` (ViT)."""
    for n in _user_inputs(graph):
        val = n.meta["val"]
        if val.dim() == 2 and not val.is_floating_point():
            return _int(val.shape[0]), _int(val.shape[1])
    for n in _user_inputs(graph):
        val = n.meta["val"]
        img, patch = getattr(config, "image_size", None), getattr(config, "patch_size", None)
        if val.dim() == 4 and isinstance(img, int) and isinstance(patch, int):
            return _int(val.shape[0]), (img // patch) ** 2 + 1
    return None, None


def _int(x):
    return x if isinstance(x, int) else None


def dimension_sources(gm: torch.fx.GraphModule, rows_by_node: dict, *, config=None,
                      tp: int = 1) -> dict:
    """``{node name: [(M, N, K) labels per row]}`` for every node of ``rows_by_node`` (its GemmRows)."""
    g = nx.DiGraph()
    for n in gm.graph.nodes:
        g.add_node(n.name)
        for a in n.all_input_nodes:
            g.add_edge(a.name, n.name)
    nodes = {n.name: n for n in gm.graph.nodes}
    inputs = {n.name: n for n in _user_inputs(gm.graph)}
    batch, seq = input_sizes(gm.graph, config)
    w_expr, a_expr = expressions(config, batch_size=batch, seq_len=seq, tp=tp)
    # batched GEMMs (attention: batch = batch_size x heads) run per sequence: when
    # batch_size is 1, "seq_len" is the right name for a dimension equal to both
    a_batched = sorted(a_expr, key=lambda e: e[0] != "seq_len")
    out = {}
    for name, rows in rows_by_node.items():
        node = nodes[name]
        res = []
        for row in rows:
            a_list = a_batched if (row.batch > 1 or row.op.startswith("sdpa")) else a_expr
            a, b, kops = _operands(node, row.op)
            conv_k = _conv_k(config) if row.op == "conv" else []
            routed = "batch_size × seq_len × top-k / experts (routing)" \
                if row.op.startswith("grouped") and batch and seq else None
            dw = row.op == "grouped_mm.dw"  # the routed rows are its reduction
            res.append((
                routed if routed and not dw
                else _label(row.m, (a,), row.op, g, inputs, w_expr, a_list),
                _label(row.n, (b,), row.op, g, inputs, w_expr, a_list),
                routed if routed and dw
                else _label(row.k, kops, row.op, g, inputs, conv_k + w_expr, a_list)))
        out[name] = res
    return out


def _label(v, carriers, op, g, inputs, w_expr, a_expr) -> str:
    weights = [w for w in (_weight_of(c) for c in carriers if c is not None) if w]
    weights = [(p, shape) for p, shape in weights if v in shape]
    if weights:
        for lbl, val in w_expr:
            if val == v:
                return lbl
        p, shape = weights[0]
        return f"{p}[{shape.index(v)}]"
    for lbl, val in a_expr:
        if val == v:
            return lbl
    if op.startswith("grouped"):
        return "routing (tokens per expert)"
    # no config match: the user's input dims that multiply to v, if any
    for c in carriers:
        if c is None:
            continue
        for src in sorted((nx.ancestors(g, c.name) | {c.name}) & set(inputs)):
            shape = tuple(inputs[src].meta["val"].shape)
            for i in range(len(shape)):
                for j in range(i + 1, len(shape) + 1):
                    if all(isinstance(d, int) for d in shape[i:j]) and \
                            math.prod(shape[i:j]) == v:
                        arg = inputs[src].meta.get("fxshape_input", src)
                        dims = "×".join(f"{arg}.shape[{x}]" for x in range(i, j))
                        return f"input {dims}"
    return "activation"
