"""A captured step executed under its setup: the liveness walk and memory (one GPU, or the
most loaded one under a plan), each tensor and parameter at its per-GPU size, the op
records and the step (one GPU's timeline, or a plan's stages and micro-batches). Moved out of
``fxshape.analysis.annotate`` (issue 53), which captures and annotates; ``analyze``
(``fxshape.report.build``) calls these on what it captured.
"""

from __future__ import annotations

import dataclasses

import torch

from ..analysis.parallel import kv_shard
from ..hardware.gpus import get_gpu
from ..parallelism.experts import sharded_share
from ..parallelism.plan import chunk_of_layer, layer_chunks, stage_layer_counts
from ..tracing.dedup import find_stacks
from ..tracing.export import module_of
from ..tracing.facts import (expert_params, hidden_size, linear_features,
                             tied_embedding_elements)
from .quantized import float8_gather

__all__ = ["liveness_walk", "param_shards", "stack_layers", "checkpointed_layers",
           "gpu_memory", "records_of", "topology_of", "executed_step", "param_groups"]


def liveness_walk(gm, dkey, mode, rows=(), tp=1, sequence_parallel=False, unfused=False,
              vocab=None, grad_bytes=4):
    """The eager liveness walk of the captured graph (``fxshape.execution.memory.liveness``:
    a ``Liveness``),
    each tensor at its per-GPU size under tensor parallelism (:func:`_activation_shares`).
    In training, the attention calls that run unfused (``unfused``: the user's
    ``attention="math"``; "flash" falls back to the math path in the time model where no
    fused kernel takes a call, fp32 on sm80+, but PyTorch's memory-efficient kernel, which
    keeps no probabilities, takes fp32) save their probabilities too
    (``fxshape.execution.memory.unfused_attention_saved``): alive from their forward to the
    backward, so counted in the walk's peak, at the backward's start and in what is saved.
    So does the cross-entropy that replaces the capture's sum (``fxshape.execution.memory.
    loss_saved``): its fp32 log-probabilities saved, its two logits-sized gradients at the
    start of the backward."""
    from .memory import SavedBytes, liveness, loss_saved, unfused_attention_saved
    from ..analysis.opcost import Sizes
    from .step import attribute_modules, loss_of, model_float_dtype, run_dtype

    sizes = Sizes(model_float_dtype(gm), run_dtype(dkey))
    grad_item = grad_bytes if mode == "train" else None  # the plan's gradient dtype
    owner = attribute_modules(gm, module_of)
    share = _activation_shares(gm, rows, owner, tp, sequence_parallel) if tp > 1 else None
    walk = liveness(gm, sizes, owner=owner, grad_itemsize=grad_item, share=share)
    if mode != "train" or walk.at_backward is None:
        return walk
    probs = unfused_attention_saved(gm, owner, run_dtype(dkey).itemsize, share=share) \
        if unfused else []
    more = sum(b.bytes for b in probs)
    walk = walk.with_saved(probs, peak=walk.peak + more, at_backward=walk.at_backward + more)
    loss = loss_of(gm, vocab, sizes)
    if loss is None:
        return walk
    kept, grads = loss_saved(loss[1].numel(), tp)
    record = SavedBytes(loss[0] + "#log_probs", owner.get(loss[0], ""), "forward", kept)
    return walk.with_saved((record,), peak=max(walk.peak + kept,
                                               walk.at_backward + kept + grads),
                           at_backward=walk.at_backward + kept)


def _activation_shares(gm, rows, owner, tp, sequence_parallel) -> dict:
    """node -> the ``tp`` ways its output is split across the GPUs (Megatron, as counted by
    Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
    Models", sec. 4): the outputs of column-parallel GEMMs and everything inside a
    tensor-parallel attention or MLP block (its heads, its MLP columns) are split; a
    row-parallel GEMM's output (a partial sum, all-reduced whole), the norms, residuals and
    embeddings are whole on every GPU, unless ``sequence_parallel`` splits them along the
    sequence too."""
    from ..analysis.parallel import in_blocks, sharded_modules, tp_blocks

    kinds = sharded_modules(rows)
    blocks = tp_blocks(kinds)
    node_kind = {r.node: kinds.get(r.module) for r in rows}
    out = {}
    for n in gm.graph.nodes:
        kind = node_kind.get(n.name)
        if kind == "column" or sequence_parallel:
            out[n.name] = tp
        elif kind != "row" and in_blocks(owner.get(n.name, ""), blocks):
            out[n.name] = tp
    return out


