"""A server under load: ``fxshape.simulate_serving``.

Requests (generated at a rate, or read from a trace) are played through vLLM's scheduler
(``fxshape.serving.scheduler``: continuous batching, chunked prefill under a token budget,
paged KV blocks, preemption by recomputation), each step priced from its own mix of
decode requests and prefill chunks (``fxshape.serving.batch.BatchStep``, from one decode
capture). What a user of ``vllm bench serve`` reads comes out: request and token
throughput, time to first token, time per output token, inter-token latency and
end-to-end latency (mean and percentiles), and the KV cache's occupancy and preemptions.

vLLM's defaults (``EngineArgs.get_batch_defaults`` in ``vllm/engine/arg_utils.py``, the
OpenAI server): ``max_num_batched_tokens`` 8192 and ``max_num_seqs`` 1024 on GPUs of at
least 70 GiB other than the A100, else 2048 and 256; KV blocks of 16 tokens;
``gpu_memory_utilization`` 0.9. The KV cache gets what is left of that share of the memory
after the weights and a forward's activations at the token budget (vLLM's profiling run),
per GPU of the tensor-parallel group: ``blocks = (utilization × memory − weights −
activations) / (block_size × KV bytes per token)``.
"""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
from dataclasses import dataclass, field

from ..config.setup import takes_setup
from .batch import SERVING, BatchStep, check_fuse, logits_module_of
from .scheduler import EngineConfig, percentile, run_engine, weighted_percentile
from .traffic import Request, poisson_requests, read_trace

__all__ = ["simulate_serving", "Server", "ServingSimulation", "Stats", "engine_defaults"]

_GIB = 2**30
_BASE_BATCH = 8  # the decode capture's sequences (a CUDA-graph size)


@dataclass(frozen=True)
class Stats:
    """Mean and percentiles of one latency, in seconds."""

    mean: float
    p50: float
    p90: float
    p99: float
    max: float

    @classmethod
    def of(cls, values) -> Stats:
        values = list(values)
        if not values:
            return cls(0.0, 0.0, 0.0, 0.0, 0.0)
        return cls(statistics.fmean(values), percentile(values, 50), percentile(values, 90),
                   percentile(values, 99), max(values))

    @classmethod
    def of_pairs(cls, pairs) -> Stats:
        """From ``(value, count)`` pairs."""
        pairs = [(v, c) for v, c in pairs if c > 0]
        total = sum(c for _, c in pairs)
        if not total:
            return cls(0.0, 0.0, 0.0, 0.0, 0.0)
        return cls(sum(v * c for v, c in pairs) / total, weighted_percentile(pairs, 50),
                   weighted_percentile(pairs, 90), weighted_percentile(pairs, 99),
                   max(v for v, _ in pairs))

    def to_dict(self) -> dict:
        return {"mean": self.mean, "p50": self.p50, "p90": self.p90, "p99": self.p99,
                "max": self.max}


