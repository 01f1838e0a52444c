"""The training step under a parallel plan (``fxshape.parallelism.plan.Parallel``): the
records of one micro-batch split into pipeline stages, each stage's forward and backward
timed (with FSDP's gathers and reduce-scatters beside its blocks), the schedule played over
the micro-batches, then each rank's tail (the gradient reduction the backward did not hide,
the optimizer on its shard, ZeRO-1/2's parameter all-gather) — the slowest rank is the step.

Stages follow Megatron: the layer stack split into ``pp × virtual_stages`` chunks (equal
by default; ``Parallel.stage_layers``: torchtitan's split or counts per chunk,
``fxshape.parallelism.plan.stage_layer_counts``); what comes before the stack in the forward
(the embedding) on the first stage, what comes after it (the final norm, the head, the
loss) on the last. The FSDP units are torchtitan's:
one per layer, the rest of the stage's parameters one more (the root, gathered before the
forward, not resharded).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ..cost.comm import predict_collective
from ..cost.host import eager_timeline
from ..parallelism.experts import sharded_share
from ..parallelism.overlap import bucketed, buckets, prefetched, sm_share
from ..parallelism.placement import per_node, stage_crosses_nodes
from ..parallelism.plan import chunk_of_layer, layer_chunks, stage_layer_counts
from ..parallelism.schedule import (SPLIT_BACKWARD, frozen_orders, play, rank_of_stage,
                                    stages_of_rank)
from .step import RECOMPUTED_OPS

__all__ = ["Collective", "StageTime", "Unit", "Units", "layer_of", "placed", "plan_step",
           "communication_of", "units_of"]


@dataclass(frozen=True)
class Collective:
    """One kind of collective in the step (``report.step.communication``): ``kind`` is the
    parallelism it serves (``tp``, ``sp``, ``dp``, ``zero``, ``pp``), ``op`` the NCCL call,
    ``bytes`` and ``count`` per step on one GPU, ``total_s`` its time, ``exposed_s`` what of
    it the step waits for, ``stretch_s`` what it adds to the compute it overlaps."""

    kind: str
    op: str
    group: int
    bytes: int
    count: int
    total_s: float
    exposed_s: float
    #: the compute it stretches while it runs beside it (its NCCL CTAs hold SMs the compute
    #: cannot use: ``fxshape.parallelism.overlap.sm_share``); on the critical path too
    stretch_s: float = 0.0

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class StageTime:
    """One pipeline rank: its virtual stages' layers, forward and backward time of one
    micro-batch (exposed FSDP traffic included), compute over the step, when its last
    pass ends, its tail after it, its idle time in the pipeline, its classes."""

    rank: int
    layers: tuple
    forward_s: float
    backward_s: float
    busy_s: float
    end_s: float
    tail_s: float
    bubble_s: float
    by_class: dict = field(hash=False, default_factory=dict)
    holds: str = ""
    #: the optimizer's wall time within ``tail_s`` (the rest is exposed communication:
    #: gradient synchronisation, ZeRO's parameter all-gather), which runs after it
    optimizer_s: float = 0.0
    #: the rank's passes as the schedule ran them: ``(kind, micro, chunk, start_s, end_s)``
    #: ("F", "B"; a split backward's "I" and "W"; empty without a pipeline). Drawn by
    #: ``Report.to_chrome_trace``; not in
    #: ``as_dict`` (a step's JSON stays the size of its ranks).
    passes: tuple = field(default=(), compare=False)

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.pop("passes")
        d["layers"] = list(self.layers)
        return d


def layer_of(module: str, stacks) -> int | None:
    """The index of the layer ``module`` is in (``stacks``: ``[(name, length)]``), or None."""
    for name, _ in stacks:
        if module.startswith(name + "."):
            head = module[len(name) + 1:].split(".", 1)[0]
            if head.isdigit():
                return int(head)
    return None


def placed(items, stacks, chunk_of, stages: int):
    """``(layer index or None, virtual stage)`` of each ``(module, phase)`` of ``items``, in
    program order (op records; parameters and saved activations, in the forward): a layer's
    chunk (``chunk_of[i]``: ``fxshape.parallelism.plan.layer_chunks``; None: no chunks,
    only the first and the last stage told apart); outside the layers, before the stack in
    the forward (after it in the backward) the first stage, the rest the last."""
    seen = {"forward": False, "backward": False}
    for module, phase in items:
        i = layer_of(module, stacks)
        phase = "backward" if phase == "backward" else "forward"
        if i is not None:
            seen[phase] = True
            yield i, (0 if chunk_of is None else chunk_of_layer(chunk_of, i))
        elif phase == "forward":
            yield None, 0 if not seen["forward"] else stages - 1
        else:
            yield None, stages - 1 if not seen["backward"] else 0


def _wall(records):
    return eager_timeline((r.host_s, r.time_s) for r in records)


def _priced(op, nbytes, group, stride, topo, memo):
    """One collective's time (0 for one rank or no bytes); ``memo``: one plan's identical
    layers and buckets priced once."""
    if group <= 1 or nbytes <= 0:
        return 0.0
    key = (op, int(nbytes), group, stride)
    if key not in memo:
        d = per_node(group, stride, topo.gpus_per_node)
        memo[key] = predict_collective(op, int(nbytes), group, topology=topo,
                                       per_node=d).time_s
    return memo[key]


@dataclass(frozen=True)
class Unit:
    """One pass (forward or backward) of one FSDP unit's records, costed once: its wall
    and idle time on the eager timeline, its GPU seconds per op class, its collectives,
    and (a backward) the GPU seconds of its weight-gradient GEMMs."""

    wall_s: float
    idle_s: float
    by_class: tuple
    comm: tuple
    weight_grad_s: float = 0.0

    @classmethod
    def of(cls, records, tokens=None) -> "Unit":
        """``tokens``: ``{module: the M of its forward GEMM}``, which tells a linear
        layer's weight-gradient GEMM (its K is the tokens) from its input-gradient one."""
        t = _wall(records)
        by: dict = {}
        for r in records:
            by[r.cls] = by.get(r.cls, 0.0) + r.time_s
        return cls(t.wall_s, t.idle_s, tuple(by.items()),
                   tuple(r for r in records if r.cls == "communication"),
                   weight_grad_s(records, tokens or {}))


