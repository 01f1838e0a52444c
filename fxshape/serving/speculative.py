"""Speculative decoding: ``fxshape.speculate``.

A draft proposes ``k`` tokens per request; the target verifies them in one step over
``k + 1`` tokens per request and keeps the longest prefix it agrees with, plus one token of
its own. With each draft token accepted with probability ``α`` (independently: the
analysis of Leviathan et al., "Fast Inference from Transformers via Speculative Decoding",
ICML 2023, eq. 1), an iteration yields ``E = (1 − α^(k+1)) / (1 − α)`` tokens per request
(``k + 1`` when ``α = 1``). Engines report the *mean acceptance length*, that ``E``
measured: give it as ``acceptance_length`` and ``α`` is solved from it.

One iteration, as vLLM V1 runs EAGLE and draft models (``vllm/v1/spec_decode/eagle.py``,
``propose``), each step priced by ``fxshape.serving.batch.BatchStep`` from one decode
capture of each model:

- **verify**: the target over ``k + 1`` tokens per request (GEMMs at ``batch × (k + 1)``
  rows, the logits at every one of them, attention on the decode path with ``k + 1``
  queries per request);
- **draft**: a first pass over the same ``k + 1`` tokens per request (logits for the last
  only), then ``k − 1`` passes of one token each.

Time per output token = the iteration / ``E``; the speedup is the plain decode step's
time per token over it. ``draft="eagle"`` is one decoder layer of the target's shapes with
its LM head (EAGLE-1 and -3 drafts: one layer over the target's hidden states; EAGLE-3's
smaller draft vocabulary is not modelled); a causal LM given as ``draft`` is run whole. The
draft shares the target's tensor parallelism. The requests are priced at mid-request
context (``prompt_len + output_len / 2``), where attention costs its mean. As the batch
grows the verification's ``k + 1`` tokens per request stop being free (the GEMMs leave the
weight-bound regime) and the draft's passes stop being cheap: ``by_batch`` gives the
speedup at each batch that fits, and ``breakeven_batch`` the first at which it no longer
pays.

The default acceptance, ``α = 0.57``, is solved from a published mean acceptance length of
1.89 at ``k = 2`` (vLLM V1, EAGLE-1 draft for Llama-3-8B-Instruct on MT-bench; vLLM PR
#16035), a representative figure, not a property of any model: give your own.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch

from ..config.setup import takes_setup
from .batch import SERVING, BatchStep, check_fuse, logits_module_of

__all__ = ["speculate", "SpeculationResult", "SpeculativeStep", "expected_tokens",
           "acceptance_from_length", "resolve_acceptance", "draft_model", "DEFAULT_ACCEPTANCE"]

#: 1 + α + α² = 1.89 (vLLM PR #16035: EAGLE-1, Llama-3-8B-Instruct, MT-bench, k = 2)
DEFAULT_ACCEPTANCE = 0.57
_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens per iteration per request: ``(1 − α^(k+1)) / (1 − α)`` (``k + 1`` at
    ``α = 1``)."""
    _check_k(k)
    _check_alpha(alpha)
    if alpha == 1:
        return float(k + 1)
    return (1 - alpha ** (k + 1)) / (1 - alpha)


def acceptance_from_length(length: float, k: int) -> float:
    """The ``α`` whose :func:`expected_tokens` is ``length`` (bisection; ``length`` in
    ``[1, k + 1]``)."""
    _check_k(k)
    if isinstance(length, bool) or not isinstance(length, (int, float)) or \
            not 1 <= length <= k + 1:
        raise ValueError(f"acceptance_length must be a number of tokens in [1, k + 1] = "
                         f"[1, {k + 1}], got {length!r}")
    lo, hi = 0.0, 1.0
    for _ in range(80):
        mid = (lo + hi) / 2
        if expected_tokens(mid, k) < length:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def _check_k(k) -> None:
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= 15:
        raise ValueError(f"k (draft tokens per step) must be an integer from 1 to 15 (the "
                         f"decode path takes up to 16 tokens a request), got {k!r}")


