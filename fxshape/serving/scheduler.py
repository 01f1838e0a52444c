"""Continuous batching as vLLM's scheduler runs it, played step by step.

Each step (vLLM V1's ``Scheduler.schedule``, FCFS):

1. **The running requests first**, in admission order: each gets the tokens it still has
   to compute (the rest of its prompt, a chunk of it, or one token in decode), up to the
   step's token budget (``max_num_batched_tokens``: chunked prefill). Each needs KV blocks
   (``block_size`` tokens) for everything it has computed plus this step's tokens; when the
   free blocks run short the last running request is **preempted** (its blocks freed, put
   back at the head of the queue, recomputed from scratch when it returns: vLLM V1's only
   mode), until the request fits or is itself the one preempted.
2. **Then the waiting requests** (none in a step that preempted), oldest first, while the
   budget lasts, fewer than ``max_num_seqs`` run, and blocks are free for their first chunk.
3. The step's time is priced from its mix (``BatchStep.time_s``: one token per decode
   request at its own context, each prefill chunk over what its request has cached). At
   its end each request that has computed all its tokens samples one: its first token
   (time to first token), the next (an inter-token gap), or its last (it finishes and
   frees its blocks).

A client may cap the requests in flight (``max_concurrency``, as ``vllm bench serve
--max-concurrency``): a request is sent when it has arrived and a slot is free; its times
count from then. The clock jumps over idle gaps to the next arrival.

:func:`run_engine` is a plain loop, no event library: the step is the only event.
"""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass

__all__ = ["EngineConfig", "RequestResult", "EngineRun", "run_engine", "percentile",
           "weighted_percentile"]


@dataclass(frozen=True)
class EngineConfig:
    """The scheduler's limits (vLLM's names)."""

    max_num_seqs: int
    max_num_batched_tokens: int
    block_size: int
    kv_blocks: int  # blocks of the KV cache (all GPUs of a tensor-parallel group alike)
    max_concurrency: int | None = None

    def __post_init__(self):
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size", "kv_blocks"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        c = self.max_concurrency
        if c is not None and (isinstance(c, bool) or not isinstance(c, int) or c <= 0):
            raise ValueError(f"max_concurrency must be a positive integer or None (no cap), "
                             f"got {c!r}")


@dataclass(frozen=True)
class RequestResult:
    """One request as served. Seconds from the start; ``ttft_s`` and ``latency_s`` from the
    moment it was sent."""

    arrival_s: float
    sent_s: float
    prompt_len: int
    output_len: int
    ttft_s: float
    latency_s: float
    preemptions: int

    @property
    def tpot_s(self) -> float:
        """Time per output token after the first (0 for one output token)."""
        if self.output_len <= 1:
            return 0.0
        return (self.latency_s - self.ttft_s) / (self.output_len - 1)


@dataclass(frozen=True)
class EngineRun:
    """What :func:`run_engine` played."""

    requests: tuple  # RequestResult, in the order given
    duration_s: float  # from the first request sent to the last finished
    steps: int
    preemptions: int
    #: inter-token gaps as (seconds, count) pairs: each step's time for the requests that
    #: sampled in it and in the step before, and the longer gaps one by one
    itl: tuple
    kv_mean: float  # time-weighted fraction of the KV blocks in use over the duration
    kv_peak: float
    mean_running: float  # time-weighted requests running over the busy time
    busy_s: float  # time the engine was running steps
    drafts: int = 0  # speculative tokens proposed
    accepted: int = 0  # ... and accepted


class _Req:
    __slots__ = ("i", "arrival", "sent", "prompt", "output", "computed", "generated",
                 "blocks", "first", "last", "preempted", "finish")

    def __init__(self, i, r):
        self.i, self.arrival, self.prompt, self.output = i, r.arrival_s, r.prompt_len, \
            r.output_len
        self.sent = r.arrival_s
        self.computed = self.generated = self.blocks = self.preempted = 0
        self.first = self.last = self.finish = -1.0


