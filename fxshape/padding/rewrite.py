"""Apply a padding plan: ``fxshape.pad(model)`` returns a copy whose padded GEMMs run aligned.

It rewrites ``nn.Linear`` layers (the LM head's vocabulary, odd MLP widths) and GPT-2-style
``Conv1D`` layers (a linear layer that stores its weight as ``[in, out]``): the layer's weight
(and bias) are padded with zeros once, when the copy is made; each call pads
the activation's K (and M) with zeros when the plan says so, runs the aligned GEMM and slices
the result back. Outputs are unchanged because the padding contributes zeros to every sum and
the padded output columns are sliced away; gradients of padded entries are zero, so SGD and
AdamW (with weight decay) keep them at zero. Tied parameters stay tied: every module sharing a
padded weight gets the padded tensor (an embedding only ever indexes its real rows), and a bias
that a parent module also holds (BERT's ``cls.predictions.bias``) is replaced there too.
``state_dict()`` shows the original keys and shapes, and ``load_state_dict`` accepts them.

GEMMs the plan pads elsewhere (activation-by-activation ``bmm``/``matmul``, routers, experts)
are left as they are, and ``padding_report`` on the returned module says so; the
``torch.compile`` backend (``fxshape.padding.compile``) pads those.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from ..analysis.annotate import module_of
from ..report.build import analyze
from ..analysis.ops import gemm_handler
from ..tracing.export import VIEW_OPS, node_op_name
from .plan import DEFAULT_MIN_GAIN, DEFAULT_MULTIPLES, plan_padding

__all__ = ["pad", "PaddedLinear", "PaddedConv1D"]


class PaddedLinear(nn.Module):
    """``nn.Linear`` computed at padded sizes; parameters stored padded, exposed unpadded."""

    #: the weight is stored ``[out, in]`` (``nn.Linear``); ``[in, out]`` when True (Conv1D)
    transposed = False

    def __init__(self, layer: nn.Module, pad_n: int, pad_k: int, pad_m: int | None = None):
        super().__init__()
        self.in_features, self.out_features = _in_out(layer)
        self.pad_n, self.pad_k, self.pad_m = pad_n, pad_k, pad_m
        self.weight = _padded_param(layer.weight, *self.weight_shape(pad_n, pad_k))
        self.bias = None if layer.bias is None else _padded_param(layer.bias, pad_n)
        _keep_state_unpadded(self, "weight", self.weight_shape(self.out_features,
                                                               self.in_features))
        if self.bias is not None:
            _keep_state_unpadded(self, "bias", (self.out_features,))

    def weight_shape(self, n: int, k: int) -> tuple[int, int]:
        return (k, n) if self.transposed else (n, k)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, runs as "
                f"K={self.pad_k}, N={self.pad_n}" + (f", M={self.pad_m}" if self.pad_m else ""))

    def _gemm(self, x):
        return F.linear(x, self.weight, self.bias)

    def forward(self, x):
        k_extra = self.pad_k - self.in_features
        lead = x.shape[:-1]
        if self.pad_m is not None or self.transposed:
            x = x.reshape(-1, x.shape[-1])
        if self.pad_m is not None:
            m = x.shape[0]
            x = F.pad(x, (0, k_extra, 0, max(0, self.pad_m - m)))
        elif k_extra:
            x = F.pad(x, (0, k_extra))
        y = self._gemm(x)
        if self.pad_m is not None:
            y = y[:m]
        y = y[..., :self.out_features]
        if self.pad_m is not None or self.transposed:
            y = y.reshape(*lead, self.out_features)
        return y.contiguous() if self.pad_n != self.out_features else y


class PaddedConv1D(PaddedLinear):
    """GPT-2's ``Conv1D`` (``y = x @ W + b`` with ``W[in, out]``) computed at padded sizes."""

    transposed = True

    def _gemm(self, x):
        if self.bias is None:
            return x @ self.weight
        return torch.addmm(self.bias, x, self.weight)


def _in_out(layer: nn.Module) -> tuple[int, int]:
    if isinstance(layer, nn.Linear):
        return layer.in_features, layer.out_features
    return layer.weight.shape[0], layer.weight.shape[1]  # Conv1D: weight [in, out]


def _is_conv1d(mod: nn.Module) -> bool:
    """Hugging Face's Conv1D (GPT-2, GPT, ...), recognised without importing transformers."""
    w = getattr(mod, "weight", None)
    return (type(mod).__name__ == "Conv1D" and isinstance(w, torch.Tensor) and w.dim() == 2
            and getattr(mod, "nf", None) == w.shape[1] and getattr(mod, "nx", None) == w.shape[0])


def _padded_param(p: torch.Tensor, rows: int, cols: int | None = None) -> nn.Parameter:
    """A new parameter: ``p`` with zero rows (and columns) appended."""
    with torch.no_grad():
        if p.dim() == 1:
            out = torch.zeros(rows, dtype=p.dtype, device=p.device)
            out[:p.shape[0]] = p
        else:
            out = torch.zeros(rows, cols, dtype=p.dtype, device=p.device)
            out[:p.shape[0], :p.shape[1]] = p
    return nn.Parameter(out, requires_grad=p.requires_grad)


