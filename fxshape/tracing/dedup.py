"""Trace each distinct layer once: find the layer stacks, capture a reduced model, expand.

A transformer repeats the same block 12, 32 or 80 times, and tracing every copy is most of
what ``analyze`` costs. :func:`find_stacks` finds the stacks (an ``nn.ModuleList`` or
``nn.Sequential`` of two or more modules of one class) and groups their layers by what
decides their GEMMs: the class of every submodule, every parameter's and buffer's name,
shape and dtype, and every plain attribute of every submodule (a sliding-window size, an
attention type, an MoE flag), the layer's own index excepted. :func:`reduced_model` returns a
shallow copy of the model (the user's model is not touched) whose stacks hold one
representative per group, in order of first appearance; the reduced model is captured and
analyzed like any other, and :func:`expand_rows` gives every layer of a group its
representative's rows, renamed to the layer's own module path, in layer order (reversed
where the representatives ran in reverse: the backward pass).

Exactness rests on the layers of a group doing the same GEMMs on the same shapes. It is
checked against the full trace over the test zoo (``tests/test_dedup.py``); a model whose
reduced copy does not capture is traced fully, and the report says why
(``analyze(..., dedup=False)`` always traces everything).
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass

import torch

__all__ = ["Stack", "find_stacks", "reduced_model", "expand_rows", "check_reduction",
           "structure_key"]

# attributes that hold a layer's own position: the one thing layers of a group may differ in
_INDEX_ATTRS = frozenset({"layer_idx", "layer_id", "layer_index", "layer_number"})
_PLAIN = (bool, int, float, str, type(None))


@dataclass(frozen=True)
class Stack:
    """A stack of layers. ``groups``: the original indices of each group of identical
    layers, in order of first appearance; the first index of a group is its
    representative."""

    name: str
    length: int
    groups: tuple

    @property
    def representatives(self) -> tuple:
        return tuple(g[0] for g in self.groups)

    def picks(self, copies: int = 1) -> tuple:
        """The layers a reduced stack keeps: the first ``copies`` of each group, in layer
        order."""
        return tuple(sorted(i for g in self.groups for i in g[:copies]))

    def group_of(self, index: int) -> int:
        return next(k for k, g in enumerate(self.groups) if index in g)


def _signature(layer: torch.nn.Module):
    sig = []
    for name, mod in layer.named_modules():
        attrs = []
        for k, v in sorted(vars(mod).items()):
            if k.startswith("_") or k in _INDEX_ATTRS or k == "training":
                continue
            if isinstance(v, _PLAIN) or (isinstance(v, tuple) and
                                         all(isinstance(x, _PLAIN) for x in v)):
                attrs.append((k, v))
        sig.append((name, type(mod).__qualname__, tuple(attrs)))
    sig.extend((n, tuple(p.shape), str(p.dtype), "param")
               for n, p in layer.named_parameters(recurse=True))
    sig.extend((n, tuple(b.shape), str(b.dtype), "buffer")
               for n, b in layer.named_buffers(recurse=True))
    return tuple(sig)


def structure_key(model: torch.nn.Module, stacks, *context) -> tuple:
    """What the two-layer check's verdict depends on: the model's class and the code its
    layers run (each stack's length, its groups, the class of every submodule of each group's
    representative), and ``context`` (mode, inputs' shapes). Sizes are left out: a candidate
    that differs in widths, head counts or vocabulary (advise, sweep) walks its layers the
    same way."""
    layers = []
    for s in stacks:
        stack = model.get_submodule(s.name)
        classes = tuple(tuple(type(m).__qualname__ for m in stack[i].modules())
                        for i in s.representatives)
        layers.append((s.name, s.groups, classes))
    return (type(model).__module__, type(model).__qualname__, tuple(layers)) + context


def find_stacks(model: torch.nn.Module) -> list:
    """The layer stacks of ``model`` (outermost only), with their groups of identical
    layers."""
    stacks = []
    for name, mod in model.named_modules():
        if not name or not isinstance(mod, (torch.nn.ModuleList, torch.nn.Sequential)):
            continue
        if any(name.startswith(s.name + ".") for s in stacks):
            continue  # inside a layer of an outer stack
        children = list(mod)
        if len(children) < 2 or len({type(c) for c in children}) != 1:
            continue
        groups: dict = {}
        for i, child in enumerate(children):
            groups.setdefault(_signature(child), []).append(i)
        stacks.append(Stack(name, len(children), tuple(tuple(g) for g in groups.values())))
    return stacks


def reduced_model(model: torch.nn.Module, stacks, copies: int = 1) -> torch.nn.Module:
    """A shallow copy of ``model`` whose stacks hold the first ``copies`` layers of each
    group (:meth:`Stack.picks`). Modules on the way to a stack are copied (with their own
    ``_modules`` dict); everything else, parameters included, is shared with ``model``,
    which is not changed."""
    root = copy.copy(model)
    root._modules = dict(model._modules)
    for s in stacks:
        parent, parts = root, s.name.split(".")
        for part in parts[:-1]:
            child = copy.copy(parent._modules[part])
            child._modules = dict(child._modules)
            parent._modules[part] = child
            parent = child
        old = parent._modules[parts[-1]]
        layers = [old[i] for i in s.picks(copies)]
        new = type(old)(layers) if isinstance(old, torch.nn.Sequential) \
            else torch.nn.ModuleList(layers)
        parent._modules[parts[-1]] = new
    return root


def _locate(module: str, stacks):
    """(stack, index in the reduced stack, rest of the path) of a module path, or None."""
    for s in stacks:
        m = re.match(re.escape(s.name) + r"\.(\d+)(\..*)?$", module)
        if m:
            return s, int(m.group(1)), m.group(2) or ""
    return None


def expand_rows(rows, stacks) -> list:
    """Every layer of every stack with its group representative's rows, renamed to its own
    path (``model.layers.7.mlp.down_proj``) and node (``linear_3@7``). A row is any frozen
    dataclass with ``module``, ``node`` and ``phase`` (GEMM rows, the step's op records)."""
    out, i = [], 0
    while i < len(rows):
        loc = _locate(rows[i].module, stacks)
        if loc is None:
            out.append(rows[i])
            i += 1
            continue
        stack = loc[0]
        # a run of consecutive rows in one stack: the representatives' rows, in the order
        # the representatives ran (ascending forward, descending backward)
        by_rep: dict = {}
        order = []
        while i < len(rows):
            loc = _locate(rows[i].module, stacks)
            if loc is None or loc[0] is not stack:
                break
            if loc[1] not in by_rep:
                order.append(loc[1])
            by_rep.setdefault(loc[1], []).append((rows[i], loc[2]))
            i += 1
        run = [row for r in order for row, _ in by_rep[r]]
        descending = order[0] > order[-1] if len(order) > 1 else \
            all(row.phase == "backward" for row in run)
        picks = stack.picks(1)
        members = {r: stack.groups[stack.group_of(picks[r])] for r in order}
        layers = sorted((idx, r) for r in order for idx in members[r])
        if descending:
            layers.reverse()
        for idx, r in layers:
            here, there = f"{stack.name}.{r}.", f"{stack.name}.{idx}."
            for row, rest in by_rep[r]:
                # parameter names in the provenance labels follow the layer too
                extra = {}
                if hasattr(row, "set_by"):
                    extra["set_by"] = tuple(lbl.replace(here, there) for lbl in row.set_by)
                out.append(renamed(row, module=f"{stack.name}.{idx}{rest}",
                                   node=f"{row.node}@{idx}", **extra))
    return out


def renamed(row, **changes):
    """A copy of the frozen dataclass ``row`` with ``changes`` (its own fields): what
    ``dataclasses.replace`` gives, without re-running ``__init__`` (a 70B model's step
    copies tens of thousands of records per plan)."""
    new = object.__new__(type(row))
    new.__dict__.update(row.__dict__)
    for k in changes:
        if k not in row.__dict__:
            raise TypeError(f"{type(row).__name__} has no field {k!r}")
    new.__dict__.update(changes)
    return new


def _normalized(rows, stacks, copies: int):
    """Rows of a reduced trace keyed by what they say, with stack layers named by their
    group: ``{("outside",): [...], (stack, group, layer): [...]}``."""
    out: dict = {}
    for r in rows:
        loc = _locate(r.module, stacks)
        if loc is None:
            where = ("outside",)
            rest, set_by = r.module, r.set_by
        else:
            stack, j, rest = loc
            layer = stack.picks(copies)[j]
            where = (stack.name, stack.group_of(layer), layer)
            prefix = f"{stack.name}.{j}."
            set_by = tuple(lbl.replace(prefix, f"{stack.name}.#.") for lbl in r.set_by)
        key = (rest, r.op, r.phase, r.batch, r.m, r.n, r.k, r.layout, r.work, r.flops,
               r.time_s, r.kernel, set_by, r.note)
        out.setdefault(where, []).append(key)
    return {k: sorted(v) for k, v in out.items()}


def check_reduction(rows_one, rows_two, stacks) -> str:
    """Why one layer per group does not stand for the others ("" if it does): compares the
    trace with one layer per group (``rows_one``) with the trace with two (``rows_two``).
    Work outside the stacks must not change, and each group's second layer must do exactly
    what its first does."""
    one, two = _normalized(rows_one, stacks, 1), _normalized(rows_two, stacks, 2)
    if one.get(("outside",)) != two.get(("outside",)):
        return "the GEMMs outside the layer stacks change with the number of layers"
    for where, keys in two.items():
        if where == ("outside",):
            continue
        stack_name, group, _ = where
        first = next(v for w, v in one.items() if w[:2] == (stack_name, group))
        if keys != first:
            return f"layers of one group in {stack_name} do different GEMMs"
    return ""
