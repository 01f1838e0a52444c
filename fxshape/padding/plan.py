"""Padding plans: should each GEMM run at padded sizes, and to what? (Decides; edits nothing.)

For every GEMM of a report, :func:`plan_padding` tries each of M, N, K at its original size
and rounded up to multiples of 8, 64 and 128 elements (every combination), predicts the padded
GEMM with ``predict_matmul`` and adds the cost of the copies padding needs: a per-call copy of
each padded activation operand and of the sliced-back output (bytes read and written over the
achievable DRAM bandwidth). Weights are padded once, ahead of time: they cost memory, not time.
It pads when the net predicted gain is at least ``min_gain``.

*May we* (:func:`can_pad`) is decided apart from *should we*: static integer sizes, a floating
dtype, an op the rewrite supports. Pure functions; deterministic.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from tabulate import tabulate

from ..cost.gemm import model_params, params_in_force, predict_matmul, use_params
from ..hardware.dtypes import itemsize, output_itemsize

__all__ = ["PadDecision", "PaddingPlan", "plan_padding", "can_pad", "padded_size",
           "DEFAULT_MIN_GAIN", "DEFAULT_MULTIPLES"]

DEFAULT_MIN_GAIN = 0.03
DEFAULT_MULTIPLES = (8, 64, 128)
#: ops the rewrite can pad (pad operands, run, slice the result back)
PADDABLE_OPS = ("linear", "mm", "addmm", "bmm", "matmul")


def padded_size(x: int, multiple: int) -> int:
    """``x`` rounded up to a multiple of ``multiple`` (a positive power of two)."""
    _check_multiple(multiple)
    return -(-x // multiple) * multiple


def check_min_gain(min_gain) -> float:
    """``min_gain`` as given: a number in [0, 1), else a one-line ``ValueError``."""
    if isinstance(min_gain, bool) or not isinstance(min_gain, (int, float)) \
            or not 0 <= min_gain < 1:
        raise ValueError(f"min_gain must be in [0, 1), got {min_gain!r}")
    return min_gain


def _check_multiple(m) -> int:
    if isinstance(m, bool) or not isinstance(m, int) or m <= 0 or m & (m - 1):
        raise ValueError(f"padding multiple must be a positive power of two, got {m!r}")
    return m


@dataclass(frozen=True)
class PadDecision:
    """The plan for one GEMM (one report row)."""

    node: str
    module: str
    op: str
    phase: str
    batch: int
    m: int
    n: int
    k: int
    pad_m: int
    pad_n: int
    pad_k: int
    time_s: float  # predicted, as it is
    padded_time_s: float  # predicted at the padded sizes, copies included
    copy_time_s: float
    weight_extra_bytes: int  # memory the padded weight adds (once)
    safe: bool
    reason: str

    @property
    def pads(self) -> bool:
        return (self.pad_m, self.pad_n, self.pad_k) != (self.m, self.n, self.k)

    @property
    def gain(self) -> float:
        """Predicted fraction of this GEMM's time saved (0 when not padded)."""
        if not self.pads or self.time_s <= 0:
            return 0.0
        return 1.0 - self.padded_time_s / self.time_s