def param_shards(model, tp, rows=(), heads=(None, None), ep=1) -> list:
    """``(elements on each GPU, is a matrix, is trained)`` per parameter (tied weights once,
    as ``model.parameters()`` gives them). At ``tp`` > 1, Megatron splits what tensor
    parallelism splits in ``rows``: a column-parallel layer's weight and bias (a K/V
    projection by whole KV heads, :func:`fxshape.analysis.parallel.kv_shard`), a
    row-parallel layer's weight (its bias is whole), and the vocabulary-parallel input
    embedding; everything else (norms, position embeddings, layers it does not know) is
    replicated, as its GEMMs are. With expert parallelism (``ep`` > 1) each GPU holds
    ``1 / ep`` of every expert tensor (``fxshape.tracing.facts.expert_params``)."""
    params = list(model.parameters())
    experts = expert_params(model) if ep > 1 else set()
    if tp == 1:
        return [(p.numel() // (ep if id(p) in experts else 1), p.dim() >= 2, p.requires_grad)
                for p in params]
    from ..analysis.parallel import sharded_modules

    kinds = sharded_modules(rows)
    features = linear_features(model)
    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    owner: dict = {}
    for name, mod in model.named_modules():
        for p in mod.parameters(recurse=False):
            owner.setdefault(id(p), (name, mod))
    out = []
    for p in params:
        name, mod = owner.get(id(p), ("", None))
        kind, n = kinds.get(name), p.numel()
        if kind == "column":
            out_features = features.get(name, (None, None))[0]
            kv = kv_shard(name, out_features, tp, *heads) if out_features else None
            n = n * kv[0] // out_features if kv else n // tp
        elif kind == "row" and p.dim() >= 2:
            n //= tp
        elif isinstance(mod, torch.nn.Embedding) and p.dim() == 2 and p.shape[0] == vocab:
            n //= tp  # the vocabulary-parallel embedding
        if id(p) in experts:
            n //= ep
        out.append((n, p.dim() >= 2, p.requires_grad))
    return out






def stack_layers(stacks) -> tuple:
    """Every layer of ``stacks`` as a module prefix (``model.layers.3``)."""
    return tuple(f"{s.name}.{i}" for s in stacks for i in range(s.length))


def checkpointed_layers(model) -> tuple:
    """The layers a Hugging Face model checkpoints (``gradient_checkpointing_enable()``: each
    layer of its stack), as module prefixes; empty when it does not."""
    flagged = {name for name, m in model.named_modules()
               if getattr(m, "gradient_checkpointing", False) is True}
    if not flagged:  # (transformers' is_gradient_checkpointing, without its deprecation)
        return ()
    layers = stack_layers(find_stacks(model))
    # transformers flags each checkpointed layer (every_n_layers may skip some); a model
    # that flags only its stack's owner checkpoints every layer
    return tuple(x for x in layers if x in flagged) or tuple(layers)


def gpu_memory(model, walk, saved_traced, spec, dkey, mode, tp, optimizer, layers=(),
            workload=None, *, shards, sequence_parallel=False, plan=None, stacks=(),
            groups=None, dropped=(), rerun=False, memo=None):
    """``report.memory``: the parameters per GPU (``shards``: :func:`param_shards`, what tensor
    parallelism splits) and the liveness walk, its saved activations scaled from the traced
    layers to all of them. With activation checkpointing, a layer keeps only its input
    (tokens x hidden) until its backward, and one layer at a time holds its full
    activations again (its recomputation). ``dropped``: the graph nodes whose saved outputs
    selective recomputation frees; ``rerun``: one layer holds its dropped outputs again
    while its backward recomputes them (torchtitan's op-level policy)."""
    from .memory import memory_of
    from .step import run_dtype

    numels = [n for n, _, trainable in shards if mode != "train" or trainable]
    matrices = sum(n for n, matrix, _ in shards if matrix)
    peak_walk, at_backward, saved = walk.peak, walk.at_backward, walk.saved
    extra = sum(b.bytes for b in saved) - saved_traced  # the layers the trace stood for
    notes = ["eager liveness of the captured graph; the allocator's rounding and the CUDA "
             "context are not counted"]
    if tp > 1:
        notes.append(f"tp {tp}: the weights of tensor-parallel layers and the vocabulary "
                     "embedding split (K/V projections by whole KV heads), the rest "
                     "replicated; activations split inside the attention and MLP blocks"
                     + (" and, with sequence parallelism, outside them" if sequence_parallel
                        else ", norms and residuals whole"))
    item = run_dtype(dkey).itemsize
    train = mode == "train" and at_backward is not None
    if train and (not plan.is_plain or dropped):
        return _plan_memory(model, walk, spec, dkey, optimizer, layers, workload,
                            shards=shards, plan=plan, stacks=stacks, groups=groups,
                            dropped=dropped, rerun=rerun, notes=notes, memo=memo)
    if train and layers:
        per_layer: dict = {}
        for b in saved:
            lay = next((x for x in layers if b.module == x or b.module.startswith(x + ".")),
                       None)
            if lay is not None:
                per_layer[lay] = per_layer.get(lay, 0) + b.bytes
        kept = len(per_layer) * _layer_input_bytes(model, workload, run_dtype(dkey).itemsize) \
            // (tp if sequence_parallel else 1)
        freed = sum(per_layer.values()) - kept - max(per_layer.values(), default=0)
        if freed > 0:
            extra -= freed
            notes.append("activation checkpointing: each layer keeps its input; one layer "
                         "at a time holds its activations again")
    return memory_of(numels=numels, mode=mode, dkey=dkey, optimizer=optimizer, run_item=item,
                     capacity=int(spec.memory_gb * 1024 ** 3),
                     peak_walk=peak_walk + (extra if train else 0),
                     activations=(at_backward + extra) if train else peak_walk,
                     gemm_weight_numel=matrices, notes=tuple(notes),
                     grad_bytes=plan.grad_bytes if plan is not None else 4)


def _saved_by_layer(saved, stacks, dropped) -> tuple:
    """The activations one micro-batch saves for its backward: ``(by layer, [before the
    layers, after them], bytes recomputation frees, the most one layer frees)``."""
    from .pipeline import placed

    per_layer: dict = {}
    gone: dict = {}  # by layer: the saved bytes recomputation frees
    ends = [0, 0]
    for b, (i, end) in zip(saved, placed(((b.module, "forward") for b in saved),
                                         _stack_info(stacks), None, 2)):
        if b.node.split("@", 1)[0] in dropped:
            gone[i] = gone.get(i, 0) + b.bytes
        elif i is not None:
            per_layer[i] = per_layer.get(i, 0) + b.bytes
        else:
            ends[end] += b.bytes
    return (per_layer, ends, sum(gone.values()),
            max((v for k, v in gone.items() if k is not None), default=0))


def _state_notes(plan, dkey: str, item: int) -> tuple:
    """What ZeRO shards and the mixed precision the training state is held in."""
    z, sh = plan.zero, plan.shard
    out = []
    if z:
        out.append(f"ZeRO-{z}: " + ", ".join(
            w for w, on in (("fp32 master weights", z >= 3), ("gradients", z >= 2),
                            ("optimizer state", True)) if on)
            + f" sharded over {sh} GPUs" + ("; the gathered blocks in the compute dtype"
                                             if z == 3 else "")
            + (f"; the experts' over the {sh // plan.ep} of them that hold the same experts"
               if plan.ep > 1 else ""))
    out.append("mixed precision: fp32 master weights (4 bytes per parameter), "
               f"{plan.grad_dtype} gradients ({plan.grad_bytes}), the optimizer's fp32 "
               "state; compute copies in "
               f"{dkey} ({item} bytes)" if item < 4 else
               f"fp32 weights and optimizer state, {plan.grad_dtype} gradients")
    return tuple(out)


def _plan_memory(model, walk, spec, dkey, optimizer, layers, workload, *, shards, plan,
                 stacks, groups, dropped, notes, rerun=False, memo=None):
    """``report.memory`` of the most loaded GPU under ``plan``: each pipeline rank's
    parameters (its stages'), ZeRO's shards of the fp32 master weights, gradients and
    optimizer state, FSDP's gathered blocks, and the activations of the micro-batches its
    schedule holds in flight."""
    from ..parallelism.schedule import frozen_orders, in_flight, stages_of_rank
    from ..parallelism.state import training_state
    from .memory import Memory
    from .step import run_dtype

    item = run_dtype(dkey).itemsize
    peak_walk, at_backward, saved = walk.peak, walk.at_backward, walk.saved
    n_layers = max((s.length for s in stacks), default=0)
    stages = plan.stages
    chunk_of = layer_chunks(stage_layer_counts(plan, n_layers)) if n_layers else (0,)
    stage_params, unit_params, stage_experts, _ = groups
    total_params = sum(stage_params) or 1
    matrices = sum(n for n, matrix, trainable in shards if matrix and trainable)
    # the activations one micro-batch leaves for its backward, by virtual stage: by layer,
    # and outside the layers before them (the first stage) and after (the last)
    memo = {} if memo is None else memo
    if "saved" not in memo:
        memo["saved"] = _saved_by_layer(saved, stacks, dropped)
    per_layer, ends, dropped_bytes, layer_gone = memo["saved"]
    act = [0] * stages
    act[0] += ends[0]
    act[-1] += ends[1]
    for i, b in per_layer.items():
        act[chunk_of_layer(chunk_of, i)] += b
    if dropped_bytes and rerun:
        notes.append(f"op-level selective checkpointing: {dropped_bytes / 2**20:.1f} MiB of "
                     "saved outputs per micro-batch not kept; one layer at a time holds its "
                     f"{layer_gone / 2**20:.1f} MiB again in its backward")
    elif dropped_bytes:
        notes.append(f"selective recomputation: {dropped_bytes / 2**20:.1f} MiB of attention "
                     "intermediates per micro-batch not kept")
    if layers and per_layer:  # full recomputation: a layer keeps its input only
        kept = _layer_input_bytes(model, workload, item) // (
            plan.tp if plan.sequence_parallel else 1) // plan.cp
        for i, b in per_layer.items():
            act[chunk_of_layer(chunk_of, i)] -= max(0, b - kept)
        notes.append("activation checkpointing: each layer keeps its input; one layer at a "
                     "time holds its activations again")
    rerun = max(per_layer.values(), default=0) if layers else layer_gone if rerun else 0
    transient = max(0, peak_walk - (at_backward or 0))  # the backward's own temporaries
    p, v = plan.pp, plan.virtual_stages
    flight = in_flight(frozen_orders(plan.schedule, p, plan.microbatches, v)) \
        if p > 1 else [1]
    z, sh = plan.zero, plan.shard
    best = None
    for d in range(p):
        mine = stages_of_rank(plan.schedule, d, p, v)
        P = sum(stage_params[s] for s in mine)
        X = sum(stage_experts[s] for s in mine)

        def sharded(by):
            return sharded_share(P, X, by, plan.ep)

        st = training_state(sharded, optimizer=optimizer, grad_bytes=plan.grad_bytes,
                            zero=z, shard=sh)
        params, grads, state, opt_temp = (int(st.master), int(st.grads), int(st.state),
                                          int(st.temp))
        if z == 3:  # the gathered blocks: the one computing, the one prefetched, the root
            units = sorted((u for s in mine for k, u in unit_params[s].items()
                            if k is not None), reverse=True)
            roots = sum(unit_params[s][None] for s in mine)
            held = (sum(units) if not plan.reshard_after_forward else sum(units[:2]))
            copies = item * (held + roots)
        else:
            copies = item * matrices * P // total_params if item < 4 else 0
        chunk = sum(act[s] for s in mine) / v
        activations = int(chunk * flight[d]) + rerun
        # the optimizer's state is there from the first step on (fxshape.execution.memory)
        peak = max(params + state + copies + activations + transient,
                   params + grads + state + opt_temp)
        rec = (peak, d, params, grads, state, activations)
        if best is None or peak > best[0]:
            best = rec
    peak, d, params, grads, state, activations = best
    if p > 1:
        notes.append(f"the most loaded GPU: pipeline stage {d} of {p}, holding "
                     f"{flight[d]} micro-batch chunk(s) of activations in flight "
                     f"({plan.schedule_name})")
    notes.extend(_state_notes(plan, dkey, item))
    return Memory(parameters=params, gradients=grads, optimizer_state=state,
                  activations=activations, peak=peak,
                  capacity=int(spec.memory_gb * 1024 ** 3), notes=tuple(notes))


