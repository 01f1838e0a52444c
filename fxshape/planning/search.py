"""The plan search: which parallel plan trains this model fastest on N GPUs, and does it fit?

:func:`plan` enumerates the plans the model and the machine allow
(``fxshape.planning.space``), leaves out those whose parameters, gradients and optimizer
state alone exceed a GPU (a lower bound, no capture needed), costs the rest with
:func:`fxshape.analyze` — each distinct per-rank shape set (tensor, context and expert
parallelism, micro-batch size) captured once, every plan that shares it only re-costed
(``fxshape.report.build.SharedCaptures``) — drops those that do not fit in memory, and
ranks the rest by predicted step time. Every number is the one ``fxshape analyze`` prints
for that plan.
"""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass, field

from ..config.setup import takes_setup
from ..cost.optimizer import check_optimizer
from ..parallelism.plan import RECOMPUTE, PlanRefused
from ..parallelism.state import training_state
from .space import Candidate, ModelShape, candidates

__all__ = ["PlanResult", "PlanSearch", "plan", "model_shape"]


@dataclass(frozen=True)
class PlanResult:
    """One costed plan: its step time, tokens per second per GPU, MFU, the most loaded GPU's
    peak memory, the pipeline bubble and the exposed communication of the step's critical
    rank."""

    candidate: Candidate
    step_s: float
    tokens_per_s_per_gpu: float
    mfu: float
    peak_bytes: int
    capacity_bytes: int
    bubble_s: float
    exposed_comm_s: float

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.capacity_bytes

    def as_dict(self) -> dict:
        c = self.candidate
        return {"plan": c.label(), "parallel": c.parallel.as_dict(),
                "micro_batch": c.micro_batch, "recompute": c.recompute,
                "step_s": self.step_s, "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
                "mfu": self.mfu, "peak_bytes": self.peak_bytes,
                "capacity_bytes": self.capacity_bytes, "fits": self.fits,
                "bubble_s": self.bubble_s, "exposed_comm_s": self.exposed_comm_s}


@dataclass(frozen=True)
class PlanSearch:
    """What :func:`plan` found: the fitting plans, fastest first (``results``); the plan
    that came nearest to fitting when none did (``nearest``); the combinations and plans
    left out, by reason (``dropped``); how many plans were enumerated and costed; the
    captures the costing needed."""

    gpus: int
    gpu: str
    global_batch: int
    seq_len: int
    results: tuple
    nearest: PlanResult | None
    dropped: tuple
    enumerated: int
    costed: int
    captures: int
    notes: tuple = field(default=())
    #: the processes that costed the plans
    workers: int = 1

    @property
    def best(self) -> PlanResult | None:
        return self.results[0] if self.results else None

    def as_dict(self) -> dict:
        return {"gpus": self.gpus, "gpu": self.gpu, "global_batch": self.global_batch,
                "seq_len": self.seq_len, "results": [r.as_dict() for r in self.results],
                "nearest": self.nearest.as_dict() if self.nearest else None,
                "dropped": [{"reason": r, "count": n} for r, n in self.dropped],
                "enumerated": self.enumerated, "costed": self.costed,
                "captures": self.captures, "workers": self.workers,
                "notes": list(self.notes)}


def model_shape(model, facts=None) -> ModelShape:
    """Layers, heads, KV heads and experts of ``model`` (what the plan rules need), from its
    ``fxshape.tracing.facts.ModelFacts`` (``facts``, or read here)."""
    from ..tracing.facts import model_facts

    f = facts or model_facts(model)
    return ModelShape(layers=f.layers, heads=f.heads or 1, kv_heads=f.kv_heads or f.heads or 1,
                      experts=f.experts)


