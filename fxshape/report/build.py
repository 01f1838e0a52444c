"""``analyze``: setup -> capture -> execute -> report.

The keywords become a :class:`fxshape.Setup` (``fxshape.config.setup``, the one
translation); the setup is checked against the model (:func:`_checked`); the model is
captured and annotated (``fxshape.analysis.annotate.capture_step``: one rank's graph, a row
per GEMM) and its op records, liveness walk and step notes computed
(``fxshape.execution``), once per capture key among the analyses that share a
:class:`SharedCaptures` (a plan search's);
the step and memory are executed under the plan (:func:`_costed`); the
:class:`~fxshape.report.report.Report` is built, its low-precision rows finished, its
error band and options said. A decode step goes through ``fxshape.execution.decode``, which
wraps the model with its KV cache and runs the same body.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from dataclasses import dataclass

import torch

from ..analysis import lowprec
from ..analysis.annotate import (Capture, capture_step, check_attention, provenance_rows,
                                 rank_seq_len)
from ..analysis.parallel import check_tp
from ..analysis.rows import WorkloadRecord
from ..cost.gemm import is_default_params
from ..execution.memory import Liveness
from ..execution.execute import (checkpointed_layers, executed_step, gpu_memory,
                                 liveness_walk, param_groups, param_shards, records_of,
                                 stack_layers, topology_of)
from ..hardware.dtypes import canonical_dtype
from ..hardware.gpus import get_gpu
from ..parallelism.plan import PlanRefused
from ..tracing.configs import check_config
from ..tracing.dedup import expand_rows, find_stacks
from ..tracing.export import (DEFAULT_BATCH_SIZE, check_module, forward_arguments,
                              is_hf_model)
from ..tracing.facts import head_counts, hidden_size, input_embedding, routed_experts

__all__ = ["analyze", "SharedCaptures"]


class SharedCaptures:
    """Analyses of one model that share its captures (``fxshape.planning``'s plan search):
    each capture (graph, rows, op records, liveness walk) kept by everything it depends on
    (``Setup.capture_key``), so that setups sharing one rank's shapes (tp, cp, ep,
    micro-batch) capture it once and only re-cost it; the model's layer stacks and the
    verdicts that one layer stands for its group, found once.

    ``shared``: entries of an earlier ``SharedCaptures`` of the same model to start from
    (:meth:`model_facts`: what holds for every capture of it)."""

    def __init__(self, shared: dict | None = None):
        self.entries: dict = dict(shared or {})

    def analyze(self, model, setup):
        """``fxshape.analyze(model, setup=setup)`` (a ``Report``), its capture shared."""
        return _run(model, _as_setup(setup), cache=self.entries)

    def model_facts(self) -> dict:
        """What holds for every capture of the model (its layer stacks, the layer-reduction
        verdicts), to start another ``SharedCaptures`` of it with."""
        return {k: v for k, v in self.entries.items()
                if isinstance(k, tuple) and k and k[0] in ("stacks", "sound")}


def analyze(model, example_inputs=None, example_kwargs=None, *, setup=None, **keywords):
    """Capture ``model`` and predict every GEMM in it, and the step it adds up to.

    Args:
        model: an ``nn.Module`` (real or meta parameters; never modified).
        example_inputs, example_kwargs: forward arguments; synthesized for Hugging Face models
            (see ``fxshape.tracing.export.example_inputs_for``).
        setup: what to predict, a :class:`fxshape.Setup` (its workload, plan, machine and
            kernels); default ``Setup()``. The keywords change its fields.
        **keywords: each a field of the setup, by name (``fxshape.config.setup.KEYWORDS``):

