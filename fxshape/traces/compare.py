"""Compare a real profiler trace with fxshape's models, operator by operator.

:func:`compare_trace` reads a PyTorch profiler (Kineto) trace (``fxshape.traces.kineto``),
pairs every kernel with the operator that launched it (``fxshape.traces.pairing``), prices
each operator from its recorded shapes (``fxshape.traces.price``) on the trace's GPU, and
returns a :class:`TraceComparison`: one :class:`TraceOpRecord` per operator that ran device
work, the error per class (GEMMs, attention, memory-bound ops, collectives), the worst
operators, and where the device time the model cannot speak for went (operators without a
model, kernels outside any operator, idle gaps).

Measured time of an operator = the summed durations of the device events it launched (a
split-K GEMM's reduce kernel included); predicted = the model's device time for it. Records,
not prints: ``to_json``, ``to_csv`` and ``to_markdown`` render them.
"""

from __future__ import annotations

import bisect
import csv
import dataclasses
import io
import json
import math
import statistics
from collections import defaultdict
from dataclasses import dataclass

from ..cost.gemm import use_params
from ..hardware.gpus import get_gpu, list_gpus
from .kineto import Trace, read_trace
from .pairing import pair
from .price import NoModel, PriceContext, price_op

__all__ = ["TraceOpRecord", "ClassError", "Unattributed", "TraceComparison", "compare_trace",
           "resolve_trace_gpu"]

CLASSES = ("gemm", "conv", "attention", "memory", "communication")
_HOST_COPY = ("HtoD", "DtoH", "HtoH", "Pageable", "Pinned")


@dataclass(frozen=True)
class TraceOpRecord:
    """One operator that ran device work: ``cls`` is a class of :data:`CLASSES`, or
    ``"no model"`` (then ``predicted_s`` is None and ``note`` says why)."""

    index: int
    name: str
    cls: str
    what: str
    kernels: tuple
    measured_s: float
    predicted_s: float | None
    note: str = ""
    #: a GEMM's ``(batch, m, n, k, dtype, layout)`` as priced; () otherwise
    gemm: tuple = ()
    #: a GEMM's bound in the model (``"compute"``, ``"memory"``, ``"latency"``); ""
    #: otherwise
    bound: str = ""
    #: SMs its kernels were priced on: fewer than the GPU's when a collective's kernel ran
    #: beside them for most of their time (its CTAs hold SMs); None: all
    sms: int | None = None
    #: a GEMM's prediction with the model's own kernel choice on the whole GPU (what
    #: ``analyze`` says of the shape); ``predicted_s`` prices the kernel that ran
    chosen_s: float | None = None
    #: a memory-bound op's kernels as priced, ``((family, bytes), ...)``
    #: (``fxshape.cost.memops.KERNEL_FAMILIES``); () otherwise
    memops: tuple = ()
    #: a GEMM priced as the tensor-core kernel that ran: ``(kernel name, split-K factor,
    #: 0 where the trace does not say)``; () otherwise
    ran: tuple = ()
    #: an SDPA call as priced: ``(AttentionShape, direction, dtype key)``; () otherwise
    attention: tuple = ()

    @property
    def error(self) -> float | None:
        """predicted / measured - 1 (None without a prediction or a measured time)."""
        if self.predicted_s is None or self.measured_s <= 0:
            return None
        return self.predicted_s / self.measured_s - 1

    def as_dict(self) -> dict:
        return {"index": self.index, "name": self.name, "class": self.cls, "what": self.what,
                "kernels": list(self.kernels), "measured_s": self.measured_s,
                "predicted_s": self.predicted_s, "error": self.error, "note": self.note,
                "bound": self.bound, "sms": self.sms, "chosen_s": self.chosen_s,
                "memops": [list(k) for k in self.memops]}


