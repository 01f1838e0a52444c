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
import logging
import re
import traceback

import torch

from .attnops import keep_attention_fused

__all__ = ["CaptureError", "capture", "example_inputs_for", "DEFAULT_SEQ_LEN",
           "DEFAULT_BATCH_SIZE", "module_of", "position_offset", "OFFSET_POSITIONS"]

DEFAULT_BATCH_SIZE = 1
#: Tokens per sequence when none is given: 1024, or the model's max_position_embeddings if
#: that is smaller (BERT: 512).
DEFAULT_SEQ_LEN = 1024


#: the largest batch size or sequence length accepted (torch's sizes and a GPU kernel's
#: grid stay in range)
MAX_SIZE = 2**31 - 1


def check_size(name: str, value, *, optional: bool = True):
    """``value`` as a size: a positive integer up to :data:`MAX_SIZE` (None when
    ``optional``); anything else (a float, a string, a bool, zero) is a ``ValueError``."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_SIZE:
        raise ValueError(f"{name} must be a positive integer up to {MAX_SIZE}, got {value!r}"
                         + (f" ({type(value).__name__})" if not isinstance(value, int) else ""))
    return value


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


def is_hf_model(model) -> bool:
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
    - speech models (``main_input_name == "input_features"``, Whisper): ``input_features`` of
      ``batch_size x num_mel_bins x 2·max_source_positions``, and ``decoder_input_ids`` of
      ``batch_size x seq_len`` (capped at ``max_target_positions``);
    - ``use_cache=False`` when the forward takes it.

    Raises:
        ValueError: not a Hugging Face model, or ``seq_len`` beyond ``max_position_embeddings``.
    """
    if not is_hf_model(model):
        raise ValueError(
            f"{type(model).__name__} is not a Hugging Face model: pass example_inputs "
            "(a tuple of tensors) or example_kwargs to say what its forward takes")
    cfg = model.config
    device = device or _model_device(model)
    b = DEFAULT_BATCH_SIZE if batch_size is None else check_size("batch_size", batch_size)
    kwargs = {}
    main = getattr(model, "main_input_name", "input_ids")
    if main == "input_features":
        # speech encoders (Whisper): log-mel features, num_mel_bins x the frames its two
        # convolutions (the second of stride 2) turn into max_source_positions positions
        mels = getattr(cfg, "num_mel_bins", None)
        positions = getattr(cfg, "max_source_positions", None)
        if not (isinstance(mels, int) and isinstance(positions, int)):
            raise ValueError(f"{type(model).__name__} takes input_features, but its config has "
                             "no num_mel_bins / max_source_positions to size them: pass "
                             "example_kwargs={'input_features': ...}")
        kwargs["input_features"] = torch.zeros(b, mels, 2 * positions, device=device)
        if getattr(cfg, "is_encoder_decoder", False):
            s = resolve_seq_len(cfg, seq_len, "max_target_positions")
            kwargs["decoder_input_ids"] = torch.zeros(b, s, dtype=torch.long, device=device)
    elif main == "pixel_values":
        size = getattr(cfg, "image_size", 224)
        size = size if isinstance(size, int) else size[0]
        ch = getattr(cfg, "num_channels", 3)
        kwargs["pixel_values"] = torch.zeros(b, ch, size, size, device=device)
    else:
        s = resolve_seq_len(cfg, seq_len)
        ids = torch.zeros(b, s, dtype=torch.long, device=device)
        kwargs["input_ids"] = ids
        if getattr(cfg, "is_encoder_decoder", False):
            kwargs["decoder_input_ids"] = torch.zeros(b, s, dtype=torch.long, device=device)
    if _accepts(model, "use_cache") and getattr(cfg, "use_cache", None) is not None:
        kwargs["use_cache"] = False
    return kwargs


#: model types whose position ids start after the padding index (``padding_idx + 1``, the
#: fairseq convention RoBERTa kept): ``max_position_embeddings`` = 514 holds 512 tokens
OFFSET_POSITIONS = frozenset({"roberta", "xlm-roberta", "xlm-roberta-xl", "camembert",
                              "roberta-prelayernorm", "data2vec-text", "xmod", "ibert",
                              "longformer", "markuplm", "layoutlmv3", "luke", "mpnet"})


def position_offset(cfg) -> int:
    """Positions a config's table holds that no token can use: ``pad_token_id + 1`` for the
    RoBERTa family (:data:`OFFSET_POSITIONS`), else 0."""
    if getattr(cfg, "model_type", None) not in OFFSET_POSITIONS:
        return 0
    pad = getattr(cfg, "pad_token_id", None)
    return pad + 1 if isinstance(pad, int) and not isinstance(pad, bool) and pad >= 0 else 0