def records_of(gm, rows, model, spec, dkey, execution):
    """The step's op records of a captured graph (``fxshape.execution.step.op_records``)."""
    from .step import op_records

    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    return op_records(gm, rows, spec=spec, dkey=dkey, module_of=module_of,
                      vocab_size=vocab if isinstance(vocab, int) else None,
                      execution=execution)


def topology_of(topology, spec):
    """The topology given, or the GPU's usual machine (what the plan must fit:
    ``fxshape.parallelism.plan.check_plan``)."""
    from ..hardware.topology import topology_for

    return topology_for(spec, topology)


def executed_step(records, model, spec, dkey, mode, tp, execution, optimizer, workload, notes, *,
          dp=1, topology=None, sequence_parallel=False, shards, plan=None, stacks=(),
          groups=None, memo=None, allreduce=None, quant=None):
    """The step (``fxshape.execution.step.step_of``) with the optimizer's and the
    collectives' records added; returns (step, records). A plan with a pipeline, ZeRO or
    micro-batches is played out by ``fxshape.execution.pipeline.plan_step``. ``memo``: a
    dict kept across the plans of one capture (a plan search): what does not depend on the
    plan's pipeline, ZeRO stage and micro-batches is computed once in it."""
    from .pipeline import communication_of
    from .step import comm_records, optimizer_records, run_dtype, step_of

    notes = list(notes)
    records = list(records)
    numels = [n for n, _, trainable in shards if trainable]
    opt_records = []
    memo = {} if memo is None else memo
    if mode == "train":
        mixed = dkey not in ("fp32", "tf32", "fp64")
        if "optimizer" not in memo:
            memo["optimizer"] = optimizer_records(optimizer, numels, spec=spec, mixed=mixed)
        opt_records = memo["optimizer"]
        if mixed:
            notes.append(f"training in {dkey} with fp32 master weights (autocast): the "
                         "weight casts and the optimizer run in fp32")
    scaled = not plan.is_plain
    dp_records = dp if not scaled else 1
    kept = memo.get((scaled, dp_records))
    if kept is not None:
        records, added, dp_total = kept[:3]
        notes.extend(added)
    else:
        records, dp_total, before = list(records), 0.0, len(notes)
    if kept is None and not scaled:
        records += opt_records
    if kept is None and tp > 1:
        from .step import shard_memory_records

        records = shard_memory_records(records, tp, spec, sequence_parallel)
        notes.append(f"tp {tp}: GEMMs are sharded, and so are the memory-bound ops inside "
                     "the attention and MLP blocks (between their column- and row-parallel "
                     "layers); " + ("with sequence parallelism, the norms and residuals too"
                                    if sequence_parallel else "norms and residuals stay whole"))
    if kept is None and (tp > 1 or (dp_records > 1 and mode == "train")):
        item = run_dtype(dkey).itemsize
        grads = plan.grad_bytes * sum(numels) if mode == "train" else 0
        records, comm_notes, dp_total = comm_records(records, tp=tp, dp=dp_records,
                                                     topology=topology, item=item,
                                                     grad_bytes=grads,
                                                     sequence_parallel=sequence_parallel,
                                                     allreduce=allreduce, spec=spec,
                                                     async_tp=plan.async_tp)
        notes.extend(comm_notes)
    if kept is None:
        kept = memo[(scaled, dp_records)] = [records, notes[before:], dp_total, None]
    tokens = None
    if workload.batch_size is not None and workload.seq_len is not None:
        tokens = workload.batch_size * workload.seq_len
    else:
        ints = [s for _, s, d in workload.inputs if d.startswith("int") and len(s) == 2]
        tokens = ints[0][0] * ints[0][1] if ints else None
    if scaled:
        if kept[3] is None:  # the records grouped by layer and costed: once per capture
            from .pipeline import units_of

            kept[3] = units_of(records, _stack_info(stacks))
        return _plan_step(records, opt_records, model, spec, dkey, execution, optimizer,
                          tokens, notes, plan=plan, topology=topology, groups=groups,
                          stacks=stacks, workload=workload, units=kept[3], quant=quant), \
            records + ([r for r in opt_records if r.cls == "optimizer"] if plan.zero == 3
                       else opt_records)  # FSDP2 gathers in the compute dtype: no casts
    step = step_of(records, execution=execution, mode=mode, optimizer=optimizer, spec=spec,
                   dkey=dkey, tokens=tokens, notes=notes)
    colls = communication_of(records, tp)
    dp_rec = next((r for r in records if r.node == "dp.all_reduce"), None)
    if dp_rec is not None:
        from .pipeline import Collective

        exposed = max(0.0, dp_total - dp_rec.overlapped_s)
        colls.append(Collective("dp", "all_reduce", dp, dp_rec.bytes, dp_rec.kernels,
                                dp_total, exposed, max(0.0, dp_rec.time_s - exposed)))
    step = dataclasses.replace(step, communication=tuple(colls))
    if mode == "train" and dp > 1:
        step = dataclasses.replace(step, replicas=dp)
    return step, records