@dataclass(frozen=True)
class ClassError:
    """The error over one class's operators (fractions: 0.05 is 5%)."""

    cls: str
    ops: int
    measured_s: float
    predicted_s: float
    median: float
    p90: float
    signed_median: float
    within_20: int  # operators within 20% of their measured time

    def as_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Unattributed:
    """Device time no operator accounts for: ``reason`` and the kernels it covers."""

    reason: str
    kernel: str
    count: int
    time_s: float


def _family(name: str) -> str:
    """An operator's name as the no-model table groups it: Inductor's generated Triton
    kernels (``triton_poi_fused_add_3``) by their kind (``triton_poi_*``)."""
    if name.startswith("triton_"):
        parts = name.split("_")
        return f"triton_{parts[1]}_*" if len(parts) > 2 else name
    return name


def _quantile(xs, q):
    xs = sorted(xs)
    if not xs:
        return 0.0
    i = q * (len(xs) - 1)
    lo = int(i)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (i - lo)


@dataclass(frozen=True)
class TraceComparison:
    """A trace against the model (times in seconds).

    ``kernel_s``: the summed duration of every device event in the trace; ``attributed_s``:
    of those paired with an operator; ``modelled_s``: of those whose operator has a model;
    ``unattributed``: the rest, by reason and kernel; ``idle_s``: time within the trace's
    device window in which the device ran nothing (``window_s`` long).
    """

    path: str
    gpu: str
    gpu_from: str
    ops: tuple
    by_class: tuple
    kernel_s: float
    attributed_s: float
    modelled_s: float
    unattributed: tuple
    idle_s: float
    window_s: float
    notes: tuple = ()
    #: the GEMMs' error by what bounds each in the model (``ClassError`` with ``cls`` one of
    #: ``"compute"``, ``"memory"``, ``"latency"``): where the GEMM model is off
    gemm_by_bound: tuple = ()
    #: the GEMMs' error by setting: ``"alone"`` (no collective beside them), ``"beside a
    #: collective"`` (priced on the SMs it left), and ``"model's kernel choice"`` (every
    #: GEMM with the model's own tile and split on the whole GPU, as ``analyze`` predicts)
    gemm_by_setting: tuple = ()
    #: device time of the kernels graph replays ran (attributed to their graph launches,
    #: not to operators: ``fxshape.traces.pairing``), and those kernels by name
    graph_s: float = 0.0
    graphed: tuple = ()
    #: the GPU the trace's deviceProperties name, where they name one that differs from
    #: ``gpu`` (a GPU given other than the trace's): "" otherwise
    trace_gpu: str = ""

    @property
    def attributed_fraction(self) -> float:
        """Of the device time, what operators account for (graph replays not counted)."""
        return self.attributed_s / self.kernel_s if self.kernel_s else 0.0

    @property
    def accounted_fraction(self) -> float:
        """Of the device time, what operators and graph launches account for."""
        return (self.attributed_s + self.graph_s) / self.kernel_s if self.kernel_s else 0.0

    @property
    def modelled_fraction(self) -> float:
        return self.modelled_s / self.kernel_s if self.kernel_s else 0.0

    def class_error(self, cls: str) -> ClassError | None:
        return next((c for c in self.by_class if c.cls == cls), None)

    def worst(self, n: int = 10) -> tuple:
        """The ``n`` predicted operators whose prediction is furthest from the measurement
        in time (``|predicted - measured|``), largest first."""
        got = [o for o in self.ops if o.predicted_s is not None]
        got.sort(key=lambda o: (-abs(o.predicted_s - o.measured_s), o.index))
        return tuple(got[:n])

    def no_model(self) -> tuple:
        """``(operator name, reason, count, measured s)`` of the operators without a model,
        most time first (Inductor's Triton kernels grouped by kind: ``triton_poi_*``)."""
        agg = defaultdict(lambda: [0, 0.0])
        for o in self.ops:
            if o.predicted_s is None:
                a = agg[(_family(o.name), o.note)]
                a[0] += 1
                a[1] += o.measured_s
        rows = [(k[0], k[1], v[0], v[1]) for k, v in agg.items()]
        rows.sort(key=lambda r: (-r[3], r[0], r[1]))
        return tuple(rows)

    def to_dict(self) -> dict:
        return {
            "path": self.path, "gpu": self.gpu, "gpu_from": self.gpu_from,
            "kernel_s": self.kernel_s, "attributed_s": self.attributed_s,
            "attributed_fraction": self.attributed_fraction, "modelled_s": self.modelled_s,
            "modelled_fraction": self.modelled_fraction, "idle_s": self.idle_s,
            "window_s": self.window_s,
            "by_class": [c.as_dict() for c in self.by_class],
            "gemm_by_bound": [c.as_dict() for c in self.gemm_by_bound],
            "gemm_by_setting": [c.as_dict() for c in self.gemm_by_setting],
            "unattributed": [u.__dict__ for u in self.unattributed],
            "graph_s": self.graph_s, "accounted_fraction": self.accounted_fraction,
            "graphed": [u.__dict__ for u in self.graphed],
            "no_model": [{"name": n, "reason": r, "count": c, "measured_s": t}
                         for n, r, c, t in self.no_model()],
            "ops": [o.as_dict() for o in self.ops], "notes": list(self.notes)}

    def to_json(self, indent: int = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=True)

    def to_csv(self) -> str:
        """One line per operator."""
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(("index", "name", "class", "what", "kernels", "measured_s", "predicted_s",
                    "error", "note"))
        for o in self.ops:
            e = o.error
            w.writerow((o.index, o.name, o.cls, o.what, " | ".join(o.kernels),
                        f"{o.measured_s:.9g}",
                        "" if o.predicted_s is None else f"{o.predicted_s:.9g}",
                        "" if e is None else f"{e:.6f}", o.note))
        return buf.getvalue()

    def to_markdown(self, worst: int = 10) -> str:
        """The report ``fxshape compare`` prints: the attribution, the error per class, and
        (``worst`` > 0) the ``worst`` worst operators, operators without a model and
        unattributed kernels."""
        from tabulate import tabulate

        us = lambda s: f"{s * 1e6:,.1f}"  # noqa: E731
        out = [f"trace {self.path} on {self.gpu} ({self.gpu_from})", ""]
        out.append(f"device time {us(self.kernel_s)} us over a {us(self.window_s)} us window "
                   f"(idle {us(self.idle_s)} us); attributed to operators "
                   f"{100 * self.attributed_fraction:.1f}%, to operators with a model "
                   f"{100 * self.modelled_fraction:.1f}%"
                   + (f"; to CUDA/HIP graph launches {100 * self.graph_s / self.kernel_s:.1f}%"
                      f" (replayed kernels: their operators ran at capture, not in this "
                      f"trace; {100 * self.accounted_fraction:.1f}% accounted for)"
                      if self.graph_s else ""))
        out.append("")
        rows = [(c.cls, c.ops, us(c.measured_s), us(c.predicted_s),
                 f"{100 * c.median:.1f}", f"{100 * c.p90:.1f}", f"{100 * c.signed_median:+.1f}",
                 f"{c.within_20}/{c.ops}") for c in self.by_class]
        out.append(tabulate(rows, headers=("class", "ops", "measured us", "predicted us",
                                           "median abs err %", "p90 %", "median signed %",
                                           "within 20%"), tablefmt="github",
                            disable_numparse=True))
        for label, title, table in (
                ("bound", "GEMMs by what bounds them in the model:", self.gemm_by_bound),
                ("setting", "GEMMs by setting (the kernel that ran, on the SMs it had; and "
                 "the model's own kernel choice on the whole GPU):", self.gemm_by_setting)):
            if not table:
                continue
            out += ["", title]
            out.append(tabulate([(c.cls, c.ops, us(c.measured_s), us(c.predicted_s),
                                  f"{100 * c.median:.1f}", f"{100 * c.signed_median:+.1f}",
                                  f"{c.within_20}/{c.ops}") for c in table],
                                headers=(label, "GEMMs", "measured us", "predicted us",
                                         "median abs err %", "median signed %",
                                         "within 20%"), tablefmt="github",
                                disable_numparse=True))
        w = self.worst(worst)
        if w:
            out += ["", f"worst {len(w)} (by time):"]
            out.append(tabulate([(o.name, o.what, us(o.measured_s), us(o.predicted_s),
                                  f"{100 * o.error:+.1f}" if o.error is not None else "")
                                 for o in w],
                                headers=("op", "priced as", "measured us", "predicted us",
                                         "error %"), tablefmt="github", disable_numparse=True))
        nm = self.no_model() if worst > 0 else ()
        if nm:
            out += ["", "operators without a model (measured time not predicted):"]
            out.append(tabulate([(n, r, c, us(t)) for n, r, c, t in nm[:worst]],
                                headers=("op", "why", "count", "measured us"),
                                tablefmt="github", disable_numparse=True))
        for kernels, title, why in (
                (self.unattributed, "device time no operator launched:", "why"),
                (self.graphed, "device time graph replays ran (attributed to the graph "
                               "launch):", "how")):
            if kernels and worst > 0:
                out += ["", title]
                out.append(tabulate([(u.kernel[:80], u.reason, u.count, us(u.time_s))
                                     for u in kernels[:worst]],
                                    headers=("kernel", why, "count", "us"),
                                    tablefmt="github", disable_numparse=True))
        out += [f"note: {n}" for n in self.notes]
        return "\n".join(out) + "\n"


