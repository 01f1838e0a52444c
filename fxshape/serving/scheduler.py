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
    _check_run(requests, config, spec_k, acceptance)
    eng = _Engine(requests, config, spec_k, acceptance, seed)
    while eng.done < len(eng.reqs):
        if not eng.admit():
            continue
        sched, decode, chunks = eng.schedule()
        if not sched:
            raise RuntimeError("the scheduler could not place a request (a bug: report it)")
        dt = step.time_s(decode, chunks, q=spec_k + 1) if spec_k else \
            step.time_s(decode, chunks)
        eng.play(sched, dt)
    return eng.run()


def _check_run(requests, config: EngineConfig, spec_k, acceptance) -> None:
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
    bs = config.block_size
    for i, r in enumerate(requests):  # (its last drafts' slots included)
        need = -(-(r.prompt_len + r.output_len - 1 + spec_k) // bs)
        if need > config.kv_blocks:
            raise ValueError(f"request {i} ({r.prompt_len:,} + {r.output_len:,} tokens) needs "
                             f"{need:,} KV blocks of {bs} tokens; the cache holds "
                             f"{config.kv_blocks:,}")


class _Engine:
    """The scheduler's state while :func:`run_engine` plays: the client's requests in flight
    (``max_concurrency``), the waiting and running queues, the free KV blocks, the clock,
    and what the run reports (steps, preemptions, inter-token gaps, KV and batch areas)."""

    def __init__(self, requests, config: EngineConfig, spec_k, acceptance, seed):
        self.config, self.spec_k, self.acceptance = config, spec_k, acceptance
        self.rng = random.Random(seed)
        self.reqs = [_Req(i, r) for i, r in enumerate(requests)]
        self.arrivals = deque(sorted(self.reqs, key=lambda q: q.arrival))
        self.cap = config.max_concurrency or len(self.reqs)
        self.waiting: deque = deque()
        self.running: list = []
        self.free = config.kv_blocks
        self.now = 0.0
        self.inflight = self.done = self.steps = self.preemptions = 0
        self.drafts = self.accepted = 0
        self.freed_at = 0.0  # when the client last had a slot free up after being full
        self.regular: dict = {}
        self.irregular: list = []
        self.kv_area = self.run_area = self.busy = 0.0
        self.peak_used = 0
        self.start = None

    def admit(self) -> bool:
        """The arrivals the client can send now join the waiting queue; False (the clock
        moved to the next arrival) when nothing is left to run."""
        while self.arrivals and self.arrivals[0].arrival <= self.now and \
                self.inflight < self.cap:
            q = self.arrivals.popleft()
            q.sent = max(q.arrival, self.freed_at)
            self.inflight += 1
            self.waiting.append(q)
        if self.start is None and self.waiting:
            self.start = self.waiting[0].sent
        if not self.running and not self.waiting:
            self.now = max(self.now, self.arrivals[0].arrival)
            return False
        return True

    def schedule(self) -> tuple:
        """One step's ``(scheduled [(request, tokens, speculative)], decode contexts,
        prefill chunks [(tokens, cached)])``: the running requests first (preempting the
        newest when blocks run out), then the waiting ones while the budget lasts."""
        state = _Step(self.config.max_num_batched_tokens)
        self._schedule_running(state)
        if not state.preempted:
            self._schedule_waiting(state)
        return state.sched, state.decode, state.chunks

    def _schedule_running(self, st) -> None:
        bs, width, spec_k = self.config.block_size, self.spec_k + 1, self.spec_k
        i = 0
        while i < len(self.running) and st.budget > 0:
            q = self.running[i]
            c = q.computed
            want = q.prompt + q.generated - c
            spec = spec_k and want == 1 and q.generated
            if spec:  # its last token and the drafts, all or nothing
                if st.budget < width:
                    break
                want = width
                need = max(0, -(-(c + width) // bs) - q.blocks)
            elif want == 1 and not spec_k:  # decode: a new block when the cache fills its
                need = 0 if c % bs else 1  # last (blocks hold ceil(computed / block))
            else:
                if want > st.budget:
                    want = st.budget
                need = max(0, -(-(c + want) // bs) - q.blocks)
            if self._preempt_for(q, need, st):
                break
            self.free -= need
            q.blocks += need
            st.budget -= want
            st.sched.append((q, want, bool(spec)))
            if spec or (want == 1 and not spec_k):
                st.decode.append(c + want)
            else:
                st.chunks.append((want, c))
            i += 1

    def _preempt_for(self, q, need: int, st) -> bool:
        """Preempt the newest running requests until ``need`` blocks are free; True when
        ``q`` itself was preempted."""
        while need > self.free:
            v = self.running.pop()
            self.free += v.blocks
            v.blocks = v.computed = 0
            v.preempted += 1
            self.preemptions += 1
            st.preempted = True
            self.waiting.appendleft(v)
            if v is q:
                return True
        return False

    def _schedule_waiting(self, st) -> None:
        bs = self.config.block_size
        while self.waiting and st.budget > 0 and len(self.running) < self.config.max_num_seqs:
            q = self.waiting[0]
            want = min(q.prompt + q.generated - q.computed, st.budget)
            need = -(-want // bs)
            if need > self.free:
                break
            self.waiting.popleft()
            self.running.append(q)
            self.free -= need
            q.blocks = need
            st.budget -= want
            st.sched.append((q, want, False))
            if want == 1 and not self.spec_k:
                st.decode.append(1)
            else:
                st.chunks.append((want, 0))

    def play(self, sched, dt: float) -> None:
        """The step of ``sched`` run for ``dt`` seconds: each request's tokens computed and
        sampled (speculative drafts accepted at random), finished requests freed."""
        used = self.config.kv_blocks - self.free
        self.peak_used = max(self.peak_used, used)
        self.kv_area += used * dt
        self.run_area += len(self.running) * dt
        self.busy += dt
        t0, self.now = self.now, self.now + dt
        now = self.now
        self.steps += 1
        finished = False
        gaps = 0
        for q, want, spec in sched:
            if spec:
                a = 0
                while a < self.spec_k and self.rng.random() < self.acceptance:
                    a += 1
                self.drafts += self.spec_k
                self.accepted += a
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
                self.irregular.append(now - q.last)
            q.last = now
            if q.generated == q.output:
                q.finish = now
                self.free += q.blocks
                q.blocks = 0
                self.done += 1
                finished = True
                if self.inflight == self.cap:
                    self.freed_at = now
                self.inflight -= 1
        if gaps:
            self.regular[dt] = self.regular.get(dt, 0) + gaps
        if finished:
            self.running = [q for q in self.running if q.finish < 0]

    def run(self) -> EngineRun:
        reqs, total = self.reqs, self.config.kv_blocks
        end = max(q.finish for q in reqs)
        duration = end - (self.start or 0.0)
        itl = tuple(sorted(self.regular.items())) + \
            tuple((g, 1) for g in sorted(self.irregular))
        results = tuple(RequestResult(arrival_s=q.arrival, sent_s=q.sent, prompt_len=q.prompt,
                                      output_len=q.output, ttft_s=q.first - q.sent,
                                      latency_s=q.finish - q.sent, preemptions=q.preempted)
                        for q in reqs)
        return EngineRun(requests=results, duration_s=duration, steps=self.steps,
                         preemptions=self.preemptions, itl=itl, drafts=self.drafts,
                         accepted=self.accepted,
                         kv_mean=self.kv_area / total / duration if duration > 0 else 0.0,
                         kv_peak=self.peak_used / total,
                         mean_running=self.run_area / self.busy if self.busy > 0 else 0.0,
                         busy_s=self.busy)


class _Step:
    """One step being scheduled: the token budget left, what is scheduled, the decode
    contexts and prefill chunks, and whether a request was preempted for it."""

    __slots__ = ("budget", "sched", "decode", "chunks", "preempted")

    def __init__(self, budget: int):
        self.budget = budget
        self.sched, self.decode, self.chunks = [], [], []
        self.preempted = False


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