def _chunk_layers(plan, layers) -> str:
    """``"8"`` (equal chunks) or ``"15/16/16/16/16/16/16/15"`` (an uneven split)."""
    counts = stage_layer_counts(plan, layers)
    return str(counts[0]) if len(set(counts)) == 1 else "/".join(map(str, counts))


def param_groups(model, shards, stacks, plan):
    """``(elements per virtual stage, per stage {layer: elements, None: the rest}, expert
    elements per virtual stage, per stage {layer or None: expert elements})``: the trained
    parameters per GPU (``shards``) by pipeline stage and by FSDP unit (each layer, then the
    rest of the stage: ``fxshape.execution.pipeline``), in parameter order (the forward's,
    for a Hugging Face model); the expert-parallel experts' share of them (held by ``dp × cp
    / ep`` ranks, not ``dp × cp``) apart."""
    from .pipeline import placed

    layers = max((s.length for s in stacks), default=0)
    stages = plan.stages
    owner: dict = {}
    for name, mod in model.named_modules():
        for p in mod.parameters(recurse=False):
            owner.setdefault(id(p), name)
    experts = expert_params(model) if plan.ep > 1 else set()
    trained = [(p, n) for p, (n, _, trainable) in zip(model.parameters(), shards) if trainable]
    layer_units = [dict() for _ in range(stages)]
    layer_experts = [dict() for _ in range(stages)]
    root = [0] * stages
    chunk_of = layer_chunks(stage_layer_counts(plan, layers)) if layers else None
    where = placed(((owner.get(id(p), ""), "forward") for p, _ in trained),
                   _stack_info(stacks), chunk_of, stages)
    for (p, n), (i, s) in zip(trained, where):
        if i is None:
            root[s] += n
        else:
            layer_units[s][i] = layer_units[s].get(i, 0) + n
        if id(p) in experts:
            layer_experts[s][i] = layer_experts[s].get(i, 0) + n
    tied = tied_embedding_elements(model)
    if tied and stages > 1:  # Megatron keeps a copy of a tied embedding on the last stage
        root[-1] += tied // plan.tp
    units = [{**{k: u[k] for k in sorted(u)}, None: root[s]} for s, u in enumerate(layer_units)]
    return ([sum(u.values()) for u in units], units,
            [sum(e.values()) for e in layer_experts], layer_experts)






