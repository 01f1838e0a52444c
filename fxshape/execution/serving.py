"""What fits a GPU when serving: the largest batch at a context, the longest context at a
batch, from one decode report's memory.

A decode step's memory per GPU is the weights, the KV cache and the step's activations
(``report.memory``). The KV cache is exactly linear in the batch and in the context
(``2 × layers × KV heads × head_dim × bytes`` per token); the activations of a decode step
(hidden states, logits) grow with the batch, not with the context (the decode kernel makes
no score matrix). So one report gives both limits, counting all of its activations per
sequence (the few that do not grow with the batch, such as the cache mask's positions, too:
the limits are lower bounds, tight when the KV cache dominates, as it does for real models):

- ``max_batch``: ``⌊(capacity − weights) / (KV + activations per sequence)⌋``;
- ``max_context``: ``⌊(capacity − weights − activations) / (KV per token)⌋``, rounded down to
  whole pages of a paged cache, and capped at the model's positions (said in the result).
  With sliding-window layers (``WorkloadRecord.kv_layout``) a layer holds at most its window, so
  the cache is piecewise linear in the context and the longest context solves that.

``capacity`` is the GPU's memory (``report.memory.capacity``), the same rule as
``report.memory.fits``. Serving engines keep a margin (vLLM's ``gpu_memory_utilization``
defaults to 0.9): pass ``utilization`` for that.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Capacity", "capacity_of"]


@dataclass(frozen=True)
class Capacity:
    """The serving limits of one decode report. Bytes per GPU."""

    max_batch: int  # sequences of ``context_len`` tokens that fit
    context_len: int
    max_context: int  # tokens per sequence that fit at ``batch_size`` sequences
    batch_size: int
    kv_bytes_per_token: int  # one token of one sequence, all layers, on one GPU
    weights: int
    usable: int  # capacity x utilization
    capped_by_positions: bool  # max_context is the model's positions, not the memory

    def describe(self) -> str:
        ctx = f"{self.max_context:,} tokens" + (" (the model's positions)"
                                                 if self.capped_by_positions else "")
        if self.max_batch < 1:
            head = f"not one sequence of {self.context_len:,} tokens fits"
        else:
            head = (f"largest batch at {self.context_len:,} tokens of context: "
                    f"{self.max_batch:,} sequences")
        return (f"serving capacity per GPU: {head}; longest context at batch "
                f"{self.batch_size}: {ctx}; KV cache {self.kv_bytes_per_token:,} bytes per token")


def _windowed_tokens(layout, per_seq: float, positions) -> int:
    """The longest context whose cache fits ``per_seq`` bytes: ``layout`` is ``((window,
    bytes a token), ...)`` (window 0: the whole context), so a context ``c`` holds
    ``Σ bytes × min(c, window)``, piecewise linear in ``c``. Without a whole-context layer
    the cache stops growing at the largest window: then the positions bound it (or, with
    none known, 2^31 tokens)."""
    if per_seq <= 0:
        return 0
    full = sum(v for w, v in layout if w == 0)
    wins = sorted((w, v) for w, v in layout if w > 0)
    start, held = 0, 0.0  # the context at the start of the segment and the bytes held there
    for k, (w, _) in enumerate(wins + [(None, 0.0)]):
        rate = full + sum(v for x, v in wins[k:])  # bytes a token while c < w
        end = w
        if rate <= 0:
            return positions + 1 if positions is not None else 2 ** 31
        reach = start + (per_seq - held) / rate
        if end is None or reach <= end:
            return max(0, int(reach))
        held += rate * (end - start)
        start = end
    return max(0, int(start))


def capacity_of(report, *, utilization: float = 1.0,
                max_positions: int | None = None) -> Capacity:
    """The serving limits of a ``mode="decode"`` report (see the module docstring).

    Raises:
        ValueError: not a decode report; a utilization outside (0, 1].
    """
    wl = report.workload
    if wl is None or wl.mode != "decode" or not report.memory.kv_cache:
        raise ValueError("capacity_of needs a mode='decode' report (one with a KV cache)")
    if isinstance(utilization, bool) or not isinstance(utilization, (int, float)) or \
            not 0 < utilization <= 1:
        raise ValueError(f"utilization must be in (0, 1], got {utilization!r}")
    mem = report.memory
    b, ctx, page_size = wl.batch_size, wl.context_len, wl.page_size
    stored = -(-ctx // page_size) * page_size if page_size else ctx
    kv_token = mem.kv_cache // (b * stored)
    weights = mem.peak - mem.activations - mem.kv_cache
    usable = int(mem.capacity * utilization)
    per_seq = kv_token * stored + mem.activations // b
    max_batch = max(0, (usable - weights) // per_seq)
    budget = usable - weights - mem.activations
    if wl.kv_layout:  # sliding-window layers hold at most their window
        tokens = _windowed_tokens(wl.kv_layout, budget / b, max_positions)
    else:
        tokens = max(0, budget // (kv_token * b))
    if page_size:
        tokens -= tokens % page_size
    capped = max_positions is not None and tokens > max_positions
    return Capacity(max_batch=int(max_batch), context_len=ctx,
                    max_context=int(max_positions if capped else tokens), batch_size=b,
                    kv_bytes_per_token=int(kv_token), weights=int(weights),
                    usable=usable, capped_by_positions=capped)