{KEYWORDS}

    Returns:
        A :class:`fxshape.report.report.Report`.
    """
    setup = _as_setup(setup)
    if keywords:
        setup = setup.replace(**keywords)
    if example_inputs is not None or example_kwargs is not None:
        setup = setup.replace(example_inputs=example_inputs, example_kwargs=example_kwargs)
    return _run(model, setup)


def _as_setup(setup):
    from ..config.setup import Setup

    if setup is None:
        return Setup()
    if not isinstance(setup, Setup):
        raise TypeError(f"setup must be a fxshape.Setup (Setup.from_keywords(...) builds one), "
                        f"got {type(setup).__name__}")
    return setup


def _run(model, setup, cache=None):
    """``analyze``'s body: the setup checked against the model, captured and costed (a
    decode step, or the other modes), its low-precision rows and its options said.
    ``cache``: a :class:`SharedCaptures`' entries, or None."""
    from ..execution.quantized import float8_parts, quantized_parts
    from .options import given_options, option_effects
    from .report import Report

    k = setup.kernels
    ctx: dict = {"plan": setup.parallel, "gemv": k.gemv or "library"}
    mode = setup.workload.run_mode
    quant = lowprec.check_quantize(k.quantize, k.group_size, mode, k.dtype, setup.machine.gpu)
    state = None if quant is None else lowprec.QuantState(
        quant, lowprec.quant_keep(model, quant, input_embedding(model)[1]))
    if k.float8 is not None:
        lowprec.check_float8(k.float8, mode, k.dtype, setup.machine.gpu, k.execution)
        state = lowprec.float8_state(model, k.float8, setup.parallel)
    if mode == "decode":
        from ..execution.decode import analyze_decode

        parts = analyze_decode(model, setup, ctx=ctx, quant=state,
                               run=functools.partial(_with_params, cache=cache))
    else:
        parts = _with_params(model, setup.replace(execution=k.execution or "eager"),
                             ctx=ctx, quant=state, cache=cache)
    if isinstance(state, lowprec.Float8State):
        parts = float8_parts(parts, state)
        ctx["quant_left"] = state.left
    elif state is not None:
        parts = quantized_parts(parts, state, model)
        ctx["quant_left"] = state.left
    given = given_options(parts, ctx, setup, quant)
    parts = dataclasses.replace(parts, workload=dataclasses.replace(
        parts.workload, gemv=k.gemv or "library", mode_default=setup.workload.mode is None))
    parts = _with_error_band(parts, low_precision=state is not None)
    return Report.of(parts, option_effects(parts, given, ctx), setup)  # built once


def _keyword_docs() -> str:
    """analyze's keywords, each with its field's help text, for its docstring."""
    import textwrap

    from ..config.setup import keyword_docs

    return "\n".join(textwrap.fill(f"{name}: {doc}", 88, initial_indent=" " * 12,
                                    subsequent_indent=" " * 16)
                      for name, doc in keyword_docs().items()
                      if name not in ("example_inputs", "example_kwargs"))


def _spelt_out():
    from ..config.setup import signature_with_keywords

    analyze.__doc__ = analyze.__doc__.replace("{KEYWORDS}", _keyword_docs())
    analyze.__signature__ = signature_with_keywords(analyze)


_spelt_out()


def _with_error_band(parts, low_precision: bool):
    """The parts with ``step.error_band`` from the held-out validation of the step's GPU
    and regime (``fxshape.hardware.validation``), and a note saying it, or saying there is
    none."""
    from ..hardware.validation import REGIMES, error_band, step_regime

    step = parts.step
    if step is None:
        return parts
    spec = get_gpu(parts.gpu)
    dkey = canonical_dtype(parts.dtype)
    band = missing = None
    if low_precision or dkey in ("fp8", "tf32"):
        what = "quantized or FP8" if low_precision or dkey == "fp8" else "TF32"
        missing = f"whole-step measurement of {what} runs"
    else:
        regime = step_regime(step.mode, dkey, step.execution)
        band = error_band(spec, regime)
        if band is None:
            missing = f"measurement of {REGIMES[regime]}"
    note = (f"step {band.describe()}" if band is not None else
            f"unvalidated: no held-out {missing} on {spec.name}; the step's expected error "
            "is unknown (fxshape gpus lists what is validated)")
    return dataclasses.replace(parts, step=dataclasses.replace(step, error_band=band),
                               notes=parts.notes + (note,))


def _with_params(model, setup, *, kv=(None, None), ctx=None, quant=None, cache=None):
    """``_analyze``, the constants of ``setup.machine.params`` named in the notes when they
    are not the packaged ones (the cost models read them from the machine's GPU,
    ``GPUSpec.constants``): the report's parts (``ReportParts``). ``ctx`` (a dict) gets
    what ``fxshape.report.options`` needs."""
    ctx = {} if ctx is None else ctx
    parts = _analyze(model, setup, kv=kv, ctx=ctx, quant=quant, cache=cache)
    path = setup.machine.spec.constants
    ctx["params_path"] = path
    ctx["params_cover_gpu"] = _params_cover(path, parts.gpu)
    if not is_default_params(path):
        parts = dataclasses.replace(parts, notes=parts.notes + (
            f"GEMM model constants from {path} (over the packaged ones)",))
    return parts