def resolve_trace_gpu(trace: Trace, gpu=None):
    """``(GPUSpec, how it was chosen)``: ``gpu`` when given, else the trace's device
    properties (the device name, else its SM/CU count and memory when only one GPU of the
    table matches).

    Raises:
        ValueError: no ``gpu`` and no device properties, or properties that match no GPU
            of the table or more than one.
    """
    if gpu is not None:
        return get_gpu(gpu), "given"
    from ..fit.calibrate import detect_gpu

    props = trace.device_properties
    if not props:
        raise ValueError(f"{trace.path!r} has no deviceProperties to say which GPU ran it: "
                         "pass gpu= (fxshape compare --gpu NAME); known GPUs: "
                         + ", ".join(list_gpus()))
    used = {ev.device for ev in trace.device_events}
    p = next((x for x in props if x.get("id") in used), props[0])
    name = str(p.get("name", ""))
    try:
        return get_gpu(detect_gpu(name)), f"deviceProperties name {name!r}"
    except ValueError:
        pass
    sms, mem = p.get("numSms"), p.get("totalGlobalMem")
    vendor = "amd" if p.get("warpSize") == 64 else "nvidia"
    cands = []
    if isinstance(sms, int) and isinstance(mem, (int, float)) and mem > 0:
        gb = mem / 1e9
        cands = [g for g in list_gpus() if get_gpu(g).vendor == vendor
                 and get_gpu(g).sm_count == sms and abs(get_gpu(g).memory_gb - gb) <= 0.1 * gb]
    if len(cands) == 1:
        return get_gpu(cands[0]), f"deviceProperties: {sms} SMs/CUs, {mem / 2**30:.0f} GiB"
    raise ValueError(f"the trace's device {name!r} ({sms} SMs/CUs, "
                     f"{(mem or 0) / 2**30:.0f} GiB) matches "
                     + (f"{' and '.join(cands)} of the GPU table" if cands else
                        "no GPU of the table")
                     + ": pass gpu= (fxshape compare --gpu NAME)")