def _check_alpha(alpha) -> None:
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 <= alpha <= 1:
        raise ValueError(f"acceptance (the probability a draft token is accepted) must be in "
                         f"[0, 1], got {alpha!r}")


@dataclass(frozen=True)
class SpeculationResult:
    """Speculative decoding against plain decoding (seconds; tokens per second)."""

    model: str
    draft: str
    gpu: str
    tp: int
    k: int
    acceptance: float  # α, per draft token
    tokens_per_step: float  # E, per request
    batch_size: int
    context: int  # the cached tokens the steps are priced at
    verify_s: float
    draft_s: float
    step_s: float  # verify + draft
    tpot_s: float  # step / E
    plain_tpot_s: float  # one plain decode step
    speedup: float  # plain_tpot / tpot
    output_tokens_per_s: float
    plain_output_tokens_per_s: float
    #: (batch, speedup) at each batch that fits
    by_batch: tuple = ()
    #: the first batch of ``by_batch`` at which speculation no longer pays (None: it pays
    #: at every one)
    breakeven_batch: int | None = None
    fuse: str = "all"
    notes: tuple = ()
    target_step: object = field(default=None, repr=False, compare=False)
    draft_step: object = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in (
            "model", "draft", "gpu", "tp", "k", "acceptance", "tokens_per_step", "batch_size",
            "context", "verify_s", "draft_s", "step_s", "tpot_s", "plain_tpot_s", "speedup",
            "output_tokens_per_s", "plain_output_tokens_per_s", "breakeven_batch", "fuse")}
        d["by_batch"] = [list(p) for p in self.by_batch]
        d["notes"] = list(self.notes)
        return d

    def describe(self) -> str:
        pays = ("it pays at every batch that fits" if self.breakeven_batch is None else
                f"it stops paying at batch {self.breakeven_batch}")
        return (f"{self.model} with a {self.draft} draft, k {self.k}, acceptance "
                f"{self.acceptance:.2f} ({self.tokens_per_step:.2f} tokens a step), batch "
                f"{self.batch_size} on {self.tp} x {self.gpu}: {self.tpot_s * 1e3:.2f} ms per "
                f"token (verify {self.verify_s * 1e3:.2f} + draft {self.draft_s * 1e3:.2f} ms "
                f"a step) against {self.plain_tpot_s * 1e3:.2f} ms plain: "
                f"{self.speedup:.2f}x; {pays}")


def _eagle_draft(model):
    cfg = copy.deepcopy(model.config)
    cfg.num_hidden_layers = 1
    for attr in ("layer_types",):  # per-layer lists sized by the layer count
        v = getattr(cfg, attr, None)
        if isinstance(v, list) and v:
            setattr(cfg, attr, v[:1])
    with torch.device("meta"):
        return type(model)(cfg)


class SpeculativeStep:
    """An engine step with speculative decoding, for ``fxshape.serving.scheduler.run_engine``:
    the target runs the step with each decode request's last token and ``k`` drafts
    (``q = k + 1`` tokens, logits at every one), beside the prefill chunks; then the draft
    runs its first pass over the same tokens (logits per request) and ``k - 1`` one-token
    passes for every request of the step (vLLM V1's EAGLE proposer drafts for all of them).

    Args:
        target, draft: :class:`~fxshape.serving.batch.BatchStep` of each model.
        k: drafts per request.
    """

    def __init__(self, target: BatchStep, draft: BatchStep, k: int):
        _check_k(k)
        self.target, self.draft, self.k = target, draft, k

    def parts(self, decode_contexts=(), chunks=(), *, q: int = 1) -> tuple:
        """``(verify, draft)`` seconds of the step (the arguments of :meth:`time_s`)."""
        rows = q * len(decode_contexts) + len(chunks)
        verify = self.target.time_s(decode_contexts, chunks, q=q, logits_rows=rows)
        first = self.draft.time_s(decode_contexts, chunks, q=q)
        keys = list(decode_contexts) + [cached + n for n, cached in chunks]
        rest = sum(self.draft.time_s([c + j + 1 for c in keys]) for j in range(self.k - 1))
        return verify, first + rest

    def time_s(self, decode_contexts=(), chunks=(), *, q: int = 1) -> float:
        return sum(self.parts(decode_contexts, chunks, q=q))


