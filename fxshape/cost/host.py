"""The host in eager PyTorch: the CPU time each op costs to dispatch and launch, and the time
the GPU waits for it.

Eager PyTorch runs an op by calling it from Python: the binding, the dispatcher (autograd,
then the device kernel), the allocator and ``cudaLaunchKernel``. The kernel is queued and the
host moves on; the GPU runs the queue in order. When kernels are shorter than the host's
time per op, the GPU waits (``eager_timeline``). The per-op CPU times:

- ``kernel_s``: an op that launches a memory-bound kernel, called from Python;
- ``gemm_s``: a GEMM or fused-attention call (cuBLAS's heuristics and handle lookups on top);
- ``view_s``: an op that launches nothing (views, reshapes, allocations);
- ``backward_factor``: ops the autograd engine runs in the backward are called from C++,
  with no Python: this fraction of the forward's time;
- ``compiled_kernel_s``: a kernel launched by a ``torch.compile``'d graph's wrapper
  (Inductor's ``CachingAutotuner.run``), and ``compiled_graph_s``: one call of a compiled
  graph (guards, the wrapper); with CUDA graphs only the latter.

And one GPU-side figure, the **launch regime** (:func:`launch_gap_s`): kernels a host
launches one by one start ``eager_gap_s`` after the previous one ends even when they are
queued in time (the front end fetches each launch), while a CUDA graph's kernels replay back
to back. Fitted per-kernel fixed costs were measured in one regime or the other (today's
H100 and B200 GEMM and attention constants under CUDA-graph replay; the 2022-2024 fits and
the memory-bound kernels as single eager launches), so a host-launched kernel priced with
graph-timed constants pays ``eager_gap_s`` more.

``kernel_s`` and ``gemm_s`` are fitted by ``bench/fit_host.py`` from the per-call overheads
the memory-op and fp32 GEMM fits found in the NeuSight data (each row times one Python call
with CUDA events on an idle GPU, so the time from the call to the kernel's start is in every
row); ``view_s``, ``backward_factor`` and the compiled launch costs are sourced (the file says
from where) and unvalidated until ``bench/gpu_check.py`` measures them. Pure functions; no torch.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

from .paramfile import read_json

__all__ = ["HostParams", "host_params", "eager_timeline", "Timeline", "launch_gap_s"]

_DEFAULT_PATH = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data",
                             "host_params.json")
_FIELDS = ("kernel_s", "gemm_s", "view_s", "backward_factor", "compiled_kernel_s",
           "compiled_graph_s")


@dataclass(frozen=True)
class HostParams:
    """CPU seconds per eager op (see the module docstring)."""

    kernel_s: float
    gemm_s: float
    view_s: float
    backward_factor: float
    compiled_kernel_s: float
    compiled_graph_s: float
    source: str = ""
    #: GPU seconds between two kernels a host launches one by one when the second is
    #: already queued (``bench/fit_host.py``: the median gap of a profiler trace's queued
    #: kernels); 0 between a CUDA graph's kernels
    eager_gap_s: float = 0.0

    def op_s(self, kind: str, phase: str = "forward") -> float:
        """Host seconds for one op of ``kind`` (``"kernel"``, ``"gemm"`` or ``"view"``)."""
        base = {"kernel": self.kernel_s, "gemm": self.gemm_s, "view": self.view_s}.get(kind)
        if base is None:
            raise ValueError(f"unknown host op kind {kind!r}; accepted: kernel, gemm, view")
        return base * (self.backward_factor if phase == "backward" else 1.0)


@functools.lru_cache(maxsize=None)
def _load(path: str) -> HostParams:
    data = read_json(path, "host parameter file")
    missing = [f for f in _FIELDS if not isinstance(data.get(f), (int, float))]
    if missing:
        raise ValueError(f"{path!r} is not a host parameter file (written by "
                         f"bench/fit_host.py): it lacks {', '.join(missing)}")
    gap = data.get("eager_gap_s", 0.0)
    if isinstance(gap, bool) or not isinstance(gap, (int, float)) or gap < 0:
        raise ValueError(f"{path!r}: eager_gap_s must be a non-negative number of seconds, "
                         f"got {gap!r}")
    return HostParams(*(float(data[f]) for f in _FIELDS), source=str(data.get("source", "")),
                      eager_gap_s=float(gap))


def host_params(path: str | None = None) -> HostParams:
    """The packaged host constants, or those of the file at ``path``."""
    return _load(os.fspath(path or _DEFAULT_PATH))


#: what launches each kernel: the host, one by one (eager PyTorch, Inductor's wrapper), or a
#: CUDA graph's replay
_HOST_LAUNCHED = {"eager": True, "compiled": True, "cudagraphs": False}


def launch_gap_s(execution: str, graph_timed: bool, hp: HostParams | None = None) -> float:
    """Seconds to add to each kernel's fitted time under ``execution`` (``"eager"``,
    ``"compiled"`` or ``"cudagraphs"``), for constants measured under CUDA-graph replay
    (``graph_timed``) or as single eager launches: ``eager_gap_s`` for a host-launched
    kernel priced with graph-timed constants, else 0. A graph replay is never slower than
    an eager launch.

    The other direction (taking the gap out of eagerly timed constants under a graph replay)
    is not applied: on the held-out CUDA-graphed decode runs (gpt-fast on A100 and MI250X,
    bench/validate_serving.py) it moved the predictions from 9.2% to 16.6% median error,
    all too fast: those constants' fixed cost is not an eager gap to remove."""
    if execution not in _HOST_LAUNCHED:
        raise ValueError(f"unknown execution {execution!r}; accepted: "
                         + ", ".join(repr(e) for e in _HOST_LAUNCHED))
    gap = (hp or host_params()).eager_gap_s
    return gap if (_HOST_LAUNCHED[execution] and graph_timed) else 0.0


@dataclass(frozen=True)
class Timeline:
    """An eager run: ``wall_s`` from the first op's call to the last kernel's end;
    ``gpu_s`` the kernels' sum; ``host_s`` the host's sum; ``idle_s`` = ``wall_s - gpu_s``,
    the time the GPU waited for the host."""

    wall_s: float
    gpu_s: float
    host_s: float
    idle_s: float


def eager_timeline(ops) -> Timeline:
    """Play ``ops`` — ``(host seconds, GPU seconds)`` pairs in program order — on one host
    thread and one stream: op i is queued when the host has spent its time on it and on
    every op before; its kernel starts when it is queued and the previous kernel has ended.
    An op with no kernel (GPU seconds 0) only advances the host."""
    host = end = gpu = hsum = 0.0
    for h, g in ops:
        if h < 0 or g < 0:
            raise ValueError(f"negative time in the timeline: host {h}, GPU {g}")
        host += h
        hsum += h
        if g > 0:
            end = max(end, host) + g
            gpu += g
    wall = max(end, host)
    return Timeline(wall_s=wall, gpu_s=gpu, host_s=hsum, idle_s=wall - gpu)