class _UnpaddedState:
    """state_dict hooks for a padded parameter: saved at its original shape, loaded from it
    (zero-padded back to the stored shape)."""

    def __init__(self, leaf: str, shape: tuple):
        self.leaf, self.shape = leaf, tuple(shape)

    def unpad(self, module, state, prefix, local_metadata):
        key = prefix + self.leaf
        if key in state:
            state[key] = state[key][tuple(slice(0, s) for s in self.shape)]
        return state

    def pad(self, module, state, prefix, *args, **kwargs):
        key = prefix + self.leaf
        if key in state and tuple(state[key].shape) == self.shape:
            state[key] = _padded_param(state[key], *getattr(module, self.leaf).shape).data


def _keep_state_unpadded(module: nn.Module, leaf: str, shape: tuple) -> None:
    """``module.<leaf>`` is stored padded; its state_dict entry keeps the original ``shape``."""
    hooks = _UnpaddedState(leaf, shape)
    module._register_state_dict_hook(hooks.unpad)
    module._register_load_state_dict_pre_hook(hooks.pad, with_module=True)


def _set_submodule(root: nn.Module, fqn: str, new: nn.Module) -> None:
    parent_name, _, leaf = fqn.rpartition(".")
    parent = root.get_submodule(parent_name) if parent_name else root
    setattr(parent, leaf, new)


def _tie_actions(root, d, old, padded, params_by_id):
    """How to keep the old layer's parameters tied after padding: a list of (owner module,
    attribute, padded parameter, original shape), or a reason it cannot be done.

    An ``nn.Embedding`` sharing the weight gets the padded weight when only its rows (the
    vocabulary) grow: it indexes real rows only. A parent of the layer that holds the same
    parameter (the ``self.decoder.bias = self.bias`` pattern) gets the padded one. Anything
    else sharing a parameter with the layer keeps the layer unpadded.
    """
    actions = []
    for leaf in ("weight", "bias"):
        p = getattr(old, leaf, None)
        if p is None:
            continue
        for name in params_by_id.get(id(p), []):
            owner_name, _, attr = name.rpartition(".")
            if owner_name == d.module:
                continue
            owner = root.get_submodule(owner_name)
            rows_only = padded.weight.shape[1] == p.shape[1] if p.dim() == 2 else True
            if leaf == "weight" and isinstance(owner, nn.Embedding) and rows_only \
                    and not padded.transposed:
                actions.append((owner, attr, padded.weight, tuple(p.shape)))
            elif owner_name == "" or d.module.startswith(owner_name + "."):
                actions.append((owner, attr, getattr(padded, leaf), tuple(p.shape)))
            else:
                return [], f"{leaf} tied to {type(owner).__name__} {owner_name}"
    return actions, ""


def _parameter_uses(gm: torch.fx.GraphModule, model: nn.Module) -> dict:
    """``{id(parameter): [node, ...]}``: the nodes of a captured graph that consume each
    parameter of ``model``, through view-like ops (``t``, ``view``, ...)."""
    uses = {}
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            name = node.target
        elif node.op == "placeholder" and "fxshape_param" in node.meta:  # joint graphs
            name = node.meta["fxshape_param"]
        else:
            continue
        try:
            param = model.get_parameter(name)
        except AttributeError:
            continue  # a buffer or constant
        found, stack, seen = [], list(node.users), set()
        while stack:
            n = stack.pop()
            if n.name in seen:
                continue
            seen.add(n.name)
            if n.op == "call_function" and node_op_name(n) in VIEW_OPS:
                stack.extend(n.users)
            elif n.op != "output":
                found.append(n)
        uses.setdefault(id(param), []).extend(found)
    return uses


def _used_elsewhere(uses: dict, layer: nn.Module, fqn: str) -> str:
    """Why ``layer`` (at ``fqn``) cannot be padded because one of its parameters is used
    outside its own GEMMs (empty if it is not): a padded weight would change that use. An
    embedding lookup of a tied weight is not such a use (it reads real rows only)."""
    for leaf in ("weight", "bias"):
        p = getattr(layer, leaf, None)
        if p is None:
            continue
        for n in uses.get(id(p), []):
            own = (n.op == "call_function" and gemm_handler(n.target) is not None
                   and module_of(n)[0] == fqn)
            lookup = (leaf == "weight" and node_op_name(n) == "embedding" and n.args
                      and getattr(n.args[0], "op", None) in ("get_attr", "placeholder"))
            if not (own or lookup):
                where = module_of(n)[0] or "(top)"
                return (f"its {leaf} is also used outside its own GEMM (by {n.target} in "
                        f"{where}), which a padded {leaf} would break")
    return ""


