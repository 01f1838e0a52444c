"""Provenance by cause: re-capture the model with one hyperparameter or input size changed.

A GEMM dimension is *set by* a hyperparameter when changing that hyperparameter changes it.
:func:`traced_sources` finds the knobs of a model (``fxshape.analysis.provenance.Knob``): the config
integers that size GEMMs (``vocab_size``, ``hidden_size``, heads, KV heads, ``head_dim``, MLP
width, experts, top-k, the vision and speech input sizes) of a Hugging Face model, and the
input sizes: ``batch_size`` and ``seq_len`` of synthesized inputs, or, for inputs the user
gives, each independent size of them (``torch.export`` with ``Dim.AUTO`` says which input
axes must be equal, and they are varied together). It re-captures the model once per knob,
with that knob alone changed (doubled; halved or one more where the model rejects the double),
at the same reduced depth as the analysis (one layer per group of identical layers), and
compares every GEMM's M, N and K with the original's. The causes of a dimension are the knobs
whose change changed it; its label is the named expression (``batch_size × seq_len``,
``num_key_value_heads × head_dim``) that equals it at *every* point measured, so values that
coincide (a sequence length equal to the head dimension, a hidden size equal to the
vocabulary) cannot be confused (``fxshape.analysis.provenance.name_by_cause``).

A knob that cannot be changed (the model rejects every value tried) is named in the report's
notes, and the labels are not tested against it. A model that its config does not rebuild
(modified after it was built, or not a Hugging Face model) has no hyperparameter knobs: its
dimensions are named by parameter axis (``fc1.weight[0]``) or by the input sizes that set
them. Results are cached per model structure, config and inputs.
"""

from __future__ import annotations

import copy
import inspect

import torch

from ..tracing.dedup import find_stacks, reduced_model
from ..tracing.export import DEFAULT_BATCH_SIZE, is_hf_model, resolve_seq_len
from .provenance import Knob, agrees, catalog, config_knobs, confirmed, environment, name_by_cause

__all__ = ["traced_sources", "row_keys"]

#: (set_by, causes) per row key and the notes, by what the result depends on
_CACHE: dict = {}
_CACHE_SIZE = 128


def row_keys(rows) -> list:
    """A key per row that a re-capture of a changed model reproduces: (module, op, phase,
    occurrence among the rows with those three)."""
    seen: dict = {}
    out = []
    for r in rows:
        base = (r.module, r.op, r.phase)
        seen[base] = seen.get(base, 0) + 1
        out.append(base + (seen[base],))
    return out


def traced_sources(model, rows, fallback, *, observe, example_inputs, example_kwargs,
                   batch_size, seq_len, stacks, tp: int, cache_key):
    """(``[(set_by, causes) per row]``, notes).

    Args:
        model: the user's model. rows: the GEMM rows of the traced (possibly reduced) model.
        fallback: per row, (M, N, K) labels to use where nothing varied changes a dimension
            (the parameter axis a weight carries, or None). ``rows``' own ``set_by`` (matched
            by value) serve where some knob could not be varied.
        observe: ``observe(target, example_inputs, example_kwargs, batch_size, seq_len)``
            -> ``{row key: (M, N, K)}`` of ``target`` traced and annotated like ``rows``
            (keys: :func:`row_keys` of ``rows``).
        stacks: the layer stacks the analysis reduced (``fxshape.tracing.dedup``); changed models
            are reduced the same way.
        cache_key: what the result depends on besides the model (mode, tp, inputs ...).
    """
    structure = _structure(model)
    key = (_model_key(model, structure),) + tuple(cache_key)
    if key not in _CACHE:
        if len(_CACHE) >= _CACHE_SIZE:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = _trace(model, structure, rows, observe, example_inputs, example_kwargs,
                             batch_size, seq_len, stacks, tp)
    by_key, notes, complete, varied = _CACHE[key]
    out = []
    for r, k, fb in zip(rows, row_keys(rows), fallback):
        labels, causes = by_key.get(k, ((None,) * 3, ((),) * 3))
        # nothing varied changes it: the parameter axis that carries it; else, where some
        # knob could not be varied (the notes say which), the label matched by value if it
        # names no knob that was varied without changing it; else a constant of the model
        matched = tuple(m if m and agrees(m, c, varied) else None
                        for m, c in zip(r.set_by, causes)) \
            if len(r.set_by) == 3 and not complete else (None,) * 3
        out.append((tuple(lbl or f or m or "model constant"
                          for lbl, f, m in zip(labels, fb, matched)), causes))
    return out, notes