@dataclass(frozen=True)
class ServingSimulation:
    """A server under load (module docstring). Seconds; throughputs per second."""

    model: str
    gpu: str
    tp: int
    allreduce: str
    config: EngineConfig
    num_requests: int
    duration_s: float
    request_throughput: float
    output_tokens_per_s: float
    total_tokens_per_s: float
    ttft_s: Stats
    tpot_s: Stats  # per request: (latency - ttft) / (output - 1)
    itl_s: Stats  # every gap between two tokens of a request
    latency_s: Stats
    kv_blocks: int
    kv_mean: float  # fraction of the KV blocks in use, time-weighted over the duration
    kv_peak: float
    preemptions: int
    steps: int
    mean_running: float
    gpu_memory_utilization: float = 0.9
    #: the seed of generated requests (None for a trace or given requests)
    seed: int | None = None
    #: speculative decoding: the draft (None: none), its tokens per step, the acceptance
    #: per draft token, and the mean tokens per verification the run drew
    draft: str | None = None
    num_speculative_tokens: int = 0
    acceptance: float | None = None
    acceptance_length: float | None = None
    fuse: str = "all"
    notes: tuple = ()
    run: object = field(default=None, repr=False, compare=False)
    decode: object = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict:
        c = self.config
        return {
            "model": self.model, "gpu": self.gpu, "tp": self.tp, "allreduce": self.allreduce,
            "max_num_seqs": c.max_num_seqs, "max_num_batched_tokens": c.max_num_batched_tokens,
            "block_size": c.block_size, "max_concurrency": c.max_concurrency,
            "gpu_memory_utilization": self.gpu_memory_utilization, "seed": self.seed,
            "draft": self.draft, "num_speculative_tokens": self.num_speculative_tokens,
            "acceptance": self.acceptance, "acceptance_length": self.acceptance_length,
            "fuse": self.fuse,
            "num_requests": self.num_requests, "duration_s": self.duration_s,
            "request_throughput": self.request_throughput,
            "output_tokens_per_s": self.output_tokens_per_s,
            "total_tokens_per_s": self.total_tokens_per_s,
            "ttft_s": self.ttft_s.to_dict(), "tpot_s": self.tpot_s.to_dict(),
            "itl_s": self.itl_s.to_dict(), "latency_s": self.latency_s.to_dict(),
            "kv_blocks": self.kv_blocks, "kv_mean": self.kv_mean, "kv_peak": self.kv_peak,
            "preemptions": self.preemptions, "steps": self.steps,
            "mean_running": self.mean_running, "notes": list(self.notes)}

    def describe(self) -> str:
        c = self.config

        def ms(s: Stats) -> str:
            return (f"mean {s.mean * 1e3:,.2f}, p50 {s.p50 * 1e3:,.2f}, p90 {s.p90 * 1e3:,.2f}, "
                    f"p99 {s.p99 * 1e3:,.2f} ms")

        cap = f", at most {c.max_concurrency} in flight" if c.max_concurrency else ""
        return "\n".join([
            f"{self.model} on {self.tp} x {self.gpu}: {self.num_requests:,} requests{cap} "
            f"(max_num_seqs {c.max_num_seqs}, max_num_batched_tokens "
            f"{c.max_num_batched_tokens:,}, {self.kv_blocks:,} KV blocks of {c.block_size})",
            f"duration {self.duration_s:,.2f} s, {self.steps:,} steps: "
            f"{self.request_throughput:,.2f} requests/s, {self.output_tokens_per_s:,.1f} output "
            f"tokens/s, {self.total_tokens_per_s:,.1f} tokens/s in all",
            f"time to first token: {ms(self.ttft_s)}",
            f"time per output token: {ms(self.tpot_s)}",
            f"inter-token latency: {ms(self.itl_s)}",
            f"end-to-end latency: {ms(self.latency_s)}",
            f"KV cache: {self.kv_mean:.0%} in use on average, {self.kv_peak:.0%} at the peak; "
            f"{self.preemptions:,} preemptions; {self.mean_running:,.1f} requests running on "
            "average"] + ([
                f"speculative decoding: {self.draft} draft, {self.num_speculative_tokens} "
                f"tokens a step, acceptance {self.acceptance:.2f} (the run drew "
                f"{self.acceptance_length or 1:.2f} tokens a verification)"]
                if self.draft else []))


def engine_defaults(spec) -> tuple:
    """vLLM's ``(max_num_batched_tokens, max_num_seqs)`` for its OpenAI server on ``spec``
    (module docstring)."""
    big = spec.memory_gb * 1e9 >= 70 * _GIB and "a100" not in spec.name.lower()
    return (8192, 1024) if big else (2048, 256)


def _requests(requests, num_requests, rate, prompt_len, output_len, seed) -> tuple:
    generated = (num_requests, prompt_len, output_len)
    if requests is not None:
        if any(v is not None for v in generated):
            raise ValueError("give requests (a trace) or num_requests with prompt_len and "
                             "output_len, not both")
        if isinstance(requests, (str, os.PathLike)):
            return read_trace(os.fspath(requests))
        requests = tuple(requests)
        if not requests or not all(isinstance(r, Request) for r in requests):
            raise ValueError("requests must be a non-empty sequence of "
                             "fxshape.serving.Request or a trace file's path")
        return requests  # Server.run sorts them by arrival
    if any(v is None for v in generated):
        raise ValueError("give num_requests, prompt_len and output_len (with a rate), or "
                         "requests (a trace file's path or Request records)")
    return poisson_requests(num_requests, rate=math.inf if rate is None else rate,
                            prompt_len=prompt_len, output_len=output_len, seed=seed)