def resolve_seq_len(cfg, seq_len, *position_attrs) -> int:
    """``seq_len``, or the default (1024, capped at the model's positions), checked against
    the positions the config allows (``position_attrs`` first, then the usual names; less the
    RoBERTa family's offset, :func:`position_offset`)."""
    max_pos = None
    for attr in position_attrs + ("max_position_embeddings", "n_positions"):
        max_pos = getattr(cfg, attr, None)
        if isinstance(max_pos, int):
            break
    offset = position_offset(cfg) if max_pos and max_pos > 0 else 0
    if offset and max_pos > offset:
        max_pos -= offset
    s = check_size("seq_len", seq_len) if seq_len is not None else \
        (min(DEFAULT_SEQ_LEN, max_pos) if max_pos else DEFAULT_SEQ_LEN)
    if max_pos and s > max_pos:
        if offset:
            raise ValueError(f"seq_len {s} exceeds the {max_pos} positions the model can use "
                             f"(max_position_embeddings {max_pos + offset} less the {offset} "
                             "ids before the first token: its position ids start at "
                             f"pad_token_id + 1); accepted: 1 to {max_pos}")
        raise ValueError(f"seq_len {s} exceeds the model's max_position_embeddings "
                         f"({max_pos}); accepted: 1 to {max_pos}")
    return s


def _to_device(obj, device):
    if isinstance(obj, torch.Tensor):
        return obj.to(device) if obj.device != device else obj
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_device(o, device) for o in obj)
    if isinstance(obj, dict):
        return {k: _to_device(v, device) for k, v in obj.items()}
    return obj


#: Which nodes of a joint (training) graph get ``fxshape_phase`` and ``fxshape_module``
#: labels (a predicate on node targets), and what runs before each capture. The op registry
#: (``fxshape.analysis.ops``) installs its own when it is imported, as ``import fxshape``
#: does: capture knows which ops are GEMMs without importing anything above it.
_LABELLED = {"is_labelled": lambda target: False, "before_capture": lambda: None}


def set_labelled_ops(is_labelled, before_capture=None) -> None:
    """Label the nodes whose target ``is_labelled`` accepts in joint graphs, and call
    ``before_capture()`` (if given) at the start of every capture."""
    _LABELLED["is_labelled"] = is_labelled
    _LABELLED["before_capture"] = before_capture or (lambda: None)


@contextlib.contextmanager
def preserve_training_flags(model: torch.nn.Module, train: bool):
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
    check_module(model)
    _LABELLED["before_capture"]()
    args, kwargs = forward_arguments(model, example_inputs, example_kwargs,
                                     batch_size=batch_size, seq_len=seq_len)
    # torch's own tracebacks of a failing path (the fake-tensor "failed while attempting to
    # run meta" logs) stay off stderr: CaptureError reports every path
    with quiet_loggers("torch._subclasses.fake_tensor", "torch._dynamo", "torch.export"):
        return _capture(model, args, kwargs, train)


def check_module(model) -> None:
    """A one-line ``ValueError`` for anything but an ``nn.Module`` (a preset's name says how
    to build it)."""
    if isinstance(model, torch.nn.Module):
        return
    hint = (f" (for a preset: from fxshape.presets import build_preset; build_preset("
            f"{model!r}), or the CLI: fxshape analyze {model})" if isinstance(model, str)
            else "")
    raise ValueError(f"expected a torch.nn.Module, got {type(model).__name__}{hint}")


def forward_arguments(model, example_inputs=None, example_kwargs=None, *, batch_size=None,
                      seq_len=None) -> tuple:
    """(args, kwargs) a capture calls ``model`` with: the given ones, or inputs synthesized
    for a Hugging Face model (:func:`example_inputs_for`); ``use_cache=False`` where the
    forward takes it; on the meta device when the model is there."""
    device = _model_device(model)
    check_size("batch_size", batch_size)
    check_size("seq_len", seq_len)
    if example_inputs is not None and not isinstance(example_inputs,
                                                     (torch.Tensor, tuple, list)):
        raise ValueError("example_inputs must be a tensor or a tuple of the forward's "
                         f"positional arguments, got {type(example_inputs).__name__}")
    if example_kwargs is not None and not isinstance(example_kwargs, dict):
        raise ValueError("example_kwargs must be a dict of the forward's keyword arguments, "
                         f"got {type(example_kwargs).__name__}")
    if example_inputs is None and example_kwargs is None:
        example_kwargs = example_inputs_for(model, batch_size=batch_size, seq_len=seq_len,
                                            device=device)
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    args = tuple(example_inputs or ())
    kwargs = dict(example_kwargs or {})
    if "use_cache" not in kwargs and is_hf_model(model) and _accepts(model, "use_cache") and \
            getattr(model.config, "use_cache", None) is not None:
        kwargs["use_cache"] = False  # a KV-cache object in the output breaks export
    if device.type == "meta":  # keep everything on meta: no real memory anywhere
        args, kwargs = _to_device(args, device), _to_device(kwargs, device)
    return args, kwargs


