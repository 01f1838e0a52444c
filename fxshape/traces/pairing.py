"""Pair each device event of a trace with the operator that launched it.

A kernel names its launch by ``correlation`` id; the launch runs on a host thread inside a
stack of operators (``aten::linear`` > ``aten::addmm``; ``MmBackward0`` > ``aten::mm``); the
kernel belongs to the *innermost* operator enclosing the launch on that thread (or to the
``nccl:*`` annotation of a collective). One sweep per thread over operators and launches in
time order, with a stack of the operators still open: O(n log n); the same sweep notes
each operator's enclosing one.

A device event is *unattributed* when its correlation id has no launch in the trace (the
launch fell outside the recording window) or when no operator encloses its launch (work
started by Python code outside any ``aten`` op, or a library thread). A kernel that a graph
replay ran (its launch a ``cudaGraphLaunch`` / ``hipGraphLaunch`` outside any operator:
vLLM's and SGLang's decode steps) is attributed to that graph launch (``graphed``): its
operators ran when the graph was captured, which the replay's trace does not hold.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from .kineto import Trace

__all__ = ["Pairing", "pair"]

#: why a device event has no operator
NO_LAUNCH = "its launch is not in the trace"
OUTSIDE = "launched outside any operator"
#: the runtime calls that replay a captured graph: each kernel of the replay names the
#: graph launch's correlation id (vLLM's and SGLang's decode steps, torch.compile's
#: "reduce-overhead")
GRAPH_LAUNCHES = ("cudaGraphLaunch", "cudaGraphLaunch_v10000", "cuGraphLaunch",
                  "hipGraphLaunch")


@dataclass(frozen=True)
class Pairing:
    """``by_op``: operator index -> the device events it launched (trace order);
    ``unattributed``: ``(device event, reason)`` for the others; ``parent``: operator
    index -> the name of the operator directly enclosing it (on the threads that launch
    device work)."""

    by_op: dict
    unattributed: tuple
    parent: dict = field(default_factory=dict)
    #: ``(device event, the graph launch's name)`` for the kernels a graph replay ran
    #: outside any operator: attributed to the launch (their operators ran at capture)
    graphed: tuple = ()


def pair(trace: Trace) -> Pairing:
    """Pair every device event of ``trace`` with the innermost operator enclosing its
    launch."""
    launch_of = {}
    for ln in trace.launches:
        launch_of.setdefault(ln.correlation, ln)
    by_thread = defaultdict(lambda: ([], []))
    for op in trace.ops:
        by_thread[(op.pid, op.tid)][0].append(op)
    wanted = {}
    for ev in trace.device_events:
        ln = launch_of.get(ev.correlation) if ev.correlation is not None else None
        if ln is not None:
            wanted.setdefault(ln.correlation, ln)
    for ln in wanted.values():
        by_thread[(ln.pid, ln.tid)][1].append(ln)
    owner = {}  # correlation -> operator index
    parent = {}  # operator index -> the enclosing operator's name
    for ops, launches in by_thread.values():
        if not launches:
            continue
        # operators open before launches at the same instant; a parent before its child
        items = sorted([(o.ts, 0, -o.dur, o.index, o) for o in ops]
                       + [(ln.ts, 1, 0.0, ln.correlation, ln) for ln in launches],
                       key=lambda t: t[:4])
        stack = []
        for ts, kind, _, _, item in items:
            while stack and stack[-1].end < ts:
                stack.pop()
            if kind == 0:
                if stack:
                    parent[item.index] = stack[-1].name
                stack.append(item)
            elif stack:
                owner[item.correlation] = stack[-1].index
    by_op, loose, graphed = defaultdict(list), [], []
    for ev in trace.device_events:
        ln = launch_of.get(ev.correlation) if ev.correlation is not None else None
        if ln is None:
            loose.append((ev, NO_LAUNCH))
        elif ln.correlation in owner:
            by_op[owner[ln.correlation]].append(ev)
        elif ln.name in GRAPH_LAUNCHES:
            graphed.append((ev, ln.name))
        else:
            loose.append((ev, OUTSIDE))
    return Pairing(dict(by_op), tuple(loose), parent, tuple(graphed))
