"""The predicted step drawn as a trace: the Chrome / Perfetto JSON ``torch.profiler`` writes
(``Report.to_chrome_trace``, ``fxshape analyze --format chrome-trace``), so that a user opens
the prediction beside the real run in the same viewer.

Without a parallel plan the step is the eager timeline (``fxshape.cost.host.eager_timeline``)
played again event by event: each op's host time on the host thread (``cpu_op``; a
``cudaLaunchKernel`` at its end carries a ``correlation`` id), its kernels on the compute
stream (``kernel``, starting when the host has launched them and the previous kernel has
ended), a collective on a communication stream: its hidden part (``overlapped_s``) in
pieces over the last compute kernels before it (the model hides it under kernel time, not
under the host's gaps), its exposed part after them, which the compute stream waits for.
Under a plan (``step.stages``) each pipeline rank is a process: its forward and backward
passes of every micro-batch as the schedule ran them (``fxshape.parallelism.schedule.play``),
then its tail: the exposed gradient synchronisation on a communication stream, then the
optimizer. A plan without a pipeline that the eager timeline is not (ZeRO's sharded
collectives, micro-batches: ``step.timeline``) is drawn the same way, its one rank's
micro-batches one after another. No host thread is drawn under a plan: a pass is one
wall-clock event, not its ops.

Times are microseconds from the step's start; the same report gives the same bytes.
"""

from __future__ import annotations

import gzip
import json

__all__ = ["chrome_trace", "write_chrome_trace"]

_HOST_PID, _DEVICE_PID = 1, 0
_HOST_TID, _COMPUTE, _COMM = 1, 7, 20


def _meta(pid, tid, kind, name):
    return {"ph": "M", "name": kind, "pid": pid, "tid": tid, "args": {"name": name}}


def _us(s: float) -> float:
    return round(s * 1e6, 6)


def _span(t0: float, t1: float) -> dict:
    """``ts`` and ``dur`` in microseconds, rounded so that one event's end is the next's
    start when the model says so (rounding each apart could overlap them by a nanosecond)."""
    a, b = _us(t0), _us(t1)
    return {"ts": a, "dur": round(b - a, 6)}


def _single(report) -> list:
    ev = [_meta(_HOST_PID, 0, "process_name", "host (predicted)"),
          _meta(_HOST_PID, _HOST_TID, "thread_name", "host thread"),
          _meta(_DEVICE_PID, 0, "process_name", f"GPU 0: {report.gpu} (predicted)"),
          _meta(_DEVICE_PID, _COMPUTE, "thread_name", "stream 7 (compute)"),
          _meta(_DEVICE_PID, _COMM, "thread_name", "stream 20 (communication)")]
    host = end = comm_free = 0.0
    corr = 0
    compute = []  # the compute stream's kernels so far
    for r in report.ops:
        args = {"node": r.node, "module": r.module, "phase": r.phase, "class": r.cls}
        h0 = host
        host += r.host_s
        if r.host_s > 0:
            ev.append({"ph": "X", "cat": "cpu_op", "name": r.op, "pid": _HOST_PID,
                       "tid": _HOST_TID, **_span(h0, host), "args": args})
        if r.time_s <= 0 and r.overlapped_s <= 0:
            continue
        corr += 1
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel",
                   "pid": _HOST_PID, "tid": _HOST_TID, "ts": _us(host), "dur": 0.0,
                   "args": {"correlation": corr}})
        start = max(end, host)
        kargs = dict(args, correlation=corr, kernels=r.kernels, bytes=r.bytes, flops=r.flops,
                     stream=_COMPUTE)
        if r.note:
            kargs["note"] = r.note
        if r.cls == "communication":
            # the hidden part under the compute kernels before it (the model hides it under
            # kernel time, not under the host's gaps: drawn in pieces, one per stretch of
            # compute), the exposed part after them, holding the compute stream
            pieces = _hidden(compute, r.overlapped_s, comm_free)
            if r.time_s > 0:
                pieces.append((start, start + r.time_s))
            for i, (a, b) in enumerate(_merged(pieces)):
                ev.append({"ph": "X", "cat": "kernel", "name": r.op, "pid": _DEVICE_PID,
                           "tid": _COMM, **_span(a, b),
                           "args": dict(kargs, stream=_COMM, piece=i, exposed_s=r.time_s,
                                        overlapped_s=r.overlapped_s)})
                comm_free = max(comm_free, b)
            end = start + r.time_s
        else:
            ev.append({"ph": "X", "cat": "kernel", "name": r.op, "pid": _DEVICE_PID,
                       "tid": _COMPUTE, **_span(start, start + r.time_s),
                       "args": kargs})
            compute.append((start, start + r.time_s))
            end = start + r.time_s
    return ev