class Server:
    """One engine, prepared once: ``model`` on ``tp`` GPUs with vLLM's scheduler limits and
    KV blocks (module docstring), its steps priced from one decode capture. :meth:`run`
    serves any requests without capturing again.

    Raises:
        ValueError: as :func:`simulate_serving`.
    """

    @takes_setup(SERVING, fixed={"mode": "decode"}, defaults={"allreduce": "auto"},
                 as_setup=True)
    def __init__(self, model, *, max_num_seqs=None, max_num_batched_tokens=None,
                 block_size: int = 16, gpu_memory_utilization: float = 0.9, draft=None,
                 num_speculative_tokens: int = 3, acceptance=None, acceptance_length=None,
                 fuse="all", setup):
        from ..report.build import analyze
        from ..execution.serving import capacity_of
        from ..tracing.decode import check_decoder
        from ..tracing.facts import max_positions

        tp, allreduce = setup.parallel.tp, setup.kernels.allreduce
        if setup.kernels.attention == "math":
            raise ValueError("attention='math' is refused under load: serving engines run a "
                             "fused attention kernel (accepted: 'flash', 'fa2', 'fa3')")
        check_decoder(model)
        fuse = check_fuse(fuse)
        if draft is None and (acceptance is not None or acceptance_length is not None):
            raise ValueError("acceptance and acceptance_length apply to speculative decoding: "
                             "give a draft ('eagle' or a draft causal LM)")
        self.spec_k, self.acceptance, self.draft_name = 0, None, None
        if draft is not None:
            from .speculative import draft_model, resolve_acceptance

            self.acceptance = resolve_acceptance(num_speculative_tokens, acceptance,
                                                 acceptance_length)
            self.spec_k = num_speculative_tokens
            drafter, self.draft_name = draft_model(model, draft)
        u = gpu_memory_utilization
        if isinstance(u, bool) or not isinstance(u, (int, float)) or not 0 < u <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {u!r}")
        spec = setup.machine.spec
        d_tokens, d_seqs = engine_defaults(spec)
        self.model_name = type(model).__name__
        self.positions = max_positions(model.config)
        self.tp, self.allreduce, self.utilization = tp, allreduce, float(u)
        context = min(1024, self.positions) if self.positions else 1024
        if isinstance(block_size, int) and not isinstance(block_size, bool) and \
                self.positions and block_size > self.positions:
            raise ValueError(f"block_size={block_size} (--block-size) exceeds the model's "
                             f"{self.positions} positions: no block could ever fill; "
                             f"accepted: 1 to {self.positions} (vLLM uses 16)")
        setup = setup.replace(batch_size=_BASE_BATCH, page_size=block_size, provenance=None)
        decode = analyze(model, setup=setup.replace(context_len=context))
        config = EngineConfig(
            max_num_seqs=d_seqs if max_num_seqs is None else max_num_seqs,
            max_num_batched_tokens=d_tokens if max_num_batched_tokens is None
            else max_num_batched_tokens,
            block_size=block_size, kv_blocks=1)
        cap = capacity_of(decode)
        activations = decode.memory.activations * config.max_num_batched_tokens // _BASE_BATCH
        weights, kv_token = cap.weights, cap.kv_bytes_per_token
        draft_rep = None
        if self.spec_k:  # the draft's weights (unless the target drafts for itself) and cache
            d_pos = max_positions(drafter.config)
            draft_rep = analyze(drafter, setup=setup.replace(
                context_len=min(context, d_pos) if d_pos else context, quantize=None,
                group_size=None))
            d_cap = capacity_of(draft_rep)
            weights += d_cap.weights if drafter is not model else 0
            kv_token += d_cap.kv_bytes_per_token
        usable = int(decode.memory.capacity * u)
        free = usable - weights - activations
        blocks = free // (kv_token * block_size) if free > 0 else 0
        if blocks < 1:
            raise ValueError(
                f"no room for a KV cache on {spec.name} at tp {tp}: {u:.0%} of "
                f"{decode.memory.capacity / _GIB:.1f} GiB less the weights "
                f"({weights / _GIB:.1f} GiB) and a {config.max_num_batched_tokens:,}-token "
                f"forward's activations ({activations / _GIB:.1f} GiB) leaves nothing; raise "
                "tp or lower max_num_batched_tokens")
        self.config = dataclasses.replace(config, kv_blocks=int(blocks))
        # vLLM runs Q, K, V as one GEMM and gate and up as one (QKVParallelLinear,
        # MergedColumnParallelLinear): fuse="all"
        self.fuse = fuse
        self.step = BatchStep(decode, logits_module=logits_module_of(model), fuse=fuse)
        if self.spec_k:
            from .speculative import SpeculativeStep

            self.step = SpeculativeStep(self.step, BatchStep(
                draft_rep, logits_module=logits_module_of(drafter), fuse=fuse), self.spec_k)
        self.decode = decode
        self.notes = (f"vLLM V1's scheduler: FCFS, chunked prefill, preemption by "
                      f"recomputation; steps priced from one decode capture of {_BASE_BATCH} "
                      f"sequences at {context:,} tokens (fxshape.serving.batch); GEMMs that "
                      f"read one activation fused: {fuse}",
                      "not modelled: the engine's CPU time between steps, prefix caching, "
                      "the sampler")

    def run(self, requests, *, max_concurrency=None, seed=None) -> ServingSimulation:
        """Serve ``requests`` (``Request`` records, any order); ``seed``: recorded in the
        result when they were generated."""
        reqs = tuple(sorted(requests, key=lambda r: r.arrival_s))
        if self.positions is not None:
            for i, r in enumerate(reqs):
                if r.prompt_len + r.output_len > self.positions:
                    raise ValueError(f"request {i}: prompt_len {r.prompt_len:,} + output_len "
                                     f"{r.output_len:,} exceed {self.model_name}'s "
                                     f"{self.positions:,} positions")
        config = dataclasses.replace(self.config, max_concurrency=max_concurrency)
        run = run_engine(self.step, reqs, config, spec_k=self.spec_k,
                         acceptance=self.acceptance or 0.0, seed=seed or 0)
        dur = run.duration_s
        out_tokens = sum(r.output_len for r in reqs)
        in_tokens = sum(r.prompt_len for r in reqs)
        results = run.requests
        return ServingSimulation(
            model=self.model_name, gpu=self.decode.gpu, tp=self.tp, allreduce=self.allreduce,
            config=config, num_requests=len(reqs), duration_s=dur,
            request_throughput=len(reqs) / dur, output_tokens_per_s=out_tokens / dur,
            total_tokens_per_s=(in_tokens + out_tokens) / dur,
            ttft_s=Stats.of(r.ttft_s for r in results),
            tpot_s=Stats.of(r.tpot_s for r in results if r.output_len > 1),
            itl_s=Stats.of_pairs(run.itl), latency_s=Stats.of(r.latency_s for r in results),
            kv_blocks=config.kv_blocks, kv_mean=run.kv_mean, kv_peak=run.kv_peak,
            preemptions=run.preemptions, steps=run.steps, mean_running=run.mean_running,
            gpu_memory_utilization=self.utilization, seed=seed, draft=self.draft_name,
            num_speculative_tokens=self.spec_k, acceptance=self.acceptance,
            acceptance_length=(1 + run.accepted * self.spec_k / run.drafts) if run.drafts
            else None, fuse=self.fuse, notes=self.notes, run=run, decode=self.decode)


