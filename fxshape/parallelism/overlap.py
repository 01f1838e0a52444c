"""Communication beside compute: FSDP's prefetched all-gathers, and gradient reductions that
run while the backward goes on.

:func:`prefetched` is FSDP2's per-block overlap (one block of prefetch, as its forward and
backward prefetching do by default): block ``i``'s parameters are all-gathered on the
communication stream while block ``i − 1`` computes; block ``i`` starts when its gather is
done and the previous block is; in the backward each block's gradients are reduce-scattered
on the same stream once the block is done, behind the next block's gather. The stream runs
its collectives one at a time, in the order they are issued.

:func:`bucketed` is DDP's (and ZeRO-1/2's) gradient reduction: buckets ready as the backward
produces their gradients (in proportion to its time), reduced one after another; what runs
past the backward's end is exposed.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Overlap", "prefetched", "bucketed", "buckets", "BUCKET_BYTES"]

#: DDP's ``bucket_cap_mb`` (25 MiB)
BUCKET_BYTES = 25 * 2 ** 20


@dataclass(frozen=True)
class Overlap:
    """``end``: when the compute and the collectives are all done (from 0); ``compute``:
    the compute alone; ``comm``: the collectives' total; ``exposed = end − compute``."""

    end: float
    compute: float
    comm: float

    @property
    def exposed(self) -> float:
        return max(0.0, self.end - self.compute)


def prefetched(compute, gathers, reduces=None) -> Overlap:
    """Blocks run in order: ``compute[i]`` needs ``gathers[i]`` (0: nothing to gather) done;
    ``gathers[i + 1]`` is issued when block ``i`` starts; ``reduces[i]`` (the backward's
    reduce-scatter) when block ``i`` ends."""
    n = len(compute)
    reduces = [0.0] * n if reduces is None else list(reduces)
    if len(gathers) != n or len(reduces) != n:
        raise ValueError("one gather and one reduce per block")
    if not n:
        return Overlap(0.0, 0.0, 0.0)
    stream = float(gathers[0])
    ready = stream
    t = 0.0
    for i in range(n):
        start = max(t, ready)
        if i + 1 < n:
            stream = max(stream, start) + gathers[i + 1]
            ready = stream
        t = start + compute[i]
        if reduces[i]:
            stream = max(stream, t) + reduces[i]
    return Overlap(end=max(t, stream), compute=float(sum(compute)),
                   comm=float(sum(gathers) + sum(reduces)))


def bucketed(duration: float, sizes, times) -> Overlap:
    """Buckets of ``sizes`` bytes, each taking ``times[i]``, ready as a backward of
    ``duration`` produces them (evenly over its time), reduced in order."""
    total = sum(sizes)
    done = end = 0.0
    for b, t in zip(sizes, times):
        done += b
        ready = duration * done / total if total else duration
        end = max(end, ready) + t
    return Overlap(end=max(end, duration), compute=duration, comm=float(sum(times)))


def buckets(nbytes: int, cap: int = BUCKET_BYTES) -> list:
    """``nbytes`` of gradients cut into DDP's buckets of ``cap`` bytes (the last one short)."""
    return [cap] * (nbytes // cap) + ([nbytes % cap] if nbytes % cap else [])