def _model_key(model, structure):
    cfg = getattr(model, "config", None)
    cfg_text = cfg.to_json_string(use_diff=False) if hasattr(cfg, "to_json_string") else None
    return (type(model).__module__, type(model).__qualname__, cfg_text, structure)


def _structure(model) -> tuple:
    """Every module's name and class and every parameter's name and shape."""
    return (tuple((n, type(m).__qualname__) for n, m in model.named_modules()),
            tuple((n, tuple(p.shape)) for n, p in model.named_parameters()))


def _trace(model, structure, rows, observe, example_inputs, example_kwargs, batch_size,
           seq_len, stacks, tp):
    config = getattr(model, "config", None) if is_hf_model(model) else None
    synthesized = example_inputs is None and example_kwargs is None
    notes, knobs, unvaried = [], [], False
    if config is not None:
        why = _rebuild_differs(model, structure)
        unvaried = bool(why)
        if why:
            notes.append(f"set by: hyperparameters not varied ({why}); dimensions named by "
                         "input size or parameter axis")
            config = None
        else:
            knobs += config_knobs(config)
    inputs = None
    if synthesized and is_hf_model(model):
        knobs += _synthesized_knobs(model, batch_size, seq_len)
    else:
        target = reduced_model(model, stacks, 1) if stacks else model
        inputs = _Inputs(target, example_inputs, example_kwargs, hf=is_hf_model(model))
        knobs += inputs.knobs
        notes += inputs.notes
    env0, labels = environment(config, knobs)
    exprs = catalog(labels, inputs.products if inputs else (), tp=tp)
    base = dict(zip(row_keys(rows), ((r.m, r.n, r.k) for r in rows)))
    measured, failed, failed_labels = [], [], set()
    for knob in knobs:
        found = None
        errors = []
        for value in _trial_values(knob.value):
            stage = "building it"
            try:
                target, ex_in, ex_kw, b, s = _variant(model, knob, value, example_inputs,
                                                      example_kwargs, batch_size, seq_len,
                                                      stacks, inputs)
                stage = "its capture"
                obs = observe(target, ex_in, ex_kw, b, s)
            except Exception as exc:  # noqa: BLE001 - a value this model rejects: say which
                # the raw message stays out of the note: where and what kind, in a word
                errors.append((value, f"{type(exc).__name__} in {stage}"))
                continue
            found = (value, obs)
            break
        if found is None:
            tried = " or ".join(str(v) for v, _ in errors)
            whys = sorted({w for _, w in errors})
            failed.append(f"{knob.label} (the model does not build or trace with it at "
                          f"{tried}: {', '.join(whys)})")
            failed_labels.add(knob.label)
            continue
        value, obs = found
        env, _ = environment(config, knobs, {knob.name: value})
        measured.append((knob.name, env, obs))
    # a label may only use knobs that were varied: what it says was then tested
    exprs = confirmed(exprs, config, knobs, [name for name, _, _ in measured])
    by_key = {}
    for k, dims in base.items():
        labels_k, causes_k = [], []
        for d in range(3):
            points = [(None, env0, dims[d])] + [(name, env, obs[k][d])
                                                 for name, env, obs in measured if k in obs]
            label, causes = name_by_cause(points, labels, exprs)
            labels_k.append(label)
            causes_k.append(tuple(labels.get(c, c) for c in causes))
        by_key[k] = (tuple(labels_k), tuple(causes_k))
    varied = [k.label for k in knobs if k.label not in failed_labels]
    if varied:
        notes.insert(0, "set by: traced by cause, the model re-traced with one of "
                     f"{', '.join(varied)} changed at a time")
    if failed:
        notes.append("set by: could not vary " + "; ".join(failed) +
                     ": labels are not tested against it")
    complete = not (failed or unvaried or (inputs and inputs.fixed))
    return by_key, tuple(notes), complete, tuple(varied)


def _first_line(exc) -> str:
    text = str(exc).strip().splitlines()
    return (text[1].strip() if len(text) > 1 and text[0].startswith("could not capture")
            else text[0] if text else type(exc).__name__)[:120]


