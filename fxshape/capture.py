"""Capture a model as an aten-level FX graph with a shape on every node, without running it.

``capture(model)`` uses ``torch.export`` (non-strict, then strict) and falls back to
``make_fx`` on fake tensors (aten-level, but without module names). Inputs are
made on the meta device when the model's parameters are there, so a model built under
``torch.device("meta")`` never allocates weights; a model with real weights is traced with
fake tensors by export itself, so no compute runs and no memory is added.
"""

from __future__ import annotations

import contextlib
import inspect
import traceback

import torch

__all__ = ["CaptureError", "capture", "example_inputs_for", "DEFAULT_SEQ_LEN",
           "DEFAULT_BATCH_SIZE"]

DEFAULT_BATCH_SIZE = 1
#: Tokens per sequence when none is given: 1024, or the model's max_position_embeddings if
#: that is smaller (BERT: 512).
DEFAULT_SEQ_LEN = 1024


class CaptureError(RuntimeError):
    """Every capture path failed; the message names each one and its first error lines."""


def _first_lines(exc: BaseException, n: int = 3) -> str:
    text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return " | ".join(lines[:n])[:400]


def _model_device(model: torch.nn.Module) -> torch.device:
    for p in model.parameters():
        return p.device
    for b in model.buffers():
        return b.device
    return torch.device("cpu")


def _is_hf(model) -> bool:
    return hasattr(model, "config") and hasattr(model.config, "to_dict") and \
        type(model).__module__.startswith("transformers")


def _accepts(model, name: str) -> bool:
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def example_inputs_for(model, *, batch_size=None, seq_len=None, device=None) -> dict:
    """Synthesize forward kwargs for a Hugging Face model (documented defaults).

    - text models: ``input_ids`` of ``batch_size x seq_len`` (defaults 1 x 1024, capped at
      ``max_position_embeddings``); encoder-decoders also get ``decoder_input_ids``;
    - vision models (``main_input_name == "pixel_values"``): ``pixel_values`` of
      ``batch_size x num_channels x image_size x image_size`` from the config;
    - ``use_cache=False`` when the forward takes it.

    Raises:
        ValueError: not a Hugging Face model, or ``seq_len`` beyond ``max_position_embeddings``.
    """
    if not _is_hf(model):
        raise ValueError(
            f"{type(model).__name__} is not a Hugging Face model: pass example_inputs "
            "(a tuple of tensors) or example_kwargs to say what its forward takes")
    cfg = model.config
    device = device or _model_device(model)
    b = DEFAULT_BATCH_SIZE if batch_size is None else int(batch_size)
    if b <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    kwargs = {}
    main = getattr(model, "main_input_name", "input_ids")
    if main == "pixel_values":
        size = getattr(cfg, "image_size", 224)
        size = size if isinstance(size, int) else size[0]
        ch = getattr(cfg, "num_channels", 3)
        kwargs["pixel_values"] = torch.zeros(b, ch, size, size, device=device)
    else:
        max_pos = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions",
                                                                            None)
        s = seq_len if seq_len is not None else (
            min(DEFAULT_SEQ_LEN, max_pos) if max_pos else DEFAULT_SEQ_LEN)
        s = int(s)
        if s <= 0:
            raise ValueError(f"seq_len must be positive, got {seq_len}")
        if max_pos and s > max_pos:
            raise ValueError(f"seq_len {s} exceeds the model's max_position_embeddings "
                             f"({max_pos})")
        ids = torch.zeros(b, s, dtype=torch.long, device=device)
        kwargs["input_ids"] = ids
        if getattr(cfg, "is_encoder_decoder", False):
            kwargs["decoder_input_ids"] = torch.zeros(b, s, dtype=torch.long, device=device)
    if _accepts(model, "use_cache") and getattr(cfg, "use_cache", None) is not None:
        kwargs["use_cache"] = False
    return kwargs


def _to_device(obj, device):
    if isinstance(obj, torch.Tensor):
        return obj.to(device) if obj.device != device else obj
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_device(o, device) for o in obj)
    if isinstance(obj, dict):
        return {k: _to_device(v, device) for k, v in obj.items()}
    return obj


@contextlib.contextmanager
def _preserve_training_flags(model: torch.nn.Module, train: bool):
    flags = [(m, m.training) for m in model.modules()]
    model.train(train)
    try:
        yield
    finally:
        for m, t in flags:
            m.training = t