def _by_kernel(events) -> list:
    """``(device event, reason)`` pairs summed by reason and kernel name, most time first."""
    acc = defaultdict(lambda: [0, 0.0])
    for ev, why in events:
        a = acc[(why, ev.name)]
        a[0] += 1
        a[1] += ev.dur * 1e-6
    return sorted((Unattributed(w, k, c, t) for (w, k), (c, t) in acc.items()),
                  key=lambda u: (-u.time_s, u.kernel, u.reason))


def _union_length(intervals) -> float:
    total, end = 0.0, None
    for s, e in sorted(intervals):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def compare_trace(path, gpu=None, *, params_path: str | None = None) -> TraceComparison:
    """Compare the PyTorch profiler trace at ``path`` with fxshape's models.

    Args:
        path: a Kineto JSON trace (``prof.export_chrome_trace``), gzipped or not, recorded
            with ``record_shapes=True``.
        gpu: the GPU it ran on (a name or alias of :func:`fxshape.list_gpus`); default: the
            trace's device properties.
        params_path: a parameter file (``fxshape calibrate``) to predict with: its GEMM
            constants, and its memory-bound and attention ones where it has ``memops`` and
            ``attention`` sections (``fxshape calibrate --trace`` writes them).

    Raises:
        ValueError: not a trace, a CPU-only trace, a trace without shapes, an unknown or
            undeterminable GPU (each in one line, saying what to do).
    """
    trace = read_trace(path)
    spec, how = resolve_trace_gpu(trace, gpu)
    pairing = pair(trace)
    beside = _collective_neighbours(trace)
    with use_params(params_path):  # memory-bound and attention constants follow it too
        records = _price_ops(trace, spec, pairing, beside, params_path)
    by_class = [e for e in (_errors(cls, [r for r in records if r.cls == cls])
                            for cls in CLASSES) if e is not None]
    by_bound = [e for e in (_errors(b, [r for r in records if r.bound == b])
                            for b in ("compute", "memory", "latency")) if e is not None]
    gemms = [r for r in records if r.cls == "gemm"]
    by_setting = [e for e in (
        _errors("alone", [r for r in gemms if r.sms is None]),
        _errors("beside a collective", [r for r in gemms if r.sms is not None]),
        _errors("model's kernel choice",
                [dataclasses.replace(r, predicted_s=r.chosen_s) for r in gemms]))
        if e is not None]
    unattributed = _by_kernel(pairing.unattributed)
    graphed = _by_kernel((ev, f"replayed by {launch}") for ev, launch in pairing.graphed)
    kernel_s = sum(ev.dur for ev in trace.device_events) * 1e-6
    attributed = sum(r.measured_s for r in records)
    modelled = sum(r.measured_s for r in records if r.predicted_s is not None)
    by_device = defaultdict(list)
    for ev in trace.device_events:
        by_device[ev.device].append((ev.ts, ev.end))
    window = idle = 0.0
    for ivs in by_device.values():
        w = max(e for _, e in ivs) - min(s for s, _ in ivs)
        window += w * 1e-6
        idle += (w - _union_length(ivs)) * 1e-6
    notes = []
    other = ""
    if how == "given" and trace.device_properties:
        try:
            seen, _ = resolve_trace_gpu(trace)
        except ValueError:
            seen = None
        if seen is not None and seen.name != spec.name:
            other = seen.name
            notes.append(f"the trace's device is {seen.name}; predicted on {spec.name} as "
                         "asked")
    if len(by_device) > 1:
        notes.append(f"{len(by_device)} devices in the trace: windows and idle time summed "
                     "over them")
    if any(r.cls == "gemm" and "fp32 " in r.what for r in records):
        notes.append("fp32 GEMMs whose kernels do not name TF32 are predicted as fp32 "
                     "without TF32 (PyTorch's default: torch.backends.cuda.matmul.allow_tf32 "
                     "= False)")
    return TraceComparison(trace.path, spec.name, how, tuple(records), tuple(by_class),
                           kernel_s, attributed, modelled, tuple(unattributed), idle, window,
                           tuple(notes), tuple(by_bound), tuple(by_setting),
                           sum(u.time_s for u in graphed), tuple(graphed), other)