def _trial_values(v: int) -> list:
    """The values a knob is changed to, in order, until the model accepts one."""
    out = []
    for x in (2 * v, v // 2 if v % 2 == 0 else 0, v + 1):
        if x > 0 and x != v and x not in out:
            out.append(x)
    return out


def _synthesized_knobs(model, batch_size, seq_len) -> list:
    cfg = model.config
    b = DEFAULT_BATCH_SIZE if batch_size is None else int(batch_size)
    knobs = [Knob("batch_size", "batch_size", b)]
    main = getattr(model, "main_input_name", "input_ids")
    if main != "pixel_values":  # images: the sequence is set by image and patch size
        attrs = ("max_target_positions",) if main == "input_features" else ()
        knobs.append(Knob("seq_len", "seq_len", resolve_seq_len(cfg, seq_len, *attrs)))
    return knobs


def _build(model, config):
    with torch.device("meta"):
        return type(model)(config)


def _rebuild_differs(model, structure) -> str:
    """Why the model's config does not rebuild it ("" if it does: the same ``structure``,
    modules, classes and parameter shapes)."""
    try:
        again = _build(model, copy.deepcopy(model.config))
    except Exception as exc:  # noqa: BLE001
        return f"{type(model).__name__}(config) fails: {_first_line(exc)}"
    if _structure(again) != structure:
        return f"the model differs from what {type(model).__name__}(its config) builds"
    return ""


def _variant(model, knob, value, example_inputs, example_kwargs, batch_size, seq_len, stacks,
             inputs):
    """(target, example_inputs, example_kwargs, batch_size, seq_len) with ``knob`` at
    ``value``, reduced like the analysis."""
    if knob.attr is not None:
        cfg = copy.deepcopy(model.config)
        setattr(cfg, knob.attr, value)
        changed = _one_layer_build(model, cfg, stacks) if stacks else None
        if changed is None:
            changed = _build(model, cfg)
            if stacks:
                mine = [s for s in find_stacks(changed) if len(s.groups) < s.length]
                if [(s.name, s.groups) for s in mine] != [(s.name, s.groups) for s in stacks]:
                    raise ValueError("changes the layer structure")
                changed = reduced_model(changed, stacks, 1)
        return changed, example_inputs, example_kwargs, batch_size, seq_len
    target = reduced_model(model, stacks, 1) if stacks else model
    if knob.name == "batch_size" and inputs is None:
        return target, None, None, value, seq_len
    if knob.name == "seq_len" and inputs is None:
        return target, None, None, batch_size, value
    ex_in, ex_kw = inputs.changed(knob, value)
    return target, ex_in, ex_kw, batch_size, seq_len


def _one_layer_build(model, config, stacks):
    """The changed model built with one layer where the analysis traced one (a single stack
    of identical layers, ``num_hidden_layers`` layers long): the same modules as the reduced
    model, without building the rest. None where that does not hold."""
    (stack,) = stacks if len(stacks) == 1 else (None,)
    if stack is None or len(stack.groups) != 1 or \
            getattr(config, "num_hidden_layers", None) != stack.length:
        return None
    small = copy.deepcopy(config)
    small.num_hidden_layers = 1
    try:
        built = _build(model, small)
    except Exception:  # noqa: BLE001 - a config that ties other fields to the layer count
        return None
    want = reduced_model(model, stacks, 1)
    if [(n, type(m)) for n, m in built.named_modules()] != \
            [(n, type(m)) for n, m in want.named_modules()]:
        return None
    return built


class _Inputs:
    """The sizes of inputs the user gave, as knobs: each independent size (the input axes
    ``torch.export`` with ``Dim.AUTO`` finds equal are one knob; sizes it specializes are
    not varied). Token ids ``[batch, seq]`` of a Hugging Face model are ``batch_size`` and
    ``seq_len``."""

    def __init__(self, model, example_inputs, example_kwargs, *, hf: bool):
        from torch.utils._pytree import tree_flatten

        if isinstance(example_inputs, torch.Tensor):
            example_inputs = (example_inputs,)
        self.args = tuple(example_inputs or ())
        self.kwargs = dict(example_kwargs or {})
        leaves, self.spec = tree_flatten((self.args, self.kwargs))
        self.leaves = leaves
        names = _leaf_names(model, self.args, self.kwargs)
        self.notes = []
        groups = _tied_axes(model, self.args, self.kwargs, leaves)
        if groups is None:  # token ids and their mask: the same axis, the same size
            self.notes.append("set by: export did not say which input sizes are tied: input "
                              "axes of the same position and size varied together")
            by_axis: dict = {}
            for i, t in enumerate(leaves):
                if isinstance(t, torch.Tensor):
                    for ax in range(t.dim()):
                        if t.shape[ax] > 1:
                            by_axis.setdefault((ax, int(t.shape[ax])), []).append((i, ax))
            groups = list(by_axis.values())
        self.knobs, self.products = [], []
        axis_knob = {}
        grouped = {m for g in groups for m in g}
        # sizes export specialized to 0 or 1 (it does so to every such size) are not varied
        self.fixed = [f"{names[i]}.shape[{ax}]" for i, t in enumerate(leaves)
                      if isinstance(t, torch.Tensor) for ax in range(t.dim())
                      if t.shape[ax] <= 1 and (i, ax) not in grouped]
        if self.fixed:
            self.notes.append(f"set by: input sizes of 1 not varied ({', '.join(self.fixed)}): "
                              "export specializes sizes 0 and 1")
        for members in groups:
            i, ax = members[0]
            t = leaves[i]
            if hf and t.dim() == 2 and not t.is_floating_point() and ax in (0, 1):
                label = ("batch_size", "seq_len")[ax]
                name = label
            else:
                label = f"{names[i]}.shape[{ax}]"
                name = "input " + label
            if any(k.name == name for k in self.knobs):
                name, label = "input " + f"{names[i]}.shape[{ax}]", f"{names[i]}.shape[{ax}]"
            self.knobs.append(Knob(name, label, int(t.shape[ax]), axes=tuple(members)))
            for m in members:
                axis_knob[m] = name
        if not hf:  # products of an input's adjacent sizes, named as before
            for i, t in enumerate(leaves):
                if not isinstance(t, torch.Tensor):
                    continue
                for a in range(t.dim()):
                    for b in range(a + 1, t.dim() + 1):
                        axes = [(i, x) for x in range(a, b)]
                        if all(x in axis_knob for x in axes):
                            label = "input " + "×".join(f"{names[i]}.shape[{x}]"
                                                        for x in range(a, b))
                            self.products.append((label, tuple(axis_knob[x] for x in axes)))

    def changed(self, knob, value):
        from torch.utils._pytree import tree_unflatten

        leaves = list(self.leaves)
        for i, ax in knob.axes:
            t = leaves[i]
            shape = list(t.shape)
            shape[ax] = value
            leaves[i] = torch.zeros(shape, dtype=t.dtype, device=t.device)
        args, kwargs = tree_unflatten(leaves, self.spec)
        return args, kwargs


def _leaf_names(model, args, kwargs) -> list:
    """A name per flattened input leaf: the forward argument's name (``x``, ``input_ids``),
    with an index for leaves inside containers."""
    from torch.utils._pytree import keystr, tree_flatten_with_path

    try:
        params = [p.name for p in inspect.signature(model.forward).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    out = []
    for path, _ in tree_flatten_with_path((args, kwargs))[0]:
        top = path[0].idx
        if top == 0:
            i = path[1].idx
            name = params[i] if i < len(params) else f"args[{i}]"
        else:
            name = str(path[1].key)
        out.append(name + keystr(path[2:]))
    return out


def _tied_axes(model, args, kwargs, leaves):
    """Groups of (leaf, axis) that must be equal (one ``Dim.AUTO`` symbol each, in order of
    first appearance), from ``torch.export`` with every input size dynamic; None if that
    export fails or its inputs cannot be matched to the leaves."""
    from torch.export import Dim
    from torch.export.graph_signature import InputKind
    from torch.utils._pytree import tree_map

    from ..tracing.attnops import keep_attention_fused
    from ..tracing.export import quiet_loggers

    def spec(x):
        return {i: Dim.AUTO for i in range(x.dim())} if isinstance(x, torch.Tensor) else None

    try:
        names = list(inspect.signature(model.forward).parameters)
        dyn = {names[i]: tree_map(spec, a) for i, a in enumerate(args)}
        dyn.update({k: tree_map(spec, v) for k, v in kwargs.items()})
        with quiet_loggers("torch._subclasses.fake_tensor", "torch._dynamo", "torch.export",
                           "torch.fx.experimental.symbolic_shapes",
                           "torch._export.non_strict_utils"), keep_attention_fused():
            ep = torch.export.export(model, args, kwargs, dynamic_shapes=dyn, strict=False)
    except Exception:  # noqa: BLE001 - the caller varies each axis alone instead
        return None
    placeholders = [n for n in ep.graph.nodes if n.op == "placeholder"]
    user = [n for n, s in zip(placeholders, ep.graph_signature.input_specs)
            if s.kind == InputKind.USER_INPUT]
    tensors = [i for i, t in enumerate(leaves) if isinstance(t, torch.Tensor)]
    vals = [n.meta.get("val") for n in user]
    vals = [v for v in vals if isinstance(v, torch.Tensor)]
    if len(vals) != len(tensors):
        return None
    groups: dict = {}
    for i, v in zip(tensors, vals):
        if v.dim() != leaves[i].dim():
            return None
        for ax, d in enumerate(v.shape):
            if isinstance(d, torch.SymInt) and d.node.expr.is_Symbol:
                groups.setdefault(str(d.node.expr), []).append((i, ax))
            elif int(d) != leaves[i].shape[ax]:
                return None
    return list(groups.values())
