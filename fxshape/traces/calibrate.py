"""Calibrate the GEMM model to the kernels of a user's own profiler trace
(``fxshape calibrate --trace TRACE``).

Every GEMM operator the comparison priced (``fxshape.traces.compare``) becomes one measured
row: its recorded sizes, dtype and layout, the tensor-core kernel that ran and its split-K
factor where the trace names them (the fit prices the row as that kernel, as the comparison
does), and the summed duration of its kernels (a split-K GEMM's reduce kernel and cuBLAS's
workspace memset included): kernel time, with no host overhead to fit. Repeated calls of
one shape and kernel are one row at their median. The rows of the
trace's most common GEMM dtype are fitted (``fxshape.fit.calibrate.fit_rows``) after a
deterministic quarter of the shapes (by a hash of the shape) is set aside to report the
fit's error on shapes it did not see.

A constant is fitted only where the trace has shapes that tell it (:data:`NEEDS`: at least
:data:`MIN_ROWS` rows of the kind); the others keep the packaged values and the report
names them. The file written is the one ``fxshape calibrate`` writes: one GPU's entry that
overlays the packaged constants (``params=`` or ``FXSHAPE_PARAMS``).

The memory-bound model's constants (``fxshape.cost.memops``: the launch latency and each
kernel family's efficiency) are fitted to the trace's memory-bound operators as well
(:func:`fit_memops`), and the fused-attention kernels' constants to its SDPA calls
(:func:`fit_attention`), written in the same file's ``memops`` and ``attention`` sections,
which those models read wherever the file is the parameter file in force.
"""

from __future__ import annotations

import hashlib
import math
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass, replace

from ..cost import memops as _memops
from ..cost.gemm import ModelParams, predict_matmul
from ..fit.calibration import CalibrationRow
from ..hardware.dtypes import canonical_dtype
from ..hardware.gpus import get_gpu
from .compare import compare_trace

__all__ = ["TraceCalibration", "KernelCalibration", "TraceRow",
           "trace_rows", "memops_rows", "attention_rows", "fit_attention",
           "fit_memops", "calibrate_from_trace", "NEEDS", "MIN_ROWS"]

#: rows of a kind needed before the constants it tells are fitted
MIN_ROWS = 5


#: constant -> (the kind of shape that tells it, a test on (row, packaged prediction))
NEEDS = {
    "e_max": ("compute-bound", lambda r, p: p.bound == "compute"),
    "power_eff": ("compute-bound", lambda r, p: p.bound == "compute"),
    "smooth_q": ("compute-bound", lambda r, p: p.bound == "compute"),
    "l2_bytes_per_clk_per_sm": ("compute-bound", lambda r, p: p.bound == "compute"),
    "dram_eff": ("memory-bound", lambda r, p: p.bound == "memory"),
    "sm_stream_bytes_per_clk": ("memory-bound", lambda r, p: p.bound == "memory"),
    "launch_s": ("latency-bound", lambda r, p: p.bound == "latency"),
    "wave_s": ("more than one wave", lambda r, p: p.waves > 1),
    "split_k_s": ("split-K", lambda r, p: p.split_k > 1),
    "batched_eff": ("batched (bmm)", lambda r, p: r.batch > 1),
    "ld_issue_clk": ("misaligned", lambda r, p: p.aligned is False),
    "align_mem_eff": ("misaligned", lambda r, p: p.aligned is False),
}


@dataclass(frozen=True)
class TraceCalibration:
    """What ``calibrate_from_trace`` did: the GPU and dtype, rows fitted and held out, the
    held-out median |error| with the packaged and the fitted constants, the constants
    fitted and those kept (with the kind of shape the trace lacked), the GEMM dtypes left
    out, and the parameter file written."""

    gpu: str
    dtype: str
    fitted_rows: int
    held_rows: int
    heldout_before: float | None
    heldout_after: float | None
    fitted: tuple
    kept: tuple  # (constant, what the trace lacked)
    other_dtypes: tuple  # (dtype, rows) not fitted
    out: str
    params: ModelParams
    #: the memory-bound kernels' constants, fitted too (None: the trace has none priced)
    memops: KernelCalibration | None = None
    #: the fused attention kernels' constants, fitted too (None: no SDPA call priced)
    attention: KernelCalibration | None = None

    def describe(self) -> str:
        lines = [f"calibrated {self.gpu} ({self.dtype}) on {self.fitted_rows} GEMM shapes of "
                 f"the trace; wrote {self.out}"]
        if self.heldout_before is not None:
            lines.append(f"held out ({self.held_rows} shapes): median |error| "
                         f"{100 * self.heldout_before:.1f}% with the packaged constants, "
                         f"{100 * self.heldout_after:.1f}% fitted")
        else:
            lines.append("no shape held out (too few): the fit's error is in-sample only")
        lines.append("fitted: " + ", ".join(self.fitted))
        if self.kept:
            lines.append("not identified by the trace (packaged values kept): " + "; ".join(
                f"{c} (needs {MIN_ROWS}+ {why} GEMMs)" for c, why in self.kept))
        if self.other_dtypes:
            lines.append("not fitted (another dtype; calibrate one at a time): " + ", ".join(
                f"{d} x{n}" for d, n in self.other_dtypes))
        if self.memops is not None:
            lines.append(self.memops.describe())
        if self.attention is not None:
            lines.append(self.attention.describe())
        return "\n".join(lines)


