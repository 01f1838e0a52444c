#!/usr/bin/env python
"""Fit the eager host model (fxshape/cost/host.py) and check it across hosts.

    python bench/fit_host.py [--out fxshape/data/host_params.json] [--validate-only]
                             [--format github]

Data: the per-call host overheads that ``bench/fit_memops.py`` (elementwise calls) and
``bench/fit_fp32.py`` (``torch.bmm`` calls) fitted on the NeuSight measurements, kept in the
packaged parameter files under ``measurement``: each is the time one Python call of an op
spends on the host before its kernel starts (the data time each call with CUDA events on an
idle GPU). Five hosts, PyTorch 2.1 / CUDA 12.1, one per GPU (A100-PCIe, V100-PCIe, T4, P100,
P4).

Method: ``kernel_s`` is the median over hosts of the elementwise overhead, ``gemm_s`` that of
``bmm`` (``F.linear``'s is larger: it includes the module's Python and the bias; a graph's
``addmm``/``mm`` nodes are the aten calls, closer to ``bmm``). LayerNorm's and softmax's
fitted overheads are not used: the fit puts two hosts' LayerNorm overhead at zero, so they
are not identified. Held-out check: leave one host out, predict its overhead with the
others' median, report the error. ``view_s`` and ``backward_factor`` have no data here; they
are sourced (pytorch/pytorch#41383: a tiny op costs about 2 us on the CPU with Python, about
half of it Python's; the autograd engine calls backward ops from C++), and so are the
compiled launch costs (meta-pytorch/tritonbench#1017).

``eager_gap_s`` (the launch regime, ``fxshape.cost.host.launch_gap_s``) is measured on a
profiler trace of an eager run (``EAGER_TRACE`` under ``<calibration dir>/traces/``: TraceLens's
H100 Qwen1.5-0.5B inference): between consecutive kernels of a stream whose launch call had
returned before the previous kernel ended (queued), the median gap from one's end to the
next's start. The script prints the same measurement on the other traces as a check (a
graph-replayed trace's gaps are the graph regime's); where the trace folder is missing it
keeps the packaged value and says so.
Deterministic; a few seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

from tabulate import tabulate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "fxshape", "data")
OUT = os.path.join(DATA, "host_params.json")
VIEW_S = 2e-6
BACKWARD_FACTOR = 0.5
#: meta-pytorch/tritonbench#1017 (GB200): CachingAutotuner.run per kernel 6.8 us (0 args) to
#: 9.1 us (19 args); a compiled graph's whole call (guards, wrapper) 44.3 us
COMPILED_KERNEL_S = 9.1e-6
COMPILED_GRAPH_S = 44.3e-6
SOURCE = ("kernel_s, gemm_s: median over the five NeuSight hosts (PyTorch 2.1) of the per-call "
          "overheads fitted by bench/fit_memops.py (elementwise) and bench/fit_fp32.py (bmm); "
          "view_s, backward_factor: pytorch/pytorch#41383 (a tiny op ~2 us of CPU, about half "
          "of it Python), unvalidated; compiled_kernel_s, compiled_graph_s: "
          "meta-pytorch/tritonbench#1017 (Inductor's per-kernel launch 9.1 us with 19 "
          "arguments, a compiled graph's call 44.3 us, GB200), unvalidated")


def overheads() -> dict:
    """{host (its GPU): {"elementwise": s, "bmm": s}} from the packaged parameter files."""
    with open(os.path.join(DATA, "memops_params.json")) as f:
        mem = json.load(f)["measurement"]
    with open(os.path.join(DATA, "perf_params.json")) as f:
        fp32 = json.load(f)["fp32"]["measurement"]
    return {g: {"elementwise": mem[g]["overhead_s"]["elementwise"],
                "bmm": fp32[g]["overhead_s"]["bmm"]} for g in sorted(mem) if g in fp32}


#: the eager trace ``eager_gap_s`` is measured on, and the traces it is checked on
EAGER_TRACE = "tracelens_h100_qwen1.5-0.5b_inference.json.gz"
GAP_SOURCE = ("; eager_gap_s: the median GPU gap between queued kernels of TraceLens's H100 "
              "eager trace (calibration/traces/" + EAGER_TRACE + ")")
CHECK_TRACES = ("tracelens_b200_llm_generation_eager.json.gz",
                "tracelens_mi300x_vllm_decode_graph_replay.json.gz",
                "tracelens_mi300x_sglang_qwen3-8b_prefill_decode.json.gz")


def queued_gaps(path: str) -> list:
    """Seconds from a kernel's end to the next one's start on the same stream, for every
    kernel whose launch call (``cuda_runtime`` / ``hip`` event with its correlation id)
    ended before the previous kernel did: the GPU had it queued, so the gap is the GPU's."""
    import gzip

    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        events = json.load(f)
    events = events["traceEvents"] if isinstance(events, dict) else events
    launches = {e["args"]["correlation"]: e for e in events
                if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "hip_runtime")
                and "correlation" in e.get("args", {})}
    streams: dict = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "kernel":
            streams.setdefault((e.get("pid"), e.get("tid")), []).append(e)
    gaps = []
    for kernels in streams.values():
        kernels.sort(key=lambda e: e["ts"])
        for a, b in zip(kernels, kernels[1:]):
            end = a["ts"] + a["dur"]
            call = launches.get(b.get("args", {}).get("correlation"))
            if call is not None and call["ts"] + call["dur"] < end:
                gaps.append((b["ts"] - end) * 1e-6)  # trace times are microseconds
    return gaps