def _positive(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def _choices(name: str, values, ok, accepted: str) -> tuple:
    """``values`` as a tuple without repeats (first order kept), each checked by ``ok``: a
    repeat would list a plan twice, a bad value would leave the search empty."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        values = (values,)
    out = tuple(dict.fromkeys(values))
    if not out:
        raise ValueError(f"{name} is empty; give one or more of: {accepted}")
    bad = [v for v in out if not ok(v)]
    if bad:
        raise ValueError(f"{name} has {bad[0]!r}; accepted: {accepted}")
    return out


def _states_lower_bound(c: Candidate, dense: int, experts: int, optimizer) -> float:
    """Bytes of master weights, gradients and optimizer state per GPU
    (``fxshape.parallelism.state``, as the analysis counts them) if every parameter split
    over ``tp × pp`` (and experts over ``ep``) and ZeRO sharded its part: no GPU holds
    less."""
    p = c.parallel
    per = (dense + experts / p.ep) / (p.tp * p.pp)
    return training_state(lambda by: per / by, optimizer=optimizer, grad_bytes=p.grad_bytes,
                          zero=p.zero, shard=p.shard).resident


def _machine(spec, topology, gpus: int):
    """The topology of ``gpus`` GPUs: as many nodes of ``topology`` as they take."""
    from ..hardware.topology import get_topology, topology_for

    topo = topology_for(spec, topology)
    if topo.gpus is None:
        nodes = -(-gpus // topo.gpus_per_node)
        topo = get_topology(f"{topo.name}:{nodes}")
    if topo.gpus < gpus:
        raise ValueError(f"{gpus} GPUs exceed the {topo.gpus} of the topology "
                         f"{topo.name}:{topo.nodes}")
    return topo


def _checked_options(*, gpus, global_batch, seq_len, top, max_cp, workers, micro_batches,
                     virtual_stages, zero, recompute) -> tuple:
    """``plan``'s own arguments checked, each in one line; the choices as tuples."""
    for name, v in (("gpus", gpus), ("global_batch", global_batch), ("seq_len", seq_len)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    if top is not None and (isinstance(top, bool) or not isinstance(top, int) or top < 1):
        raise ValueError(f"top must be a positive integer or None, got {top!r}")
    micro_batches = _choices("micro_batches", micro_batches, _positive, "positive integers")
    virtual_stages = _choices("virtual_stages", virtual_stages, _positive,
                              "positive integers")
    zero = _choices("zero", zero, lambda v: v in (0, 1, 2, 3) and not isinstance(v, bool),
                    "0, 1, 2 or 3")
    recompute = _choices("recompute", recompute, lambda v: v in RECOMPUTE,
                         "None, 'full', 'selective', 'op'")
    if not _positive(max_cp):
        raise ValueError(f"max_cp must be a positive integer, got {max_cp!r}")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int)
                                or workers < 1):
        raise ValueError(f"workers must be a positive integer or None (one per CPU core), "
                         f"got {workers!r}")
    return micro_batches, virtual_stages, zero, recompute


@takes_setup(("gpu", "dtype", "topology", "execution", "optimizer", "attention"),
             fixed={"mode": "train"})
