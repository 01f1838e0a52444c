"""Measured GEMM times in the calibration schema: read, write, locate.

Schema (one row per measured GEMM; ``C[batch, M, N] = A[batch, M, K] @ B[batch, K, N]``)::

    source,sweep,gpu,op,layout,dtype,batch,m,n,k,time_s,timing

Used by ``bench/fit_model.py``, ``bench/validate_model.py`` and ``bench/measure_gemm.py``.
"""

from __future__ import annotations

import csv
import glob
import os
from dataclasses import astuple, dataclass, fields

from ..hardware.dtypes import canonical_dtype

__all__ = ["CalibrationRow", "COLUMNS", "calibration_dir", "read_rows", "read_dir",
           "write_rows", "CALIBRATION_GPU", "calibration_sku"]

COLUMNS = ("source", "sweep", "gpu", "op", "layout", "dtype", "batch", "m", "n", "k",
           "time_s", "timing")

#: GPU labels used in the calibration files -> the SKU fxshape takes them for.
#: (The sources do not always state the SKU; see docs/model.md.)
CALIBRATION_GPU = {
    "a100": "a100-sxm4-80gb",
    "h100": "h100-sxm",
    "a40": "a40",
    "v100": "v100-sxm2",
    "mi250x": "mi250x-gcd",
    "mi210": "mi210",
}
#: Exceptions by (source, gpu label). The cookbook's A100 runs the same 4096^3 GEMM ~10%
#: faster than vidur's and has no DRAM-bound rows that would need 80 GB bandwidth, while
#: vidur's sustains 1.55 TB/s on weight reads (only an 80 GB part can): so they are taken to be
#: two machines, the cookbook's a 40 GB SXM4 (docs/model.md, "Calibration data").
_SOURCE_SKU = {
    ("eleutherai-cookbook", "a100"): "a100-sxm4-40gb",
}


def calibration_sku(source: str, gpu: str) -> str:
    """The fxshape GPU name a calibration row's (source, gpu label) is fitted and validated as."""
    key = (source, gpu.strip().lower())
    if key in _SOURCE_SKU:
        return _SOURCE_SKU[key]
    if key[1] in CALIBRATION_GPU:
        return CALIBRATION_GPU[key[1]]
    from ..hardware.gpus import get_gpu  # any fxshape GPU name or alias works as a label too

    return get_gpu(key[1]).name


@dataclass(frozen=True)
class CalibrationRow:
    source: str
    sweep: str
    gpu: str
    op: str
    layout: str
    dtype: str
    batch: int
    m: int
    n: int
    k: int
    time_s: float
    timing: str


def calibration_dir(explicit: str | None = None) -> str:
    """The calibration folder: ``explicit``, else ``$FXSHAPE_CALIBRATION_DIR``, else
    ``../shared/calibration`` relative to the repository root (then the working directory)."""
    if explicit:
        return explicit
    env = os.environ.get("FXSHAPE_CALIBRATION_DIR")
    if env:
        return env
    # fxshape/fit/calibration.py -> the repository root
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for base in (repo, os.getcwd()):
        cand = os.path.normpath(os.path.join(base, "..", "shared", "calibration"))
        if os.path.isdir(cand):
            return cand
    return os.path.normpath(os.path.join(repo, "..", "shared", "calibration"))


def _parse(rec: dict, path: str, lineno: int) -> CalibrationRow:
    missing = [c for c in COLUMNS if c not in rec or rec[c] in (None, "")]
    if missing:
        raise ValueError(f"{path}:{lineno}: missing column(s) {', '.join(missing)}")
    try:
        row = CalibrationRow(
            rec["source"], rec["sweep"], rec["gpu"].strip().lower(), rec["op"],
            rec["layout"], rec["dtype"], int(rec["batch"]), int(rec["m"]), int(rec["n"]),
            int(rec["k"]), float(rec["time_s"]), rec["timing"])
    except ValueError as exc:
        raise ValueError(f"{path}:{lineno}: {exc}") from None
    canonical_dtype(row.dtype)
    if min(row.batch, row.m, row.n, row.k) <= 0 or not row.time_s > 0:
        raise ValueError(f"{path}:{lineno}: sizes and time_s must be positive")
    if row.layout not in ("nn", "nt", "tn", "tt"):
        raise ValueError(f"{path}:{lineno}: unknown layout {row.layout!r}")
    return row


def read_rows(path: str) -> list[CalibrationRow]:
    """Read one calibration CSV, validating every row."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        return [_parse(rec, path, i + 2) for i, rec in enumerate(reader)]


#: Subfolders of the calibration folder that hold tensor-core GEMM rows in the same schema
#: (``step1/``: the step-1 vocabulary sweep of the reduction dimension); the packaged fit
#: reads them too. ``neusight/`` has its own readers (fp32, memory-bound ops).
GEMM_SUBDIRS = ("step1",)


def read_dir(directory: str | None = None, subdirs=()) -> list[CalibrationRow]:
    """Read every ``*.csv`` in the calibration folder, then in each of ``subdirs`` that
    exists (sorted by file name within each)."""
    d = calibration_dir(directory)
    paths = sorted(glob.glob(os.path.join(d, "*.csv")))
    for sub in subdirs:
        paths += sorted(glob.glob(os.path.join(d, sub, "*.csv")))
    if not paths:
        raise FileNotFoundError(
            f"no calibration CSVs in {d!r}; pass a folder or set FXSHAPE_CALIBRATION_DIR")
    rows: list[CalibrationRow] = []
    for p in paths:
        rows.extend(read_rows(p))
    return rows


def write_rows(path_or_file, rows) -> None:
    """Write rows (CalibrationRow or tuples in COLUMNS order) with a header."""
    own = isinstance(path_or_file, (str, os.PathLike))
    f = open(path_or_file, "w", newline="") if own else path_or_file
    try:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(COLUMNS)
        for r in rows:
            vals = list(astuple(r)) if isinstance(r, CalibrationRow) else list(r)
            if len(vals) != len(COLUMNS):
                raise ValueError(f"row has {len(vals)} fields, expected {len(COLUMNS)}")
            vals[10] = f"{float(vals[10]):.6e}"
            w.writerow(vals)
    finally:
        if own:
            f.close()


assert tuple(f.name for f in fields(CalibrationRow)) == COLUMNS
