"""Serving: a request as an engine runs it, from captures re-costed rather than repeated.

``steps`` turns one decode analysis into the time of a decode step at any context length
(each attention call re-predicted at its own context, everything else as captured);
``request`` is ``fxshape.serve``: a batch of requests end to end (the prefill's time to the
first token, every decode step at its own context, the latency and the throughput), under
the tensor parallelism and the all-reduce the engine runs (``fxshape.cost.allreduce``).
``batch`` prices one step of a continuous-batching engine's mixed batch (decode requests at
their own contexts, prefill chunks) from one decode analysis; ``traffic`` makes or reads
the requests (Poisson arrivals, length ranges, CSV traces); ``scheduler`` plays them through
vLLM's scheduler (chunked prefill, KV blocks, preemption); ``simulate`` is
``fxshape.simulate_serving``: a server under load, its throughput and latency percentiles;
``speculative`` is ``fxshape.speculate``: a draft's proposals verified by the target, the
time per token against plain decoding and the batch at which it stops paying;
``capacity`` is ``fxshape.plan_capacity``: the highest request rate, or the fewest GPUs for
a rate, within TTFT and inter-token latency SLOs, over tensor-parallel degrees.

May import: hardware, cost, tracing, parallelism, config, analysis, execution, report.
"""

from .batch import BatchStep
from .capacity import CapacityPlan, TpCapacity, plan_capacity
from .request import ServeResult, serve
from .scheduler import EngineConfig, EngineRun, RequestResult, run_engine
from .simulate import Server, ServingSimulation, Stats, simulate_serving
from .speculative import SpeculationResult, speculate
from .steps import DecodeSteps
from .traffic import Request, poisson_requests, read_trace

__all__ = ["serve", "ServeResult", "DecodeSteps", "BatchStep", "simulate_serving",
           "ServingSimulation", "Stats", "Request", "poisson_requests", "read_trace",
           "EngineConfig", "EngineRun", "RequestResult", "run_engine", "speculate",
           "SpeculationResult", "plan_capacity", "CapacityPlan", "TpCapacity", "Server"]