def plan(model, *, gpus: int, global_batch: int, seq_len: int, gpu="h100", dtype="bf16",
         topology=None, micro_batches=(1, 2, 4), recompute=(None, "selective", "full"),
         zero=(0, 1, 3), virtual_stages=(1, 2, 4), max_cp: int = 8, top: int = 10,
         execution="eager", optimizer="adamw", attention="flash", progress=None,
         workers=None) -> PlanSearch:
    """Search the parallel plans for training ``model`` on ``gpus`` GPUs of kind ``gpu``,
    ``global_batch`` sequences of ``seq_len`` tokens per optimizer step.

    Returns a :class:`PlanSearch` with the ``top`` fastest plans that fit (all of them if
    ``top`` is None). ``progress``: a progress bar on standard error (default: when it is
    a terminal). ``execution``, ``optimizer``, ``attention``: as for
    :func:`fxshape.analyze`, for every plan. ``workers``: processes costing the captures'
    groups of plans at once (default: one per CPU core, where the platform forks; 1: in
    this process); the result does not depend on it. ``setup``: a :class:`fxshape.Setup`
    holding ``gpu``, ``dtype``, ``topology``, ``execution``, ``optimizer`` and ``attention``
    (its mode ``"train"`` or unset; the plan is what is searched), the keywords changing it.

    Raises:
        ValueError: sizes that are not positive integers, more GPUs than the topology holds,
            a GPU or dtype fxshape does not know, or a model with nothing to plan.
    """
    from ..tracing.facts import model_facts
    from ..hardware.gpus import get_gpu
    from ..tracing.export import check_module, resolve_seq_len
    from ..tracing.configs import check_config

    micro_batches, virtual_stages, zero, recompute = _checked_options(
        gpus=gpus, global_batch=global_batch, seq_len=seq_len, top=top, max_cp=max_cp,
        workers=workers, micro_batches=micro_batches, virtual_stages=virtual_stages,
        zero=zero, recompute=recompute)
    check_module(model)
    if getattr(model, "config", None) is not None:
        check_config(model.config)
        # a sequence beyond the positions: said here, not as "no plan fits"
        resolve_seq_len(model.config, seq_len)
    spec = get_gpu(gpu)
    spec.peak_tflops(dtype)
    topo = _machine(spec, topology, gpus)
    facts = model_facts(model)
    shape = model_shape(model, facts)
    plans, dropped = candidates(shape, gpus=gpus, global_batch=global_batch, seq_len=seq_len,
                                gpus_per_node=topo.gpus_per_node,
                                micro_batches=tuple(micro_batches),
                                recompute=tuple(recompute), zero=tuple(zero),
                                virtual_stages=tuple(virtual_stages), max_cp=max_cp)
    if not plans:
        raise ValueError(f"no parallel plan divides the model ({shape.layers} layers, "
                         f"{shape.heads} heads) and {gpus} GPUs with a global batch of "
                         f"{global_batch}: " + "; ".join(f"{r} ({n})" for r, n in
                                                         sorted(dropped.items())))
    experts = facts.expert_elements
    dense = sum(p.numel() for p in model.parameters()) - experts
    capacity = int(spec.memory_gb * 1024 ** 3)
    show = sys.stderr.isatty() if progress is None else progress
    todo = []
    check_optimizer(optimizer)  # an unknown optimizer refused before any capture
    for c in plans:
        if _states_lower_bound(c, dense, experts, optimizer) > capacity:
            dropped["does not fit: parameters, gradients and optimizer state alone"] += 1
        else:
            todo.append(c)
    # one group per capture (per-rank shapes: tp, cp, ep, micro-batch), costed together
    groups: dict = {}
    for c in todo:
        p = c.parallel
        groups.setdefault((p.tp, p.cp, p.ep, c.micro_batch), []).append(c)
    job = dict(model=model, spec=spec, dtype=dtype, seq_len=seq_len, topo=topo,
               execution=execution, optimizer=optimizer, attention=attention, gpus=gpus,
               global_batch=global_batch, capacity=capacity)
    n = _workers(workers, len(groups))
    results, misses = [], []
    done = 0
    for got, refused in _run_groups(list(groups.values()), job, n):
        for r in got:
            if r.fits:
                results.append(r)
            else:
                dropped["does not fit: peak memory over the GPU's"] += 1
                misses.append(r)
        dropped.update(refused)
        done += len(got) + sum(refused.values())
        if show:
            sys.stderr.write(f"\rplan search: {done}/{len(todo)} plans costed")
            sys.stderr.flush()
    if show:
        sys.stderr.write("\n")
    results.sort(key=lambda r: (r.step_s, r.candidate.label()))
    nearest = None
    if not results and misses:
        nearest = min(misses, key=lambda r: (r.peak_bytes, r.step_s, r.candidate.label()))
    notes = (f"{len(plans)} plans enumerated, {len(todo)} costed from {len(groups)} captures "
             "(one per distinct tp, cp, ep and micro-batch size); sequence parallelism on "
             "wherever tp > 1",)
    return PlanSearch(gpus=gpus, gpu=spec.label, global_batch=global_batch, seq_len=seq_len,
                      results=tuple(results[:top] if top else results), nearest=nearest,
                      dropped=tuple(sorted(dropped.items(), key=lambda x: (-x[1], x[0]))),
                      enumerated=len(plans), costed=len(todo), captures=len(groups),
                      notes=notes, workers=n)