def eager_gap(directory=None) -> tuple:
    """``(eager_gap_s, [(trace, queued kernels, median gap, p25, p75)])``: the measured
    constant and the table of every trace; ``(None, [])`` without the trace folder."""
    sys.path.insert(0, ROOT)
    from fxshape.fit.calibration import calibration_dir

    base = os.path.join(calibration_dir(directory), "traces")
    if not os.path.exists(os.path.join(base, EAGER_TRACE)):
        return None, []
    table, value = [], None
    for name in (EAGER_TRACE,) + CHECK_TRACES:
        path = os.path.join(base, name)
        if not os.path.exists(path):
            continue
        g = sorted(queued_gaps(path))
        if not g:
            continue
        med = statistics.median(g)
        if name == EAGER_TRACE:
            value = float(f"{med:.3g}")
        table.append((name, len(g), f"{med * 1e6:.2f}", f"{g[len(g) // 4] * 1e6:.2f}",
                      f"{g[3 * len(g) // 4] * 1e6:.2f}"))
    return value, table


def fit(data: dict) -> dict:
    return {"kernel_s": statistics.median(d["elementwise"] for d in data.values()),
            "gemm_s": statistics.median(d["bmm"] for d in data.values())}


def leave_one_out(data: dict) -> list:
    rows = []
    for g in data:
        rest = fit({h: d for h, d in data.items() if h != g})
        for kind, key in (("elementwise", "kernel_s"), ("bmm", "gemm_s")):
            got, want = rest[key], data[g][kind]
            rows.append((g, kind, f"{want * 1e6:.1f}", f"{got * 1e6:.1f}",
                         f"{100 * (got / want - 1):+.0f}"))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=OUT)
    ap.add_argument("--validate-only", action="store_true")
    ap.add_argument("--format", default="simple")
    ap.add_argument("--calibration-dir", default=None)
    args = ap.parse_args(argv)
    data = overheads()
    params = fit(data)
    print(f"kernel_s = {params['kernel_s'] * 1e6:.1f} us, gemm_s = {params['gemm_s'] * 1e6:.1f}"
          f" us (medians over {len(data)} hosts)\n")
    print("Leave one host out: each host's overhead predicted by the others' median")
    print(tabulate(leave_one_out(data), headers=("host", "op", "measured us", "predicted us",
                                                 "error %"), tablefmt=args.format,
                   disable_numparse=True))
    gap, table = eager_gap(args.calibration_dir)
    if gap is None:
        with open(OUT) as f:
            gap = json.load(f).get("eager_gap_s", 0.0)
        print(f"\nno {EAGER_TRACE} under the calibration folder: eager_gap_s kept at "
              f"{gap * 1e6:.2f} us")
    else:
        print(f"\neager_gap_s = {gap * 1e6:.2f} us: the median gap between queued kernels "
              f"of {EAGER_TRACE}; the other traces as a check (graph replays: ~0)")
        print(tabulate(table, headers=("trace", "queued kernels", "median gap us", "p25",
                                       "p75"), tablefmt=args.format, disable_numparse=True))
    if not args.validate_only:
        out = {"comment": "Written by bench/fit_host.py; do not edit.",
               "kernel_s": round(params["kernel_s"], 9), "gemm_s": round(params["gemm_s"], 9),
               "view_s": VIEW_S, "backward_factor": BACKWARD_FACTOR,
               "compiled_kernel_s": COMPILED_KERNEL_S, "compiled_graph_s": COMPILED_GRAPH_S,
               "eager_gap_s": gap, "source": SOURCE + GAP_SOURCE}
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1, sort_keys=True)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
