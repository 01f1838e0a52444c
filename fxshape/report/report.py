"""Reports: per-GEMM rows, collapsed tables, JSON / CSV / Markdown / networkx views.

The only module that imports tabulate. Output is deterministic: the same model and options
give byte-identical JSON.
"""

from __future__ import annotations

import csv
import dataclasses
import html
import io
import json
import re
from collections import OrderedDict
from dataclasses import dataclass, field

from tabulate import tabulate

from ..config.setup import Setup
from ..hardware.gpus import get_gpu
from ..analysis.rows import kernel_figures, misaligned
from ..execution.parts import ReportParts

__all__ = ["Report"]

_LAYER_INDEX = re.compile(r"(?<=\.)\d+(?=\.|$)")


def _pattern(module: str) -> str:
    """``model.layers.7.mlp.down_proj`` -> ``model.layers.*.mlp.down_proj``."""
    return _LAYER_INDEX.sub("*", module)


def _set_by(row) -> str:
    """``M: batch_size × seq_len; N: vocab_size; K: hidden_size`` (empty when unknown)."""
    if not row.set_by:
        return ""
    return "; ".join(f"{d}: {s}" for d, s in zip("MNK", row.set_by))


@dataclass(frozen=True)
class Report(ReportParts):
    """What ``fxshape.analyze`` found: its parts (``fxshape.execution.parts.ReportParts``:
    ``rows``, one record per GEMM node, not collapsed; the unsupported ops, the workload,
    every op, the step, the memory, the capacity, the notes), what each option did and the
    setup it was asked under. ``analyze`` builds it once (:meth:`of`)."""

    #: every option given with a value other than its default, and what it did
    #: (``fxshape.report.options.OptionEffect``)
    options: tuple = ()
    #: what was asked (``fxshape.Setup``): what re-pricing this report (serving's
    #: ``BatchStep``) runs under unless told otherwise; None for a report built by hand
    setup: Setup | None = field(default=None, compare=False, repr=False)

    @classmethod
    def of(cls, parts: ReportParts, options: tuple = (), setup: Setup | None = None):
        """The report of an analysis's last ``parts``, with what each option did."""
        return cls(**parts.parts(), options=options, setup=setup)

    @property
    def spec(self):
        """The GPU the report was priced on, as its cost models saw it: the setup's
        machine (its power limit and its constants, ``GPUSpec.constants``) when
        ``analyze`` built it, else the GPU its name gives; what re-pricing it (padding,
        serving) hands the cost models."""
        return self.setup.machine.spec if self.setup is not None else get_gpu(self.gpu)

    # -- totals ---------------------------------------------------------------------------
    @property
    def total_time_s(self) -> float:
        return sum(r.time_s for r in self.rows)

    @property
    def total_flops(self) -> int:
        return sum(r.flops for r in self.rows)

    @property
    def efficiency(self) -> float:
        """FLOP-weighted efficiency: achieved GEMM FLOP/s over the dtype's dense peak."""
        if not self.rows or self.total_time_s == 0:
            return 0.0
        peak = get_gpu(self.gpu).peak_tflops(self.dtype) * 1e12
        return self.total_flops / self.total_time_s / peak

    @property
    def gemm_error_band(self):
        """The expected error of the report's plain GEMM rows (fp16/bf16 tensor-core GEMMs,
        neither attention nor quantized) on its GPU: the held-out validation of regime
        ``gemm`` (``fxshape.hardware.validation.ErrorBand``; each such row's time is within
        ``± fraction`` of what is measured on about nine GEMMs in ten). None where the report
        has no such row or the GPU has no GEMM validation (the other rows: unvalidated as
        GEMMs; the step has its own band, ``step.error_band``)."""
        from ..hardware.dtypes import canonical_dtype
        from ..hardware.validation import error_band

        plain = [r for r in self.rows if not r.quant and r.attention is None]
        if not plain or any(canonical_dtype(r.dtype) not in ("fp16", "bf16") for r in plain):
            return None
        return error_band(self.gpu, "gemm")

    # -- grouping -------------------------------------------------------------------------
    def groups(self):
        """Distinct GEMMs with repeated layers collapsed, sorted by predicted time share. Rows
        of one shape with different causes stay apart (a layer's input- and weight-gradient
        GEMMs can share a shape, each set by other hyperparameters)."""
        acc: "OrderedDict[tuple, list]" = OrderedDict()
        for r in self.rows:
            key = (_pattern(r.module), r.op, r.phase, r.batch, r.m, r.n, r.k, r.layout,
                   tuple(_pattern(s) for s in r.set_by), r.causes)
            acc.setdefault(key, []).append(r)
        out = []
        total = self.total_time_s or 1.0
        for key, rs in acc.items():
            t = sum(r.time_s for r in rs)
            out.append(dict(module=key[0] or "(top)", op=key[1], phase=key[2], count=len(rs),
                            row=rs[0], time_s=t, share=t / total))
        out.sort(key=lambda g: (-g["time_s"], g["module"], g["op"]))
        return out

    # -- views ----------------------------------------------------------------------------
    def _body(self, groups):
        """Header and one row of cells per collapsed group (the table's contents)."""
        head = ("module", "op", "phase", "count", "M", "N", "K", "batch", "tile", "tile eff",
                "waves", "wave eff", "TFLOP/s", "% peak", "time %", "misaligned")
        with_set_by = any(r.set_by for r in self.rows)
        if with_set_by:
            head += ("set by",)
        body = []
        for g in groups:
            r = g["row"]
            k = kernel_figures(r)
            name = g["module"] + (f" x{g['count']}" if g["count"] > 1 else "")
            op = f"{r.op} ({r.kernel or r.quant})" if (r.kernel or r.quant) else r.op
            body.append((name, op, r.phase, g["count"], r.m, r.n, r.k, r.batch,
                         k["tile"], f"{100 * k['tile_efficiency']:.0f}%", k["waves"],
                         f"{100 * k['wave_efficiency']:.0f}%", f"{r.tflops:.0f}",
                         f"{100 * r.efficiency:.0f}%", f"{100 * g['share']:.1f}",
                         misaligned(r)) + ((_set_by(r),) if with_set_by else ()))
        return head, body

    def table(self, fmt: str = "simple") -> str:
        """The collapsed per-GEMM table plus a summary, as text (tabulate format ``fmt``)."""
        if not self.rows:
            msg = f"{self.model_name or 'model'}: no matmuls found"
            opts = f"\noptions: {self.options_text()}" if self.options else ""
            return msg + self._unsupported_text() + opts
        groups = self.groups()
        head, body = self._body(groups)
        text = tabulate(body, headers=head, tablefmt=fmt, disable_numparse=True)
        return text + "\n\n" + self.summary(groups) + self._unsupported_text()

    def _repr_html_(self) -> str:
        """The table as HTML (Jupyter), misaligned dimensions highlighted."""
        if not self.rows:
            return f"<pre>{html.escape(self.table())}</pre>"
        groups = self.groups()
        head, body = self._body(groups)
        flag = head.index("misaligned")
        cells = []
        for row in body:
            row = [html.escape(str(c)) for c in row]
            if row[flag]:
                row[flag] = f'<span style="color:#c00;font-weight:bold">{row[flag]}</span>'
            cells.append(row)
        text = tabulate(cells, headers=[html.escape(h) for h in head], tablefmt="unsafehtml",
                        disable_numparse=True)
        tail = html.escape(self.summary(groups) + self._unsupported_text()).replace("\n", "<br>")
        return f"{text}<p>{tail}</p>"

    def plot(self, path: str, *, top: int = 15) -> bool:
        """Where the time goes, as a bar chart (``fxshape.report.plot.plot_report``) written to
        ``path`` (.png or .svg). Returns False when matplotlib is not installed."""
        from .plot import plot_report

        return plot_report(self, path, top=top)

    def summary(self, groups=None) -> str:
        """Totals and the top misaligned offenders (``groups``: from :meth:`groups`)."""
        lines = [
            f"GPU {self.gpu}, GEMMs in {self.dtype}: {len(self.rows)} GEMMs, "
            f"{self.total_flops / 1e12:.3f} TFLOP, predicted GEMM time "
            f"{self.total_time_s * 1e3:.3f} ms, FLOP-weighted efficiency "
            f"{100 * self.efficiency:.1f}% of dense peak",
        ]
        if self.workload is not None:
            lines.append(f"workload: {self.workload.describe()}")
        if self.step is not None:
            lines.append(self.step.describe())
            other = self.by_class()
            if other:
                lines.append("non-GEMM ops: " + "; ".join(
                    f"{c['cls']} {c['family']} x{c['count']} {c['time_s'] * 1e3:.3f} ms"
                    for c in other[:6]) + ("; ..." if len(other) > 6 else ""))
            lines.extend(f"note: {n}" for n in self.step.notes)
        if self.memory is not None:
            lines.append(self.memory.describe())
        if self.capacity is not None:
            lines.append(self.capacity.describe())
        lines.extend(f"note: {n}" for n in self.notes)
        if self.options:
            lines.append(f"options: {self.options_text()}")
        offenders = [g for g in (groups or self.groups()) if misaligned(g["row"])][:3]
        if offenders:
            lines.append("top offenders (misaligned): " + "; ".join(
                f"{g['module']} {g['op']} ({misaligned(g['row'])}{_culprits(g['row'])}, "
                f"{100 * g['share']:.1f}% of time)" for g in offenders))
        return "\n".join(lines)

    def by_class(self) -> list:
        """The non-GEMM ops of the step collapsed by class and kernel family, longest first:
        ``[{"cls", "family", "count", "kernels", "bytes", "time_s"}, ...]``."""
        acc: dict = {}
        for o in self.ops:
            if o.cls in ("gemm", "attention", "view"):
                continue
            a = acc.setdefault((o.cls, o.family), [0, 0, 0, 0.0])
            a[0] += 1
            a[1] += o.kernels
            a[2] += o.bytes
            a[3] += o.time_s
        out = [dict(cls=c, family=f, count=a[0], kernels=a[1], bytes=a[2], time_s=a[3])
               for (c, f), a in acc.items()]
        out.sort(key=lambda d: (-d["time_s"], d["cls"], d["family"]))
        return out

    def _unsupported_text(self) -> str:
        text = ""
        if self.unsupported:
            items = "; ".join(f"{u.node} ({u.target}{', ' + u.module if u.module else ''}): "
                              f"{u.reason}" for u in self.unsupported)
            text += f"\nunsupported matmul-like ops (not counted): {items}"
        if self.unsupported_ops:
            names = sorted({u.target for u in self.unsupported_ops})
            text += (f"\nops without a cost model (not in the step): "
                     f"{len(self.unsupported_ops)} nodes of {', '.join(names)}")
        return text

    def __str__(self) -> str:
        return self.table()

    def compare(self, other: "Report", fmt: str = "simple") -> str:
        """Before (this report) / after (``other``, e.g. of ``fxshape.pad(model)``), per GEMM
        and in total: shapes, predicted time, efficiency. GEMMs are matched by module, op and
        phase, in graph order."""
        def keyed(rep):
            out: dict = {}
            for r in rep.rows:
                out.setdefault((r.module, r.op, r.phase), []).append(r)
            return out

        a, b = keyed(self), keyed(other)
        body = []
        for key in sorted(set(a) | set(b)):
            ra, rb = a.get(key, []), b.get(key, [])
            for i in range(max(len(ra), len(rb))):
                x = ra[i] if i < len(ra) else None
                y = rb[i] if i < len(rb) else None
                same = x is not None and y is not None and (x.m, x.n, x.k) == (y.m, y.n, y.k)
                if same and abs(x.time_s - y.time_s) <= 1e-12:
                    continue  # unchanged
                body.append((key[0] or "(top)", key[1], key[2],
                             "-" if x is None else f"{x.m}x{x.n}x{x.k}",
                             "-" if y is None else f"{y.m}x{y.n}x{y.k}",
                             "-" if x is None else f"{x.time_s * 1e6:.1f}",
                             "-" if y is None else f"{y.time_s * 1e6:.1f}",
                             "-" if x is None else f"{100 * x.efficiency:.0f}%",
                             "-" if y is None else f"{100 * y.efficiency:.0f}%"))
        head = ("module", "op", "phase", "before MxNxK", "after MxNxK", "us before",
                "us after", "eff before", "eff after")
        text = tabulate(body, headers=head, tablefmt=fmt, disable_numparse=True) if body \
            else "no GEMM changed"
        t0, t1 = self.total_time_s, other.total_time_s
        change = 0.0 if t0 == 0 else 1 - t1 / t0
        return (text + f"\n\npredicted GEMM time {t0 * 1e3:.3f} ms -> {t1 * 1e3:.3f} ms "
                f"({100 * change:.1f}% less); FLOP-weighted efficiency "
                f"{100 * self.efficiency:.1f}% -> {100 * other.efficiency:.1f}%")

    def to_markdown(self) -> str:
        return self.table(fmt="github")

    def to_dict(self) -> dict:
        gemm_band = self.gemm_error_band
        return {
            "model": self.model_name,
            "gpu": self.gpu,
            "dtype": self.dtype,
            "total_flops": self.total_flops,
            "total_time_s": self.total_time_s,
            "efficiency": self.efficiency,
            "notes": list(self.notes),
            "workload": None if self.workload is None else self.workload.as_dict(),
            "rows": [_row_dict(r) for r in self.rows],
            "unsupported": [u.__dict__ for u in self.unsupported],
            "step": None if self.step is None else self.step.as_dict(),
            "gemm_error_band": None if gemm_band is None else gemm_band.as_dict(),
            "ops": [o.as_dict() for o in self.ops],
            "unsupported_ops": [u.__dict__ for u in self.unsupported_ops],
            "memory": None if self.memory is None else self.memory.as_dict(),
            "capacity": None if self.capacity is None else dataclasses.asdict(self.capacity),
            "options": [o.as_dict() for o in self.options],
        }

    def ops_csv(self) -> str:
        """Every op of the step (``report.ops``) as CSV, one line each, program order."""
        buf = io.StringIO()
        cols = ("node", "op", "module", "phase", "cls", "family", "kernels", "bytes", "flops",
                "time_s", "host_s", "note")
        extra, tail = self._csv_tail()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(cols + extra)
        for o in self.ops:
            d = o.as_dict()
            w.writerow([d[c] for c in cols] + tail)
        return buf.getvalue()

    _WORKLOAD_COLUMNS = ("mode", "batch_size", "seq_len", "tp", "attention")

    def _csv_tail(self) -> tuple:
        """(column names, cells) that end every line of both CSVs: the workload and the
        options, so that any slice of a file still says what it describes."""
        wl = self.workload.as_dict() if self.workload is not None else {}
        cells = ["" if wl.get(c) is None else wl[c] for c in self._WORKLOAD_COLUMNS]
        return self._WORKLOAD_COLUMNS + ("options",), cells + [self.options_text()]

    def options_text(self) -> str:
        """The options line's text (``fxshape.report.options``): every option given, and
        what it did."""
        return "; ".join(o.describe() for o in self.options)

    def to_json(self, indent: int = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=True)

    def to_chrome_trace(self, path: str) -> str:
        """Write the predicted step as a Chrome / Perfetto trace (the JSON
        ``torch.profiler`` writes; gzipped when ``path`` ends in ``.gz``) and return
        ``path``: the host thread, the compute and communication streams, pipeline ranks as
        processes (``fxshape.report.chrome``)."""
        from .chrome import write_chrome_trace

        return write_chrome_trace(self, path)

    def to_csv(self) -> str:
        buf = io.StringIO()
        cols = ("node", "module", "module_type", "op", "kernel", "phase", "batch", "m", "n", "k",
                "dtype", "layout", "work", "flops", "time_s", "tflops", "efficiency", "tile",
                "tile_efficiency", "waves", "wave_efficiency", "bound", "misaligned", "note",
                "set_by_m", "set_by_n", "set_by_k")
        extra, tail = self._csv_tail()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(cols + extra)
        for r in self.rows:
            d = _row_dict(r)
            w.writerow([d[c] for c in cols] + tail)
        return buf.getvalue()

    def to_networkx(self):
        """The matmul dataflow graph: one node per GEMM node, an edge where one's output
        reaches another through non-matmul ops. Node attributes: the GemmRow records.

        A deduplicated report (``analyze(..., dedup=True)``) names each layer's copy of a
        representative node ``node@layer``; edges are those of the traced graph, drawn
        between copies of the same layer and between layers and the rest of the model
        (``dedup=False`` gives the exact graph of every layer)."""
        import networkx as nx

        g = nx.DiGraph()
        by_node: dict[str, list] = {}
        for r in self.rows:
            by_node.setdefault(r.node, []).append(r)
        copies: dict[str, list] = {}
        for name, rs in by_node.items():
            g.add_node(name, rows=tuple(rs), module=rs[0].module, op=rs[0].op)
            copies.setdefault(name.split("@")[0], []).append(name)
        gm = self.graph_module
        if gm is None:
            return g
        nodes = {n.name: n for n in gm.graph.nodes}
        for base in copies:
            seen, stack, reached = set(), list(nodes[base].users), []
            while stack:
                u = stack.pop()
                if u.name in seen:
                    continue
                seen.add(u.name)
                if u.name in copies:
                    reached.append(u.name)
                else:
                    stack.extend(u.users)
            for target in reached:
                for src in copies[base]:
                    for dst in copies[target]:
                        if "@" in src and "@" in dst and \
                                src.split("@")[1] != dst.split("@")[1]:
                            continue  # another layer's copy
                        g.add_edge(src, dst)
        return g


