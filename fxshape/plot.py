"""Plots (the ``plot`` extra: matplotlib). The only module that imports matplotlib."""

from __future__ import annotations

__all__ = ["plot_sweep"]


def plot_sweep(points, param: str, path: str, *, title: str = "") -> bool:
    """Draw predicted TFLOP/s against ``param`` to ``path`` (.png or .svg).

    Returns False (and writes nothing) when matplotlib is not installed. Invalid values
    (``tflops is None``) are left out of the line. Deterministic SVG: no timestamps, fixed
    hash salt.
    """
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    matplotlib.rcParams["svg.hashsalt"] = "fxshape"
    xs = [p.value for p in points if p.tflops is not None]
    ys = [p.tflops for p in points if p.tflops is not None]
    fig, ax = plt.subplots(figsize=(8, 4), dpi=100)
    ax.plot(xs, ys, marker=".", linewidth=1)
    ax.set_xlabel(param)
    ax.set_ylabel("predicted GEMM TFLOP/s")
    if title:
        ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    meta = {"Date": None} if path.lower().endswith(".svg") else {"Software": None}
    fig.savefig(path, metadata=meta)
    plt.close(fig)
    return True