def weight_grad_s(records, tokens: dict) -> float:
    """GPU seconds of the weight-gradient GEMMs among backward ``records``: a GEMM of a
    module whose forward GEMM had M = ``tokens[module]`` and that reduces over those tokens
    (``K``), ``[out, tokens] x [tokens, in]``; where the input-gradient GEMM has the same
    shape (M = K = tokens) the two cannot be told apart and each counts half."""
    total = 0.0
    for r in records:
        if r.phase != "backward" or r.cls != "gemm" or len(r.shape) != 4:
            continue
        n = tokens.get(r.module)
        if n is None or r.shape[3] != n:
            continue
        total += r.time_s * (0.5 if r.shape[1] == n else 1.0)
    return total


_EMPTY = Unit(0.0, 0.0, (), ())


@dataclass(frozen=True)
class Units:
    """One micro-batch's records as a pipeline places them (:func:`placed`), each group
    costed once: every layer's forward and backward (``{layer index: Unit}``), and what is
    outside the layers by where it runs (``roots[(first, last)]``: the (forward, backward)
    Units of a stage that is the first and/or the last). Plans that differ in stages,
    virtual stages, data parallelism, ZeRO and micro-batches compose their step from the
    same Units (:func:`plan_step`), in time proportional to the layers, not the records."""

    forward: dict = field(hash=False)
    backward: dict = field(hash=False)
    roots: dict = field(hash=False)
    #: over all the records: the useful GEMM and attention FLOPs (``Step.model_flops``),
    #: the kernel launches, the host seconds
    flops: int = 0
    kernels: int = 0
    host_s: float = 0.0