@dataclass(frozen=True)
class KernelCalibration:
    """The constants of one kernel model fitted to a trace's kernels (``fit_memops``: the
    memory-bound model's launch latency and family efficiencies; ``fit_attention``: the
    fused attention kernels' constants): the entry written (``{constant: value}``), the
    rows fitted and held out, the held-out median |error| with the constants in force
    before and the fitted ones, the constants fitted and those kept (with the kind of
    kernel the trace lacked)."""

    model: str  # "memory-bound" or "attention (SDPA)"
    entry: dict
    fitted_rows: int
    held_rows: int
    heldout_before: float | None
    heldout_after: float | None
    fitted: tuple
    kept: tuple  # (constant, what the trace lacked)

    def describe(self) -> str:
        lines = [f"{self.model} kernels: fitted on {self.fitted_rows} calls"]
        if self.heldout_before is not None:
            lines.append(f"  held out ({self.held_rows}): median |error| "
                         f"{100 * self.heldout_before:.1f}% with the packaged constants, "
                         f"{100 * self.heldout_after:.1f}% fitted")
        lines.append("  fitted: " + (", ".join(
            f"{c} {self.entry[c]:.4g}" for c in self.fitted) or "none"))
        if self.kept:
            lines.append("  not identified by the trace (packaged values kept): " + "; ".join(
                f"{c} (needs {MIN_ROWS}+ {why})" for c, why in self.kept))
        return "\n".join(lines)


def memops_rows(comparison) -> list:
    """``(family, bytes, measured seconds)`` of every memory-bound operator of a
    ``TraceComparison`` priced as one kernel (a LayerNorm backward's two are left out: the
    trace times them together)."""
    return [(o.memops[0][0], o.memops[0][1], o.measured_s) for o in comparison.ops
            if o.cls == "memory" and len(o.memops) == 1 and o.measured_s > 0]


def _memop_time(entry, spec, family, nbytes) -> float:
    return float(entry["launch_s"]) + _memops.transfer_s(entry, spec, family, nbytes)


def _held_out(key: str) -> bool:
    """A deterministic quarter of the rows, by a hash of their ``key``."""
    return hashlib.sha1(key.encode()).digest()[0] % 4 == 0


def _held_memop(row) -> bool:
    return _held_out(f"{row[0]}:{row[1]}")


def fit_memops(rows, gpu, packaged: dict | None = None) -> KernelCalibration:
    """Fit the memory-bound model ``time = launch_s + bytes / (efficiency[family] *
    bandwidth)`` to ``rows`` (:func:`memops_rows`) on ``gpu``.

    A quarter of the rows, by a hash of ``(family, bytes)``, is held out. ``launch_s`` is
    the median, over the fitted rows the packaged constants call latency-bound (transfer
    below the launch latency), of the measured time less the transfer; then each family's
    efficiency is the median, over its memory-bound rows, of ``bytes / ((time - launch_s)
    * bandwidth)`` (rows whose time does not exceed ``launch_s`` left out), within
    [0.05, 1]. A constant is fitted only where :data:`MIN_ROWS` rows tell it; the others
    keep ``packaged`` (default: the packaged constants of ``gpu``).
    """
    spec = get_gpu(gpu)
    base = dict(packaged if packaged is not None
                else _memops.memops_params(spec, _memops.PACKAGED_PATH)[1])
    entry = {k: base[k] for k in _memops.FAMILIES + ("launch_s",)}
    held = [r for r in rows if _held_memop(r)]
    fit = [r for r in rows if not _held_memop(r)]
    if len(fit) < MIN_ROWS:
        fit, held = list(rows), []
    bw = spec.memory_bandwidth_gbs * 1e9
    launch0 = float(entry["launch_s"])

    def transfer(fam, b, e):
        return _memops.transfer_s(e, spec, fam, b)

    fitted, kept = [], []
    lat = [t - transfer(f, b, entry) for f, b, t in fit if transfer(f, b, entry) < launch0]
    if len(lat) >= MIN_ROWS:
        entry["launch_s"] = float(f"{max(0.0, statistics.median(lat)):.4g}")
        fitted.append("launch_s")
    else:
        kept.append(("launch_s", "latency-bound kernels"))
    launch = float(entry["launch_s"])
    for fam in _memops.FAMILIES:
        effs = [b / ((t - launch) * bw) for f, b, t in fit
                if _memops.KERNEL_FAMILIES[f] == fam and transfer(f, b, base) >= launch0
                and t > launch]
        if len(effs) >= MIN_ROWS:
            entry[fam] = float(f"{min(1.0, max(0.05, statistics.median(effs))):.5g}")
            fitted.append(fam)
        else:
            kept.append((fam, f"memory-bound {fam} kernels"))
    before = after = None
    if held:
        before = statistics.median(abs(_memop_time(base, spec, f, b) / t - 1)
                                   for f, b, t in held)
        after = statistics.median(abs(_memop_time(entry, spec, f, b) / t - 1)
                                  for f, b, t in held)
    return KernelCalibration("memory-bound", entry, len(fit), len(held), before, after,
                             tuple(fitted), tuple(kept))