def _params_cover(path, gpu) -> bool:
    """Does the parameter file ``path`` hold GEMM constants of its own for ``gpu`` (its
    name, the GPU its family borrows from, or its family)?"""
    from ..cost.gemm import constants_source
    from ..cost.paramfile import read_json

    if is_default_params(path):
        return True
    user = read_json(path, "fxshape parameter file")
    spec = get_gpu(gpu)
    for sec in (user, user.get("fp32") or {}):
        if not isinstance(sec, dict):
            continue
        names = sec.get("gpus") or {}
        if spec.name in names or constants_source(spec, path) in names or \
                spec.arch in (sec.get("families") or {}):
            return True
    return False


def _analyze(model, setup, *, kv=(None, None), ctx=None, quant=None, cache=None):
    """A prefill, inference or training step of ``model`` under ``setup`` (its execution
    given): checked, captured (once per capture key within a plan search), costed.
    ``quant``: the low precision its linear layers run in (``analysis.lowprec``: a
    ``QuantState`` or ``Float8State``, made from the setup and the model in ``_run``)."""
    checked = _checked(model, setup, cache)
    ckey = None
    w = setup.workload
    if cache is not None and w.example_inputs is None and w.example_kwargs is None:
        # everything the capture depends on: the setup's fields marked so
        ckey = (id(model), kv) + setup.capture_key()
    got = cache.get(ckey) if ckey is not None else None
    if got is None:
        got = _executed(model, setup, checked, kv, cache, quant)
        if ckey is not None:
            cache[ckey] = got
    return _costed(model, setup, checked, got, kv, ctx, cache, ckey, quant)


@dataclass(frozen=True)
class _Checked:
    """What checking the setup against the model found: the GPU, the dtype, the machine,
    every layer stack, the sizes one rank captures, the notes so far."""

    spec: object
    dkey: str
    topology: object
    stacks: tuple
    sizes: dict
    notes: tuple

    @property
    def reducible(self) -> list:
        """The stacks with fewer groups than layers: what dedup traces one layer of."""
        return [s for s in self.stacks if len(s.groups) < s.length]


def _checked(model, setup, cache=None) -> _Checked:
    """The setup against the model: a module, its config, its heads for tp, the GPU's dtype,
    the attention kernel, the plan against its layers and the machine, its experts for
    ep."""
    from ..parallelism.plan import check_plan

    w, m, plan = setup.workload, setup.machine, setup.parallel
    tp = plan.tp
    check_module(model)
    if is_hf_model(model):
        check_config(model.config)
    heads, kv_heads = head_counts(model)
    check_tp(tp, heads, kv_heads)
    spec = m.spec
    dkey = canonical_dtype(setup.kernels.dtype)
    spec.peak_tflops(dkey)  # fail before capturing
    check_attention(setup.kernels.attention, spec, dkey)
    topo = topology_of(m.topology, spec)
    if cache is not None:  # a plan search: the model's layer stacks found once
        if ("stacks", id(model)) not in cache:
            cache[("stacks", id(model))] = find_stacks(model)
        all_stacks = cache[("stacks", id(model))]
    else:
        all_stacks = find_stacks(model)
    n_layers = max((s.length for s in all_stacks), default=0)
    check_plan(plan, layers=n_layers or None, topology=topo)
    if plan.ep > 1:
        from ..parallelism.experts import check_ep

        experts = routed_experts(model)
        if not experts:
            raise PlanRefused(f"ep={plan.ep} spreads MoE experts over ranks, but "
                              f"{type(model).__name__} has no routed experts in its config "
                              "(num_local_experts, n_routed_experts, num_experts): use ep=1",
                              "ep without routed experts")
        check_ep(plan.ep, experts)
    sizes = dict(batch_size=w.batch_size,
                 seq_len=rank_seq_len(model, w.example_inputs, w.example_kwargs, w.seq_len,
                                      plan.cp),
                 train=w.run_mode == "train")
    notes = ()
    if heads and kv_heads and kv_heads < heads and tp > kv_heads:
        notes = (f"tp {tp} > {kv_heads} KV heads: each GPU holds one whole KV head "
                 f"(K/V projections and KV cache replicated {tp // kv_heads}x), as "
                 "Megatron and the serving engines do",)
    return _Checked(spec=spec, dkey=dkey, topology=topo, stacks=tuple(all_stacks),
                    sizes=sizes, notes=notes)


