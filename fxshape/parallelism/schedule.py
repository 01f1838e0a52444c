"""Pipeline schedules played out over the micro-batches.

A pipeline of ``p`` ranks holds ``S = p × v`` model chunks (virtual stages): rank ``d`` holds
chunks ``d, d + p, d + 2p, ...`` (Megatron's interleaving; ``v = 1``: one contiguous chunk
each). :func:`orders` gives each rank's sequence of forward and backward passes:

- **GPipe**: every micro-batch's forward, then every backward (Huang et al. 2019).
- **1F1B** (PipeDream-flush; Narayanan et al. 2021): rank ``d`` runs ``p − d − 1`` warm-up
  forwards, then alternates one forward and one backward, then drains the backwards.
- **Interleaved 1F1B** (Narayanan et al. 2021, sec. 2.2; Megatron-LM's
  ``forward_backward_pipelining_with_interleaving``): ``(p − d − 1) × 2 + (v − 1) × p``
  warm-up passes, chunks taken ``p`` micro-batches at a time.
- **ZB-V** (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, sec. 6; PyTorch's
  ``ScheduleZBVZeroBubble``, torchtitan's ``ZBVZeroBubble``): two chunks a rank placed in a
  V (rank ``d`` holds stages ``d`` and ``2p − 1 − d``, so the first rank holds the embedding
  and the head, and the turn at stage ``p − 1`` to ``p`` stays on one rank), each backward
  split into its input-gradient pass (``"I"``: what the previous stage waits for) and its
  weight-gradient pass (``"W"``: nothing waits for it), the ``W`` passes moved into what
  would be the bubble. Each rank's order is PyTorch's (``_calculate_single_rank_operations``
  of ``ScheduleZBVZeroBubble``, torch 2.13): ``2(p − d) − 1`` forwards of chunk 0, ``d``
  pairs of chunk-1 and chunk-0 forwards, ``p − d`` rounds of a chunk-1 F, I, W, then the
  steady F I W of each chunk in turn, and a cool-down of I passes with the deferred W.

:func:`play` runs them: a pass starts when its rank is free and its input has arrived (the
previous chunk's forward of that micro-batch plus the activation's send/recv; for a
backward, the next chunk's backward plus the gradient's send/recv). With equal stage times
and free transfers the idle time is the closed form: bubble fraction ``(p − 1) / m`` for
GPipe and 1F1B, ``(p − 1) / (v m)`` interleaved (:func:`bubble_fraction`).
:func:`in_flight` counts the micro-batches whose activations a rank holds at once (GPipe:
all ``m``; 1F1B: ``p − d``), in chunks.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

__all__ = ["Pass", "Playout", "orders", "frozen_orders", "play", "in_flight",
           "bubble_fraction", "stage_of", "stages_of_rank", "rank_of_stage",
           "SPLIT_BACKWARD", "V_SCHEDULES"]

#: schedules whose backward runs as separate input-gradient (``"I"``) and weight-gradient
#: (``"W"``) passes
SPLIT_BACKWARD = ("zbv",)
#: schedules that place a rank's two chunks in a V (stages ``d`` and ``2p − 1 − d``)
V_SCHEDULES = ("zbv",)


def stage_of(schedule: str, rank: int, chunk: int, p: int) -> int:
    """The virtual stage of ``rank``'s ``chunk``: ``chunk × p + rank`` (Megatron's loop), or
    in a V schedule ``rank`` then ``2p − 1 − rank``."""
    if schedule in V_SCHEDULES:
        return rank if chunk == 0 else 2 * p - 1 - rank
    return chunk * p + rank


def stages_of_rank(schedule: str, rank: int, p: int, v: int) -> list:
    """The virtual stages ``rank`` holds, chunk by chunk."""
    return [stage_of(schedule, rank, c, p) for c in range(v)]


def rank_of_stage(schedule: str, stage: int, p: int) -> int:
    """The rank that holds virtual ``stage``."""
    if schedule in V_SCHEDULES:
        return stage if stage < p else 2 * p - 1 - stage
    return stage % p


@dataclass(frozen=True)
class Pass:
    """One forward (``"F"``) or backward (``"B"``; split: its input-gradient ``"I"`` and
    weight-gradient ``"W"`` passes) of micro-batch ``micro`` through the rank's ``chunk``
    (0 .. v − 1; virtual stage :func:`stage_of`)."""

    kind: str
    micro: int
    chunk: int


@dataclass(frozen=True)
class Playout:
    """``makespan``: from the first forward's start to the last backward's end; ``busy``:
    each rank's compute time; ``ends``: when each rank's last pass ends; ``passes``: per
    rank, each pass as ``(kind, micro, chunk, start, end)`` in the order it ran."""

    makespan: float
    busy: tuple
    ends: tuple
    passes: tuple = ()

    @property
    def bubble(self) -> tuple:
        """Each rank's idle time inside the makespan."""
        return tuple(self.makespan - b for b in self.busy)


