"""Which hyperparameter sets each GEMM dimension ("lm_head N <- vocab_size").

By cause (the default of ``analyze``): ``fxshape.analysis.perturb`` re-traces the model with one
*knob* (:class:`Knob`: a config hyperparameter such as ``vocab_size``, or an input size such
as ``seq_len``) changed at a time, and :func:`name_by_cause` names each dimension from what it
measured at every point: its causes are the knobs whose change changed it, its label the first
named expression of :func:`catalog` (``batch_size × seq_len``, ``num_key_value_heads ×
head_dim``, ``3 × hidden_size``, ... evaluated on :func:`environment`, which derives
``head_dim = hidden_size / num_attention_heads`` and the like as Hugging Face models do) that
equals the dimension at all of them. A dimension no knob changes is named by the parameter axis
that carries it (:func:`weight_axes`, dataflow through view-like ops).

By value (``analyze(provenance="matched")``, :func:`dimension_sources`), without re-tracing:

1. Dataflow (networkx over the captured graph): which operand carries the dimension (M: the
   left operand, N: the right, K: both), and whether that operand is a parameter — reached
   through view-like ops (transpose, reshape, dtype casts) from a ``get_attr`` node or a
   parameter placeholder — or an activation, computed from the user's inputs (``nx.ancestors``).
2. Naming: a dimension carried by a weight is matched against the model's config
   (``vocab_size``, ``hidden_size``, ``intermediate_size``, fused ``3 × hidden_size``,
   ``num_key_value_heads × head_dim``, … and ``/ tp`` when sharded); one carried by activations
   against the input sizes as well (``batch_size × seq_len``, ``seq_len``, ``head_dim``,
   ``batch_size × num_attention_heads``). Without a config (a plain module) the answer is the
   parameter and axis (``fc1.weight[0]``) or the input (``input x[0] × x[1]``). Values that
   coincide are decided by a fixed preference order, which can be wrong (a sequence length
   equal to the head dimension).

Pure functions over graphs, configs and measured sizes; deterministic.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import networkx as nx
import torch

from ..tracing.configs import HEAD_FIELDS, HIDDEN_FIELDS
from ..tracing.export import VIEW_OPS, node_op_name

__all__ = ["hyperparameters", "expressions", "dimension_sources", "input_sizes", "Knob",
           "config_knobs", "environment", "catalog", "confirmed", "agrees", "name_by_cause",
           "weight_axes"]

#: canonical hyperparameter -> config attribute names that hold it, first found wins
_FIELDS = {
    "vocab_size": ("vocab_size",),
    "hidden_size": HIDDEN_FIELDS,
    "num_attention_heads": HEAD_FIELDS,
    "num_key_value_heads": ("num_key_value_heads",),
    "head_dim": ("head_dim", "d_kv"),
    "intermediate_size": ("intermediate_size", "n_inner", "d_ff", "ffn_dim"),
    "num_local_experts": ("num_local_experts", "num_experts", "n_routed_experts"),
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
        if node.op != "call_function" or node_op_name(node) not in VIEW_OPS:
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


# ---------------------------------------------------------------------------------------
# provenance by cause: what changes when one hyperparameter or input size changes
# ---------------------------------------------------------------------------------------

#: config integers varied besides the hyperparameters above: routing and the vision inputs
_EXTRA_KNOBS = {
    "num_experts_per_tok": ("num_experts_per_tok",),
    # MoE expert widths and shared experts (Qwen-MoE, DeepSeek)
    "moe_intermediate_size": ("moe_intermediate_size",),
    "shared_expert_intermediate_size": ("shared_expert_intermediate_size",),
    "n_shared_experts": ("n_shared_experts",),
    # multi-head latent attention (DeepSeek-V2/V3): low-rank Q and KV, split head dims
    "q_lora_rank": ("q_lora_rank",),
    "kv_lora_rank": ("kv_lora_rank",),
    "qk_nope_head_dim": ("qk_nope_head_dim",),
    "qk_rope_head_dim": ("qk_rope_head_dim",),
    "v_head_dim": ("v_head_dim",),
    "image_size": ("image_size",),
    "patch_size": ("patch_size",),
    "num_channels": ("num_channels",),
    "max_source_positions": ("max_source_positions",),  # speech encoders: frames / 2
    "num_mel_bins": ("num_mel_bins",),
}


@dataclass(frozen=True)
class Knob:
    """One thing that provenance varies, one at a time: a config attribute (``attr``), a size
    of the synthesized inputs (``batch_size``, ``seq_len``), or one size of the user's inputs
    (``axes``: every (input, axis) that must equal it, varied together)."""

    name: str  # key in an environment (canonical hyperparameter, "batch_size", ...)
    label: str  # as the user writes it: "n_embd", "batch_size", "x.shape[0]"
    value: int
    attr: str | None = None
    axes: tuple = ()


def config_knobs(config) -> list:
    """The config integers that set GEMM sizes, as knobs (first attribute found per
    hyperparameter, as :func:`hyperparameters` names them)."""
    out = []
    for canonical, attrs in {**_FIELDS, **_EXTRA_KNOBS}.items():
        for attr in attrs:
            v = getattr(config, attr, None)
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                out.append(Knob(canonical, attr, v, attr=attr))
                break
    return out


def environment(config, knobs, values: dict | None = None):
    """(values, labels) of every quantity a label may use, with ``values`` overriding knob
    values (a perturbed point). Derived quantities follow their sources the way Hugging Face
    models derive them: ``head_dim = hidden_size / num_attention_heads`` when the config
    states none, GPT-2's unset ``n_inner = 4 × n_embd``, ``num_key_value_heads =
    num_attention_heads`` when unset, ViT's ``seq_len = (image_size / patch_size)² + 1``."""
    env = {k.name: k.value for k in knobs}
    env.update(values or {})
    lab = {k.name: k.label for k in knobs}
    h, a = env.get("hidden_size"), env.get("num_attention_heads")
    if "head_dim" not in env and h and a and h % a == 0:
        env["head_dim"] = h // a
        lab["head_dim"] = f"head_dim = {lab['hidden_size']} / {lab['num_attention_heads']}"
    if "intermediate_size" not in env and h and config is not None and \
            hasattr(config, "n_inner"):
        env["intermediate_size"] = 4 * h
        lab["intermediate_size"] = f"4 × {lab['hidden_size']} (n_inner unset)"
    if "num_key_value_heads" not in env and a:
        env["num_key_value_heads"], lab["num_key_value_heads"] = a, lab["num_attention_heads"]
    img, patch = env.get("image_size"), env.get("patch_size")
    if "seq_len" not in env and img and patch:
        env["seq_len"] = (img // patch) ** 2 + 1
        lab["seq_len"] = f"seq_len = ({lab['image_size']} / {lab['patch_size']})² + 1"
    return env, lab


def catalog(labels: dict, inputs=(), *, tp: int = 1) -> list:
    """Named expressions, ``(label, function of an environment)``, in preference order: the
    names a dimension may get when it equals one at every point provenance measured.
    ``inputs``: (label, (knob names...)) for products of the user's input sizes."""
    L = labels.get
    out = []

    def add(label, fn, *needs):
        if all(n in labels for n in needs):
            out.append((label, fn))

    hd = "head_dim"
    weight = [
        (L("vocab_size"), lambda e: e["vocab_size"], "vocab_size"),
        (L("hidden_size"), lambda e: e["hidden_size"], "hidden_size"),
        (L("intermediate_size"), lambda e: e["intermediate_size"], "intermediate_size"),
        (f"2 × {L('intermediate_size')}", lambda e: 2 * e["intermediate_size"],
         "intermediate_size"),
        (f"3 × {L('hidden_size')}", lambda e: 3 * e["hidden_size"], "hidden_size"),
        (f"{L('num_attention_heads')} × head_dim",
         lambda e: e["num_attention_heads"] * e[hd], "num_attention_heads", hd),
        (f"{L('num_key_value_heads')} × head_dim",
         lambda e: e["num_key_value_heads"] * e[hd], "num_key_value_heads", hd),
        (f"({L('num_attention_heads')} + 2 × {L('num_key_value_heads')}) × head_dim",
         lambda e: (e["num_attention_heads"] + 2 * e["num_key_value_heads"]) * e[hd],
         "num_attention_heads", "num_key_value_heads", hd),
        (f"3 × {L('num_attention_heads')} × head_dim",
         lambda e: 3 * e["num_attention_heads"] * e[hd], "num_attention_heads", hd),
        (L("num_local_experts"), lambda e: e["num_local_experts"], "num_local_experts"),
        (L("moe_intermediate_size"), lambda e: e["moe_intermediate_size"],
         "moe_intermediate_size"),
        (f"{L('n_shared_experts')} × {L('moe_intermediate_size')}",
         lambda e: e["n_shared_experts"] * e["moe_intermediate_size"], "n_shared_experts",
         "moe_intermediate_size"),
        (L("shared_expert_intermediate_size"), lambda e: e["shared_expert_intermediate_size"],
         "shared_expert_intermediate_size"),
        (L("q_lora_rank"), lambda e: e["q_lora_rank"], "q_lora_rank"),
        (L("kv_lora_rank"), lambda e: e["kv_lora_rank"], "kv_lora_rank"),
        (f"{L('kv_lora_rank')} + {L('qk_rope_head_dim')}",
         lambda e: e["kv_lora_rank"] + e["qk_rope_head_dim"], "kv_lora_rank",
         "qk_rope_head_dim"),
        (f"{L('num_attention_heads')} × ({L('qk_nope_head_dim')} + {L('qk_rope_head_dim')})",
         lambda e: e["num_attention_heads"] * (e["qk_nope_head_dim"] + e["qk_rope_head_dim"]),
         "num_attention_heads", "qk_nope_head_dim", "qk_rope_head_dim"),
        (f"{L('num_attention_heads')} × ({L('qk_nope_head_dim')} + {L('v_head_dim')})",
         lambda e: e["num_attention_heads"] * (e["qk_nope_head_dim"] + e["v_head_dim"]),
         "num_attention_heads", "qk_nope_head_dim", "v_head_dim"),
        (f"{L('num_attention_heads')} × {L('v_head_dim')}",
         lambda e: e["num_attention_heads"] * e["v_head_dim"], "num_attention_heads",
         "v_head_dim"),
        (f"{L('num_channels')} × {L('patch_size')}²",
         lambda e: e["num_channels"] * e["patch_size"] ** 2, "num_channels", "patch_size"),
    ]
    if tp > 1:
        for label, fn, *needs in list(weight):
            add(f"{label} / tp", lambda e, fn=fn: fn(e) // tp if fn(e) % tp == 0 else None,
                *needs)
    for label, fn, *needs in weight:
        add(label, fn, *needs)
    # a head_dim the config states is "head_dim" (T5's d_kv too), a derived one says how
    hd_label = L(hd) if " = " in L(hd, "") else "head_dim"
    act = [
        ("batch_size × seq_len", lambda e: e["batch_size"] * e["seq_len"],
         "batch_size", "seq_len"),
        (L("seq_len"), lambda e: e["seq_len"], "seq_len"),
        (hd_label, lambda e: e[hd], hd),
        (L("v_head_dim"), lambda e: e["v_head_dim"], "v_head_dim"),
        (f"{L('qk_nope_head_dim')} + {L('qk_rope_head_dim')}",
         lambda e: e["qk_nope_head_dim"] + e["qk_rope_head_dim"], "qk_nope_head_dim",
         "qk_rope_head_dim"),
    ]
    for k in ("num_attention_heads", "num_key_value_heads"):
        if tp > 1:
            act.append((f"batch_size × {L(k)} / tp",
                        lambda e, k=k: e["batch_size"] * e[k] // tp
                        if e["batch_size"] * e[k] % tp == 0 else None, "batch_size", k))
        act.append((f"batch_size × {L(k)}", lambda e, k=k: e["batch_size"] * e[k],
                    "batch_size", k))
    act += [
        ("batch_size", lambda e: e["batch_size"], "batch_size"),
        (f"batch_size × ({L('image_size')} / {L('patch_size')})²",
         lambda e: e["batch_size"] * (e["image_size"] // e["patch_size"]) ** 2,
         "batch_size", "image_size", "patch_size"),
        (L("max_source_positions"), lambda e: e["max_source_positions"],
         "max_source_positions"),
        (f"batch_size × {L('max_source_positions')}",
         lambda e: e["batch_size"] * e["max_source_positions"],
         "batch_size", "max_source_positions"),
        ("batch_size × seq_len × top-k / experts (routing)",
         lambda e: max(1, -(-e["batch_size"] * e["seq_len"] * e["num_experts_per_tok"]
                            // e["num_local_experts"])),
         "batch_size", "seq_len", "num_experts_per_tok", "num_local_experts"),
    ]
    for label, fn, *needs in act:
        add(label, fn, *needs)
    for label, names in inputs:
        add(label, lambda e, names=names: math.prod(e[n] for n in names), *names)
    return out


def _evaluate(fn, env):
    try:
        return fn(env)
    except (KeyError, ZeroDivisionError, TypeError):
        return None


def confirmed(exprs, config, knobs, varied) -> list:
    """The expressions of ``exprs`` (:func:`catalog`) every knob of which is in ``varied``
    (knob names): one that depends on a knob never varied could equal a dimension by
    coincidence (DeepSeek's 24,576 = 3 × 128 heads × 64 is 128 heads × (128 + 64)). What an
    expression depends on is found by changing each knob in its environment."""
    env0, _ = environment(config, knobs)
    varied = set(varied)
    out = []
    for label, fn in exprs:
        base = _evaluate(fn, env0)
        deps = {k.name for k in knobs
                if _evaluate(fn, environment(config, knobs, {k.name: 2 * k.value + 1})[0])
                != base}
        if deps <= varied:
            out.append((label, fn))
    return out


def agrees(label: str, causes, varied_labels) -> bool:
    """Does ``label`` (matched by value) name no knob that was varied without changing the
    dimension (``causes``: the labels of the knobs that did)?"""
    return not any(re.search(rf"(?<![\w.]){re.escape(v)}(?![\w])", label)
                   for v in varied_labels if v not in causes)


def name_by_cause(points, labels: dict, exprs) -> tuple:
    """(label or None, causes) of one GEMM dimension from what it measured at each point.

    ``points``: ``[(knob name or None, environment, value), ...]``, the first the model as
    given and each other one the model with that one knob changed. ``causes``: the knobs whose
    change changed the dimension, in order. The label is the first expression of ``exprs``
    (:func:`catalog`) equal to the dimension at *every* point; else a monomial in the causes
    read off the points (``4 × x.shape[0]``); else ``f(causes)``; None when nothing varied
    changes it (the caller names the parameter axis, or says it is fixed)."""
    (_, env0, v0), rest = points[0], points[1:]
    causes = tuple(k for k, _, v in rest if v != v0)
    for label, fn in exprs:
        if all(_evaluate(fn, env) == v for _, env, v in points):
            return label, causes
    if not causes:
        return None, causes
    mono = _monomial(v0, env0, [(k, env, v) for k, env, v in rest if k in causes], labels)
    return mono or "f(" + ", ".join(labels.get(c, c) for c in causes) + ")", causes


def _monomial(v0, env0, moved, labels):
    """``c × Π knob^e`` through the base point and each moved point, if the ratios are
    exact integer powers (|e| ≤ 3); its label, or None."""
    from fractions import Fraction

    c, num, den = Fraction(v0), [], []
    for k, env, v in moved:
        r, q = Fraction(v, v0), Fraction(env[k], env0[k])
        e = next((e for e in (1, -1, 2, -2, 3, -3) if q ** e == r), None)
        if e is None:
            return None
        c /= Fraction(env0[k]) ** e
        term = labels.get(k, k) + ("" if abs(e) == 1 else "²" if abs(e) == 2 else "³")
        (num if e > 0 else den).append(term)
    if c.numerator != 1 or not num:
        num.insert(0, str(c.numerator))
    if c.denominator != 1:
        den.insert(0, str(c.denominator))
    text = " × ".join(num)
    if den:
        text += " / " + (den[0] if len(den) == 1 else "(" + " × ".join(den) + ")")
    return text


def weight_axes(gm: torch.fx.GraphModule, rows_by_node: dict) -> dict:
    """``{node name: [(M, N, K) parameter-axis labels or None, per row]}``: the dimension's
    parameter axis (``fc1.weight[0]``) where a weight carries it (dataflow)."""
    nodes = {n.name: n for n in gm.graph.nodes}
    out = {}
    for name, rows in rows_by_node.items():
        res = []
        for row in rows:
            a, b, kops = _operands(nodes[name], row.op)
            labels = []
            for v, carriers in ((row.m, (a,)), (row.n, (b,)), (row.k, kops)):
                found = None
                for c in carriers:
                    w = _weight_of(c) if c is not None else None
                    if w and v in w[1]:
                        found = f"{w[0]}[{w[1].index(v)}]"
                        break
                labels.append(found)
            res.append(tuple(labels))
        out[name] = res
    return out
