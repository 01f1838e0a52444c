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

Both take ``slow``, the share of the compute's rate a collective takes while it runs beside
it (:func:`sm_share`: NCCL's CTAs each hold an SM the compute kernels cannot use), so an
overlapped collective stretches the compute under it (``Overlap.stretch``) besides what of it
is exposed.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Overlap", "prefetched", "bucketed", "buckets", "BUCKET_BYTES", "sm_share",
           "NCCL_CTAS"]

#: DDP's ``bucket_cap_mb`` (25 MiB)
BUCKET_BYTES = 25 * 2 ** 20


#: CTAs (SMs) an NCCL collective holds while it runs, by the link it crosses. NCCL runs one
#: CTA per channel and "NCCL CTAs won't share an SM with compute kernels" (S. Jeaugey,
#: NVIDIA/nccl#689); within an NVSwitch node 24 (DGX A100's all-reduce: 12 NVLinks, 24
#: CTAs, NVIDIA/nccl#1225; an H100's all-gather beside a GEMM launches 24 blocks, NVIDIA
#: developer forum "Compute-Communication Overlap Causes Severe GEMM Performance Degradation
#: because of Tail Effect", 2025, Nsight Systems); across DGX nodes with 8 adapters 16, and a
#: PCIe system with one adapter 2 (Jeaugey, NVIDIA/nccl#689). Pairs of NVLink bridges are
#: taken as NVSwitch's.
NCCL_CTAS = {"nvswitch": 24, "nvswitch_nvls": 24, "nvlink_pair": 24, "network": 16,
             "pcie": 2}


def sm_share(spec, link_class: str) -> float:
    """The share of ``spec``'s SMs an NCCL collective over a ``link_class`` link
    (``Topology.link_class``) holds while it runs: the compute beside it runs on the rest.
    0 on AMD GPUs (RCCL's CTAs are not modelled)."""
    if spec.vendor != "nvidia":
        return 0.0
    try:
        ctas = NCCL_CTAS[link_class]
    except KeyError:
        raise ValueError(f"link class {link_class!r}; accepted: "
                         + ", ".join(sorted(NCCL_CTAS))) from None
    return min(ctas, spec.sm_count) / spec.sm_count


@dataclass(frozen=True)
class Overlap:
    """``end``: when the compute and the collectives are all done (from 0); ``compute``:
    the compute alone; ``comm``: the collectives' total; ``stretch``: what the collectives
    beside the compute added to it (their SMs taken from it);
    ``exposed = end − compute − stretch``: the time the compute waits for them."""

    end: float
    compute: float
    comm: float
    stretch: float = 0.0

    @property
    def exposed(self) -> float:
        return max(0.0, self.end - self.compute - self.stretch)


def _finish(start: float, work: float, busy, slow: float) -> float:
    """When compute of ``work`` seconds (alone) started at ``start`` ends, running at
    ``1 − slow`` of its rate inside the ``busy`` intervals (in order, not overlapping)."""
    t, w = start, work
    for s, e in busy:
        if e <= t or w <= 0:
            continue
        if s > t:
            if w <= s - t:
                return t + w
            w -= s - t
            t = s
        cap = (e - t) * (1.0 - slow)
        if w <= cap:
            return t + w / (1.0 - slow)
        w -= cap
        t = e
    return t + max(w, 0.0)


def _check_slow(slow) -> float:
    if not 0.0 <= slow < 1.0:
        raise ValueError(f"slow must be in [0, 1), the compute rate a collective takes; got "
                         f"{slow!r}")
    return float(slow)


def prefetched(compute, gathers, reduces=None, slow: float = 0.0) -> Overlap:
    """Blocks run in order: ``compute[i]`` needs ``gathers[i]`` (0: nothing to gather) done;
    ``gathers[i + 1]`` is issued when block ``i`` starts; ``reduces[i]`` (the backward's
    reduce-scatter) when block ``i`` ends. While a collective runs, the compute runs at
    ``1 − slow`` of its rate."""
    n = len(compute)
    reduces = [0.0] * n if reduces is None else list(reduces)
    if len(gathers) != n or len(reduces) != n:
        raise ValueError("one gather and one reduce per block")
    slow = _check_slow(slow)
    if not n:
        return Overlap(0.0, 0.0, 0.0)
    stream = float(gathers[0])
    busy = [(0.0, stream)] if stream > 0 else []
    ready = stream
    t = stretch = 0.0
    for i in range(n):
        start = max(t, ready)
        if i + 1 < n:
            begin = max(stream, start)
            stream = begin + gathers[i + 1]
            if gathers[i + 1]:
                busy.append((begin, stream))
            ready = stream
        t = _finish(start, compute[i], busy, slow)
        stretch += (t - start) - compute[i]
        if reduces[i]:
            begin = max(stream, t)
            stream = begin + reduces[i]
            busy.append((begin, stream))
    return Overlap(end=max(t, stream), compute=float(sum(compute)),
                   comm=float(sum(gathers) + sum(reduces)), stretch=max(0.0, stretch))


def bucketed(duration: float, sizes, times, slow: float = 0.0) -> Overlap:
    """Buckets of ``sizes`` bytes, each taking ``times[i]``, ready as a backward of
    ``duration`` (alone) produces them (evenly over its work), reduced in order; the
    backward runs at ``1 − slow`` of its rate while a reduction runs."""
    slow = _check_slow(slow)
    total = sum(sizes)
    done = end = 0.0
    busy = []
    for b, t in zip(sizes, times):
        done += b
        ready = _finish(0.0, duration * done / total if total else duration, busy, slow)
        begin = max(end, ready)
        end = begin + t
        if t:
            busy.append((begin, end))
    backward = _finish(0.0, duration, busy, slow)
    return Overlap(end=max(end, backward), compute=duration, comm=float(sum(times)),
                   stretch=max(0.0, backward - duration))


def buckets(nbytes: int, cap: int = BUCKET_BYTES) -> list:
    """``nbytes`` of gradients cut into DDP's buckets of ``cap`` bytes (the last one short)."""
    return [cap] * (nbytes // cap) + ([nbytes % cap] if nbytes % cap else [])