def draft_model(model, draft):
    """``(draft model, its name)`` for ``draft="eagle"`` (one decoder layer of the target's
    shapes) or a causal LM.

    Raises:
        ValueError: anything else.
    """
    from ..tracing.decode import check_decoder

    if isinstance(draft, str):
        if draft != "eagle":
            raise ValueError(f"draft must be 'eagle' or a draft causal LM, got {draft!r}")
        return _eagle_draft(model), "EAGLE (one layer)"
    if isinstance(draft, torch.nn.Module):
        check_decoder(draft)
        mine = getattr(getattr(model, "config", None), "vocab_size", None)
        theirs = getattr(getattr(draft, "config", None), "vocab_size", None)
        if isinstance(mine, int) and isinstance(theirs, int) and mine != theirs:
            raise ValueError(f"the draft {type(draft).__name__} has a vocabulary of "
                             f"{theirs:,} tokens and the target {type(model).__name__} "
                             f"{mine:,}: a draft proposes the target's tokens, so it must "
                             "share its tokenizer (vLLM refuses such a pair); accepted: a "
                             "draft of the same vocabulary, or 'eagle'")
        return draft, type(draft).__name__
    raise ValueError(f"draft must be 'eagle' or a draft causal LM, got {type(draft).__name__}")


def resolve_acceptance(k: int, acceptance=None, acceptance_length=None) -> float:
    """``α`` from ``acceptance`` or ``acceptance_length`` (default
    :data:`DEFAULT_ACCEPTANCE`).

    Raises:
        ValueError: both given; a bad value.
    """
    _check_k(k)
    if acceptance is not None and acceptance_length is not None:
        raise ValueError("give acceptance (per draft token) or acceptance_length (tokens per "
                         "step), not both")
    if acceptance_length is not None:
        return acceptance_from_length(acceptance_length, k)
    alpha = DEFAULT_ACCEPTANCE if acceptance is None else acceptance
    _check_alpha(alpha)
    return alpha


@takes_setup(SERVING, fixed={"mode": "decode"}, defaults={"allreduce": "auto"},
             as_setup=True)
