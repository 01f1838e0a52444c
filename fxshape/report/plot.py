"""Plots (the ``plot`` extra: matplotlib). The only module that imports matplotlib."""

from __future__ import annotations

from collections import Counter

from ..analysis.rows import kernel_figures, misaligned

__all__ = ["plot_sweep", "plot_report", "loss_cause", "bar_labels", "check_path"]

#: what a GEMM's time beyond the dense peak is lost to, and the colour each is drawn in
CAUSES = {
    "tile quantization": "#d95f02",
    "wave quantization": "#7570b3",
    "misalignment": "#e7298a",
    "memory-bound": "#66a61e",
    "attention kernel overheads": "#e6ab02",
    "other (latency, pipeline, power)": "#999999",
}


def check_path(path, what: str = "plot path") -> str:
    """``path`` as a string; a one-line error (naming ``what``, e.g. ``--plot``) for one that
    cannot be written as a .png or .svg."""
    import os

    if not isinstance(path, (str, os.PathLike)):
        raise ValueError(f"{what} must be a path ending in .png or .svg, got "
                         f"{type(path).__name__}")
    path = os.fspath(path)
    if not path.lower().endswith((".png", ".svg")):
        raise ValueError(f"{what} must end in .png or .svg, got {path!r}")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ValueError(f"{what} {path!r}: folder {folder} does not exist")
    return path


def _pyplot():
    """matplotlib's pyplot on the non-interactive backend with a fixed SVG hash salt
    (deterministic files), or None when matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    matplotlib.rcParams["svg.hashsalt"] = "fxshape"
    return plt


def plot_sweep(points, param: str, path: str, *, title: str = "") -> bool:
    """Draw predicted TFLOP/s against ``param`` to ``path`` (.png or .svg).

    Returns False (and writes nothing) when matplotlib is not installed. Invalid values
    (``tflops is None``) are left out of the line. Deterministic SVG: no timestamps, fixed
    hash salt.
    """
    path = check_path(path)
    plt = _pyplot()
    if plt is None:
        return False
    fig, ax = plt.subplots(figsize=(8, 4), dpi=100)
    for xs, ys in _segments(points):  # a failed value breaks the line
        ax.plot(xs, ys, marker=".", linewidth=1, color="#1f78b4")
    failed = [p.value for p in points if p.tflops is None]
    if failed:
        ax.plot(failed, [0.0] * len(failed), "x", color="#999999",
                label=f"no model ({len(failed)} values)")
        ax.legend(fontsize=8, loc="lower right")
    ax.set_xlabel(param)
    ax.set_ylabel("predicted GEMM TFLOP/s")
    if title:
        ax.set_title(_wrap(title, 90), fontsize=10)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    meta = {"Date": None} if path.lower().endswith(".svg") else {"Software": None}
    fig.savefig(path, metadata=meta)
    plt.close(fig)
    return True


def _segments(points) -> list:
    """``(xs, ys)`` runs of consecutive points that have a prediction: a failed point (no
    TFLOP/s) ends one run, so no line is drawn across it."""
    runs, xs, ys = [], [], []
    for p in points:
        if p.tflops is None:
            if xs:
                runs.append((xs, ys))
            xs, ys = [], []
        else:
            xs.append(p.value)
            ys.append(p.tflops)
    if xs:
        runs.append((xs, ys))
    return runs


def _wrap(text: str, width: int) -> str:
    """A title in lines of at most ``width`` characters (a long one is otherwise cut at the
    figure's right edge)."""
    import textwrap

    return "\n".join(textwrap.fill(line, width) for line in text.split("\n"))


def loss_cause(row) -> str:
    """The main reason a report row runs below the dense peak (a key of ``CAUSES``)."""
    if row.kernel and row.kernel != "math":
        return "attention kernel overheads"
    if misaligned(row):
        return "misalignment"
    k = kernel_figures(row)
    if k["bound"] == "memory":
        return "memory-bound"
    tile, wave = k["tile_efficiency"], k["wave_efficiency"]
    if min(tile, wave) >= 0.97:
        return "other (latency, pipeline, power)"
    return "tile quantization" if tile < wave else "wave quantization"


def bar_labels(groups) -> list:
    """One label per collapsed row (``Report.groups()``), all different: module (with its
    repeat count), op, kernel and phase, and the shape where those still coincide."""
    base = []
    for g in groups:
        r = g["row"]
        name = g["module"] + (f" x{g['count']}" if g["count"] > 1 else "")
        base.append(f"{name} {r.op}" + (f" ({r.kernel})" if r.kernel else "") + f" [{r.phase}]")
    seen = Counter(base)
    out = [b if seen[b] == 1 else f"{b} {g['row'].batch}x{g['row'].m}x{g['row'].n}x{g['row'].k}"
           for g, b in zip(groups, base)]
    # groups differ in their keys (module, op, phase, sizes, layout): only the layout is left
    seen = Counter(out)
    return [lab if seen[lab] == 1 else f"{lab} {g['row'].layout}"
            for g, lab in zip(groups, out)]


#: a colour per class of the step (``fxshape.execution.step.CLASSES``), none of them a colour
#: of the GEMM panel above it (:data:`CAUSES`, "at dense peak"), so that a colour means one
#: thing in the figure
STEP_COLOURS = {"gemm": "#1f78b4", "attention": "#a6cee3", "memory": "#fb9a99",
                "optimizer": "#cab2d6", "communication": "#b15928", "host_idle": "#dddddd",
                "pipeline_bubble": "#ffff99"}
#: the GEMM panel's colour for the time a GEMM's FLOPs take at the dense peak
AT_PEAK = "#1b9e77"


def _plot_step(ax, step) -> None:
    """The step as one stacked bar, a segment per class (its share in the label); under a
    pipeline, a bar per pipeline rank."""
    bars = [("step", step.by_class)] if len(step.stages) < 2 else \
        [(f"stage {s.rank}", s.by_class) for s in reversed(step.stages)]
    labelled = set()
    for name, by in bars:
        left = 0.0
        for cls, colour in STEP_COLOURS.items():
            t = by.get(cls, 0.0) * 1e3
            if t <= 0:
                continue
            label = None
            if cls not in labelled:
                labelled.add(cls)
                label = f"{cls.replace('_', ' ')} {100 * t / (step.time_s * 1e3):.0f}%"
            ax.barh([name], [t], left=left, color=colour, label=label)
            left += t
    ax.set_xlabel("predicted step time (ms)")
    ax.legend(fontsize=8, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.75))
    ax.set_title(_wrap(step.describe().split(";")[0], 110), fontsize=9)