def units_of(records, stacks) -> Units:
    """``records`` (one micro-batch, in program order) grouped and costed as
    :class:`Units`; ``stacks``: ``[(name, length)]``."""
    fwd: dict = {}
    bwd: dict = {}
    # outside the layers, by pass and by where placed() puts it among two stages (0: the
    # first stage's, 1: the last's): the program order within each is kept
    outside = {(back, end): [] for back in (False, True) for end in (0, 1)}
    # each linear layer's tokens: the M of its forward GEMM (one batch)
    tokens = {r.module: r.shape[1] for r in records
              if r.phase == "forward" and r.cls == "gemm" and len(r.shape) == 4
              and r.shape[0] == 1 and r.module}
    for r, (i, end) in zip(records, placed(((r.module, r.phase) for r in records), stacks,
                                           None, 2)):
        back = r.phase == "backward"
        if i is not None:
            (bwd if back else fwd).setdefault(i, []).append(r)
        else:
            outside[(back, end)].append(r)
    # a stage that is the first and/or the last runs those parts, in program order (the
    # forward's first-stage part comes before its last-stage part; the backward's after)
    roots = {}
    for first in (False, True):
        for last in (False, True):
            f = (outside[(False, 0)] if first else []) + (outside[(False, 1)] if last else [])
            b = (outside[(True, 1)] if last else []) + (outside[(True, 0)] if first else [])
            roots[(first, last)] = (Unit.of(f), Unit.of(b, tokens))
    return Units(forward={i: Unit.of(v) for i, v in fwd.items()},
                 backward={i: Unit.of(v, tokens) for i, v in bwd.items()}, roots=roots,
                 flops=sum(r.flops for r in records if r.cls in ("gemm", "attention")
                           and r.op not in RECOMPUTED_OPS),
                 kernels=sum(r.kernels for r in records),
                 host_s=sum(r.host_s for r in records))


def communication_of(records, group: int = 0, cp: int = 1, ep: int = 1) -> list:
    """The tensor-, context- and expert-parallel collectives among ``records`` (class
    ``communication``; their ``time_s`` is on the critical path, ``overlapped_s`` hidden
    under compute), one :class:`Collective` per kind and op; ``group``: the tensor-parallel
    degree, ``cp``: the context-parallel one (ring attention's send/recv), ``ep``: the
    expert-parallel one (the MoE all-to-alls)."""
    agg: dict = {}
    for r in records:
        if r.cls != "communication" or not r.op.startswith(("tp ", "cp ", "ep ")):
            continue
        op = r.op.split(" ", 1)[1]
        kind = r.op[:2] if r.op.startswith(("cp ", "ep ")) else \
            "sp" if op in ("reduce_scatter", "all_gather") else "tp"
        a = agg.setdefault((kind, op), [0, 0, 0.0, 0.0])
        a[0] += r.bytes
        a[1] += r.kernels
        a[2] += r.time_s + r.overlapped_s
        a[3] += r.time_s
    size = {"cp": cp, "ep": ep}
    return [Collective(kind, op, size.get(kind, group), b, c, t, e)
            for (kind, op), (b, c, t, e) in agg.items()]


