"""Capture one rank's step and annotate every matmul-like node with its GEMMs and cost.

:func:`capture_step` captures the model (``fxshape.capture``; one layer per group of identical
layers where the layers repeat, ``fxshape.tracing.dedup``), asks the op registry
(``fxshape.analysis.ops``) which GEMMs each node runs, predicts each with ``predict_matmul``
(``fxshape.cost.gemv`` for Inductor's matrix-vector products with ``gemv="inductor"``) and
stores a tuple of :class:`GemmRow` records on ``node.meta["fxshape"]``: a :class:`Capture`.
``analyze`` (``fxshape.report.build``) executes it and builds the report.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from ..cost.gemv import price_matmul
from ..cost.notes import join_notes
from ..hardware.dtypes import canonical_dtype
from ..hardware.gpus import get_gpu
from ..parallelism.experts import apportion
from ..parallelism.plan import PlanRefused
from ..tracing.dedup import check_reduction, reduced_model, structure_key
from ..tracing.facts import attention_windows, head_counts, linear_features
from ..tracing.export import CaptureError, capture, forward_arguments, module_of, resolve_seq_len
from . import lowprec
from .ops import Gemm, gemm_handler, gemms_for_node, looks_like_matmul
from .parallel import kv_shard, layer_kind, shard_gemm, sharded_modules
from .rows import GemmRow, Unsupported

__all__ = ["annotate", "Capture", "capture_step", "provenance_rows", "rank_seq_len",
           "check_attention", "module_of"]

META_KEY = "fxshape"


def annotate(gm: torch.fx.GraphModule, *, gpu="h100", dtype=torch.bfloat16,
             phase: str = "forward", tp: int = 1, features=None, heads=None,
             causal_decoder=False, moe_routing=None, attention: str = "flash", kv_dtype=None,
             page_size=None, cp: int = 1, ep: int = 1, capacity_factor=None, windows=None,
             quant=None, gemv: str | None = None):
    """Put GEMM rows on every matmul-like node; return (rows, unsupported).

    ``tp`` > 1 shards each GEMM Megatron-style (``fxshape.analysis.parallel``); ``features``
    maps a module name to its (out_features, in_features), to find the sharded dimension of
    backward GEMMs; ``heads``: (query heads, KV heads), so that K/V projections keep whole KV
    heads (``fxshape.analysis.parallel.kv_shard``). ``causal_decoder``: attention that gets a
    mask tensor over a square (query = key length) self-attention is the causal mask of a
    decoder (Hugging Face decoders pass the causal mask as a tensor, not ``is_causal``).
    ``moe_routing``: fractions of the routed rows per expert; default balanced. ``attention``:
    the kernel attention calls are predicted as (``fxshape.cost.attention.ATTENTION_CHOICES``;
    ``"flash"``: what PyTorch's SDPA runs on the GPU). ``kv_dtype``, ``page_size``: the KV
    cache's dtype (default ``dtype``) and page size (default contiguous), for decode
    attention (``fxshape.cost.decode_attention``). ``cp`` > 1: the graph is one rank's share
    of a context-parallel plan (``s / cp`` tokens); its attention calls run as ring attention
    over ``cp`` ranks (``fxshape.parallelism.context``): the key dimension spans the whole
    sequence, priced as the ring's kernels. ``ep`` > 1: each grouped (MoE) GEMM as the
    busiest of ``ep`` expert-parallel ranks runs it (its block of experts on the rows the group
    routes to them, ``capacity_factor``: padded to capacity; ``fxshape.parallelism.experts``).
    ``windows``: attention module name -> its sliding window in keys (:func:`_windows`); a
    causal call there keeps only the band, a decode call reads the last ``window`` keys.
    ``quant``: the low precision the linear layers run in (``fxshape.analysis.lowprec``:
    a ``QuantState`` or ``Float8State``; None: ``dtype``), which records the layers it
    leaves in bf16. ``gemv``: how matrix-vector products run (``fxshape.cost.gemv``;
    None: the ``use_gemv`` context's choice).
    """
    spec = get_gpu(gpu)
    dkey = canonical_dtype(dtype)
    spec.peak_tflops(dkey)
    rows: list[GemmRow] = []
    unsupported: list[Unsupported] = []
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        fqn, cls = module_of(node)
        integer = _integer_operand(node)
        if integer and (looks_like_matmul(node.target) or gemm_handler(node.target)):
            unsupported.append(Unsupported(node.name, str(node.target), fqn,
                                           f"integer matmul ({integer}): fxshape models "
                                           "floating-point GEMMs only"))
            continue
        try:
            gemms = gemms_for_node(node)
        except ValueError as exc:
            unsupported.append(Unsupported(node.name, str(node.target), fqn, str(exc)))
            continue
        if gemms is None:
            if looks_like_matmul(node.target):
                unsupported.append(Unsupported(node.name, str(node.target), fqn,
                                               "no GEMM handler registered"))
            continue
        node_phase = node.meta.get("fxshape_phase", phase)
        if causal_decoder:
            gemms = [_causal(node, g, fqn) for g in gemms]
        if windows and windows.get(fqn) and cp == 1:  # (a ring over windows: not modelled)
            gemms = _windowed(gemms, windows[fqn])
        if moe_routing is not None or ep > 1:
            gemms = [x for g in gemms for x in _route(g, moe_routing, ep, capacity_factor)]
        if tp > 1:
            gemms = [_shard(g, fqn, node_phase, tp, features or {}, heads) for g in gemms]
        if gemms and all(g.attn is not None for g in gemms):
            node_rows = _attention_rows(node, gemms, fqn, cls, node_phase, dkey, spec,
                                        attention, kv_dtype, page_size, cp, quant, gemv)
        else:
            node_rows = tuple(_row(node, g, fqn, cls, node_phase, dkey, spec, quant, gemv)
                              for g in gemms)
        node.meta[META_KEY] = node_rows
        rows.extend(node_rows)
    return rows, unsupported


def _integer_operand(node) -> str:
    """The dtype of the data operands (the first two tensor arguments: A and B, or a bias
    and A) of ``node`` when one is an integer or bool tensor, else ``""``. Later arguments
    (an attention mask, grouped-GEMM offsets) may be integers."""
    vals = [a.meta.get("val") for a in node.args if isinstance(a, torch.fx.Node)]
    for v in [v for v in vals if isinstance(v, torch.Tensor)][:2]:
        if not (v.is_floating_point() or v.is_complex()):
            return str(v.dtype).replace("torch.", "")
    return ""


def _by_node(rows) -> dict:
    by_node: dict[str, list] = {}
    for r in rows:
        by_node.setdefault(r.node, []).append(r)
    return by_node


def _replaced(gm, rows, changes):
    """``rows`` with each row's ``changes`` (a dict of fields) applied, also on
    ``node.meta``."""
    new = [dataclasses.replace(r, **c) for r, c in zip(rows, changes)]
    nodes = {n.name: n for n in gm.graph.nodes}
    for name, rs in _by_node(new).items():
        nodes[name].meta[META_KEY] = tuple(rs)
    return new


def _with_provenance(gm, rows, config, tp):
    """Rows with ``set_by`` matched by value
    (``fxshape.analysis.provenance.dimension_sources``), also on ``node.meta``."""
    from .provenance import dimension_sources

    by_node = _by_node(rows)
    sources = dimension_sources(gm, by_node, config=config, tp=tp)
    # annotate adds each node's rows together: graph order is kept
    flat = [s for name in by_node for s in sources[name]]
    order = [r for rs in by_node.values() for r in rs]
    return _replaced(gm, order, [{"set_by": s} for s in flat])


def _with_traced_provenance(gm, rows, model, args, stacks):
    """Rows with ``set_by`` and ``causes`` traced by cause (``fxshape.analysis.perturb``); notes."""
    from .fasttrace import aligned, gemm_graph, gemm_nodes
    from .perturb import row_keys, traced_sources
    from .provenance import weight_axes

    example_inputs, example_kwargs, kw = args.example_inputs, args.example_kwargs, args.sizes
    tp, moe_routing, cp, moe = args.tp, args.moe_routing, args.cp, args.moe
    by_node = _by_node(rows)
    axes = weight_axes(gm, by_node)
    order = [r for rs in by_node.values() for r in rs]
    fallback = [a for name in by_node for a in axes[name]]
    keys = row_keys(order)
    base_nodes = gemm_nodes(gm)

    def recorded(target, ex_in, ex_kw, b, s, sizes):
        """Sizes by row key from running ``target`` on meta or fake tensors
        (``fxshape.analysis.fasttrace``), or None where its GEMMs do not line up with the captured
        graph's (with ``sizes``: or their sizes differ)."""
        a, k = forward_arguments(target, ex_in, ex_kw, batch_size=b, seq_len=s)
        try:
            fast = gemm_graph(target, a, k, train=kw["train"])
        except Exception:  # noqa: BLE001 - the capture path measures it instead
            return None
        if not aligned(gm, fast, sizes=sizes):
            return None
        pairs = list(zip(base_nodes, gemm_nodes(fast)))
        for bn, fn in pairs:
            fn.meta["fxshape_module"] = module_of(bn)[0]
        got, _ = _annotate(fast, target, args)
        mine = _by_node(got)
        out = {}
        for bn, fn in pairs:
            theirs, ours = by_node.get(bn.name, []), mine.get(fn.name, [])
            if len(theirs) != len(ours):
                return None
            out.update({id(t): (o.m, o.n, o.k) for t, o in zip(theirs, ours)})
        return {key: out[id(r)] for key, r in zip(keys, order)}

    fast_ok = []  # the fast trace reproduces this graph's rows (decided at first use)

    def observe(target, ex_in, ex_kw, b, s):
        if not fast_ok:
            base = reduced_model(model, stacks, 1) if stacks else model
            fast_ok.append(recorded(base, example_inputs, example_kwargs, kw["batch_size"],
                                    kw["seq_len"], sizes=True) ==
                           {key: (r.m, r.n, r.k) for key, r in zip(keys, order)})
        got = recorded(target, ex_in, ex_kw, b, s, sizes=False) if fast_ok[0] else None
        if got is None:
            theirs = _annotated(target, dataclasses.replace(
                args, example_inputs=ex_in, example_kwargs=ex_kw,
                sizes=dict(kw, batch_size=b, seq_len=s)), provenance=None)[1]
            got = dict(zip(row_keys(theirs), ((r.m, r.n, r.k) for r in theirs)))
        return got

    # what the labels depend on besides the model: sizes do not depend on the GPU or dtype,
    # but which rows there are may (an attention kernel's), so the rows are in the key
    key = (kw["train"], tp, cp, moe, _shapes(moe_routing), _shapes(example_inputs),
           _shapes(example_kwargs), kw["batch_size"], kw["seq_len"],
           tuple((s.name, s.groups) for s in stacks),
           tuple(k + (r.m, r.n, r.k) for k, r in zip(keys, order)))
    sources, notes = traced_sources(
        model, order, fallback, observe=observe, example_inputs=example_inputs,
        example_kwargs=example_kwargs, batch_size=kw["batch_size"], seq_len=kw["seq_len"],
        stacks=stacks, tp=tp, cache_key=key)
    return _replaced(gm, order, [{"set_by": s, "causes": c} for s, c in sources]), notes


def _causal(node, g: Gemm, fqn: str) -> Gemm:
    """A masked square self-attention outside an encoder is a decoder's causal mask."""
    a = g.attn
    if a is None or a.shape.causal or not a.masked:
        return g
    cross = any(s in fqn.lower() for s in ("encdec", "cross"))
    square = a.shape.seq_q == a.shape.seq_k
    if square and not cross and ("decoder" in fqn or "encoder" not in fqn):
        call = dataclasses.replace(a, shape=dataclasses.replace(a.shape, causal=True))
        note = join_notes(g.note, "causal (decoder mask): half the blocks")
        return dataclasses.replace(g, work=call.shape.causal_fraction, note=note, attn=call)
    return g


def _windowed(gemms, window: int) -> list:
    """One attention call's GEMMs under a sliding window of ``window`` keys, as a fused kernel
    with a window (FlashAttention's ``window_size``, vLLM's) runs it: a causal square call
    keeps the band's blocks (``AttentionShape.window``); a decode call (fewer queries than
    keys, not causal) reads only the last ``window`` keys, as an engine's sliding-window cache
    holds them. Unfused math attention (no ``attn``) computes every score: unchanged."""
    out = []
    for g in gemms:
        a = g.attn
        if a is None or window >= a.shape.seq_k:
            out.append(g)
            continue
        sq, sk = a.shape.seq_q, a.shape.seq_k
        if a.shape.causal:
            shape = dataclasses.replace(a.shape, window=window)
            call = dataclasses.replace(a, shape=shape)
            w = shape.causal_fraction
            note = join_notes(g.note, f"sliding window of {window} keys: {w:.1%} of the scores")
            out.append(dataclasses.replace(g, work=w, note=note, attn=call))
        elif sq < sk and a.direction == "forward" and g.op in ("sdpa.qk", "sdpa.pv"):
            shape = dataclasses.replace(a.shape, seq_k=window)
            call = dataclasses.replace(a, shape=shape)
            dims = {"n": window} if g.op == "sdpa.qk" else {"k": window}
            note = join_notes(g.note, f"sliding window: the last {window} of {sk} keys read")
            out.append(dataclasses.replace(g, note=note, attn=call, **dims))
        else:
            out.append(g)
    return out


def _route(g: Gemm, routing, ep: int = 1, capacity_factor=None):
    """A grouped (MoE) GEMM as one rank runs it: split into one GEMM per expert by the given
    routing fractions; with expert parallelism (``ep`` > 1), the busiest rank's block of
    ``E / ep`` experts on the rows the group routes to them
    (``fxshape.parallelism.experts``)."""
    if not g.op.startswith("grouped"):
        return [g]
    if routing is not None:
        try:
            fractions = [float(f) for f in routing]
        except (TypeError, ValueError):
            raise ValueError(f"moe_routing must be a sequence of fractions, one per expert, "
                             f"got {routing!r}") from None
        if len(fractions) != g.batch:
            raise ValueError(f"moe_routing has {len(fractions)} fractions but the layer has "
                             f"{g.batch} experts")
        if any(f < 0 for f in fractions) or abs(sum(fractions) - 1.0) > 1e-6:
            raise ValueError("moe_routing fractions must be non-negative and sum to 1")
    else:
        fractions = None
    dim = "k" if g.op.endswith(".dw") else "m"  # weight gradients reduce over the rows
    rows = round(getattr(g, dim) * g.batch * g.work)  # the layer's routed rows, exactly
    if ep > 1:
        return _expert_parallel(g, dim, rows, fractions, ep, capacity_factor)
    if fractions is None:
        return [g]
    shares = apportion(rows, fractions)
    idle = [e for e, m in enumerate(shares) if m == 0]
    tail = (f"; experts {', '.join(map(str, idle))} get no rows and run no GEMM"
            if idle else "")
    out = []
    for e, m in enumerate(shares):
        if m > 0:
            out.append(dataclasses.replace(
                g, batch=1, work=1.0, **{dim: m},
                note=f"MoE expert {e}: {m} of {rows} routed rows (routing given; shares "
                     f"rounded so that they sum to {rows}{tail})"))
    return out


def _expert_parallel(g: Gemm, dim: str, rows: int, fractions, ep: int, capacity_factor):
    """The busiest expert-parallel rank's GEMMs for a grouped GEMM of ``rows`` routed rows
    per rank: one grouped GEMM over its ``E / ep`` experts when they get equal rows
    (balanced, or padded to capacity), else one GEMM per expert."""
    from ..parallelism.experts import expert_rows

    experts = g.batch
    rank, shares = expert_rows(rows, experts, ep, fractions, capacity_factor)
    per = experts // ep
    first = rank * per
    where = (f"EP over {ep}: rank {rank} holds experts {first}..{first + per - 1} of "
             f"{experts}")
    if capacity_factor is not None:
        return [dataclasses.replace(
            g, batch=per, work=1.0, **{dim: shares[0]},
            note=f"{where}; each padded to its capacity of {shares[0]} rows (capacity factor "
                 f"{capacity_factor:g} × {ep * rows} routed rows / {experts} experts)")]
    got = sum(shares)
    how = "balanced routing assumed" if fractions is None else "the busiest rank (routing given)"
    if len(set(shares)) == 1:
        m = shares[0]
        return [dataclasses.replace(
            g, batch=per, work=1.0, **{dim: m},
            note=f"{where}, {got} of the group's {ep * rows} routed rows ({how})")]
    return [dataclasses.replace(
        g, batch=1, work=1.0, **{dim: m},
        note=f"{where}; expert {first + i}: {m} of the group's {ep * rows} routed rows "
             f"({how}; {got} on this rank)")
        for i, m in enumerate(shares) if m > 0]


def _attention_rows(node, gemms, fqn, cls, phase, dkey, spec, attention, kv_dtype=None,
                    page_size=None, cp=1, quant=None, gemv=None):
    """Rows of one attention call, predicted as the kernel it runs (``fxshape.cost.attention``).

    A fused kernel's time is split over its GEMMs by FLOPs, so every row shows the kernel's
    throughput. The math path runs its GEMMs unfused (each predicted by the GEMM model; no
    recomputed QKᵀ in the backward; the full score matrix even when causal), and the
    elementwise kernels between them are split over its rows by FLOPs."""
    from ..cost.attention import predict_attention

    call = gemms[0].attn
    pred = predict_attention(call.shape, direction=call.direction, attention=attention,
                             dtype=dkey, gpu=spec, kv_dtype=kv_dtype, page_size=page_size)
    if cp > 1:
        pred, gemms = _ring(pred, gemms, cp, call, attention, dkey, spec)
    if pred.kernel == "math":
        gemms = [dataclasses.replace(g, work=1.0, note=join_notes(g.note, pred.note))
                 for g in gemms if g.op != "sdpa.bwd.qk"]
    elif pred.note:
        gemms = [dataclasses.replace(g, note=join_notes(g.note, pred.note)) for g in gemms]
    rows = [_row(node, g, fqn, cls, phase, dkey, spec, quant, gemv) for g in gemms]
    total = sum(r.flops for r in rows) or 1
    if pred.kernel == "math":
        rest = max(0.0, pred.time_s - sum(r.prediction.time_s for r in rows))
        times = [r.prediction.time_s + rest * r.flops / total for r in rows]
    else:
        times = [pred.time_s * r.flops / total for r in rows]
    return tuple(dataclasses.replace(r, time_s=t, kernel=pred.kernel, attention=pred)
                 for r, t in zip(rows, times))


def _ring(pred, gemms, cp, call, attention, dkey, spec):
    """One rank's ring attention (``fxshape.parallelism.context``): the call's prediction as
    the sum of its ``cp`` kernels, and its GEMMs with the key dimension over the whole
    sequence (the rank's share of the scores: half of ``s/cp × s`` when causal)."""
    from ..parallelism.context import KEY_DIMS, ring_blocks
    from ..parallelism.context import block_times

    if pred.kernel == "math":
        raise ValueError("context parallelism runs ring attention on a fused kernel; the "
                         f"attention here runs unfused (attention={attention!r} in {dkey}): "
                         "accepted: attention='flash', 'fa2' or 'fa3' in fp16 or bf16")
    blocks = ring_blocks(call.shape, cp)
    total = sum(block_times(call.shape, cp, call.direction, pred.kernel, dkey, spec))
    note = (f"ring attention over cp {cp}: {sum(n for _, n in blocks)} kernels per rank ("
            + " + ".join(f"{n} × {b.seq_q}×{b.seq_k}{' causal' if b.causal else ''}"
                         for b, n in blocks) + ")")
    pred = dataclasses.replace(pred, time_s=total, kernels=sum(n for _, n in blocks),
                               note=join_notes(pred.note, note))
    work = 0.5 if call.shape.causal else 1.0
    out = []
    for g in gemms:
        dim = KEY_DIMS.get(g.op)
        if dim is None:
            raise ValueError(f"ring attention: no key dimension known for {g.op!r}")
        out.append(dataclasses.replace(g, **{dim: getattr(g, dim) * cp}, work=work,
                                       note=join_notes(g.note, f"keys over the whole "
                                                               f"sequence (cp {cp})")))
    return pred, out


#: the two-layer check's verdicts ("" = the reduction holds), by fxshape.tracing.dedup.structure_key
_CHECKED: dict = {}


def _shapes(obj):
    """A hashable summary of example inputs: tensor shapes and dtypes, other values' types."""
    if isinstance(obj, torch.Tensor):
        return ("tensor", tuple(obj.shape), str(obj.dtype))
    if isinstance(obj, (list, tuple)):
        return tuple(_shapes(o) for o in obj)
    if isinstance(obj, dict):
        return tuple(sorted((k, _shapes(v)) for k, v in obj.items()))
    return repr(obj) if isinstance(obj, (int, float, bool, str, type(None))) \
        else type(obj).__name__


@dataclass(frozen=True)
class _Annotating:
    """What the annotate pass of one capture is given besides its target (the model, or a
    reduced copy of it): from the setup (:func:`_args`)."""

    example_inputs: object
    example_kwargs: object
    #: ``fxshape.capture``'s sizes: batch_size, seq_len, train
    sizes: dict
    spec: object
    dkey: str
    tp: int
    #: the model as given (its config; whether it decodes)
    model: object
    moe_routing: object
    attention: str
    kv: tuple = (None, None)
    cp: int = 1
    #: (ep, capacity_factor)
    moe: tuple = (1, None)
    #: the low precision the linear layers run in (``fxshape.analysis.lowprec``)
    quant: object = None
    #: how matrix-vector products run (``fxshape.cost.gemv``)
    gemv: str = "library"


def _annotate(gm, target, a: _Annotating):
    """:func:`annotate` on ``gm``, a graph of ``target`` (the model, a reduced copy of it,
    or its fast GEMM trace's), as ``a`` says: the one translation of a capture's setup into
    the pass's keywords."""
    return annotate(gm, gpu=a.spec, dtype=a.dkey, tp=a.tp,
                    features=linear_features(target) if a.tp > 1 else None,
                    heads=head_counts(target), windows=attention_windows(target),
                    causal_decoder=_is_decoder(a.model), moe_routing=a.moe_routing,
                    attention=a.attention, kv_dtype=a.kv[0], page_size=a.kv[1], cp=a.cp,
                    ep=a.moe[0], capacity_factor=a.moe[1], quant=a.quant, gemv=a.gemv)


def _annotated(target, a: _Annotating, provenance="matched"):
    """Capture ``target`` (the model, or a reduced copy of it) and annotate its graph:
    (graph, rows, unsupported); rows with provenance matched by value unless ``provenance``
    is None."""
    gm = capture(target, a.example_inputs, a.example_kwargs, **a.sizes)
    rows, unsupported = _annotate(gm, target, a)
    if provenance is not None:
        rows = _with_provenance(gm, rows, getattr(a.model, "config", None), a.tp)
    return gm, rows, unsupported


def rank_seq_len(model, example_inputs, example_kwargs, seq_len, cp):
    """The tokens one rank captures: ``seq_len``, or with context parallelism its share,
    ``seq_len / cp`` (``seq_len`` a multiple of ``2 × cp``)."""
    if cp == 1:
        return seq_len
    from ..parallelism.plan import check_cp_seq

    if example_inputs is not None or example_kwargs is not None:
        raise ValueError(f"cp={cp} captures one rank's share of each sequence from synthesized "
                         "inputs: give seq_len (and batch_size), not example inputs")
    full = resolve_seq_len(getattr(model, "config", None), seq_len)
    check_cp_seq(full, cp)
    return full // cp


def check_attention(attention, spec, dkey) -> None:
    """Fail before capturing on an unknown kernel choice or FA3 off Hopper."""
    from ..cost.attention import resolve_kernel

    resolve_kernel(attention, spec, dkey, 128)


def _shard(g: Gemm, fqn: str, phase: str, tp: int, features, heads=None) -> Gemm:
    kind = layer_kind(fqn, g.op, g.n, g.k)
    out_in = features.get(fqn)
    feat = None if out_in is None else (out_in[0] if kind == "column" else out_in[1])
    kv = kv_shard(fqn, feat, tp, *(heads or (None, None))) if kind == "column" else None
    return shard_gemm(g, kind, tp, phase, feat, kv)


def _is_decoder(model) -> bool:
    """Does self-attention in this model use a causal mask (decoders, causal LMs)?"""
    cfg = getattr(model, "config", None)
    if cfg is None:
        return False  # plain modules say so themselves with is_causal=True
    name = type(model).__name__
    return bool(getattr(cfg, "is_decoder", False) or getattr(cfg, "is_encoder_decoder", False)
                or name.endswith(("ForCausalLM", "LMHeadModel")))


def _row(node, g: Gemm, fqn, cls, phase, dkey, spec, state=None, gemv=None) -> GemmRow:
    if isinstance(state, lowprec.Float8State):
        row = lowprec.float8_row(node, g, fqn, cls, phase, dkey, spec, state)
        if row is not None:
            return row
    elif state is not None:
        row = lowprec.quantized_row(node, g, fqn, cls, phase, dkey, spec, state, gemv)
        if row is not None:
            return row
    p = price_matmul(g.op, max(g.m, 1), max(g.n, 1), max(g.k, 1),
                     batch=max(g.batch, 1), dtype=dkey, gpu=spec, layout=g.layout, gemv=gemv)
    flops = int(round(2 * g.batch * g.m * g.n * g.k * g.work))
    return GemmRow(node=node.name, module=fqn, module_type=cls, op=g.op, phase=phase,
                   batch=g.batch, m=g.m, n=g.n, k=g.k, dtype=dkey, layout=g.layout,
                   work=g.work, note=g.note, flops=flops, time_s=p.time_s * g.work,
                   prediction=p)


@dataclass(frozen=True)
class Capture:
    """One rank's step captured and annotated: the graph, a row per GEMM (on the graph's
    nodes too), the ops with FLOPs and no handler, the layer stacks traced once (empty: every
    layer traced) and what the capture notes (the layers traced)."""

    graph_module: torch.fx.GraphModule
    rows: tuple
    unsupported: tuple
    stacks: tuple
    notes: tuple


def _args(model, setup, sizes, spec, dkey, kv, quant) -> _Annotating:
    """What ``_annotated`` is given besides the target, from the setup."""
    w, plan = setup.workload, setup.parallel
    return _Annotating(w.example_inputs, w.example_kwargs, sizes, spec, dkey, plan.tp, model,
                       w.moe_routing, setup.kernels.attention, kv, plan.cp,
                       (plan.ep, plan.capacity_factor), quant,
                       setup.kernels.gemv or "library")


def capture_step(model, setup, *, sizes: dict, spec, dkey: str, kv=(None, None), stacks=(),
                 cache=None, quant=None) -> Capture:
    """Capture and annotate one rank's step of ``model`` under ``setup`` (``sizes``: the
    synthesized inputs' sizes and ``train``, as ``fxshape.capture`` takes them), one layer
    per group of ``stacks`` where a reduced copy with two per group shows the layers repeat
    (``fxshape.tracing.dedup``), else every layer. ``cache``: a plan search's, where the
    verdict that the layers repeat is kept per model and tp. ``quant``: the low precision
    the linear layers run in (:func:`annotate`)."""
    w, tp = setup.workload, setup.parallel.tp
    mode = "inference" if w.run_mode == "prefill" else w.run_mode
    args = _args(model, setup, sizes, spec, dkey, kv, quant)
    stacks, notes = list(stacks), []
    if stacks:
        key = structure_key(model, stacks, mode, tp, _shapes(w.example_inputs),
                            _shapes(w.example_kwargs), w.batch_size, w.seq_len)
        why = _CHECKED.get(key)
        # a plan search checks a model's layers once per tp: the micro-batch and the
        # context split change the sizes, not whether the layers repeat
        sound = ("sound", id(model), mode, tp)
        if why is None and cache is not None and cache.get(sound):
            why = ""
        try:
            if not why:  # unchecked (None) or checked and sound ("")
                gm, rows, unsupported = _annotated(reduced_model(model, stacks, 1), args)
            if why is None:
                # one layer per group, checked against two per group: the work outside the
                # stacks must not change and a group's second layer must repeat its first
                _, rows2, _ = _annotated(reduced_model(model, stacks, 2), args)
                why = check_reduction(rows, rows2, stacks)
        except CaptureError as exc:
            why = "the model with fewer layers did not capture (" + \
                str(exc).splitlines()[1].strip()[:200] + ")"
        # the verdict holds for models that differ only outside their layers (advise and
        # sweep candidates): checked once per structure
        _CHECKED[key] = why
        if cache is not None and not why:
            cache[sound] = True
        if why:
            notes.append(f"traced every layer: {why}")
            stacks = []
        else:
            notes.append("traced one layer per group of identical layers (checked against "
                         "two): " + "; ".join(f"{s.name}: {len(s.groups)} of {s.length}"
                                              for s in stacks))
    if not stacks:
        gm, rows, unsupported = _annotated(model, args)
    if tp > 1 and not sharded_modules(rows):
        raise PlanRefused(f"tp={tp}: no layer of {type(model).__name__} is tensor-parallel "
                          "(fxshape splits attention and MLP projections it knows by name: "
                          "q_proj, c_attn, up_proj, down_proj ...; "
                          "fxshape.analysis.parallel), so every GPU would run the whole "
                          "model: use tp=1", "tp: no tensor-parallel layer")
    return Capture(graph_module=gm, rows=tuple(rows), unsupported=tuple(unsupported),
                   stacks=tuple(stacks), notes=tuple(notes))


def provenance_rows(capture: Capture, model, setup, *, sizes: dict, spec, dkey: str,
                    kv=(None, None), quant=None) -> tuple:
    """The capture's rows with what sets each dimension decided as ``setup.provenance``
    says (``fxshape.analysis.provenance``, ``fxshape.analysis.perturb``), and the notes
    that adds: ``(rows, notes)``."""
    gm, rows = capture.graph_module, capture.rows
    if setup.provenance == "traced":
        args = _args(model, setup, sizes, spec, dkey, kv, quant)
        rows, notes = _with_traced_provenance(gm, rows, model, args, list(capture.stacks))
        return tuple(rows), tuple(notes)
    if setup.provenance is None:
        return tuple(_replaced(gm, rows, [{"set_by": ()}] * len(rows))), ()
    return rows, ()