def pad(model: nn.Module, example_inputs=None, example_kwargs=None, *, gpu="h100",
        dtype=None, min_gain: float = DEFAULT_MIN_GAIN, multiples=DEFAULT_MULTIPLES,
        filter_fn=None, params=None, **analyze_kwargs) -> nn.Module:
    """A copy of ``model`` whose planned-for linear layers (``nn.Linear``, ``Conv1D``) run
    at padded sizes.

    The model itself is not changed. The plan (``fxshape.plan_padding``) decides from the
    performance model for ``gpu`` and ``dtype`` (the dtype the GEMMs run in; default: that of
    ``fxshape.analyze``, bf16); only GEMMs with a predicted net gain of at least ``min_gain``
    are padded. The returned module carries the plan as ``padding_plan`` and a
    one-line-per-GEMM ``padding_report``.

    Args:
        model: the module to pad (real weights or meta).
        example_inputs, example_kwargs, **analyze_kwargs: as for ``fxshape.analyze``.
        filter_fn: ``filter_fn(module, fqn) -> bool`` restricts which layers are padded.
        params: a parameter file to plan with (e.g. from ``fxshape calibrate``).
    """
    def row_filter(row):
        if filter_fn is None:
            return True
        try:
            mod = model.get_submodule(row.module)
        except AttributeError:
            return False
        return bool(filter_fn(mod, row.module))

    if "dedup" in analyze_kwargs:
        raise ValueError("pad traces every layer (it reads each layer's parameter uses off "
                         "the captured graph): dedup is not accepted")
    kw = dict(analyze_kwargs, dedup=False)
    kw.setdefault("provenance", None)  # the plan does not say what sets a dimension
    if dtype is not None:
        kw["dtype"] = dtype
    report = analyze(model, example_inputs, example_kwargs, gpu=gpu, params=params, **kw)
    plan = plan_padding(report, min_gain=min_gain, multiples=multiples, filter_fn=row_filter,
                        params=params)
    uses = _parameter_uses(report.graph_module, model)
    new = copy.deepcopy(model)
    applied, skipped = {}, {}  # decision -> padded module / why not
    first = {}  # module -> the decision it was padded for
    params_by_id = {}
    for name, p in new.named_parameters(remove_duplicate=False):
        params_by_id.setdefault(id(p), []).append(name)
    for d in plan.padded:
        if d.phase != "forward":
            continue  # autograd runs a padded layer's backward GEMMs padded too
        try:
            mod = new.get_submodule(d.module)
        except AttributeError:
            skipped[d] = "no such module"
            continue
        if isinstance(mod, (PaddedLinear, PaddedConv1D)):
            continue  # a layer called twice: padded once, for its first GEMM
        if isinstance(mod, nn.Linear):
            cls = PaddedLinear
        elif _is_conv1d(mod):
            cls = PaddedConv1D
        else:
            skipped[d] = (f"{type(mod).__name__} layers are not rewritten (the "
                          "torch.compile backend pads any mm/addmm/bmm)")
            continue
        why = _used_elsewhere(uses, model.get_submodule(d.module), d.module)
        if why:
            skipped[d] = why
            continue
        pad_m = d.pad_m if d.pad_m != d.m else None
        padded = cls(mod, d.pad_n, d.pad_k, pad_m)
        ties, why = _tie_actions(new, d, mod, padded, params_by_id)
        if why:
            skipped[d] = why
            continue
        _set_submodule(new, d.module, padded)
        for owner, leaf, param, shape in ties:
            setattr(owner, leaf, param)
            _keep_state_unpadded(owner, leaf, shape)
        applied[d] = padded
        first[d.module] = d
    new.padding_plan = plan
    new.padding_report = _report(plan, applied, skipped, first)
    return new


def _report(plan, applied, skipped, first) -> str:
    """One line per GEMM of the plan, in graph order: what was done to it and why."""
    lines = []
    for d in plan.decisions:
        shape = f"{d.module or '(top)'}: {d.op} [{d.phase}] M={d.m} N={d.n} K={d.k}"
        lead = first.get(d.module)
        if not d.pads:
            if lead is not None:  # planned unpadded, but its layer now runs padded
                lines.append(f"{shape}: runs as N={lead.pad_n} K={lead.pad_k}: its layer is "
                             f"padded for another GEMM (not padded by the plan: {d.reason})")
            else:
                lines.append(f"{shape}: not padded: {d.reason}")
        elif d in applied:
            lines.append(f"{shape} runs as M={d.pad_m} N={d.pad_n} K={d.pad_k} "
                         f"(predicted {100 * d.gain:.1f}% faster)")
        elif d in skipped:
            lines.append(f"{shape}: planned padding not applied: {skipped[d]}")
        elif lead is not None and d.phase != "forward":
            lines.append(f"{shape}: runs padded through its layer (autograd runs the backward "
                         f"on the padded weight; planned M={d.pad_m} N={d.pad_n} K={d.pad_k}, "
                         f"predicted {100 * d.gain:.1f}% faster)")
        elif lead is not None:
            lines.append(f"{shape}: runs as N={lead.pad_n} K={lead.pad_k}: the layer is called "
                         f"again and was padded for its first call (planned M={d.pad_m} "
                         f"N={d.pad_n} K={d.pad_k})")
        else:
            why = ("its layer's forward GEMM is not padded" if d.phase != "forward"
                   else "no layer to rewrite")
            lines.append(f"{shape}: planned padding not applied: {why}")
    return "\n".join(lines) if lines else "no GEMMs"