def _cost_group(group, job) -> tuple:
    """Cost one capture's plans with ``analyze`` (one capture, the rest re-costed from it:
    ``fxshape.report.build.SharedCaptures``); ``(results, Counter of refusals)``."""
    import contextlib

    from ..report.build import SharedCaptures
    from ..config.setup import Setup

    results, refused = [], Counter()
    # what every plan shares; each candidate changes its plan and micro-batch
    base = Setup.from_keywords(gpu=job["spec"], dtype=job["dtype"], seq_len=job["seq_len"],
                               mode="train", topology=job["topo"], provenance=None,
                               execution=job["execution"], optimizer=job["optimizer"],
                               attention=job["attention"])
    captures = SharedCaptures(_SHARED)
    for c in group:
        try:
            with contextlib.redirect_stdout(None):
                rep = captures.analyze(job["model"], base.replace(
                    batch_size=c.micro_batch, parallel=c.parallel))
        except PlanRefused as exc:  # the rule it breaks, typed where it is raised
            refused["refused: " + exc.reason] += 1
            continue
        except ValueError as exc:  # not a plan this search should have tried: a bug
            raise ValueError(f"plan {c.label()}: {exc}") from exc
        step, mem = rep.step, rep.memory
        tokens = job["global_batch"] * job["seq_len"]
        results.append(PlanResult(
            candidate=c, step_s=step.time_s,
            tokens_per_s_per_gpu=tokens / step.time_s / job["gpus"], mfu=step.mfu,
            peak_bytes=int(mem.peak), capacity_bytes=job["capacity"],
            bubble_s=step.by_class.get("pipeline_bubble", 0.0),
            exposed_comm_s=step.by_class.get("communication", 0.0)))
    # what holds for every capture of the model (its layer stacks, the verdict that one
    # layer stands for its group) goes on to the next group
    _SHARED.update(captures.model_facts())
    return results, refused


#: shared between the groups of one search (in each process): the model's layer stacks and
#: the layer-reduction verdicts (``fxshape.analysis.annotate``, ``fxshape.report.build``)
_SHARED: dict = {}
#: the job a forked worker reads (set before the pool forks: nothing large is pickled)
_JOB: dict = {}


def _in_worker(i: int) -> tuple:
    return _cost_group(_JOB["groups"][i], _JOB)


def _workers(workers, groups: int) -> int:
    import multiprocessing
    import os

    if workers is None:
        if "fork" not in multiprocessing.get_all_start_methods():
            return 1
        workers = os.cpu_count() or 1
    return max(1, min(workers, groups))


def _run_groups(groups, job, n):
    """Each group's ``(results, refusals)``; ``n`` processes (forked: the model is not
    pickled; only the results come back)."""
    _SHARED.clear()
    if n == 1:
        for g in groups:
            yield _cost_group(g, job)
        _SHARED.clear()
        return
    import multiprocessing

    _JOB.clear()
    _JOB.update(job)
    _JOB["groups"] = groups
    ctx = multiprocessing.get_context("fork")
    try:
        with ctx.Pool(n) as pool:
            # biggest groups first, so that the last one to finish is short
            order = sorted(range(len(groups)), key=lambda i: (-len(groups[i]), i))
            yield from pool.imap(_in_worker, order)
    finally:
        _JOB.clear()
        _SHARED.clear()
