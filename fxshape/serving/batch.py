"""One step of a serving engine's mixed batch, priced from one decode analysis.

A continuous-batching engine (vLLM, SGLang, TensorRT-LLM) runs every step over a flat
batch of tokens: one token for each request in decode, a chunk of the prompt for each
request in prefill. :class:`BatchStep` prices such a step from one ``mode="decode"`` report
of ``B0`` sequences, re-costing each of its records at the step's real mix rather than
capturing again:

- **GEMMs** at ``M = tokens`` (their captured ``M`` times ``tokens / B0``): the step's
  scheduled tokens, padded as vLLM pads them to its CUDA-graph sizes (1, 2, 4, then
  multiples of 8 up to 512; larger steps run unpadded, rounded here to 16 tokens, which no
  GEMM tile of 64 or more rows can tell apart). The logits GEMM (the model's output
  embedding) at ``M = requests`` in the step: engines compute logits for each request's
  last scheduled token only.
- **memory-bound kernels** (Inductor's fused kernels of the compiled model): each kernel's
  launch as captured, its bytes scaled by ``tokens / B0`` (they move hidden states, one row
  per token); those after the logits GEMM by ``requests / B0``.
- **all-reduces** (tensor parallelism) re-priced at ``tokens / B0`` of their bytes with the
  engine's algorithm (``fxshape.cost.allreduce``).
- **attention** per request, not at a mean context: the decode requests in one varlen
  split-KV call over their own contexts
  (``fxshape.cost.decode_attention.predict_decode_ragged``), each prefill chunk of ``c``
  tokens after ``p`` cached ones as a causal ``c × c`` call plus a ``c × p`` call over the
  cache (``fxshape.cost.attention.predict_attention``). Engines run them all in one varlen
  launch: the separate calls' fixed costs (a few µs each) are counted once per call here.
- **the host**: a graphed step (at most 512 tokens) costs the report's idle host time (the
  graph's launch); a larger step runs the compiled model without graphs, each kernel
  launched by the host, and takes the longer of the GPU's time and the host's.

Not modelled: the engine's scheduler and sampler on the CPU between steps (not overlapped
with the GPU without vLLM's asynchronous scheduling), prefix caching, sampling kernels.
"""

from __future__ import annotations

import dataclasses

from ..execution.step import regime_gaps
from ..cost.allreduce import predict_allreduce
from ..cost.attention import AttentionShape, predict_attention, resolve_kernel
from ..cost.decode_attention import predict_decode_ragged
from ..cost.gemv import price_matmul
from ..cost.quant import predict_quantized, quantization_of
from ..cost.host import host_params
from ..cost.memops import memops_params
from ..hardware.dtypes import itemsize, kv_format
from ..hardware.topology import topology_for

__all__ = ["BatchStep", "SERVING", "GRAPH_SIZES", "padded_tokens", "FUSE_CHOICES", "check_fuse",
           "logits_module_of"]

#: vLLM's CUDA-graph batch sizes (``CompilationConfig``: 1, 2, 4, then multiples of 8 up to
#: ``max_capture_size`` 512): a step of at most 512 tokens runs the graph of the next size
#: the fields of a :class:`fxshape.Setup` every serving API prices with (its keywords, or
#: ``setup=``; ``fxshape.config.setup.takes_setup``): the machine, the kernels, the
#: tensor-parallel degree and the KV cache's dtype
SERVING = ("gpu", "topology", "dtype", "tp", "attention", "allreduce", "kv_dtype",
           "quantize", "group_size")

GRAPH_SIZES = (1, 2, 4) + tuple(range(8, 513, 8))