def _price_ops(trace, spec, pairing, beside, params_path) -> list:
    """One :class:`TraceOpRecord` per operator that launched device work."""
    ops_by_index = {o.index: o for o in trace.ops}
    records = []
    for idx in sorted(pairing.by_op):
        op = ops_by_index[idx]
        evs = pairing.by_op[idx]
        measured = sum(ev.dur for ev in evs) * 1e-6
        names = tuple(ev.name for ev in evs)
        if evs and all(ev.kind == "memcpy" and any(h in ev.name for h in _HOST_COPY)
                       for ev in evs):
            records.append(TraceOpRecord(idx, op.name, "no model", "", names, measured, None,
                                         "a copy between host and device (no PCIe model)"))
            continue
        sms = None
        if not any(_is_collective(ev.name) for ev in evs):
            held = beside(evs)
            sms = max(1, spec.sm_count - held) if held else None
        ctx = PriceContext(spec, names, pairing.parent.get(idx, ""), trace.world_size,
                           params_path, tuple(ev.grid for ev in evs), sms)
        try:
            got = price_op(op, ctx)
        except NoModel as exc:
            records.append(TraceOpRecord(idx, op.name, "no model", "", names, measured, None,
                                         str(exc)))
            continue
        if got.cls in ("gemm", "attention") and not any(ev.kind == "kernel" for ev in evs):
            records.append(TraceOpRecord(idx, op.name, "no model", got.what, names, measured,
                                         None, "none of its kernels is in the trace (only "
                                         "copies or memsets): not compared"))
            continue
        records.append(TraceOpRecord(idx, op.name, got.cls, got.what, names, measured,
                                     got.time_s, gemm=got.gemm, bound=got.bound,
                                     sms=sms if got.cls == "gemm" else None,
                                     chosen_s=got.chosen_s, memops=got.memops,
                                     ran=got.ran, attention=got.attention))
    return records