@dataclass(frozen=True)
class TraceRow(CalibrationRow):
    """A calibration row read from a trace: a :class:`CalibrationRow` with the tensor-core
    kernel that ran (its name, whose CTA tile ``parse_gemm_tile`` reads; "" for the model's
    choice) and its split-K factor (the trace's grid.z; 0 for the model's choice)."""

    kernel: str = ""
    split_k: int = 0


#: the fused kernels' constants each (kernel, direction) of a trace's SDPA calls tells
#: (``sync_mma_frac`` only where FA2's ``mma.sync`` is not the native MMA: Hopper on)
_ATTENTION_GROUPS = {("fa2", "forward"): ("block_cycles", "cta_cycles", "sync_mma_frac"),
                     ("mem_efficient", "forward"): ("block_cycles", "cta_cycles"),
                     ("fa2", "backward"): ("bwd_mma_frac", "bwd_cta_cycles"),
                     ("mem_efficient", "backward"): ("bwd_mma_frac", "bwd_cta_cycles")}


def attention_rows(comparison) -> list:
    """``(AttentionShape, direction, dtype key, attention choice, measured seconds)`` of the
    SDPA calls of a ``TraceComparison`` the fused-kernel model prices (the choice: the kernel
    the trace's operator ran, ``fxshape.traces.price.sdpa_backend``) (a decode-shaped forward runs the
    split-KV decode model, whose constants are not these)."""
    from ..cost.decode_attention import is_decode_shape

    return [o.attention + (o.measured_s,) for o in comparison.ops
            if o.cls == "attention" and o.attention and o.measured_s > 0
            and not (o.attention[1] == "forward"
                     and is_decode_shape(o.attention[0].seq_q, o.attention[0].seq_k))]


def _held_attention(row) -> bool:
    shape, direction, dkey = row[:3]
    return _held_out(f"{shape}:{direction}:{dkey}")