def _layer_input_bytes(model, workload, item) -> int:
    """One micro-batch's tokens x hidden in ``item`` bytes: what a checkpointed layer keeps
    (0 when the inputs were given, not synthesized)."""
    tokens = (workload.batch_size or 0) * (workload.seq_len or 0) if workload else 0
    return tokens * hidden_size(model) * item


def _stack_info(stacks) -> list:
    """``[(name, length)]`` of the layer stacks (``fxshape.execution.pipeline.layer_of``)."""
    return [(s.name, s.length) for s in stacks]


def _plan_step(records, opt_records, model, spec, dkey, execution, optimizer, tokens, notes,
               *, plan, topology, groups, stacks, workload, units=None, quant=None):
    """The Step of a plan with a pipeline, ZeRO or micro-batches
    (``fxshape.execution.pipeline.plan_step``)."""
    from .pipeline import plan_step
    from .step import Step, run_dtype

    item = run_dtype(dkey).itemsize
    stage_params, unit_params, stage_experts, unit_experts = groups
    b = workload.batch_size or 1
    seq = workload.seq_len or 1
    # one rank's activation between stages: its 1/cp of each sequence
    hidden_bytes = b * seq * hidden_size(model) * item // (
        plan.tp if plan.sequence_parallel else 1) // plan.cp
    layers = max((s.length for s in stacks), default=0)
    if units is None:
        from .pipeline import units_of

        units = units_of(records, _stack_info(stacks))
    time_s, critical, stages, colls = plan_step(
        records, opt_records, plan=plan, topo=topology, stacks=_stack_info(stacks),
        layers=layers,
        stage_params=stage_params, unit_params=unit_params, item=item,
        hidden_tokens_bytes=hidden_bytes, stage_experts=stage_experts,
        unit_experts=unit_experts, units=units,
        gather_item=float8_gather(model, stacks, item, quant),
        spec=spec)
    m = plan.microbatches
    crit = stages[critical]
    flops = units.flops * m // plan.pp
    notes = list(notes) + [f"plan: {plan.describe()}"]
    slowest = max(range(len(stages)), key=lambda d: (stages[d].busy_s, -d))
    if plan.pp > 1:
        bubble = crit.by_class["pipeline_bubble"]
        notes.append(f"pipeline: {plan.schedule_name} over {m} micro-batches, "
                     f"{plan.stages} chunks of {_chunk_layers(plan, layers)} layers; the "
                     "slowest "
                     f"stage is {slowest} of {plan.pp} ({stages[slowest].holds}: "
                     f"{stages[slowest].busy_s * 1e3:.3f} ms of compute); the step ends with "
                     f"stage {critical}'s last pass and tail; its bubble {bubble * 1e3:.3f} ms "
                     f"({100 * bubble / time_s:.1f}% of the step)")
    if plan.zero == 3:
        notes.append("FSDP: each layer's parameters all-gathered in the compute dtype one "
                     "block ahead of its compute"
                     + (", again for its backward" if plan.reshard_after_forward else "")
                     + "; gradients reduce-scattered in fp32 per block, overlapped with the "
                       "backward; the optimizer on 1/" + f"{plan.shard} of the parameters")
    elif plan.zero:
        notes.append(f"ZeRO-{plan.zero}: optimizer state"
                     + (" and gradients" if plan.zero == 2 else "")
                     + f" sharded over {plan.shard}; the updated parameters all-gathered "
                       "after the optimizer")
    if m > 1:
        notes.append(f"{m} micro-batches: one optimizer step and one gradient reduction per "
                     "step" + (" (ZeRO-2 and FSDP reduce every micro-batch)"
                               if plan.zero >= 2 else ""))
    kernels = units.kernels * m // plan.pp + sum(r.kernels for r in opt_records)
    by = {c: crit.by_class.get(c, 0.0) for c in
          ("gemm", "attention", "memory", "optimizer", "communication", "host_idle",
           "pipeline_bubble")}
    gpu_s = sum(v for k, v in by.items() if k not in ("host_idle", "pipeline_bubble"))
    host_s = units.host_s * m / plan.pp
    return Step(execution=execution, mode="train", optimizer=optimizer, time_s=time_s,
                by_class=by, gpu_s=gpu_s, host_s=host_s, kernels=int(kernels),
                model_flops=int(flops), peak_tflops=get_gpu(spec).peak_tflops(dkey),
                tokens=None if tokens is None else tokens * m, notes=tuple(notes),
                replicas=plan.dp, communication=tuple(colls),
                stages=tuple(stages) if plan.pp > 1 else (),
                critical=f"stage {slowest} of {plan.pp}, {stages[slowest].holds}"
                if plan.pp > 1 else "",
                microbatches=m, timeline=tuple(stages) if plan.pp == 1 else ())