def capture(model, example_inputs=None, example_kwargs=None, *, batch_size=None,
            seq_len=None, train: bool = False) -> torch.fx.GraphModule:
    """Capture ``model`` as an aten-level ``torch.fx.GraphModule``.

    Every node carries ``node.meta["val"]`` (a fake/meta tensor with its shape) and, where
    torch.export provides it, ``node.meta["nn_module_stack"]`` (the owning modules).

    Args:
        model: an ``nn.Module``. Parameters may be real or on the meta device; nothing is
            allocated for them and the model is not changed.
        example_inputs: positional forward arguments (a tuple, or one tensor).
        example_kwargs: keyword forward arguments.
        batch_size, seq_len: for synthesized inputs (Hugging Face models only).
        train: capture the joint forward + backward graph that autograd runs for a scalar
            loss on the model's first output (training mode). Every GEMM node then carries
            ``node.meta["fxshape_phase"]`` ("forward" or "backward") and
            ``node.meta["fxshape_module"]`` (the module it belongs to, from the parameters it
            reads or whose gradient it produces, else from its nearest such neighbour).

    Raises:
        CaptureError: no capture path worked; the message lists each with its error.
        ValueError: no example inputs for a model that is not a Hugging Face model.
    """
    if not isinstance(model, torch.nn.Module):
        raise ValueError(f"expected a torch.nn.Module, got {type(model).__name__}")
    from .ops import register_transformers_ops

    register_transformers_ops()
    device = _model_device(model)
    if example_inputs is None and example_kwargs is None:
        example_kwargs = example_inputs_for(model, batch_size=batch_size, seq_len=seq_len,
                                            device=device)
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    args = tuple(example_inputs or ())
    kwargs = dict(example_kwargs or {})
    if device.type == "meta":  # keep everything on meta: no real memory anywhere
        args, kwargs = _to_device(args, device), _to_device(kwargs, device)

    errors = []
    if train:
        with _preserve_training_flags(model, True):
            try:
                return _joint(model, args, kwargs)
            except Exception as exc:  # noqa: BLE001 - reported below
                errors.append(("torch.export + joint forward/backward (aot_autograd)", exc))
        raise CaptureError(_failure_text(model, errors))
    with _preserve_training_flags(model, train):
        for name, fn in (("torch.export (non-strict)", lambda: _export(model, args, kwargs,
                                                                        strict=False)),
                         ("torch.export (strict)", lambda: _export(model, args, kwargs,
                                                                    strict=True)),
                         ("make_fx (fake tensors)", lambda: _make_fx(model, args, kwargs))):
            try:
                return fn()
            except Exception as exc:  # noqa: BLE001 - every failure is reported below
                errors.append((name, exc))
    raise CaptureError(_failure_text(model, errors))


def _failure_text(model, errors) -> str:
    lines = [f"could not capture {type(model).__name__}:"]
    lines += [f"  - {name}: {_first_lines(exc)}" for name, exc in errors]
    lines.append("  hint: pass example_inputs/example_kwargs matching forward(); build the "
                 "model under torch.device('meta'); for Hugging Face models, check that "
                 "seq_len fits max_position_embeddings.")
    return "\n".join(lines)


def _export(model, args, kwargs, *, strict):
    ep = torch.export.export(model, args, kwargs, strict=strict)
    return ep.module()


def _make_fx(model, args, kwargs):
    from torch.fx.experimental.proxy_tensor import make_fx

    def run(*a):
        return model(*a, **kwargs)

    # aten-level tracing on fake tensors: no compute; no nn_module_stack on this path
    return make_fx(run, tracing_mode="fake")(*args)


# ---------------------------------------------------------------------------------------
# training: the joint forward + backward graph
# ---------------------------------------------------------------------------------------

_VIEW_OPS = {"permute", "t", "transpose", "view", "reshape", "_unsafe_view", "expand", "clone",
             "detach", "alias", "contiguous", "_to_copy", "squeeze", "unsqueeze", "slice",
             "select", "to", "type_as", "_reshape_alias", "as_strided"}


class _ScalarLoss(torch.nn.Module):
    """The model with a scalar loss on its first floating output (the GEMMs autograd runs
    do not depend on which loss: the gradient reaches every op the same way)."""

    def __init__(self, model, static_kwargs):
        super().__init__()
        self.m = model
        self.static = static_kwargs

    def forward(self, *args, **kwargs):
        out = self.m(*args, **kwargs, **self.static)
        return (_first_float(out).float().sum(),)


def _first_float(out):
    if isinstance(out, torch.Tensor):
        return out
    values = out.values() if isinstance(out, dict) else out
    for v in values:
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            return v
        if isinstance(v, (tuple, list, dict)):
            try:
                return _first_float(v)
            except ValueError:
                continue
    raise ValueError("the model returned no floating-point tensor to put a loss on")