def _hidden(compute, hidden_s: float, after: float) -> list:
    """Stretches at the end of the compute kernels ``compute`` (in order), no earlier than
    ``after``, adding up to ``hidden_s``: where a collective's hidden part runs. Where the
    kernels are too few, the rest goes just before the first stretch."""
    pieces, left = [], hidden_s
    for a, b in reversed(compute):
        if left <= 0 or b <= after:
            break
        take = min(left, b - max(a, after))
        if take > 0:
            pieces.append((b - take, b))
            left -= take
    if left > 1e-15:
        first = min((a for a, _ in pieces), default=compute[-1][1] if compute else 0.0)
        pieces.append((max(after, first - left), first))
    return sorted(pieces)


def _merged(pieces) -> list:
    out = []
    for a, b in sorted(pieces):
        if out and a <= out[-1][1] + 1e-15:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        elif b > a:
            out.append((a, b))
    return out


#: what each pipeline pass is (``fxshape.parallelism.schedule.Pass``)
_PASS_NAMES = {"F": "forward", "B": "backward", "I": "backward (input gradient)",
               "W": "backward (weight gradient)"}


def _pipeline(report, stages) -> list:
    step = report.step
    ev = []
    m = max(1, step.microbatches)
    for st in stages:
        pid = st.rank
        ev.append(_meta(pid, 0, "process_name", f"rank {st.rank}: {report.gpu} (predicted; "
                                                f"{st.holds})"))
        ev.append(_meta(pid, _COMPUTE, "thread_name", "stream 7 (compute)"))
        passes = st.passes or tuple(
            p for i in range(m) for p in (
                ("F", i, 0, i * (st.forward_s + st.backward_s),
                 i * (st.forward_s + st.backward_s) + st.forward_s),
                ("B", i, 0, i * (st.forward_s + st.backward_s) + st.forward_s,
                 (i + 1) * (st.forward_s + st.backward_s))))
        for kind, micro, chunk, t0, t1 in passes:
            name = f"{_PASS_NAMES.get(kind, kind)} micro-batch {micro}" + (
                f" (chunk {chunk})" if chunk else "")
            ev.append({"ph": "X", "cat": "kernel", "name": name, "pid": pid,
                       "tid": _COMPUTE, **_span(t0, t1),
                       "args": {"rank": st.rank, "micro": micro, "chunk": chunk,
                                "pass": kind}})
        # the tail: exposed communication (gradient synchronisation, ZeRO's all-gather) on
        # the communication stream, then the optimizer, which waits for it
        comm = max(0.0, st.tail_s - st.optimizer_s)
        if comm > 0:
            ev.append(_meta(pid, _COMM, "thread_name", "stream 20 (communication)"))
            ev.append({"ph": "X", "cat": "kernel", "name": "gradient synchronisation (exposed)",
                       "pid": pid, "tid": _COMM, **_span(st.end_s, st.end_s + comm),
                       "args": {"rank": st.rank}})
        if st.tail_s - comm > 0:
            ev.append({"ph": "X", "cat": "kernel", "name": "optimizer", "pid": pid,
                       "tid": _COMPUTE, **_span(st.end_s + comm, st.end_s + st.tail_s),
                       "args": {"rank": st.rank}})
    return ev


def chrome_trace(report) -> dict:
    """The Chrome / Perfetto trace of ``report``'s predicted step, as a JSON-ready dict.

    Raises:
        ValueError: a report without a step (built by hand).
    """
    step = getattr(report, "step", None)
    if step is None:
        raise ValueError("this report has no predicted step to draw (fxshape.analyze makes "
                         "one)")
    events = _pipeline(report, step.stages or step.timeline) \
        if step.stages or step.timeline else _single(report)
    return {"schemaVersion": 1, "displayTimeUnit": "ms",
            "deviceProperties": [{"id": 0, "name": report.gpu}],
            "otherData": {"producer": "fxshape (predicted step)", "gpu": report.gpu,
                          "dtype": str(report.dtype), "mode": step.mode,
                          "execution": step.execution, "step_s": step.time_s},
            "traceEvents": events}


def write_chrome_trace(report, path: str) -> str:
    """Write :func:`chrome_trace` to ``path`` (gzipped when it ends in ``.gz``); returns
    ``path``."""
    data = json.dumps(chrome_trace(report), sort_keys=True)
    if str(path).endswith(".gz"):
        # no name and mtime 0 in the header: the same report gives the same bytes
        with open(path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw,
                                                     mtime=0) as f:
            f.write(data.encode())
    else:
        with open(path, "w") as f:
            f.write(data)
    return str(path)
