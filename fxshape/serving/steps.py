"""A decode step at any context length, from one decode analysis.

A decode step's work is the same at every context length but for attention: the GEMMs see
one token per sequence, the memory-bound kernels the batch's hidden states, the
all-reduces the same bytes. Only each attention call reads a cache that grows by a token a
step. :class:`DecodeSteps` keeps one ``mode="decode"`` report and prices a step at context
``c`` as the report's step with each attention call re-predicted at ``c`` keys
(``fxshape.cost.attention.predict_attention``, on the decode path the report used: same
kernel, dtype, KV dtype and pages). A layer whose captured key length is not the context (a
sliding window shorter than it) keeps that length, or ``c`` if ``c`` is shorter. Nothing
is re-captured: pricing a thousand steps costs a thousand cached predictions.
"""

from __future__ import annotations

import dataclasses

from ..cost.attention import predict_attention

__all__ = ["DecodeSteps"]


class DecodeSteps:
    """The step time of one decode report at other context lengths.

    Args:
        report: a ``mode="decode"`` report (``fxshape.analyze``).

    Raises:
        ValueError: not a decode report.
    """

    def __init__(self, report):
        wl = report.workload
        if wl is None or wl.mode != "decode":
            raise ValueError("DecodeSteps needs a mode='decode' report")
        self.report = report
        self.context_len = wl.context_len
        calls = {}
        for r in report.rows:
            if r.attention is not None:
                calls.setdefault(r.node, (r.attention, r.dtype))
        self._calls = tuple(calls.values())
        self._memo: dict = {}
        self._spec = report.spec  # the GPU with the constants the report was priced with

    def _call_time(self, pred, dtype, context: int) -> float:
        wl = self.report.workload
        sk = pred.shape.seq_k
        keys = context if sk == self.context_len else min(sk, context)
        shape = dataclasses.replace(pred.shape, seq_k=keys)
        return predict_attention(shape, attention=wl.attention, dtype=dtype,
                                 gpu=self._spec, kv_dtype=wl.kv_dtype,
                                 page_size=wl.page_size).time_s

    def attention_s(self, context: int) -> float:
        """The step's attention time at ``context`` tokens of cache per sequence."""
        if context not in self._memo:
            self._memo[context] = sum(self._call_time(p, d, context) for p, d in self._calls)
        return self._memo[context]

    def time_s(self, context: int) -> float:
        """The whole step at ``context`` tokens of cache per sequence (the report's step with
        its attention re-priced; at the report's own context, the report's step time)."""
        if isinstance(context, bool) or not isinstance(context, int) or context < 1:
            raise ValueError(f"context must be a positive integer, got {context!r}")
        base = self.report.step.time_s
        if context == self.context_len:
            return base
        return base - self.attention_s(self.context_len) + self.attention_s(context)