def speculate(model, *, prompt_len: int, output_len: int, draft="eagle", k: int = 3,
              acceptance=None, acceptance_length=None, batch_size: int = 1, fuse="all",
              setup) -> SpeculationResult:
    """Speculative decoding of ``batch_size`` requests (module docstring).

    Args:
        model: the target, a Hugging Face causal LM (meta weights are enough; never
            modified).
        draft: ``"eagle"`` (one decoder layer of the target's shapes and its LM head) or a
            draft causal LM.
        k: draft tokens per step (1 to 15).
        acceptance: ``α``, the probability each draft token is accepted (default
            :data:`DEFAULT_ACCEPTANCE`); or ``acceptance_length``: the measured mean tokens
            per step (``[1, k + 1]``), from which ``α`` is solved. Not both.
        prompt_len, output_len: the requests' sizes (they set the context priced).
        gpu, tp, dtype, allreduce, topology, attention, kv_dtype, fuse: as in
            ``fxshape.serve``.
        quantize, group_size: the target's linear layers quantized, as in
            ``fxshape.analyze`` (``fxshape.cost.quant``); the draft stays in ``dtype``.
        setup: a :class:`fxshape.Setup` holding those fields (as for ``fxshape.serve``).

    Raises:
        ValueError: bad sizes, ``k``, acceptance; a draft that is not ``"eagle"`` or a
            causal LM; a batch whose caches and weights do not fit.
    """
    from ..report.build import analyze
    from ..execution.serving import capacity_of
    from ..tracing.decode import check_decoder
    from ..tracing.facts import max_positions
    from ..tracing.export import check_size

    prompt_len = check_size("prompt_len", prompt_len, optional=False)
    output_len = check_size("output_len", output_len, optional=False)
    batch_size = check_size("batch_size", batch_size, optional=False)
    alpha = resolve_acceptance(k, acceptance, acceptance_length)
    fuse = check_fuse(fuse)
    check_decoder(model)
    drafter_model, draft_name = draft_model(model, draft)
    positions = max_positions(model.config)
    total = prompt_len + output_len + k
    if positions is not None and total > positions:
        raise ValueError(f"prompt_len {prompt_len:,} + output_len {output_len:,} + k {k} = "
                         f"{total:,} tokens exceed {type(model).__name__}'s {positions:,} "
                         "positions")
    tp = setup.parallel.tp
    ctx0 = min(1024, positions) if positions else 1024
    setup = setup.replace(batch_size=8, page_size=16, provenance=None, context_len=ctx0)
    t_rep = analyze(model, setup=setup)
    d_pos = max_positions(drafter_model.config)
    d_rep = analyze(drafter_model, setup=setup.replace(
        context_len=min(ctx0, d_pos) if d_pos else ctx0, quantize=None, group_size=None))
    # fuse="all": as vLLM runs them, Q, K, V in one GEMM, gate and up in one
    target = BatchStep(t_rep, logits_module=logits_module_of(model), fuse=fuse)
    drafter = BatchStep(d_rep, logits_module=logits_module_of(drafter_model), fuse=fuse)
    t_cap, d_cap = capacity_of(t_rep), capacity_of(d_rep)
    weights = t_cap.weights + (d_cap.weights if drafter_model is not model else 0)
    per_seq = (t_cap.kv_bytes_per_token + d_cap.kv_bytes_per_token) * total
    memory = t_rep.memory.capacity

    def fits(b):
        return weights + b * per_seq <= memory

    if not fits(batch_size):
        most = max(0, (memory - weights) // per_seq)
        raise ValueError(f"{batch_size} requests of {total:,} tokens with the draft's cache do "
                         f"not fit on {t_rep.gpu} at tp {tp} (at most {most:,})")
    context = prompt_len + output_len // 2
    e = expected_tokens(alpha, k)

    step_model = SpeculativeStep(target, drafter, k)

    def at(b):
        plain = target.time_s([context + 1] * b)
        verify, drafting = step_model.parts([context + k + 1] * b, q=k + 1)
        return plain, verify, drafting

    plain, verify, drafting = at(batch_size)
    step = verify + drafting
    tpot = step / e
    by_batch = []
    for b in sorted(set(_BATCHES) | {batch_size}):
        if not fits(b):
            break
        p, v, d = at(b)
        by_batch.append((b, p / ((v + d) / e)))
    breakeven = next((b for b, s in by_batch if s < 1), None)
    notes = (f"priced at {context:,} cached tokens per request (mid-request); steps from one "
             "decode capture of each model (fxshape.serving.batch)",
             f"acceptance {alpha:.3f} per draft token, independent across positions "
             "(Leviathan et al. 2023)")
    return SpeculationResult(
        model=type(model).__name__, draft=draft_name, gpu=t_rep.gpu, tp=tp, k=k,
        acceptance=alpha, tokens_per_step=e, batch_size=batch_size, context=context,
        verify_s=verify, draft_s=drafting, step_s=step, tpot_s=tpot, plain_tpot_s=plain,
        speedup=plain / tpot, output_tokens_per_s=batch_size / tpot,
        plain_output_tokens_per_s=batch_size / plain, by_batch=tuple(by_batch),
        breakeven_batch=breakeven, fuse=fuse, notes=notes, target_step=target,
        draft_step=drafter)