@dataclass(frozen=True)
class _Executed:
    """One capture and what every plan sharing it re-costs: its op records, those it could
    not price, the step's notes so far and the liveness walk."""

    capture: Capture
    records: tuple
    op_unsupported: tuple
    step_notes: tuple
    walk: Liveness


def _executed(model, setup, checked: _Checked, kv, cache, quant) -> _Executed:
    """Capture and annotate one rank's step, then its op records (at the sustained clock
    in training; with the ring's and the all-to-all's records under cp and ep) and its
    liveness walk."""
    plan, k = setup.parallel, setup.kernels
    spec, dkey, topo, tp = checked.spec, checked.dkey, checked.topology, plan.tp
    mode = "inference" if setup.workload.run_mode == "prefill" else setup.workload.run_mode
    cap = capture_step(model, setup, sizes=checked.sizes, spec=spec, dkey=dkey, kv=kv,
                       stacks=checked.reducible if setup.dedup else [], cache=cache,
                       quant=quant)
    gm, rows = cap.graph_module, cap.rows
    records, op_unsupported, step_notes = records_of(gm, rows, model, spec, dkey, k.execution)
    if mode == "train":  # a long job: its dense kernels at the power-limited clock
        from ..execution.step import sustained_records

        records, clock_note = sustained_records(records, rows, spec, dkey)
        step_notes = tuple(step_notes) + (clock_note,)
    if plan.cp > 1:
        from ..execution.ring import ring_records
        from ..execution.step import run_dtype

        records, ring_note = ring_records(records, rows, cp=plan.cp, tp=tp, topology=topo,
                                          item=run_dtype(dkey).itemsize, dkey=dkey, spec=spec)
        step_notes = tuple(step_notes) + (ring_note,)
    if plan.ep > 1:
        from ..execution.experts import all_to_all_records
        from ..execution.step import run_dtype

        records, a2a_note = all_to_all_records(records, rows, ep=plan.ep, tp=tp,
                                               topology=topo, item=run_dtype(dkey).itemsize,
                                               hidden=hidden_size(model))
        step_notes = tuple(step_notes) + (a2a_note,)
    walk = liveness_walk(gm, dkey, mode, rows, tp, plan.sequence_parallel,
                         unfused=k.attention == "math", grad_bytes=plan.grad_bytes,
                         vocab=getattr(getattr(model, "config", None), "vocab_size", None))
    return _Executed(capture=cap, records=records, op_unsupported=tuple(op_unsupported),
                     step_notes=tuple(step_notes), walk=walk)