@contextlib.contextmanager
def quiet_loggers(*names, level=logging.CRITICAL):
    """Raise the named loggers to ``level`` for the duration, then restore their levels."""
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(level)
    try:
        yield
    finally:
        for lg, old in zip(loggers, levels):
            lg.setLevel(old)


def _capture(model, args, kwargs, train):
    """Try the capture paths in order; CaptureError lists every failure."""
    errors = []
    if train:
        with preserve_training_flags(model, True), keep_attention_fused():
            try:
                return _joint(model, args, kwargs)
            except Exception as exc:  # noqa: BLE001 - reported below
                errors.append(("torch.export + joint forward/backward (make_fx + autograd)",
                               exc))
        raise CaptureError(_failure_text(model, errors))
    with preserve_training_flags(model, train), keep_attention_fused():
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

VIEW_OPS = {"permute", "t", "transpose", "view", "reshape", "_unsafe_view", "expand", "clone",
             "detach", "alias", "contiguous", "_to_copy", "squeeze", "unsqueeze", "slice",
             "select", "to", "type_as", "_reshape_alias", "as_strided"}


class _ScalarLoss(torch.nn.Module):
    """The model with a scalar loss on its first floating output (the GEMMs autograd runs
    do not depend on which loss: the gradient reaches every op the same way). The other
    floating outputs are returned detached, so the forward work behind them (BertModel's
    pooler) stays in the graph without a gradient."""

    def __init__(self, model, static_kwargs):
        super().__init__()
        self.m = model
        self.static = static_kwargs

    def forward(self, *args, **kwargs):
        outs = float_outputs(self.m(*args, **kwargs, **self.static))
        if not outs:
            raise ValueError("the model returned no floating-point tensor to put a loss on")
        return (outs[0].float().sum(), *(o.detach() for o in outs[1:]))


def float_outputs(out) -> list:
    """Floating-point tensors of a (nested) model output, in order, without repeats."""
    if isinstance(out, torch.Tensor):
        return [out] if out.is_floating_point() else []
    if isinstance(out, dict):
        values = out.values()
    elif isinstance(out, (tuple, list)):
        values = out
    else:
        return []
    found = []
    for v in values:
        for t in float_outputs(v):
            if not any(t is f for f in found):
                found.append(t)
    return found


def node_op_name(node) -> str:
    return getattr(node.target, "__name__", str(node.target)).split(".")[0]


def _joint(model, args, kwargs):
    """The joint forward + backward graph: ``torch.export`` of the model with a scalar loss,
    then ``make_fx`` over that program and ``torch.autograd.grad`` of the loss with respect
    to every parameter (aten-level, fake tensors; no decomposition table, so the graph holds
    the aten ops eager PyTorch dispatches: ``native_layer_norm_backward``, ``gelu_backward``,
    ``embedding_dense_backward`` ... each one kernel launch or a known few). Parameters the loss
    does not reach (BertModel's pooler, unused tied copies) get no gradient and so no
    weight-gradient GEMM."""
    from torch._guards import detect_fake_mode
    from torch.export.graph_signature import InputKind
    from torch.fx.experimental.proxy_tensor import make_fx

    tensors = {k: v for k, v in kwargs.items() if isinstance(v, torch.Tensor)}
    static = {k: v for k, v in kwargs.items() if not isinstance(v, torch.Tensor)}
    ep = torch.export.export(_ScalarLoss(model, static), args, tensors, strict=False)
    program = ep.graph_module
    placeholders = [n for n in program.graph.nodes if n.op == "placeholder"]
    specs = ep.graph_signature.input_specs
    fake_args = [n.meta["val"] for n in placeholders]
    is_param = [s.kind == InputKind.PARAMETER for s in specs]
    fqns = [_strip(s.target) if s.kind == InputKind.PARAMETER else None for s in specs]
    # differentiate with respect to the parameters and to user inputs that require grad
    wrt = [p or (isinstance(a, torch.Tensor) and a.requires_grad)
           for a, p in zip(fake_args, is_param)]
    with_grad: list[int] = []  # which of them got a gradient (filled while tracing)

    def joint(*flat):
        # run node by node, so that each forward op's nn_module_stack reaches its aten
        # nodes (preserve_node_meta below): the step model attributes them to their layer
        loss = torch.fx.Interpreter(program).run(*flat)[0]
        _mark_backward_origins(loss)
        grads = torch.autograd.grad(loss, [x for x, w in zip(flat, wrt) if w],
                                    allow_unused=True)
        with_grad[:] = [i for i, g in enumerate(grads) if g is not None]
        return (loss, *(g for g in grads if g is not None))

    fake_args = [a.detach().requires_grad_(w) if isinstance(a, torch.Tensor)
                 and a.is_floating_point() else a for a, w in zip(fake_args, wrt)]
    with detect_fake_mode(fake_args) or contextlib.nullcontext(), \
            torch.fx.traceback.preserve_node_meta():
        gm = make_fx(joint)(*fake_args)
    jph = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for n, spec in zip(jph, specs):  # buffers and constants are not the user's inputs
        if spec.kind == InputKind.USER_INPUT:
            n.meta["fxshape_input"] = spec.arg.name  # the forward argument's name
        elif spec.kind != InputKind.PARAMETER:
            n.meta["fxshape_buffer"] = spec.target
    params = {n.name: fqn for n, fqn in zip(jph, fqns) if fqn is not None}
    out = next(n for n in gm.graph.nodes if n.op == "output")
    loss, grads = out.args[0][0], out.args[0][1:]
    owners = [f for f, w in zip(fqns, wrt) if w]  # parameter name, or None for an input
    grad_of = {g.name: owners[i] for g, i in zip(grads, with_grad)
               if isinstance(g, torch.fx.Node) and owners[i] is not None}
    _label_joint(gm, params, grad_of, loss)
    _label_modules(gm)
    return gm


