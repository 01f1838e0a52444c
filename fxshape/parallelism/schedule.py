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
           "bubble_fraction"]


@dataclass(frozen=True)
class Pass:
    """One forward (``"F"``) or backward (``"B"``) of micro-batch ``micro`` through the
    rank's ``chunk`` (0 .. v − 1; virtual stage ``chunk × p + rank``)."""

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


def play(order: list, fwd, bwd, send=0.0) -> Playout:
    """Run ``order`` (:func:`orders`): ``fwd[s]``, ``bwd[s]``: the time of one micro-batch's
    forward and backward through virtual stage ``s`` (``chunk × p + rank``); ``send``: the
    time to pass an activation (or its gradient) from stage ``s`` to ``s + 1`` (a number, or
    one per boundary).

    Raises:
        ValueError: orders that wait on each other for ever.
    """
    p = len(order)
    stages = len(fwd)
    if len(bwd) != stages or stages % p:
        raise ValueError(f"{stages} forward and {len(bwd)} backward stage times for "
                         f"{p} ranks: one of each per virtual stage, a multiple of the ranks")
    sends = [send] * max(stages - 1, 0) if isinstance(send, (int, float)) else list(send)
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
                s = x.chunk * p + d
                if x.kind == "F":
                    dep = None if s == 0 else ("F", x.micro, s - 1)
                    cost, wire = fwd[s], (sends[s - 1] if s else 0.0)
                else:
                    dep = ("F", x.micro, s) if s == stages - 1 else ("B", x.micro, s + 1)
                    cost, wire = bwd[s], (0.0 if s == stages - 1 else sends[s])
                if dep is not None and dep not in done:
                    break
                ready = 0.0 if dep is None else done[dep] + wire
                start = max(free[d], ready)
                free[d] = start + cost
                spans[d].append((x.kind, x.micro, x.chunk, start, free[d]))
                busy[d] += cost
                done[(x.kind, x.micro, s)] = free[d]
                pos[d] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise ValueError("the pipeline orders wait on each other for ever")
    return Playout(makespan=max(free), busy=tuple(busy), ends=tuple(free),
                   passes=tuple(tuple(x) for x in spans))


def in_flight(order: list) -> list:
    """Per rank, the most chunk-activations it holds at once: forwards run whose backward
    has not (one chunk of one micro-batch each)."""
    out = []
    for seq in order:
        held = peak = 0
        for x in seq:
            held += 1 if x.kind == "F" else -1
            peak = max(peak, held)
        out.append(peak)
    return out


def bubble_fraction(schedule: str, p: int, m: int, v: int = 1) -> float:
    """The closed form: idle over useful time with equal stage times, free transfers."""
    return (p - 1) / (m * (v if schedule != "gpipe" else 1))