def plan_step(records, optimizer_records, *, plan, topo, stacks, layers, stage_params,
              unit_params, item, hidden_tokens_bytes, stage_experts=None, unit_experts=None,
              units=None, gather_item=None, spec=None):
    """The step of ``records`` (one micro-batch's forward and backward, per GPU: tensor
    parallelism applied) under ``plan``; ``optimizer_records``: the optimizer (and autocast's
    weight casts) over all the parameters one GPU of a pipeline-less replica holds, scaled
    here to each rank's share; ``stage_params``: trained parameter elements per virtual
    stage; ``unit_params``: per virtual stage, the elements of each FSDP unit in forward
    order (``{layer index: elements}``, the rest of the stage under None, last); ``item``:
    the compute dtype's bytes;
    ``hidden_tokens_bytes``: one micro-batch's activation between stages;
    ``stage_experts``, ``unit_experts``: the expert-parallel experts' share of
    ``stage_params`` and of each layer's unit (reduced and sharded over ``dp × cp / ep``
    ranks, ``ep`` apart; None: no expert parallelism); ``units``: ``units_of(records,
    stacks)`` when the caller keeps it for other plans of the same records;
    ``gather_item``: ``{layer index or None: bytes per element}`` FSDP gathers a unit's
    parameters in where it is not ``item`` (torchao's float8 all-gather); ``spec``: the GPU,
    whose SMs the overlapped collectives take from the compute (None: they take none).

    Returns ``(time_s, critical rank, ranks [StageTime], collectives [Collective])``."""
    p, m, stages = plan.pp, plan.microbatches, plan.stages
    grouped = units if units is not None else units_of(records, stacks)
    counts = stage_layer_counts(plan, layers)
    chunk_of = layer_chunks(counts)
    in_stage = [[] for _ in range(stages)]  # the layers each virtual stage runs
    for i in sorted(set(grouped.forward) | set(grouped.backward)):
        in_stage[chunk_of_layer(chunk_of, i)].append(i)
    shape = _StageShape(grouped, tuple(tuple(x) for x in in_stage),
                        tuple(grouped.roots[(s == 0, s == stages - 1)]
                              for s in range(stages)))
    pr = _Pricer(plan, topo, spec)
    stage_experts = stage_experts or [0] * len(stage_params)
    unit_experts = unit_experts or [{} for _ in stage_params]
    all_params = sum(stage_params) or 1
    casts = [r for r in optimizer_records if r.cls != "optimizer"]
    opt = [r for r in optimizer_records if r.cls == "optimizer"]
    if plan.zero == 3:
        casts = []  # FSDP2 gathers the parameters in the compute dtype: no autocast casts
    passes = [_stage_pass(pr, shape, s, stage_params[s] / all_params, casts, unit_params[s],
                          unit_experts[s], gather_item or {}, item)
              for s in range(stages)]
    played = _played(pr, passes, hidden_tokens_bytes)
    ranks, rank_comm = [], []
    for d in range(p):
        mine = stages_of_rank(plan.schedule, d, p, plan.virtual_stages)
        rank, coll = _rank_tail(pr, d, mine, passes, played, stage_params, stage_experts,
                                all_params, opt, item, hidden_tokens_bytes)
        ranks.append(rank)
        rank_comm.append(coll)
    time_s = max(r.end + r.tail + r.opt_wall for r in ranks)
    critical = max(range(p), key=lambda d: (ranks[d].end + ranks[d].tail + ranks[d].opt_wall,
                                            -d))
    stage_times = [_stage_time(plan, shape, r, passes, played, time_s, counts)
                   for r in ranks]
    tp_like = communication_of([r for s in ranks[critical].mine
                                for u in _stage_units(grouped, in_stage[s], shape.roots[s])
                                for r in u.comm], plan.tp, plan.cp, plan.ep)
    collectives = [dataclasses.replace(c, bytes=c.bytes * m, count=c.count * m,
                                       total_s=c.total_s * m, exposed_s=c.exposed_s * m)
                   for c in tp_like]
    collectives += [Collective(k, op, c[0], int(c[1]), int(c[2]), c[3], c[4], c[5])
                    for (k, op), c in rank_comm[critical].items()]
    return time_s, critical, stage_times, collectives