@takes_setup(SERVING, fixed={"mode": "decode"}, defaults={"allreduce": "auto"},
             as_setup=True)
def simulate_serving(model, *, requests=None, num_requests=None, rate=None, prompt_len=None,
                     output_len=None, seed: int = 0, max_num_seqs=None,
                     max_num_batched_tokens=None, max_concurrency=None, block_size: int = 16,
                     gpu_memory_utilization: float = 0.9, draft=None,
                     num_speculative_tokens: int = 3, acceptance=None,
                     acceptance_length=None, fuse="all", setup) -> ServingSimulation:
    """Serve requests with continuous batching on ``tp`` GPUs (module docstring).

    Args:
        model: a Hugging Face causal LM (meta weights are enough; never modified).
        requests: a trace file's path (``fxshape.serving.traffic.read_trace``) or
            ``Request`` records; or else
        num_requests, rate, prompt_len, output_len, seed: ``num_requests`` arriving as a
            Poisson process of ``rate`` per second (None or ``math.inf``: all at once),
            lengths an integer or an inclusive range ``(lo, hi)`` / ``"lo:hi"``.
        max_num_seqs, max_num_batched_tokens: the scheduler's limits (default vLLM's for
            the GPU); ``block_size``: tokens per KV block; ``gpu_memory_utilization``: the
            share of the GPU's memory vLLM takes.
        max_concurrency: at most this many requests in flight (the client's cap).
        gpu, dtype, tp, topology, attention, kv_dtype, allreduce: as in ``fxshape.serve``.
        draft, num_speculative_tokens, acceptance, acceptance_length: speculative decoding
            (``fxshape.speculate``'s arguments; ``draft=None``: none): each decode request
            verifies its drafts in the step, accepting each with that probability.
        fuse: the GEMMs run as one when they read one activation (``"all"``: vLLM's
            Q/K/V and gate/up; ``"qkv"``; ``"none"``: as captured).
        quantize, group_size: the target model's linear layers quantized, as in
            ``fxshape.analyze`` (``fxshape.cost.quant``); a draft stays in ``dtype``.
        setup: a :class:`fxshape.Setup` holding those fields (as for ``fxshape.serve``;
            ``Server`` takes it too).

    Raises:
        ValueError: bad requests or limits (named); a request longer than the model's
            positions or than the KV cache; weights that leave no room for the cache.
    """
    reqs = _requests(requests, num_requests, rate, prompt_len, output_len, seed)
    EngineConfig(1, 1, 1, 1, max_concurrency)  # the cap checked before the capture
    server = Server(model, max_num_seqs=max_num_seqs,
                    max_num_batched_tokens=max_num_batched_tokens, block_size=block_size,
                    gpu_memory_utilization=gpu_memory_utilization, draft=draft,
                    num_speculative_tokens=num_speculative_tokens, acceptance=acceptance,
                    acceptance_length=acceptance_length, fuse=fuse, setup=setup)
    return server.run(reqs, max_concurrency=max_concurrency,
                      seed=seed if requests is None else None)