def fit_attention(rows, gpu) -> KernelCalibration:
    """Fit the fused attention kernels' constants to ``rows`` (:func:`attention_rows`) on
    ``gpu``, through the model that ships (``fxshape.cost.attention.predict_with``, with
    the GEMM constants in force).

    A quarter of the rows, by a hash of the call, is held out. The rows are grouped by the
    kernel PyTorch's SDPA runs and the direction; a group with :data:`MIN_ROWS` or more
    distinct calls fits its constants (``_ATTENTION_GROUPS``: forward ``block_cycles`` and
    ``cta_cycles``, and ``sync_mma_frac`` on Hopper and later; backward ``bwd_mma_frac`` and
    ``bwd_cta_cycles``) by robust least squares on log(predicted / measured), in log space,
    from the packaged values; the others keep theirs and are named.
    """
    import numpy as np
    from scipy.optimize import least_squares

    from ..cost.attention import (NEWER_MMA, attention_params, predict_with,
                                  resolve_kernel)

    spec = get_gpu(gpu)
    base = attention_params()  # the constants in force, without any GPU's overlay
    held = [r for r in rows if _held_attention(r)]
    fit = [r for r in rows if not _held_attention(r)]
    if len({r[:3] for r in fit}) < MIN_ROWS:
        fit, held = list(rows), []

    def kernel_of(r):
        shape, direction, dkey, choice, _ = r
        return resolve_kernel(choice, spec, dkey, max(shape.head_dim, shape.head_dim_v))[0]

    groups = defaultdict(list)
    for r in fit:
        groups[(kernel_of(r), r[1])].append(r)
    # the fused kernel SDPA's flash backend runs on this GPU (FA2 on sm80+, the
    # memory-efficient one before): the one whose shared constants a trace calibrates
    sdpa = "mem_efficient" if spec.arch in ("volta", "turing") else "fa2"
    kept, fitted, told_rows = [], [], []
    for (kernel, direction), names in _ATTENTION_GROUPS.items():
        if kernel != sdpa:
            continue
        names = tuple(n for n in names if n != "sync_mma_frac" or spec.arch in NEWER_MMA)
        rs = groups.get((kernel, direction), [])
        if len({r[:3] for r in rs}) < MIN_ROWS:
            kept += [(n, f"distinct {kernel} {direction} calls") for n in names]
            continue
        fitted += [n for n in names if n not in fitted]
        told_rows += rs
    params = base
    if fitted:  # one fit of every told constant to every told row (they interact)
        t = np.array([r[4] for r in told_rows])

        def residual(x):
            ap = replace(base, **{n: float(math.exp(v)) for n, v in zip(fitted, x)})
            pred = np.array([predict_with(ap, s_, d, c, k, spec).time_s
                             for s_, d, k, c, _ in told_rows])
            return np.log(pred / t)

        x0 = [math.log(getattr(base, n)) for n in fitted]
        res = least_squares(residual, np.array(x0), loss="soft_l1", f_scale=0.05,
                            diff_step=1e-4, max_nfev=2000)
        params = replace(base, **{n: float(f"{math.exp(v):.5g}")
                                  for n, v in zip(fitted, res.x)})
    entry = {n: getattr(params, n) for n in fitted}
    before = after = None
    if held:
        def err(ap):
            return statistics.median(abs(predict_with(ap, s, d, c, k, spec).time_s / t - 1)
                                     for s, d, k, c, t in held)
        before, after = err(base), err(params)
    return KernelCalibration("attention (SDPA)", entry, len(fit), len(held), before, after,
                             tuple(fitted), tuple(kept))


def trace_rows(comparison) -> list:
    """One :class:`TraceRow` per distinct GEMM shape and kernel of a
    ``TraceComparison`` (the median of its calls' kernel time), of the calls that ran
    alone: a call with a collective's kernel beside it (``TraceOpRecord.sms``) had fewer SMs
    than the constants describe. A row names the tensor-core kernel that ran and its split-K
    factor where the trace does (``TraceOpRecord.ran``), so the fit prices it as that
    kernel, as the comparison does."""
    by = defaultdict(list)
    for o in comparison.ops:
        if o.cls == "gemm" and o.gemm and o.measured_s > 0 and o.sms is None:
            by[(o.gemm, o.ran)].append(o.measured_s)
    rows = []
    for ((b, m, n, k, dkey, layout), ran), ts in sorted(by.items()):
        kernel, split = ran if ran else ("", 0)
        rows.append(TraceRow("trace", comparison.path, comparison.gpu,
                             "bmm" if b > 1 else "mm", layout, dkey, b, m, n, k,
                             statistics.median(ts), "profiler-kernel", kernel, int(split)))
    return rows


def _predict(r, gpu, dkey, params_path=None):
    """A row's prediction as the fit prices it: the kernel that ran where the row names
    one, else the model's choice."""
    return predict_matmul(r.m, r.n, r.k, batch=r.batch, dtype=dkey, gpu=gpu,
                          layout=r.layout, params_path=params_path,
                          kernel=r.kernel or None, split_k=r.split_k or None)


def _held(r) -> bool:
    return _held_out(f"{r.batch}x{r.m}x{r.n}x{r.k}:{r.layout}")


def _median_err(rows, gpu, dkey, params_path=None) -> float:
    return statistics.median(abs(_predict(r, gpu, dkey, params_path).time_s / r.time_s - 1)
                             for r in rows)