def _interleaved_chunk(k: int, p: int, v: int, forward: bool) -> tuple:
    """(micro-batch, chunk) of a rank's ``k``-th forward or backward (Megatron)."""
    group = k % (p * v)
    chunk = group // p
    micro = (k // (p * v)) * p + k % p
    return micro, chunk if forward else v - 1 - chunk


def orders(schedule: str, p: int, m: int, v: int = 1) -> list:
    """Each rank's passes, in the order it runs them (a list per rank)."""
    return [list(seq) for seq in frozen_orders(schedule, p, m, v)]


@functools.lru_cache(maxsize=256)
def frozen_orders(schedule: str, p: int, m: int, v: int = 1) -> tuple:
    """:func:`orders` as tuples, computed once per schedule and sizes (a plan search asks
    for the same few many times)."""
    if schedule == "zbv":
        if v != 2:
            raise ValueError(f"the ZB-V schedule holds two chunks a rank, got v={v}")
        return tuple(_zbv_rank(d, p, m) for d in range(p))
    out = []
    for d in range(p):
        if schedule == "gpipe":
            seq = [Pass("F", i, 0) for i in range(m)] + [Pass("B", i, 0) for i in range(m)]
        elif v == 1:
            warm = min(p - d - 1, m)
            seq = [Pass("F", i, 0) for i in range(warm)]
            f, b = warm, 0
            while f < m:
                seq += [Pass("F", f, 0), Pass("B", b, 0)]
                f, b = f + 1, b + 1
            seq += [Pass("B", i, 0) for i in range(b, m)]
        else:
            total = m * v
            warm = min((p - d - 1) * 2 + (v - 1) * p, total)
            seq = [Pass("F", *_interleaved_chunk(k, p, v, True)) for k in range(warm)]
            f, b = warm, 0
            while f < total:
                seq.append(Pass("F", *_interleaved_chunk(f, p, v, True)))
                seq.append(Pass("B", *_interleaved_chunk(b, p, v, False)))
                f, b = f + 1, b + 1
            seq += [Pass("B", *_interleaved_chunk(k, p, v, False)) for k in range(b, total)]
        out.append(tuple(seq))
    return tuple(out)


def _zbv_rank(d: int, p: int, m: int) -> tuple:
    """Rank ``d``'s ZB-V passes (PyTorch's order, module docstring): planned for
    ``max(2p − 1, m)`` micro-batches, the passes of those past ``m`` dropped."""
    n = max(2 * p - 1, m)
    seq = []
    f = [0, 0]  # forwards run, per chunk
    b = [0, 0]  # input-gradient passes run
    w = [0, 0]  # weight-gradient passes run

    def add(kind, chunk):
        count = {"F": f, "I": b, "W": w}[kind]
        seq.append(Pass(kind, count[chunk], chunk))
        count[chunk] += 1

    for _ in range(2 * (p - d) - 1):
        add("F", 0)
    for _ in range(d):
        add("F", 1)
        add("F", 0)
    for _ in range(p - d):
        add("F", 1)
        add("I", 1)
        add("W", 1)
    while f[1] < f[0] or f[0] < n:
        if f[0] < n:
            add("F", 0)
        add("I", 0)
        add("W", 0)
        add("F", 1)
        add("I", 1)
        add("W", 1)
    for _ in range(d):  # cool-down: input gradients first, their weight gradients later
        add("I", 0)
        add("I", 1)
    for _ in range(p - d):
        add("I", 0)
        add("W", 0)
    while w[1] < b[1]:
        add("W", 1)
    while w[0] < b[0]:
        add("W", 0)
    return tuple(x for x in seq if x.micro < m)


def play(order: list, fwd, bwd, send=0.0, wgrad=None, schedule: str = "1f1b") -> Playout:
    """Run ``order`` (:func:`orders`): ``fwd[s]``, ``bwd[s]``: the time of one micro-batch's
    forward and backward through virtual stage ``s`` (``chunk × p + rank``); ``send``: the
    time to pass an activation (or its gradient) from stage ``s`` to ``s + 1`` (a number, or
    one per boundary; a boundary inside one rank, a V schedule's turn, costs none);
    ``wgrad[s]``: the weight-gradient part of ``bwd[s]``, which a split backward runs as its
    ``"W"`` pass (the rest is its ``"I"`` pass); ``schedule``: whose stage placement
    (:func:`stage_of`).

    Raises:
        ValueError: orders that wait on each other for ever.
    """
    p = len(order)
    stages = len(fwd)
    if len(bwd) != stages or stages % p:
        raise ValueError(f"{stages} forward and {len(bwd)} backward stage times for "
                         f"{p} ranks: one of each per virtual stage, a multiple of the ranks")
    sends = [send] * max(stages - 1, 0) if isinstance(send, (int, float)) else list(send)
    wgrad = [0.0] * stages if wgrad is None else list(wgrad)
    if len(wgrad) != stages:
        raise ValueError(f"{len(wgrad)} weight-gradient times for {stages} stages")
    sends = [0.0 if rank_of_stage(schedule, b, p) == rank_of_stage(schedule, b + 1, p)
             else x for b, x in enumerate(sends)]
    done: dict = {}
    free = [0.0] * p
    busy = [0.0] * p
    pos = [0] * p
    spans = [[] for _ in range(p)]
    remaining = sum(len(o) for o in order)
    while remaining:
        progressed = False
        for d in range(p):
            while pos[d] < len(order[d]):
                x = order[d][pos[d]]
                s = stage_of(schedule, d, x.chunk, p)
                kind = "B" if x.kind == "I" else x.kind  # the gradient the stage before waits on
                if x.kind == "F":
                    dep = None if s == 0 else ("F", x.micro, s - 1)
                    cost, wire = fwd[s], (sends[s - 1] if s else 0.0)
                elif x.kind == "W":  # after its own stage's input gradient, on this rank
                    dep = ("B", x.micro, s)
                    cost, wire = wgrad[s], 0.0
                else:
                    dep = ("F", x.micro, s) if s == stages - 1 else ("B", x.micro, s + 1)
                    cost = bwd[s] - (wgrad[s] if x.kind == "I" else 0.0)
                    wire = 0.0 if s == stages - 1 else sends[s]
                if dep is not None and dep not in done:
                    break
                ready = 0.0 if dep is None else done[dep] + wire
                start = max(free[d], ready)
                free[d] = start + cost
                spans[d].append((x.kind, x.micro, x.chunk, start, free[d]))
                busy[d] += cost
                done[(kind, x.micro, s)] = free[d]
                pos[d] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise ValueError("the pipeline orders wait on each other for ever")
    return Playout(makespan=max(free), busy=tuple(busy), ends=tuple(free),
                   passes=tuple(tuple(x) for x in spans))


def in_flight(order: list) -> list:
    """Per rank, the most chunk-activations it holds at once: forwards run whose backward
    has not (one chunk of one micro-batch each); a split backward frees them with its
    weight-gradient pass, which reads the layer inputs."""
    out = []
    for seq in order:
        held = peak = 0
        for x in seq:
            held += 1 if x.kind == "F" else 0 if x.kind == "I" else -1
            peak = max(peak, held)
        out.append(peak)
    return out


def bubble_fraction(schedule: str, p: int, m: int, v: int = 1) -> float:
    """The closed form: idle over useful time with equal stage times, free transfers (for
    ZB-V, whose bubble depends on how the backward splits, none: play it out)."""
    if schedule in SPLIT_BACKWARD:
        raise ValueError(f"{schedule}: no closed form; play the orders out (play)")
    return (p - 1) / (m * (v if schedule != "gpipe" else 1))