def plot_report(report, path: str, *, top: int = 15) -> bool:
    """One horizontal bar per collapsed row of ``report`` (the ``top`` by time share): its
    predicted time split into what its FLOPs take at the dense peak and what is lost,
    coloured by :func:`loss_cause`; model totals in the title; under it, the whole step as
    one bar split by class (``report.step``). Written to ``path`` (.png or .svg); returns
    False (writing nothing) when matplotlib is not installed."""
    path = check_path(path)
    plt = _pyplot()
    if plt is None:
        return False
    from matplotlib.patches import Patch

    from ..hardware.gpus import get_gpu

    peak = get_gpu(report.gpu).peak_tflops(report.dtype) * 1e12
    groups = report.groups()[:top]
    labels, ideal, lost, colours = [], [], [], []
    for g, label in zip(reversed(groups), reversed(bar_labels(groups))):  # largest on top
        r = g["row"]
        t = g["time_s"] * 1e3
        t_peak = min(t, r.flops * g["count"] / peak * 1e3)
        labels.append(label)
        ideal.append(t_peak)
        lost.append(t - t_peak)
        colours.append(CAUSES[loss_cause(r)])
    step = report.step
    if step is not None and step.time_s > 0:
        fig, (ax, ax_step) = plt.subplots(
            2, 1, figsize=(10, 0.35 * len(groups) + 3.0), dpi=100,
            gridspec_kw={"height_ratios": [max(len(groups), 1), 2.2]})
        _plot_step(ax_step, step)
    else:
        fig, ax = plt.subplots(figsize=(10, 0.35 * len(groups) + 1.6), dpi=100)
    ax.barh(labels, ideal, color=AT_PEAK, label="at dense peak")
    ax.barh(labels, lost, left=ideal, color=colours)
    ax.set_xlabel("predicted GEMM and attention time per step (ms)")
    ax.tick_params(axis="y", labelsize=8)
    used = [c for c in CAUSES if CAUSES[c] in colours]
    ax.legend(handles=[Patch(color=AT_PEAK, label="at dense peak")]
              + [Patch(color=CAUSES[c], label=f"lost: {c}") for c in used],
              fontsize=8, loc="lower right")
    title = (f"{report.model_name} on {report.gpu} ({report.dtype}): "
             f"{report.total_time_s * 1e3:.3f} ms, {report.total_flops / 1e12:.3f} TFLOP, "
             f"{100 * report.efficiency:.1f}% of dense peak")
    if report.workload is not None:
        w = report.workload
        size = (f"batch {w.batch_size}" + (f" x seq_len {w.seq_len}" if w.seq_len else "")
                if w.batch_size is not None else "inputs given")
        title += f"\n{w.mode}, {size}, tp {w.tp}, attention {w.attention}"
    ax.set_title(_wrap(title, 100), fontsize=10)
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    meta = {"Date": None} if path.lower().endswith(".svg") else {"Software": None}
    fig.savefig(path, metadata=meta)
    plt.close(fig)
    return True