def run_engine(step, requests, config: EngineConfig, *, spec_k: int = 0,
               acceptance: float = 0.0, seed: int = 0) -> EngineRun:
    """Play ``requests`` (``fxshape.serving.traffic.Request``, sorted by arrival) through the
    scheduler (module docstring), each step priced by ``step.time_s(decode_contexts,
    chunks)``.

    With ``spec_k`` drafts (speculative decoding, as vLLM V1 schedules it), each decode
    request feeds its last token and ``spec_k`` drafts (``spec_k + 1`` tokens of the budget
    and of KV slots), the step is priced by ``step.time_s(decode_contexts, chunks,
    q=spec_k + 1)`` (``fxshape.serving.speculative.SpeculativeStep``), and the request
    gains ``1 + a`` tokens, ``a`` the drafts accepted before the first rejection, each with
    probability ``acceptance`` (drawn from a generator seeded with ``seed``).

    Raises:
        ValueError: no requests; a request whose KV cache alone exceeds the blocks; a bad
            ``spec_k`` or acceptance; a token budget below one speculative decode.
    """
    if not requests:
        raise ValueError("no requests to serve")
    if isinstance(spec_k, bool) or not isinstance(spec_k, int) or not 0 <= spec_k <= 15:
        raise ValueError(f"spec_k must be an integer from 0 (no speculation) to 15, got "
                         f"{spec_k!r}")
    if isinstance(acceptance, bool) or not isinstance(acceptance, (int, float)) or \
            not 0 <= acceptance <= 1:
        raise ValueError(f"acceptance must be in [0, 1], got {acceptance!r}")
    width = spec_k + 1
    if spec_k and config.max_num_batched_tokens < width:
        raise ValueError(f"max_num_batched_tokens {config.max_num_batched_tokens} is below "
                         f"one speculative decode's {width} tokens (its last token and "
                         f"{spec_k} drafts, scheduled all or nothing): no request could "
                         f"ever decode; accepted: at least {width}")
    rng = random.Random(seed)
    drafts = accepted = 0
    bs, total_blocks = config.block_size, config.kv_blocks
    for i, r in enumerate(requests):  # (its last drafts' slots included)
        need = -(-(r.prompt_len + r.output_len - 1 + spec_k) // bs)
        if need > total_blocks:
            raise ValueError(f"request {i} ({r.prompt_len:,} + {r.output_len:,} tokens) needs "
                             f"{need:,} KV blocks of {bs} tokens; the cache holds "
                             f"{total_blocks:,}")
    reqs = [_Req(i, r) for i, r in enumerate(requests)]
    arrivals = deque(sorted(reqs, key=lambda q: q.arrival))
    cap = config.max_concurrency or len(reqs)
    budget0, max_seqs = config.max_num_batched_tokens, config.max_num_seqs
    waiting: deque = deque()
    running: list = []
    free = total_blocks
    now = 0.0
    inflight = done = steps = preemptions = 0
    freed_at = 0.0  # when the client last had a slot free up after being full
    regular: dict = {}
    irregular: list = []
    kv_area = run_area = busy = 0.0
    peak_used = 0
    start = None
    n = len(reqs)
    while done < n:
        while arrivals and arrivals[0].arrival <= now and inflight < cap:
            q = arrivals.popleft()
            q.sent = max(q.arrival, freed_at)
            inflight += 1
            waiting.append(q)
        if start is None and waiting:
            start = waiting[0].sent
        if not running and not waiting:
            now = max(now, arrivals[0].arrival)
            continue
        budget = budget0
        decode, chunks, sched = [], [], []
        preempted = False
        i = 0
        while i < len(running) and budget > 0:
            q = running[i]
            c = q.computed
            want = q.prompt + q.generated - c
            spec = spec_k and want == 1 and q.generated
            if spec:  # its last token and the drafts, all or nothing
                if budget < width:
                    break
                want = width
                need = max(0, -(-(c + width) // bs) - q.blocks)
            elif want == 1 and not spec_k:  # decode: a new block when the cache fills its
                need = 0 if c % bs else 1  # last (blocks hold ceil(computed / block))
            else:
                if want > budget:
                    want = budget
                need = max(0, -(-(c + want) // bs) - q.blocks)
            itself = False
            while need > free:
                v = running.pop()
                free += v.blocks
                v.blocks = v.computed = 0
                v.preempted += 1
                preemptions += 1
                preempted = True
                waiting.appendleft(v)
                if v is q:
                    itself = True
                    break
            if itself:
                break
            free -= need
            q.blocks += need
            budget -= want
            sched.append((q, want, bool(spec)))
            if spec or (want == 1 and not spec_k):
                decode.append(c + want)
            else:
                chunks.append((want, c))
            i += 1
        if not preempted:
            while waiting and budget > 0 and len(running) < max_seqs:
                q = waiting[0]
                want = min(q.prompt + q.generated - q.computed, budget)
                need = -(-want // bs)
                if need > free:
                    break
                waiting.popleft()
                running.append(q)
                free -= need
                q.blocks = need
                budget -= want
                sched.append((q, want, False))
                if want == 1 and not spec_k:
                    decode.append(1)
                else:
                    chunks.append((want, 0))
        if not sched:
            raise RuntimeError("the scheduler could not place a request (a bug: report it)")
        dt = step.time_s(decode, chunks, q=width) if spec_k else step.time_s(decode, chunks)
        used = total_blocks - free
        peak_used = max(peak_used, used)
        kv_area += used * dt
        run_area += len(running) * dt
        busy += dt
        t0, now = now, now + dt
        steps += 1
        finished = False
        gaps = 0
        for q, want, spec in sched:
            if spec:
                a = 0
                while a < spec_k and rng.random() < acceptance:
                    a += 1
                drafts += spec_k
                accepted += a
                take = min(1 + a, q.output - q.generated)
                q.computed += take  # the token fed and the drafts accepted
                q.generated += take - 1  # (one more below: the token sampled)
            else:
                q.computed += want
                if q.computed < q.prompt + q.generated:
                    continue
            q.generated += 1
            if q.generated == 1:
                q.first = now
            elif q.last == t0:
                gaps += 1
            else:
                irregular.append(now - q.last)
            q.last = now
            if q.generated == q.output:
                q.finish = now
                free += q.blocks
                q.blocks = 0
                done += 1
                finished = True
                if inflight == cap:
                    freed_at = now
                inflight -= 1
        if gaps:
            regular[dt] = regular.get(dt, 0) + gaps
        if finished:
            running = [q for q in running if q.finish < 0]
    end = max(q.finish for q in reqs)
    duration = end - (start or 0.0)
    itl = tuple(sorted(regular.items())) + tuple((g, 1) for g in sorted(irregular))
    results = tuple(RequestResult(arrival_s=q.arrival, sent_s=q.sent, prompt_len=q.prompt,
                                  output_len=q.output, ttft_s=q.first - q.sent,
                                  latency_s=q.finish - q.sent, preemptions=q.preempted)
                    for q in reqs)
    return EngineRun(requests=results, duration_s=duration, steps=steps,
                     preemptions=preemptions, itl=itl, drafts=drafts, accepted=accepted,
                     kv_mean=kv_area / total_blocks / duration if duration > 0 else 0.0,
                     kv_peak=peak_used / total_blocks,
                     mean_running=run_area / busy if busy > 0 else 0.0, busy_s=busy)


def percentile(values, q: float) -> float:
    """The ``q``-th percentile (0-100) of ``values``, interpolated linearly between ranks
    (numpy's default); 0 for none."""
    return weighted_percentile([(v, 1) for v in values], q)


def weighted_percentile(pairs, q: float) -> float:
    """The ``q``-th percentile of values given as ``(value, count)`` pairs, as if each value
    were repeated ``count`` times (linear interpolation between ranks); 0 for none."""
    pairs = sorted((v, c) for v, c in pairs if c > 0)
    total = sum(c for _, c in pairs)
    if total == 0:
        return 0.0
    pos = q / 100 * (total - 1)
    lo, frac = int(math.floor(pos)), pos - math.floor(pos)

    def at(rank):
        seen = 0
        for v, c in pairs:
            seen += c
            if rank < seen:
                return v
        return pairs[-1][0]

    a = at(lo)
    return a if frac == 0 else a + (at(lo + 1) - a) * frac