@dataclass(frozen=True)
class PaddingPlan:
    decisions: tuple
    gpu: str
    dtype: str
    min_gain: float
    #: the analysis options the plan's report was made with, and what each did
    #: (``Report.options``, as text)
    options: str = ""

    @property
    def padded(self):
        return tuple(d for d in self.decisions if d.pads)

    @property
    def time_before_s(self) -> float:
        return sum(d.time_s for d in self.decisions)

    @property
    def time_after_s(self) -> float:
        return sum(d.padded_time_s if d.pads else d.time_s for d in self.decisions)

    @property
    def extra_bytes(self) -> int:
        return sum(d.weight_extra_bytes for d in self.padded)

    def _body(self):
        """Header and one row of cells per padded GEMM."""
        rows = []
        for d in self.padded:
            change = ", ".join(f"{x.upper()} {a}->{b}" for x, a, b in
                               (("m", d.m, d.pad_m), ("n", d.n, d.pad_n), ("k", d.k, d.pad_k))
                               if a != b)
            rows.append((d.module or "(top)", d.op, d.phase, d.batch, d.m, d.n, d.k, change,
                         f"{d.time_s * 1e6:.1f}", f"{d.padded_time_s * 1e6:.1f}",
                         f"{100 * d.gain:.1f}%", f"{d.weight_extra_bytes / 2**20:.2f}"))
        head = ("module", "op", "phase", "batch", "M", "N", "K", "pad", "us before",
                "us after", "gain", "+MiB")
        return head, rows

    def _summary(self) -> list:
        """Why the others are not padded, and the totals."""
        why: dict[str, int] = {}
        for d in self.decisions:
            if not d.pads:
                key = d.reason if not d.reason.startswith("best padding saves") \
                    else f"best padding saves < {100 * self.min_gain:.0f}%"
                why[key] = why.get(key, 0) + 1
        before, after = self.time_before_s, self.time_after_s
        gain = 0.0 if before == 0 else 1 - after / before
        lines = []
        if why:
            lines.append("not padded: " + "; ".join(f"{n} x {r}" for r, n in sorted(why.items())))
        lines.append(f"padded {len(self.padded)} of {len(self.decisions)} GEMMs on {self.gpu} "
                     f"({self.dtype}), min gain {100 * self.min_gain:.0f}%: predicted GEMM time "
                     f"{before * 1e3:.3f} ms -> {after * 1e3:.3f} ms ({100 * gain:.1f}% less), "
                     f"padded weights +{self.extra_bytes / 2**20:.2f} MiB")
        return lines

    def table(self, fmt: str = "simple") -> str:
        """One row per GEMM the plan pads; then why the others are not, and totals."""
        head, rows = self._body()
        text = tabulate(rows, headers=head, tablefmt=fmt, disable_numparse=True) if rows \
            else "no GEMM is worth padding"
        return "\n".join([text, ""] + self._summary())

    def __str__(self) -> str:
        return self.table()

    _CSV_COLUMNS = ("node", "module", "op", "phase", "batch", "m", "n", "k", "pad_m", "pad_n",
                    "pad_k", "pads", "time_s", "padded_time_s", "copy_time_s", "gain",
                    "weight_extra_bytes", "safe", "reason")

    def _decision_dict(self, d) -> dict:
        out = {c: getattr(d, c) for c in self._CSV_COLUMNS if c not in ("pads", "gain")}
        out.update(pads=d.pads, gain=d.gain)
        return out

    def to_dict(self) -> dict:
        """Every decision (padded or not, with its reason) and the totals."""
        return {"gpu": self.gpu, "dtype": self.dtype, "min_gain": self.min_gain,
                "time_before_s": self.time_before_s, "time_after_s": self.time_after_s,
                "extra_bytes": self.extra_bytes, "padded": len(self.padded),
                "decisions": [self._decision_dict(d) for d in self.decisions]}

    def to_csv(self) -> str:
        """One row per GEMM of the plan (the columns of :class:`PadDecision`, plus ``pads``
        and ``gain``)."""
        import csv
        import io

        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(self._CSV_COLUMNS + ("options",))
        for d in self.decisions:
            row = self._decision_dict(d)
            w.writerow([row[c] for c in self._CSV_COLUMNS] + [self.options])
        return buf.getvalue()

    def _repr_html_(self) -> str:
        """The plan as HTML (Jupyter), each padded GEMM's new sizes highlighted."""
        import html

        head, rows = self._body()
        pad = head.index("pad")
        cells = []
        for row in rows:
            row = [html.escape(str(c)) for c in row]
            row[pad] = f'<span style="color:#060;font-weight:bold">{row[pad]}</span>'
            cells.append(row)
        text = tabulate(cells, headers=head, tablefmt="unsafehtml", disable_numparse=True) \
            if cells else "<p>no GEMM is worth padding</p>"
        return text + "".join(f"<p>{html.escape(line)}</p>" for line in self._summary())


def can_pad(row) -> tuple[bool, str]:
    """May this GEMM be padded? (static sizes, floating dtype, an op the rewrite handles)."""
    if "symbolic" in (row.note or ""):
        return False, "symbolic sizes: left unpadded"
    if row.op not in PADDABLE_OPS:
        return False, f"{row.op}: not a paddable op"
    if row.dtype not in ("fp16", "bf16", "fp32", "tf32"):
        return False, f"{row.dtype}: not padded"
    return True, ""


def _weight_operand(row) -> str | None:
    """Which operand of this row is a weight (padded once): 'b' for linear layers."""
    return "b" if row.op in ("linear", "addmm") and row.module else None


def _copy_bytes(row, pm, pn, pk, e, eo) -> tuple[int, int]:
    """(per-call copy bytes, extra weight bytes) for padding this row to (pm, pn, pk)."""
    b, m, n, k = row.batch, row.m, row.n, row.k
    weight = _weight_operand(row)
    per_call = 0
    if (pm, pk) != (m, k):  # A[m, k] padded: read it, write the padded copy
        per_call += b * (m * k + pm * pk) * e
    extra = 0
    if (pk, pn) != (k, n):
        if weight == "b":
            extra = b * (pk * pn - k * n) * e  # padded once, kept
        else:
            per_call += b * (k * n + pk * pn) * e
    if (pm, pn) != (m, n):  # slice the result back into a contiguous tensor
        per_call += b * (pm * pn + m * n) * eo
    return per_call, extra


