"""``fxshape gpus``: the GPU table, its constants and its validated errors."""

from __future__ import annotations

import argparse

from tabulate import tabulate

from ..hardware.gpus import ALIASES, get_gpu, list_gpus


def run(args) -> int:
    rows = []
    back = {}
    for alias, name in ALIASES.items():
        back.setdefault(name, []).append(alias)
    from ..hardware.topology import default_topology

    for name in list_gpus():
        g = get_gpu(name)
        pk = g.peaks
        fmt = lambda v: "-" if v is None else f"{v:g}"  # noqa: E731
        fp32 = fmt(pk.fp32) + ("" if pk.fp32_matrix is None else f" ({pk.fp32_matrix:g}m)")
        watts = fmt(g.power_w) + ("" if g.power_limit_w is None or g.tdp_w is None
                                  or g.power_limit_w == g.tdp_w else f" of {g.tdp_w:g}")
        rows.append((name, ", ".join(sorted(a for a in back.get(name, []) if a != name)),
                     g.arch, g.sm_count, g.boost_clock_mhz, fmt(pk.fp16), fmt(pk.bf16),
                     fmt(pk.tf32), fmt(pk.fp8), fmt(pk.fp4), fp32, f"{g.memory_gb:g}",
                     f"{g.memory_bandwidth_gbs:g}", f"{g.l2_mb:g}", watts,
                     default_topology(name).name))
    print(tabulate(rows, headers=("gpu", "aliases", "arch", "SMs", "MHz", "fp16", "bf16",
                                  "tf32", "fp8", "fp4", "fp32", "memory GiB", "GB/s", "L2 MB",
                                  "W", "machine"),
                   disable_numparse=True))
    print("\npeaks: dense TFLOP/s per dtype (- = not supported; fp32 (Nm): GEMMs run on "
          "matrix cores at N); memory GiB: the capacity a report's 'fits' is checked against; "
          "W: the power limit a long job's clocks follow (of the board's, where lower; "
          "'h100-sxm@500w' sets one); machine: the topology it is priced in by default")
    print("\n" + _constants_table())
    print("\n" + _validation_table())
    return 0


def _constants_table() -> str:
    """Whose fitted tensor-core GEMM constants each GPU uses, and the libraries they
    describe."""
    from ..cost.gemm import constants_library, constants_source

    rows = []
    for name in list_gpus():
        src = constants_source(name)
        rows.append((name, "own fit" if src == name else
                     f"{src}'s ({get_gpu(name).arch} family; no measurement of its own)",
                     constants_library(name)))
    return ("tensor-core GEMM constants (--params 2024: the 2022-2024 fits of the GPUs "
            "refitted since):\n" + tabulate(rows, headers=("gpu", "constants", "library"),
                                              disable_numparse=True))


def _validation_table() -> str:
    """Each GPU's held-out validation per regime (fxshape.hardware.validation), or
    'unvalidated'."""
    from ..hardware.validation import validations

    rows = []
    for name in list_gpus():
        got = validations(name)
        if not got:
            rows.append((name, "unvalidated", "", "", "", ""))
        for regime, v in got.items():
            rows.append((name, regime, v.n, f"{100 * v.median:.1f}%", f"{100 * v.p90:.1f}%",
                         "" if v.signed_median is None else f"{100 * v.signed_median:+.1f}%"))
    return ("held-out validation (bench/validation_summary.py: published measurements "
            "nothing was fitted to; + = predicted slower):\n"
            + tabulate(rows, headers=("gpu", "regime", "rows", "median abs error",
                                      "p90 abs error", "median signed"),
                       disable_numparse=True))


def add_parser(sub) -> argparse.ArgumentParser:
    """The ``gpus`` command's parser."""
    pg = sub.add_parser("gpus", help="list the GPU table")
    pg.set_defaults(func=run)
    return pg