def _op_name(node) -> str:
    return getattr(node.target, "__name__", str(node.target)).split(".")[0]


def _joint(model, args, kwargs):
    import torch.export.experimental as export_experimental
    from torch.export.graph_signature import InputKind

    tensors = {k: v for k, v in kwargs.items() if isinstance(v, torch.Tensor)}
    static = {k: v for k, v in kwargs.items() if not isinstance(v, torch.Tensor)}
    wrapper = _ScalarLoss(model, static)
    ep = torch.export.export(wrapper, args, tensors, strict=False)
    sig = ep.graph_signature
    ph = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    # Tied weights (GPT-2's wte/lm_head) leave one parameter placeholder unused, which the
    # joint tracer rejects: drop it from this private copy of the program.
    for spec in list(sig.input_specs):
        if spec.kind == InputKind.PARAMETER and not ph[spec.arg.name].users:
            ep.graph.erase_node(ph[spec.arg.name])
            sig.input_specs.remove(spec)
            ep.state_dict.pop(spec.target, None)
    ep.graph_module.recompile()
    jep = export_experimental._export_forward_backward(ep, joint_loss_index=0)
    gm = jep.graph_module
    _label_joint(gm, jep.graph_signature)
    return gm


def _strip(fqn: str) -> str:
    return fqn[2:] if fqn.startswith("m.") else fqn


def _label_joint(gm, sig) -> None:
    from .ops import gemm_handler

    params = {name: _strip(fqn) for name, fqn in sig.inputs_to_parameters.items()}
    bw = sig.backward_signature
    grads = {name: _strip(fqn) for name, fqn in (bw.gradients_to_parameters if bw else {}).items()}
    nodes = {n.name: n for n in gm.graph.nodes}
    for name, fqn in params.items():  # which parameter each placeholder is (provenance)
        if name in nodes:
            nodes[name].meta["fxshape_param"] = fqn
    # forward = everything the loss depends on
    forward = set()
    stack = [nodes[bw.loss_output]] if bw and bw.loss_output in nodes else []
    while stack:
        n = stack.pop()
        if n.name in forward:
            continue
        forward.add(n.name)
        stack.extend(n.all_input_nodes)
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    grad_of = {}
    for arg in out_node.args[0]:
        if isinstance(arg, torch.fx.Node) and arg.name in grads:
            grad_of[arg.name] = grads[arg.name]

    def first_hit(starts, step, hit):
        """Walk from ``starts`` through view-like ops (``step``: next nodes); the first
        value ``hit`` returns for a node, else None."""
        seen, stack = set(), list(starts)
        while stack:
            n = stack.pop()
            if n.name in seen:
                continue
            seen.add(n.name)
            found = hit(n)
            if found is not None:
                return found
            if n.op == "call_function" and _op_name(n) in _VIEW_OPS:
                stack.extend(step(n))
        return None

    def owner_from_params(node, backward):
        # a parameter it reads (forward GEMMs, input gradients) ...
        found = first_hit(node.all_input_nodes, lambda n: n.all_input_nodes,
                          lambda n: params.get(n.name) if n.op == "placeholder" else None)
        if found is None and backward:
            # ... or the parameter gradient it produces (weight gradients)
            found = grad_of.get(node.name)
            if found is None:
                found = first_hit(node.users, lambda n: n.users,
                                  lambda n: grad_of.get(n.name))
        return found

    gemm_nodes = [n for n in gm.graph.nodes
                  if n.op == "call_function" and gemm_handler(n.target) is not None]
    owner = {}
    for n in gemm_nodes:
        n.meta["fxshape_phase"] = "forward" if n.name in forward else "backward"
        p = owner_from_params(n, n.name not in forward)
        if p is not None:
            owner[n.name] = p.rsplit(".", 1)[0]  # the parameter's module
    # GEMMs without parameters (attention): the parent of the nearest attributed GEMM
    for n in gemm_nodes:
        if n.name in owner:
            n.meta["fxshape_module"] = owner[n.name]
            continue
        seen, frontier, found = {n.name}, list(n.all_input_nodes), None
        while frontier and found is None:
            nxt = []
            for m in frontier:
                if m.name in seen:
                    continue
                seen.add(m.name)
                if m.name in owner:
                    found = owner[m.name]
                    break
                nxt.extend(m.all_input_nodes)
            frontier = nxt
        n.meta["fxshape_module"] = found.rsplit(".", 1)[0] if found and "." in found else ""