def padded_tokens(tokens: int) -> int:
    """The tokens a step of ``tokens`` runs at: the next CUDA-graph size up to 512; beyond,
    ``tokens`` rounded up to 16 (a GEMM's time cannot tell them apart)."""
    if tokens <= GRAPH_SIZES[-1]:
        for g in GRAPH_SIZES:
            if g >= tokens:
                return g
    return -(-tokens // 16) * 16


@dataclasses.dataclass(frozen=True)
class _Call:
    """The attention calls of one kind in a step (``count`` layers alike)."""

    count: int
    heads: int
    kv_heads: int
    head_dim: int
    head_dim_v: int
    dtype: str
    window: int | None  # a sliding window's keys; None: the whole context


class BatchStep:
    """The time of one engine step of any mix of decode requests and prefill chunks, from
    one ``mode="decode"`` report (module docstring).

    Args:
        report: a ``mode="decode"`` report (``fxshape.analyze``), best with
            ``page_size`` set to the engine's KV block (vLLM: 16).
        allreduce: the engine's all-reduce (``fxshape.cost.allreduce``); default the
            report's (its setup's, else vLLM's ``"auto"``, as decode is priced).
        topology: the machine; default the report's (its setup's, else the GPU's usual
            one).
        logits_module: the module of the logits GEMM (default the report's last GEMM's).
        fuse: which GEMMs that read one activation run as one GEMM of their summed ``N``:
            ``"all"`` (or True; vLLM's ``QKVParallelLinear`` and
            ``MergedColumnParallelLinear``: Q, K and V in one, gate and up in one),
            ``"qkv"`` (only those of an attention module: gpt-fast's ``wqkv``), ``"none"``
            (or False: as captured). ``self.fused`` counts the GEMMs merged away.

    Raises:
        ValueError: not a decode report; a collective it cannot re-price.
    """

    def __init__(self, report, *, allreduce: str | None = None, topology=None,
                 logits_module: str | None = None, fuse="none"):
        wl = report.workload
        if wl is None or wl.mode != "decode":
            raise ValueError("BatchStep needs a mode='decode' report")
        asked = report.setup
        if allreduce is None:
            allreduce = (asked and asked.kernels.allreduce) or "auto"
        if topology is None and asked is not None:
            topology = asked.machine.topology
        self.report = report
        self.base = wl.batch_size
        self.context_len = wl.context_len
        self.tp = wl.tp
        self.allreduce = allreduce
        self.spec = report.spec  # with the constants the report was priced with
        self.topology = topology_for(self.spec, topology)
        self._attention, self._kv_dtype, self._page = wl.attention, wl.kv_dtype, wl.page_size
        if any(o.cls == "attention" and o.family == "math" for o in report.ops):
            raise ValueError("BatchStep needs a fused attention kernel (attention='flash', "
                             "'fa2' or 'fa3'), as serving engines run; the report ran 'math'")
        rows = {r.node: r for r in report.rows if r.attention is None}
        self._op = {node: r.op for node, r in rows.items()}
        # quantized linear layers (analyze(quantize=)): node -> Quantization.key
        self._quant = {node: r.quant for node, r in rows.items() if r.quant}
        self._act_dtype = report.dtype
        self.gemv = wl.gemv
        gemms = [o for o in report.ops if o.cls == "gemm"]
        if not gemms:
            raise ValueError("BatchStep needs a report with GEMMs")
        head = logits_module if logits_module is not None else gemms[-1].module
        # each kernel's time in the step's launch regime (fxshape.execution.step.launch_regime)
        gaps = regime_gaps(report.step.execution, self.spec)
        self._gemm_gap, self._attention_gap = gaps["gemm"], gaps["attention"]
        launch = float(memops_params(self.spec)[1]["launch_s"])
        body, tail, after = [], [], False
        for o in report.ops:
            part = tail if after else body
            if o.cls == "gemm":
                r = rows[o.node]
                item = (r.m, r.n, r.k, r.batch, r.dtype, r.layout, r.work, o.node)
                if o.module == head:
                    tail.append(("gemm", item))
                    after = True
                else:
                    part.append(("gemm", item))
            elif o.cls == "memory":
                fixed = o.kernels * launch
                part.append(("memory", (fixed, max(0.0, o.time_s - fixed), o.kernels)))
            elif o.cls == "communication":
                if o.op != "tp all_reduce":
                    raise ValueError(f"BatchStep cannot re-price {o.op!r} (tensor-parallel "
                                     "all-reduces only)")
                part.append(("allreduce", o.bytes))
            elif o.cls not in ("attention", "view"):
                raise ValueError(f"BatchStep cannot re-price a {o.cls!r} record ({o.node})")
        if not tail:
            raise ValueError(f"no GEMM of the logits module {head!r} in the report")
        fuse = check_fuse(fuse)
        self.fused = 0
        if fuse != "none":
            attention_modules = ({r.module for r in report.rows if r.attention is not None}
                                 if fuse == "qkv" else None)
            body, self.fused = _fuse_shared_inputs(report, gemms, rows, body,
                                                   attention_modules)
        self._body, self._tail = tuple(body), tuple(tail)
        self.logits_module = head
        calls: dict = {}
        seen = set()
        for r in report.rows:
            if r.attention is None or r.node in seen:
                continue
            seen.add(r.node)
            sh = r.attention.shape
            window = sh.seq_k if sh.seq_k < self.context_len else None
            key = (sh.heads, sh.kv_heads, sh.head_dim, sh.head_dim_v, r.dtype, window)
            calls[key] = calls.get(key, 0) + 1
        self._calls = tuple(_Call(n, *k) for k, n in calls.items())
        self._kernels_attention = sum(o.kernels for o in report.ops if o.cls == "attention")
        self._graph_host = report.step.by_class.get("host_idle", 0.0)
        hp = host_params()
        self._kernel_host, self._graph_call = hp.compiled_kernel_s, hp.compiled_graph_s
        self._memo_body: dict = {}
        self._memo_tail: dict = {}

    @property
    def gemms(self) -> tuple:
        """The GEMMs of a step but the logits', as ``(M, N, K)`` at the capture's batch
        (after fusion when ``fuse``)."""
        return tuple(it[:3] for kind, it in self._body if kind == "gemm")

    # -- the parts that scale with tokens (body) and with requests (tail) ------------------
    def _price(self, items, count: int) -> tuple:
        scale = count / self.base
        t, kernels = 0.0, 0
        for kind, it in items:
            if kind == "gemm":
                m, n, k, batch, dtype, layout, work, node = it
                rows = max(1, round(m * scale))
                if node in self._quant:
                    qg = predict_quantized(rows, n, k, quantization_of(self._quant[node]),
                                           gpu=self.spec, dtype=self._act_dtype, batch=batch,
                                           op=self._op[node], gemv=self.gemv, layout=layout)
                    t += qg.prediction.time_s * work + self._gemm_gap * qg.kernels
                    kernels += qg.kernels
                    continue
                t += price_matmul(self._op[node], rows, n, k, batch=batch, dtype=dtype,
                                  gpu=self.spec, layout=layout, gemv=self.gemv).time_s * work \
                    + self._gemm_gap
                kernels += 1
            elif kind == "memory":
                fixed, transfer, n = it
                t += fixed + transfer * scale
                kernels += n
            else:
                nbytes = max(1, round(it * scale))
                t += predict_allreduce(nbytes, self.tp, algorithm=self.allreduce,
                                       topology=self.topology, gpu=self.spec).time_s
                kernels += 1
        return t, kernels

    def body_s(self, tokens: int) -> tuple:
        """(GPU seconds, kernels) of everything but attention and the logits, at ``tokens``
        scheduled tokens (padded: :func:`padded_tokens`)."""
        t = padded_tokens(tokens)
        if t not in self._memo_body:
            self._memo_body[t] = self._price(self._body, t)
        return self._memo_body[t]

    def logits_s(self, requests: int) -> tuple:
        """(GPU seconds, kernels) of the logits GEMM and what follows it, for ``requests``."""
        if requests not in self._memo_tail:
            self._memo_tail[requests] = self._price(self._tail, requests)
        return self._memo_tail[requests]

    def attention_s(self, decode_contexts, chunks=(), q: int = 1) -> float:
        """The step's attention: the decode requests' calls over their own contexts (keys
        per request, its ``q`` new tokens included; ``q > 1``: speculative verification),
        each prefill chunk ``(tokens, cached)`` as a causal chunk over itself plus the chunk
        over its cached tokens."""
        total = 0.0
        kv_item = kv_format(self._kv_dtype)[1] if self._kv_dtype else None
        for c in self._calls:
            one = 0.0
            item = itemsize(c.dtype)
            if decode_contexts:
                ctx = (decode_contexts if c.window is None
                       else [min(x, c.window) for x in decode_contexts])
                # the fused kernel the attention choice runs: its own decode constants
                kernel = resolve_kernel(self._attention, self.spec, c.dtype,
                                        max(c.head_dim, c.head_dim_v))[0]
                dec = predict_decode_ragged(
                    ctx, c.heads, c.kv_heads, q, c.head_dim, gpu=self.spec, itemsize=item,
                    kv_itemsize=kv_item, page_size=self._page, head_dim_v=c.head_dim_v,
                    peak_tflops=self.spec.peak_tflops(c.dtype), kernel=kernel)
                one += dec.time_s + self._attention_gap * dec.kernels
            for n, cached in chunks:
                keys = cached if c.window is None else min(cached, c.window)
                one += predict_attention(
                    AttentionShape(1, c.heads, c.kv_heads, n, n, c.head_dim, c.head_dim_v,
                                   causal=True), attention=self._attention, dtype=c.dtype,
                    gpu=self.spec).time_s + self._attention_gap
                if keys:
                    p = predict_attention(
                        AttentionShape(1, c.heads, c.kv_heads, n, keys, c.head_dim,
                                       c.head_dim_v), attention=self._attention,
                        dtype=c.dtype, gpu=self.spec, kv_dtype=self._kv_dtype,
                        page_size=self._page)
                    one += p.time_s + self._attention_gap * p.kernels
            total += one * c.count
        return total

    def _gpu(self, decode_contexts, chunks, q, logits_rows) -> tuple:
        if isinstance(q, bool) or not isinstance(q, int) or q < 1:
            raise ValueError(f"q (tokens per decode request) must be a positive integer, got "
                             f"{q!r}")
        n_tokens = q * len(decode_contexts) + sum(n for n, _ in chunks)
        requests = len(decode_contexts) + len(chunks)
        if requests == 0:
            raise ValueError("a step needs at least one decode request or prefill chunk")
        body, kb = self.body_s(n_tokens)
        tail, kt = self.logits_s(requests if logits_rows is None else logits_rows)
        return body + tail + self.attention_s(decode_contexts, chunks, q), kb + kt, n_tokens

    def gpu_s(self, decode_contexts=(), chunks=(), *, q: int = 1, logits_rows=None) -> float:
        """The step's GPU time alone (its kernels back to back, no host)."""
        return self._gpu(decode_contexts, chunks, q, logits_rows)[0]

    def time_s(self, decode_contexts=(), chunks=(), *, q: int = 1, logits_rows=None) -> float:
        """One step: ``decode_contexts`` (keys per decode request, its new tokens included)
        and prefill ``chunks`` (``(tokens, cached tokens)`` per request). ``q``: tokens
        each decode request feeds (1; ``k + 1`` to verify ``k`` drafts); ``logits_rows``:
        the rows the logits GEMM runs at (default one per request; a verification scores
        every token)."""
        gpu, kernels, n_tokens = self._gpu(decode_contexts, chunks, q, logits_rows)
        if padded_tokens(n_tokens) <= GRAPH_SIZES[-1]:
            return gpu + self._graph_host
        host = (kernels + self._kernels_attention) * self._kernel_host + self._graph_call
        return max(gpu, host)

    def verify_s(self, contexts, tokens: int, logits_rows: int | None = None) -> float:
        """A step in which each request feeds ``tokens`` new tokens over its cache
        (``contexts``: cached tokens per request): speculative decoding's verification of
        ``tokens - 1`` drafts (or a draft model's first pass over them), the logits at
        ``logits_rows`` (default every token: verification scores each draft)."""
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
            raise ValueError(f"tokens must be a positive integer, got {tokens!r}")
        if not contexts:
            raise ValueError("a verification step needs at least one request")
        rows = len(contexts) * tokens if logits_rows is None else logits_rows
        return self.time_s([c + tokens for c in contexts], q=tokens, logits_rows=rows)


FUSE_CHOICES = ("all", "qkv", "none")


def check_fuse(fuse) -> str:
    """``fuse`` as one of :data:`FUSE_CHOICES` (True: ``"all"``, False: ``"none"``).

    Raises:
        ValueError: anything else.
    """
    if fuse is True or fuse is False:
        return "all" if fuse else "none"
    if fuse not in FUSE_CHOICES:
        raise ValueError(f"fuse must be one of 'all', 'qkv', 'none' (or a bool), got "
                         f"{fuse!r}")
    return fuse


def _fuse_shared_inputs(report, gemms, rows, body, attention_modules=None) -> tuple:
    """``body`` with the GEMMs that read the same activation (the same input node of the
    captured graph, in the same copy of a deduplicated layer) at the same ``M``, ``K``,
    dtype and layout merged into one of their summed ``N``, placed where the first was;
    and the number of GEMMs merged away. GEMMs whose input the graph does not show stay
    as they are. ``attention_modules``: only groups whose GEMMs belong to one of these
    modules (an attention module's Q, K and V projections)."""
    gm = report.graph_module
    nodes = {n.name: n for n in gm.graph.nodes} if gm is not None else {}
    groups: dict = {}
    for o in gemms:
        base, _, copy = o.node.partition("@")
        n = nodes.get(base)
        if n is None or not n.args or not hasattr(n.args[0], "name"):
            continue
        r = rows.get(o.node)
        if r is None or r.batch != 1 or r.work != 1:
            continue
        if attention_modules is not None and \
                o.module.rpartition(".")[0] not in attention_modules:
            continue
        key = (n.args[0].name, copy, r.m, r.k, r.dtype, r.layout)
        groups.setdefault(key, []).append(o.node)
    merged = {}
    for members in groups.values():
        if len(members) > 1:
            for m in members:
                merged[m] = members
    out, done, fused = [], set(), 0
    for kind, it in body:
        if kind != "gemm" or it[-1] not in merged:
            out.append((kind, it))
            continue
        members = merged[it[-1]]
        if members[0] in done:
            fused += 1
            continue
        done.add(members[0])
        n_sum = sum(rows[x].n for x in members)
        m, _, k, batch, dtype, layout, work, node = it
        out.append(("gemm", (m, n_sum, k, batch, dtype, layout, work, node)))
    return out, fused


def logits_module_of(model) -> str | None:
    """The name of ``model``'s output embedding (its logits GEMM's module), or None."""
    out = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return next((name for name, m in model.named_modules() if m is out), None)