class _Pricer:
    """One plan's collectives on its machine, each size priced once (``memo``), and the
    compute rate each takes from the SMs beside it (``spec``; None: none)."""

    def __init__(self, plan, topo, spec):
        self.plan, self.topo, self.spec, self.memo = plan, topo, spec, {}

    def coll(self, op, nbytes, group, stride) -> float:
        return _priced(op, nbytes, group, stride, self.topo, self.memo)

    def slow(self, group, stride) -> float:
        """The compute rate a collective over ``group`` ranks ``stride`` apart takes."""
        if self.spec is None or group <= 1:
            return 0.0
        return sm_share(self.spec, self.topo.link_class(
            group, per_node(group, stride, self.topo.gpus_per_node)))

    def split(self, op, elements, experts, nbytes, group, stride) -> float:
        """A collective over the dense parameters' ``group`` and the experts' ``group /
        ep`` (``ep`` times the stride apart)."""
        dense = self.coll(op, (elements - experts) * nbytes, group, stride)
        if not experts:
            return dense
        ep = self.plan.ep
        return dense + self.coll(op, experts * nbytes, group // ep, stride * ep)


@dataclass(frozen=True)
class _StageShape:
    """What each virtual stage runs: the units by layer (``Units``), the layers of each
    stage, and each stage's root units (forward, backward) outside the layers."""

    grouped: object
    in_stage: tuple
    roots: tuple


@dataclass(frozen=True)
class _StagePass:
    """One virtual stage's micro-batch: its forward and backward walls (FSDP's gathers and
    reduce-scatters overlapped), their exposed and stretched communication, its collectives
    (``{(kind, op): [group, bytes, count, time]}``), its share of autocast's casts and of
    its backward that computes weight gradients (a split backward's W; 0 otherwise)."""

    fwd: float
    bwd: float
    exposed: float
    stretched: float
    comm: dict
    cast: float
    wgrad: float


def _stage_pass(pr, shape, s, share, casts, unit_params, unit_experts, gather_item,
                item) -> _StagePass:
    """Virtual stage ``s``'s micro-batch (``share``: its part of the parameters)."""
    plan, grouped, in_stage, roots = pr.plan, shape.grouped, shape.in_stage[s], shape.roots[s]
    cast_f = sum(r.time_s for r in casts if r.phase == "forward") * share
    cast_b = sum(r.time_s for r in casts if r.phase == "backward") * share
    ids = list(unit_params)
    units = list(unit_params.values())
    xunits = [unit_experts.get(k, 0) for k in ids]
    # unit order (the stage's layers, then the root); the backward runs it reversed. A
    # layer without a unit of its own (no trained parameters) runs in the root's
    loose = [i for i in in_stage if i not in unit_params]
    f_walls = [grouped.forward.get(i, _EMPTY).wall_s for i in ids if i is not None] + \
        [roots[0].wall_s + sum(grouped.forward.get(i, _EMPTY).wall_s for i in loose)]
    b_walls = [grouped.backward.get(i, _EMPTY).wall_s for i in ids if i is not None] + \
        [roots[1].wall_s + sum(grouped.backward.get(i, _EMPTY).wall_s for i in loose)]
    comm: dict = {}
    shard, tp = plan.shard, plan.tp
    if plan.zero == 3:
        gat = [pr.split("all_gather", n, x, gather_item.get(k, item), shard, tp)
               for k, n, x in zip(ids, units, xunits)]
        g = plan.grad_bytes  # the gradients' dtype (fp32 unless the plan says)
        rs = [pr.split("reduce_scatter", n, x, g, shard, tp) for n, x in zip(units, xunits)]
        if plan.replicate > 1:  # hybrid sharding: the shard's gradient all-reduced across
            rs = [r + pr.coll("all_reduce", g * sharded_share(n, x, shard, plan.ep),
                              plan.replicate, tp * shard)
                  for r, n, x in zip(rs, units, xunits)]
        # the root (last unit) stays gathered; the layers regather for their backward
        again = [x if plan.reshard_after_forward and i < len(units) - 1 else 0.0
                 for i, x in enumerate(gat)]
        fsdp_slow = pr.slow(shard, tp)  # the widest group the stream serves
        fo = prefetched(f_walls, gat, slow=fsdp_slow)
        bo = prefetched(b_walls[::-1], again[::-1], rs[::-1], slow=fsdp_slow)
        fwd, bwd = fo.end + cast_f, bo.end + cast_b
        exposed, stretched = fo.exposed + bo.exposed, fo.stretch + bo.stretch
        gathered = sum(u * gather_item.get(k, item) * (2 if a else 1)
                       for k, u, a in zip(ids, units, again))
        comm[("zero", "all_gather")] = [shard, int(round(gathered)),
                                        len(units) + sum(1 for a in again if a),
                                        sum(gat) + sum(again)]
        comm[("zero", "reduce_scatter")] = [shard, sum(units) * g, len(units), sum(rs)]
    else:
        fwd, bwd = sum(f_walls) + cast_f, sum(b_walls) + cast_b
        exposed = stretched = 0.0
    wgrad = 0.0
    if plan.schedule in SPLIT_BACKWARD:
        # the backward's weight-gradient share of its GPU time, of its wall (only a split
        # backward runs it apart: a plan search's other plans skip this)
        b_units = [grouped.backward.get(i, _EMPTY) for i in in_stage] + [roots[1]]
        gpu_b = sum(t for u in b_units for c, t in u.by_class if c != "communication")
        w_gpu = sum(u.weight_grad_s for u in b_units)
        wgrad = bwd * w_gpu / gpu_b if gpu_b > 0 else 0.0
    return _StagePass(fwd, bwd, exposed, stretched, comm,
                      share * sum(r.time_s for r in casts), wgrad)


@dataclass(frozen=True)
class _Played:
    """The micro-batches played through the schedule: each rank's end and busy time, its
    passes in order, and the send/recv between consecutive virtual stages."""

    ends: tuple
    busy: tuple
    passes: tuple
    sends: tuple


def _played(pr, passes, hidden_tokens_bytes) -> _Played:
    plan, topo = pr.plan, pr.topo
    p, m = plan.pp, plan.microbatches
    fwd_t, bwd_t = [x.fwd for x in passes], [x.bwd for x in passes]
    if p == 1:
        ends = (m * (fwd_t[0] + bwd_t[0]),)
        return _Played(ends, ends, ((),), ())
    # the activation (forward) and its gradient (backward) between virtual stages s and
    # s + 1, on different ranks but at a V schedule's turn
    sends = []
    for b in range(plan.stages - 1):
        r0, r1 = (rank_of_stage(plan.schedule, x, p) for x in (b, b + 1))
        if r0 == r1:  # a V schedule's turn: the same rank, nothing sent
            sends.append(0.0)
            continue
        sends.append(predict_collective(
            "send_recv", int(hidden_tokens_bytes), 2, topology=topo,
            per_node=1 if stage_crosses_nodes(min(r0, r1), plan.gpus // p,
                                              topo.gpus_per_node) else 2).time_s)
    wgrad = [x.wgrad for x in passes] if plan.schedule in SPLIT_BACKWARD else None
    out = play(frozen_orders(plan.schedule, p, m, plan.virtual_stages), fwd_t, bwd_t, sends,
               wgrad=wgrad, schedule=plan.schedule)
    return _Played(tuple(out.ends), tuple(out.busy), tuple(out.passes), tuple(sends))


@dataclass(frozen=True)
class _RankTail:
    """One pipeline rank: its virtual stages, when its last pass ends, its busy time, what
    follows the passes (the data-parallel reduction and ZeRO's gather, exposed), its
    optimizer's wall and FSDP's exposed and stretched communication."""

    rank: int
    mine: tuple
    end: float
    busy: float
    tail: float
    opt_wall: float
    fsdp: float


def _rank_tail(pr, d, mine, passes, played, stage_params, stage_experts, all_params, opt,
               item, hidden_tokens_bytes) -> tuple:
    """``(_RankTail, its collectives {(kind, op): [group, bytes, count, time, exposed,
    stretched]})`` of rank ``d`` running the virtual stages ``mine``."""
    plan = pr.plan
    m, shard, tp = plan.microbatches, plan.shard, plan.tp
    params = sum(stage_params[s] for s in mine)
    experts = sum(stage_experts[s] for s in mine)
    fraction = sharded_share(params, experts, shard, plan.ep) / all_params  # the optimizer's
    coll: dict = {}
    for s in mine:
        for key, (group, nbytes, count, total) in passes[s].comm.items():
            c = coll.setdefault(key, [group, 0, 0, 0.0, 0.0, 0.0])
            c[1] += m * nbytes
            c[2] += m * count
            c[3] += m * total
    fs_exposed = m * sum(passes[s].exposed for s in mine)
    fs_stretch = m * sum(passes[s].stretched for s in mine)
    zkeys = [k for k in coll if k[0] == "zero"]
    ztotal = sum(coll[k][3] for k in zkeys) or 1.0
    for k in zkeys:  # gathers and reduce-scatters share the stream: split by their time
        coll[k][4] = fs_exposed * coll[k][3] / ztotal
        coll[k][5] = fs_stretch * coll[k][3] / ztotal
    tail = 0.0
    if plan.data_ranks > 1 and plan.zero < 3:
        grad = params * plan.grad_bytes
        group = shard if plan.zero else plan.data_ranks
        op = "all_reduce" if plan.zero == 0 else "reduce_scatter"
        sizes = buckets(grad)
        xfrac = experts / params if params else 0.0
        times = [pr.split(op, b, b * xfrac, 1, group, tp) for b in sizes]
        if plan.zero and plan.replicate > 1:
            times = [t + pr.coll("all_reduce", b / shard, plan.replicate, tp * shard)
                     for t, b in zip(times, sizes)]
        ov = bucketed(passes[mine[0]].bwd, sizes, times, slow=pr.slow(group, tp))
        times_run = m if plan.zero == 2 else 1  # ZeRO-2 reduces every micro-batch
        tail += (ov.exposed + ov.stretch) * times_run
        coll[("dp" if plan.zero == 0 else "zero", op)] = [
            group, grad * times_run, len(sizes) * times_run, ov.comm * times_run,
            ov.exposed * times_run, ov.stretch * times_run]
    opt_wall = eager_timeline((r.host_s, r.time_s * fraction) for r in opt).wall_s
    if plan.zero in (1, 2):
        ag = pr.split("all_gather", params, experts, item, shard, tp)
        tail += ag
        coll[("zero", "all_gather")] = [shard, params * item, 1, ag, ag, 0.0]
    if plan.pp > 1:
        sends = played.sends
        out_of = [s for s in mine if s < plan.stages - 1 and sends[s] > 0]  # to another rank
        n_send = 2 * m * len(out_of)
        coll[("pp", "send_recv")] = [2, n_send * int(hidden_tokens_bytes), n_send,
                                     m * 2 * sum(sends[s] for s in out_of), 0.0, 0.0]
    return _RankTail(d, tuple(mine), played.ends[d], played.busy[d], tail, opt_wall,
                     fs_exposed + fs_stretch), coll


def _stage_time(plan, shape, r: _RankTail, passes, played, time_s, counts) -> StageTime:
    """Rank ``r``'s :class:`StageTime`: its step split by class, what is left of the
    step's time a bubble (a pipeline's) or the host's."""
    m, p = plan.microbatches, plan.pp
    cls = {"gemm": 0.0, "attention": 0.0, "memory": 0.0, "optimizer": r.opt_wall,
           "communication": r.tail + r.fsdp, "host_idle": 0.0, "pipeline_bubble": 0.0}
    for s in r.mine:
        for u in _stage_units(shape.grouped, shape.in_stage[s], shape.roots[s]):
            for c, t in u.by_class:
                if c in cls:
                    cls[c] += m * t
            cls["host_idle"] += m * u.idle_s
        cls["memory"] += m * passes[s].cast
    rest = max(0.0, time_s - sum(cls.values()))
    # without a pipeline what is left is the host's (the timelines' rounding): no bubble
    cls["pipeline_bubble" if p > 1 else "host_idle"] += rest
    return StageTime(
        rank=r.rank, layers=tuple(_layers_in(r.mine, counts)),
        forward_s=sum(passes[s].fwd for s in r.mine),
        backward_s=sum(passes[s].bwd for s in r.mine),
        busy_s=r.busy, end_s=r.end, tail_s=r.tail + r.opt_wall,
        bubble_s=max(0.0, r.end - r.busy), by_class=cls, holds=_holds(r.mine, plan.stages),
        optimizer_s=r.opt_wall, passes=played.passes[r.rank] if p > 1 else ())


def _layers_in(mine, counts):
    """``(first, last)`` layer of each of the chunks ``mine`` (layers per chunk:
    ``counts``)."""
    starts = [sum(counts[:c]) for c in range(len(counts))]
    return [(starts[s], starts[s] + counts[s] - 1) for s in mine]


def _holds(mine, stages):
    """What a rank holding the virtual stages ``mine`` runs besides its layers."""
    if stages == 1:
        return "the whole model"
    first, last = 0 in mine, stages - 1 in mine
    if first and last:  # a V schedule's first rank
        return "the embedding, the head and the loss"
    if first:
        return "the embedding"
    if last:
        return "the head and the loss"
    return "layers only"


def _stage_units(units, layer_ids, root):
    """The Units a virtual stage runs: its layers' forward and backward, then its root's."""
    for i in layer_ids:
        yield units.forward.get(i, _EMPTY)
        yield units.backward.get(i, _EMPTY)
    yield from root