def _costed(model, setup, checked: _Checked, got: _Executed, kv, ctx, cache, ckey, quant):
    """The captured step executed under the setup's plan, recomputation and optimizer: its
    provenance decided, its layers expanded, its step and memory, the report."""
    from ..execution.parts import ReportParts

    w, k, plan = setup.workload, setup.kernels, setup.parallel
    shown, mode = w.run_mode, ("inference" if w.run_mode == "prefill" else w.run_mode)
    tp, recompute, provenance = plan.tp, plan.recompute, setup.provenance
    spec, dkey, all_stacks = checked.spec, checked.dkey, checked.stacks
    cap = got.capture
    gm, stacks = cap.graph_module, list(cap.stacks)
    notes = list(checked.notes) + list(cap.notes)
    if ctx is not None:
        from ..cost.attention import resolve_kernel

        # dedup=False has an effect where dedup=True would have traced fewer layers
        ctx.update(stacks=bool(stacks if setup.dedup else checked.reducible),
                   flash_kernel=resolve_kernel("flash", spec, dkey, 128)[0],
                   attention_kernel=resolve_kernel(k.attention, spec, dkey, 128)[0])
    if w.moe_routing is not None and not any(r.op.startswith("grouped") for r in cap.rows):
        raise ValueError("moe_routing was given, but the model has no MoE expert layers "
                         "(grouped expert GEMMs) to route")
    rows, traced_notes = provenance_rows(cap, model, setup, sizes=checked.sizes, spec=spec,
                                         dkey=dkey, kv=kv, quant=quant)
    notes.extend(traced_notes)
    # what follows depends on the capture, the recomputation and the provenance, not on the
    # rest of the plan: within a plan search (a capture cache), computed once per capture
    memo = cache.setdefault(("derived", ckey), {}) \
        if ckey is not None and provenance != "traced" else {}
    prepared = memo.get(("prepared", recompute, provenance))
    if prepared is None:
        prepared = _prepared(model, gm, rows, got.records, got.walk, stacks, all_stacks,
                             got.step_notes, w.example_inputs, w.example_kwargs,
                             batch_size=w.batch_size, seq_len=w.seq_len, mode=mode,
                             shown=shown, tp=tp, attention=k.attention, recompute=recompute,
                             memo=memo.setdefault(("expanded", provenance), {}))
        memo[("prepared", recompute, provenance)] = prepared
    rows, records, walk, workload, step_notes = (prepared.rows, prepared.records,
                                                 prepared.walk, prepared.workload,
                                                 prepared.step_notes)
    saved_traced, layers, selective = (prepared.saved_traced, prepared.layers,
                                       prepared.selective)
    if mode == "train":
        workload = dataclasses.replace(workload,
                                       parallel="" if plan.is_plain and
                                       plan.grad_dtype == "fp32" else plan.describe(),
                                       microbatches=plan.microbatches, dp=plan.dp)
    if "shards" not in memo:  # the step's and the memory's
        memo["shards"] = param_shards(model, tp, rows, head_counts(model), plan.ep)
    shards = memo["shards"]
    # the plan's parameters by stage and FSDP unit, for the step and the memory of a plan
    # played out (or selective recomputation's memory): computed once
    groups = None
    if mode == "train" and (not plan.is_plain or selective):
        split = ("groups", plan.stages, plan.stage_layers)
        if split not in memo:
            memo[split] = param_groups(model, shards, all_stacks, plan)
        groups = memo[split]
    step, records = executed_step(records, model, spec, dkey, mode, tp, k.execution,
                                  k.optimizer, workload, step_notes, dp=plan.dp,
                                  topology=checked.topology,
                                  sequence_parallel=plan.sequence_parallel, shards=shards,
                                  plan=plan, stacks=all_stacks, groups=groups,
                                  allreduce=k.allreduce, quant=quant,
                                  memo=memo.setdefault(("step", recompute, provenance,
                                                        k.optimizer, k.allreduce), {}))
    step = dataclasses.replace(step, mode=shown)
    memory = gpu_memory(model, walk, saved_traced, spec, dkey, mode, tp, k.optimizer, layers,
                        workload, shards=shards, sequence_parallel=plan.sequence_parallel,
                        plan=plan, stacks=all_stacks, groups=groups,
                        dropped=selective["dropped"] if selective else (),
                        rerun=bool(selective and selective.get("rerun")),
                        memo=memo.setdefault(("memory", recompute, provenance), {}))
    return ReportParts(rows=tuple(rows), unsupported=tuple(cap.unsupported), gpu=spec.label,
                       dtype=dkey, model_name=type(model).__name__, graph_module=gm,
                       notes=tuple(notes), workload=workload, ops=tuple(records), step=step,
                       unsupported_ops=tuple(got.op_unsupported), memory=memory)


@dataclass(frozen=True)
class _Prepared:
    """The captured rows, op records and liveness walk with the deduplicated layers
    expanded and the recomputation applied: the bytes the traced layers saved (before the
    expansion), the workload, the checkpointed layers, selective recomputation's nodes
    and the step's notes."""

    rows: tuple
    records: tuple
    walk: Liveness
    saved_traced: int
    workload: WorkloadRecord
    layers: tuple
    selective: object
    step_notes: tuple