def _mark_backward_origins(loss) -> None:
    """Have each backward aten node record the sequence number of the forward op whose
    gradient it computes (``node.meta["seq_nr"]``), as aot_autograd does; best effort: a
    torch without the hook leaves the backward nodes unmarked."""
    try:
        from torch._functorch._aot_autograd import logging_utils
    except ImportError:  # pragma: no cover - other torch versions
        return
    hooks = getattr(logging_utils, "setup_stacktrace_preservation_hooks", None)
    if hooks is not None and isinstance(loss, torch.Tensor) and loss.grad_fn is not None:
        hooks([loss.grad_fn])


def _label_modules(gm) -> None:
    """``fxshape_module`` on every node of a joint graph that has none: a forward node's own
    module (its ``nn_module_stack`` from the exported program), a backward node's that of the
    forward op it differentiates (same ``seq_nr``)."""
    by_seq = {}
    for n in gm.graph.nodes:
        stack = n.meta.pop("nn_module_stack", None)
        if n.op != "call_function" or not stack:
            continue
        fqn = _strip(str(list(stack.values())[-1][0]))
        by_seq.setdefault(n.meta.get("seq_nr"), fqn)
        n.meta.setdefault("fxshape_module", fqn)
    by_seq.pop(None, None)
    for n in gm.graph.nodes:
        if n.op == "call_function" and "fxshape_module" not in n.meta and \
                n.meta.get("seq_nr") in by_seq:
            n.meta["fxshape_module"] = by_seq[n.meta["seq_nr"]]


def _strip(fqn: str) -> str:
    return fqn[2:] if fqn.startswith("m.") else fqn


def _label_joint(gm, params: dict, grad_of: dict, loss) -> None:
    """Phase and owning module of every GEMM node of a joint graph. ``params``: placeholder
    name -> parameter name; ``grad_of``: output node name -> the parameter it is the gradient
    of; ``loss``: the loss node."""
    nodes = {n.name: n for n in gm.graph.nodes}
    for name, fqn in params.items():  # which parameter each placeholder is (provenance)
        if name in nodes:
            nodes[name].meta["fxshape_param"] = fqn
    # backward = everything computed from the loss (the gradient seed is made from it);
    # forward = the rest, including work the loss does not depend on (BertModel's pooler)
    backward = set()
    stack = list(loss.users) if isinstance(loss, torch.fx.Node) else []
    while stack:
        n = stack.pop()
        if n.name in backward or n.op == "output":
            continue
        backward.add(n.name)
        stack.extend(n.users)
    forward = {n.name for n in gm.graph.nodes} - backward

    def first_hit(starts, step, hit, through=VIEW_OPS):
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
            if n.op == "call_function" and node_op_name(n) in through:
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
                # through views and the adds that sum a tied weight's gradients (T5)
                found = first_hit(node.users, lambda n: n.users,
                                  lambda n: grad_of.get(n.name), VIEW_OPS | {"add"})
        return found

    gemm_nodes = [n for n in gm.graph.nodes
                  if n.op == "call_function" and _LABELLED["is_labelled"](n.target)]
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


def module_of(node) -> tuple[str, str]:
    """(fully qualified name, class name) of the innermost module that owns ``node``."""
    if "fxshape_module" in node.meta:  # joint training graphs (see capture(train=True))
        return node.meta["fxshape_module"], ""
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return "", ""
    fqn, cls = list(stack.values())[-1]
    cls = cls if isinstance(cls, str) else getattr(cls, "__name__", str(cls))
    fqn = re.sub(r"^L\['self'\]\.?", "", str(fqn))
    return fqn, cls.rsplit(".", 1)[-1]