def best_padding(row, time_s, dkey, spec, multiples, bw):
    """The fastest (time, pad_m, pad_n, pad_k, copy time, extra weight bytes) for one GEMM
    ``row`` (anything with batch, m, n, k, layout, op, module), copies included; the original
    sizes (and ``time_s``) when no padding is predicted faster."""
    e, eo = itemsize(dkey), output_itemsize(dkey)
    best = (time_s, row.m, row.n, row.k, 0.0, 0)
    options = [sorted({x} | {padded_size(x, mul) for mul in multiples})
               for x in (row.m, row.n, row.k)]
    for pm, pn, pk in itertools.product(*options):
        if (pm, pn, pk) == (row.m, row.n, row.k):
            continue
        p = predict_matmul(pm, pn, pk, batch=row.batch, dtype=dkey, gpu=spec, layout=row.layout)
        per_call, extra = _copy_bytes(row, pm, pn, pk, e, eo)
        copy_t = per_call / bw
        t = p.time_s + copy_t
        if t < best[0] - 1e-15:  # strict improvement; ties keep the smaller padding
            best = (t, pm, pn, pk, copy_t, extra)
    return best


def plan_padding(model_or_report, example_inputs=None, example_kwargs=None, *, gpu="h100",
                 dtype=None, min_gain: float = DEFAULT_MIN_GAIN,
                 multiples=DEFAULT_MULTIPLES, filter_fn=None, params=None,
                 **analyze_kwargs) -> PaddingPlan:
    """Decide, per GEMM, whether and how to pad M, N and K.

    Args:
        model_or_report: a :class:`fxshape.Report`, or a model (analyzed first, with the
            remaining arguments passed to :func:`fxshape.analyze`).
        gpu, dtype: used when analyzing a model (a report keeps its own).
        min_gain: pad a GEMM only if its predicted time, copies included, drops by at least
            this fraction (default 3%).
        multiples: element multiples to try (positive powers of two).
        filter_fn: ``filter_fn(row) -> bool`` chooses which GEMMs may be padded.
        params: a parameter file to predict with (as for :func:`fxshape.analyze`).

    Raises:
        ValueError: a multiple that is not a positive power of two, or a negative min_gain.
    """
    with use_params(params):  # the analysis of a model, in force for its setup
        return _plan_padding(model_or_report, example_inputs, example_kwargs, gpu=gpu,
                             dtype=dtype, min_gain=min_gain, multiples=multiples,
                             filter_fn=filter_fn, params=params, **analyze_kwargs)


def _plan_padding(model_or_report, example_inputs, example_kwargs, *, gpu, dtype, min_gain,
                  multiples, filter_fn, params, **analyze_kwargs) -> PaddingPlan:
    from ..report.report import Report

    multiples = tuple(_check_multiple(m) for m in multiples)
    check_min_gain(min_gain)
    if isinstance(model_or_report, Report):
        report = model_or_report
    else:
        from ..report.build import analyze

        kw = dict(analyze_kwargs)
        kw.setdefault("provenance", None)  # the plan does not say what sets a dimension
        if dtype is not None:
            kw["dtype"] = dtype
        report = analyze(model_or_report, example_inputs, example_kwargs, gpu=gpu, **kw)
    # the GPU with the constants the report was priced with, or those of params=
    spec = report.spec if params is None else \
        report.spec.with_constants(params_in_force(params))
    dkey = report.dtype
    bw = spec.memory_bandwidth_gbs * 1e9 * model_params(spec).dram_eff
    decisions = []
    for row in report.rows:
        base = dict(node=row.node, module=row.module, op=row.op, phase=row.phase,
                    batch=row.batch, m=row.m, n=row.n, k=row.k, time_s=row.time_s)
        safe, reason = can_pad(row)
        if safe and filter_fn is not None and not filter_fn(row):
            safe, reason = False, "excluded by filter_fn"
        best = (row.time_s, row.m, row.n, row.k, 0.0, 0)
        if safe:
            best = best_padding(row, row.time_s, dkey, spec, multiples, bw)
        t, pm, pn, pk, copy_t, extra = best
        gain = 1 - t / row.time_s if row.time_s > 0 else 0.0
        if safe and (pm, pn, pk) != (row.m, row.n, row.k) and gain >= min_gain:
            reason = f"predicted {100 * gain:.1f}% faster"
        else:
            if safe:
                reason = (f"best padding saves {100 * gain:.1f}% < {100 * min_gain:.0f}%"
                          if gain > 0 else "no padding is predicted faster")
            pm, pn, pk, t, copy_t, extra = row.m, row.n, row.k, row.time_s, 0.0, 0
        decisions.append(PadDecision(**base, pad_m=pm, pad_n=pn, pad_k=pk, padded_time_s=t,
                                     copy_time_s=copy_t, weight_extra_bytes=extra, safe=safe,
                                     reason=reason))
    return PaddingPlan(tuple(decisions), spec.name, dkey, min_gain,
                       options=report.options_text())