def _prepared(model, gm, rows, records, walk, stacks, all_stacks, step_notes,
              example_inputs, example_kwargs, *, batch_size, seq_len, mode, shown, tp,
              attention, recompute, memo=None) -> _Prepared:
    """The captured rows, records and liveness walk with the deduplicated layers expanded,
    the recomputation applied, and the workload. ``memo``: the expansion and the workload
    kept for the capture's other recomputations."""
    memo = {} if memo is None else memo
    if "expanded" not in memo:
        saved_traced = sum(b.bytes for b in walk.saved)
        if stacks:
            rows = expand_rows(rows, stacks)
            records = expand_rows(records, stacks)
            walk = dataclasses.replace(walk, saved=tuple(expand_rows(walk.saved, stacks)))
        workload = _workload(model, example_inputs, example_kwargs, batch_size=batch_size,
                             seq_len=seq_len, mode=shown, tp=tp, attention=attention,
                             rows=rows)
        # the expansion alone, shared by the capture's recomputations (none applied yet)
        memo["expanded"] = _Prepared(rows, records, walk, saved_traced, workload, (), (), ())
    got = memo["expanded"]
    rows, records, walk, workload = got.rows, got.records, got.walk, got.workload
    layers = checkpointed_layers(model) if mode == "train" else ()
    stacked = stack_layers(all_stacks) if recompute else ()
    if recompute and not stacked:
        what = "forward" if recompute == "full" else "attention core"
        raise PlanRefused(f"recompute={recompute!r} re-runs each layer's {what} in its "
                          f"backward, but {type(model).__name__} has no stack of repeated "
                          "layers", "recompute without a stack of repeated layers")
    if recompute == "full":
        layers = stacked
    selective = ()
    if layers:
        from ..execution.step import recompute_records

        records = recompute_records(records, layers)
        step_notes = tuple(step_notes) + (
            f"activation checkpointing: each of {len(layers)} layers recomputes its forward "
            "in the backward (not counted in the model FLOPs)",)
    elif recompute in ("op", "selective"):
        from ..execution.step import op_checkpoint_nodes, recompute_records, selective_nodes

        selective = op_checkpoint_nodes(records, stacked) if recompute == "op" else \
            selective_nodes(records, gm)
        records = recompute_records(records, stacked,
                                    select=lambda r: r.node in selective["all"])
        step_notes = tuple(step_notes) + (_RECOMPUTE_NOTES[recompute],)
    return _Prepared(rows, records, walk, got.saved_traced, workload, layers,
                     selective, tuple(step_notes))


#: the step's note of each selective recomputation
_RECOMPUTE_NOTES = {
    "op": "op-level selective checkpointing (torchtitan's selective_ac_option='op'): each "
          "layer's every second matmul (torch.ops.aten.mm, counted in its forward) and its "
          "memory-bound ops run again in its backward; the attention kernel's and the other "
          "matmuls' outputs are saved",
    "selective": "selective recomputation (Megatron): each layer's attention core (QKᵀ, "
                 "softmax, dropout, the product with V) runs again in its backward; its saved "
                 "intermediates are not kept"}


def _workload(model, example_inputs, example_kwargs, *, batch_size, seq_len, mode, tp,
              attention, rows) -> WorkloadRecord:
    """What the report describes: the forward's tensor inputs as captured, the synthesized
    sizes, mode, tp and the attention kernel (asked for, and what the rows ran as)."""
    args, kwargs = forward_arguments(model, example_inputs, example_kwargs,
                                     batch_size=batch_size, seq_len=seq_len)
    try:
        params = [p for p in inspect.signature(model.forward).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        names = [p.name for p in params]
    except (TypeError, ValueError):
        names = []
    names += [f"input {i}" for i in range(len(names), len(args))]
    inputs = []

    def add(name, v):
        if isinstance(v, torch.Tensor):
            inputs.append((name, tuple(v.shape), str(v.dtype).replace("torch.", "")))
        elif isinstance(v, (list, tuple)):
            for i, x in enumerate(v):
                add(f"{name}[{i}]", x)
        elif isinstance(v, dict):
            for k, x in v.items():
                add(f"{name}[{k!r}]", x)

    for name, v in list(zip(names, args)) + list(kwargs.items()):
        add(name, v)
    synthesized = example_inputs is None and example_kwargs is None
    b = s = None
    if synthesized:
        b = DEFAULT_BATCH_SIZE if batch_size is None else batch_size
        ids = kwargs.get("input_ids", kwargs.get("decoder_input_ids"))
        s = ids.shape[1] if isinstance(ids, torch.Tensor) and ids.dim() == 2 else None
    return WorkloadRecord(mode=mode, inputs=tuple(inputs), batch_size=b, seq_len=s,
                    seq_len_default=synthesized and seq_len is None and s is not None, tp=tp,
                    attention=attention, kernels=tuple(sorted({r.kernel for r in rows
                                                               if r.kernel})))