def _culprits(row) -> str:
    """`` <- vocab_size`` for the misaligned dimensions of a row with provenance."""
    if not row.set_by:
        return ""
    bad = [a.dim for a in row.prediction.alignment if a.status == "misaligned" and a.leading]
    names = sorted({row.set_by["MNK".index(d)] for d in bad if d in "MNK"})
    return f" <- {', '.join(names)}" if names else ""


def _row_dict(r) -> dict:
    k = kernel_figures(r)
    return {
        "node": r.node, "module": r.module, "module_type": r.module_type, "op": r.op,
        "kernel": r.kernel, "phase": r.phase, "batch": r.batch, "m": r.m, "n": r.n, "k": r.k,
        "dtype": r.dtype, "layout": r.layout, "work": r.work, "flops": r.flops,
        "time_s": r.time_s, "tflops": r.tflops, "efficiency": r.efficiency,
        "tile": k["tile"], "tile_efficiency": k["tile_efficiency"], "waves": k["waves"],
        "wave_efficiency": k["wave_efficiency"], "bound": k["bound"], "misaligned": misaligned(r),
        "note": r.note, "set_by_m": r.set_by[0] if r.set_by else "",
        "set_by_n": r.set_by[1] if r.set_by else "", "set_by_k": r.set_by[2] if r.set_by else "",
        "causes_m": list(r.causes[0]) if r.causes else [],
        "causes_n": list(r.causes[1]) if r.causes else [],
        "causes_k": list(r.causes[2]) if r.causes else [],
        **({"quant": r.quant, "kernels": r.kernels} if r.quant else {}),
    }