def _is_collective(kernel: str) -> bool:
    """A collective library's kernel (NCCL's, or RCCL's, which keeps NCCL's names)."""
    name = kernel[5:] if kernel.startswith("void ") else kernel
    return name.lower().startswith(("nccl", "rccl"))


def _collective_neighbours(trace: Trace):
    """A function of an operator's device events: the CTAs of the collective kernels that
    ran beside them on their device for more than half their time (the largest such
    kernel's grid), else 0. A collective's CTAs stay resident for the whole collective, so
    the SMs they hold are not the GEMM's."""
    coll = defaultdict(list)
    for ev in trace.device_events:
        if ev.kind == "kernel" and _is_collective(ev.name):
            ctas = math.prod(ev.grid) if ev.grid else 0
            coll[ev.device].append((ev.ts, ev.end, ctas))
    for v in coll.values():
        v.sort()
    starts = {d: [c[0] for c in v] for d, v in coll.items()}

    def held(evs) -> int:
        total = sum(ev.dur for ev in evs)
        if total <= 0:
            return 0
        over, ctas = 0.0, 0
        for ev in evs:
            v = coll.get(ev.device)
            if not v:
                continue
            for s, e, c in v[:bisect.bisect_left(starts[ev.device], ev.end)]:
                if e > ev.ts:
                    over += min(e, ev.end) - max(s, ev.ts)
                    ctas = max(ctas, c)
        return ctas if over > 0.5 * total else 0
    return held


def _errors(label: str, rs) -> ClassError | None:
    """The error over records ``rs`` (those with a prediction and a measured time)."""
    rs = [r for r in rs if r.error is not None]
    if not rs:
        return None
    errs = [r.error for r in rs]
    return ClassError(label, len(rs), sum(r.measured_s for r in rs),
                      sum(r.predicted_s for r in rs), statistics.median(abs(e) for e in errs),
                      _quantile([abs(e) for e in errs], 0.9), statistics.median(errs),
                      sum(abs(e) <= 0.2 for e in errs))
