"""Serving: a request as an engine runs it, from captures re-costed rather than repeated.

``steps`` turns one decode analysis into the time of a decode step at any context length
(each attention call re-predicted at its own context, everything else as captured);
``request`` is ``fxshape.serve``: a batch of requests end to end (the prefill's time to the
first token, every decode step at its own context, the latency and the throughput), under
the tensor parallelism and the all-reduce the engine runs (``fxshape.cost.allreduce``).

May import: hardware, cost, tracing, parallelism, analysis.
"""

from .request import ServeResult, serve
from .steps import DecodeSteps

__all__ = ["serve", "ServeResult", "DecodeSteps"]