def calibrate_from_trace(path, *, gpu=None, out: str = "fxshape_params.json",
                         dtype=None) -> TraceCalibration:
    """Fit ``gpu``'s GEMM constants to the GEMM kernels of the trace at ``path``.

    Args:
        path: a PyTorch profiler trace (``fxshape compare`` reads the same).
        gpu: the GPU it ran on (default: the trace's device properties).
        out: the parameter file to write.
        dtype: the GEMM dtype to fit (default: the trace's most common one).

    Raises:
        ValueError: what ``compare_trace`` refuses; a trace without GEMMs of a tensor-core
            dtype to fit (fp32 without TF32 runs SIMT kernels: ``bench/fit_fp32.py``), or
            with fewer than :data:`MIN_ROWS` distinct shapes.
    """
    from ..fit.calibrate import check_out_path, fit_rows, write_params

    check_out_path(out)  # before the fit, not after it
    c = compare_trace(path, gpu=gpu)
    spec = get_gpu(c.gpu)
    if c.trace_gpu:
        raise ValueError(f"the trace ran on {c.trace_gpu} (its deviceProperties), not "
                         f"{spec.name}: its kernels would be written as {spec.name}'s "
                         f"constants; drop --gpu (gpu=) or give {c.trace_gpu}")
    rows = trace_rows(c)
    counts = Counter(r.dtype for r in rows)
    if not counts:
        raise ValueError(f"{path!r} has no GEMM the model priced (aten::mm, addmm, bmm, "
                         "baddbmm with recorded shapes): nothing to calibrate")
    dkey = canonical_dtype(dtype) if dtype else max(sorted(counts), key=lambda d: counts[d])
    if dkey not in counts:
        raise ValueError(f"the trace has no {dkey} GEMMs; it has "
                         + ", ".join(f"{d} x{n}" for d, n in sorted(counts.items())))
    if dkey == "fp32" and spec.vendor == "nvidia":
        raise ValueError("the trace's GEMMs are fp32 without TF32 (SIMT sgemm kernels), "
                         "which calibrate does not fit (bench/fit_fp32.py does, from kernel "
                         "names); record with torch.backends.cuda.matmul.allow_tf32 = True, "
                         "or in bf16/fp16, to calibrate the tensor-core constants")
    mine = [r for r in rows if r.dtype == dkey]
    if len(mine) < MIN_ROWS:
        raise ValueError(f"the trace has {len(mine)} distinct {dkey} GEMM shapes; "
                         f"calibrating needs at least {MIN_ROWS}")
    held = [r for r in mine if _held(r)]
    fit = [r for r in mine if not _held(r)]
    if len(fit) < MIN_ROWS:  # too few to set a quarter aside: fit them all
        fit, held = mine, []
    packaged = {id(r): _predict(r, spec, dkey) for r in fit}
    kept, hold = [], set()
    for const, (why, test) in NEEDS.items():
        if sum(1 for r in fit if test(r, packaged[id(r)])) < MIN_ROWS:
            hold.add(const)
            kept.append((const, why))
    params, summary = fit_rows(fit, spec, hold=tuple(sorted(hold)))
    extra = {"source": f"profiler trace {c.path}", "held_out_rows": len(held),
             "not_identified": [c for c, _ in kept]}
    before = after = None
    # the GEMM constants first: the held-out check and the attention fit price with them
    write_params(out, params, summary, device=f"trace {c.path}", extra=extra)
    if held:
        before = _median_err(held, spec, dkey)
        after = _median_err(held, spec, dkey, params_path=out)
        extra.update(held_out_median_error_before=round(before, 4),
                     held_out_median_error_after=round(after, 4))
    fitted = tuple(f for f in ModelParams.STORED if f in summary["fitted"])
    kept += [(f, NEEDS[f][0]) for f in ModelParams.STORED
             if f not in fitted and f not in hold]
    # the memory-bound and attention kernels' constants, in the same file (its memops and
    # attention sections, which those models read wherever the file is the parameter file
    # in force); the attention fit prices through the GEMM constants just fitted
    mrows = memops_rows(c)
    mem = fit_memops(mrows, spec) if mrows else None
    arows = attention_rows(c)
    att = None
    if arows:
        from ..cost.gemm import use_params

        with use_params(out):
            att = fit_attention(arows, spec)
    sections = {}
    for key, got_ in (("memops", mem), ("attention", att)):
        if got_ is None:
            continue
        entry = dict(got_.entry, rows=got_.fitted_rows) if key == "memops" else got_.entry
        if entry:
            sections[key] = {spec.name: entry}
        extra[key] = {
            "fitted": sorted(got_.fitted),
            "not_identified": [k for k, _ in got_.kept], "held_out_rows": got_.held_rows,
            **({"held_out_median_error_before": round(got_.heldout_before, 4),
                "held_out_median_error_after": round(got_.heldout_after, 4)}
               if got_.heldout_before is not None else {})}
    write_params(out, params, summary, device=f"trace {c.path}", extra=extra,
                 sections=sections)
    _memops.forget_params_files()
    from ..cost import attention as _attention

    _attention.forget_params_files()
    return TraceCalibration(spec.name, dkey, len(fit), len(held), before, after, fitted,
                            tuple(kept), tuple((d, n) for d, n in sorted(counts.items())
                                               if d != dkey), out, params, mem, att)
