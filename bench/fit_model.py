#!/usr/bin/env python
"""Fit the performance model's constants to the measured GEMM times.

    python bench/fit_model.py [--calibration-dir DIR] [--out fxshape/data/perf_params.json]

For each GPU in the calibration data it fits the ``ModelParams`` (see fxshape/cost/gemm.py)
plus timing-method nuisance terms for every method other than a CUDA-timed kernel
(``mean-wall``, ``worst-iteration-wall``, and LLMCompass's ``reported`` figures, whose smallest
GEMMs take ~30 us): an additive host overhead per call and a slow-iteration factor, by
robust (soft-L1) least squares on log(predicted / measured), every sweep weighted equally,
from a few fixed starting points; the start whose result has the lowest mean absolute log
error wins. Deterministic: the same data give the same numbers.

Bounds keep constants physical (e.g. launch latency 2-10 us, efficiencies <= 1).
Parameters that a GPU's data cannot identify are taken from a related GPU fitted first
(``_PLAN`` below), e.g. H100 and A40 data contain no misaligned shapes, so their
alignment constants (``ld_issue_clk``, ``align_mem_eff``) come from the A100 fit, whose data
include the step-1 K sweep (``step1/`` is read along with the top-level CSVs). Families
without any measured GPU inherit a fitted family (``_FAMILY_FROM``). Everything is written to the JSON file the package reads.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict
from dataclasses import asdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fxshape.fit.calibration import GEMM_SUBDIRS, calibration_sku, read_dir  # noqa: E402
from fxshape.fit.fitting import (_BOUNDS, _START, _STARTS, _Problem, _fit_one,  # noqa: E402,F401
                             _from_unbounded, _round, _to_unbounded)
from fxshape.hardware.gpus import get_gpu, list_gpus  # noqa: E402
from fxshape.cost.gemm import ModelParams, model_params  # noqa: E402

# (SKU, params to fit, SKU to take the others from) in fitting order.
_ALL = ModelParams.STORED  # batched_eff too: the cookbook has bmm sweeps
_NO_ALIGN = tuple(f for f in ModelParams.FIELDS if f not in ModelParams.ALIGNMENT)
_PLAN = (
    ("a100-sxm4-40gb", _ALL, None),
    ("v100-sxm2", _ALL, None),
    ("mi250x-gcd", _ALL, None),
    ("a100-sxm4-80gb", _NO_ALIGN, "a100-sxm4-40gb"),
    ("h100-sxm", _NO_ALIGN, "a100-sxm4-40gb"),
    ("a40", _NO_ALIGN, "a100-sxm4-40gb"),
    ("mi210", ("e_max", "power_eff", "dram_eff", "launch_s"), "mi250x-gcd"),
)
# Families with no measured GPU take the constants of the nearest measured one.
_FAMILY_FROM = {
    "pascal": "v100-sxm2",  # no tensor cores: only read for DRAM efficiency (fp32 models)
    "volta": "v100-sxm2", "turing": "v100-sxm2", "ampere": "a100-sxm4-80gb",
    "ampere-ga10x": "a40", "ada": "a40", "hopper": "h100-sxm", "blackwell": "h100-sxm",
    "cdna1": "mi250x-gcd", "cdna2": "mi250x-gcd", "cdna3": "mi250x-gcd",
}

def fit(calibration_dir=None, only=None):
    rows = read_dir(calibration_dir, GEMM_SUBDIRS)
    by_gpu = defaultdict(list)
    for r in rows:
        by_gpu[calibration_sku(r.source, r.gpu)].append(r)
    fitted: dict[str, dict] = {}
    measurement: dict[str, dict] = {}
    planned = {p[0] for p in _PLAN}
    # SKUs measured by the user (bench/measure_gemm.py) that the plan does not name are
    # fitted like H100/A40: alignment constants from their family's measured GPU.
    extra = tuple((sku, _NO_ALIGN, _FAMILY_FROM.get(get_gpu(sku).arch, "a100-sxm4-40gb"))
                  for sku in sorted(by_gpu) if sku not in planned)
    for label, free, base in _PLAN + extra:
        if label not in by_gpu or (only and label not in only):
            continue
        spec = get_gpu(label)
        fixed = dict(_START)
        if base in fitted:
            fixed.update({f: fitted[base][f] for f in ModelParams.STORED})
        elif base is not None:  # base not in this data: use its packaged constants
            fixed.update(asdict(model_params(base)))
        prob = _Problem(by_gpu[label], spec)
        params, meas, loss = _fit_one(prob, free, fixed)
        fitted[spec.name] = {f: _round(getattr(params, f)) for f in ModelParams.STORED}
        fitted[spec.name]["fitted"] = sorted(free)
        fitted[spec.name]["rows"] = len(by_gpu[label])
        measurement[label] = {t: {k: _round(v) for k, v in d.items()} for t, d in meas.items()}
        print(f"{label:7s} -> {spec.name:16s} rows={len(by_gpu[label]):5d} "
              f"mean|log err|={loss:.4f} " +
              " ".join(f"{f}={fitted[spec.name][f]:.4g}" for f in ModelParams.STORED),
              file=sys.stderr)
    families = {}
    for name in list_gpus():
        arch = get_gpu(name).arch
        if arch in families:
            continue
        src = _FAMILY_FROM[arch]
        families[arch] = {"from": src}
    return {
        "comment": "Written by bench/fit_model.py from the calibration CSVs; do not edit.",
        "gpus": fitted,
        "families": dict(sorted(families.items())),
        "measurement": measurement,
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--calibration-dir", default=None,
                    help="folder of calibration CSVs (default: $FXSHAPE_CALIBRATION_DIR "
                         "or ../shared/calibration)")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))), "fxshape", "data", "perf_params.json"))
    ap.add_argument("--only", nargs="*", help="fit only these calibration GPU labels")
    ap.add_argument("--legacy-out", default=None,
                    help="where the fits of GPUs that bench/fit_aiconfigurator.py fits to "
                         "today's libraries go (default: perf_params_2024.json beside --out)")
    args = ap.parse_args(argv)
    result = fit(args.calibration_dir, args.only)
    fitted = set(result["gpus"])
    legacy = None
    # Keep what this script does not fit: the fp32 (SIMT) section written by
    # bench/fit_fp32.py, and with --only the other GPUs' entries of the file being updated.
    if os.path.exists(args.out):
        with open(args.out) as f:
            old = json.load(f)
        if "fp32" in old:
            result["fp32"] = old["fp32"]
        if args.only:
            for key in ("gpus", "measurement"):
                result[key] = {**old.get(key, {}), **result[key]}
        result, legacy = split_generations(result, old, fitted)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"wrote {args.out}", file=sys.stderr)
    if legacy is not None:
        path = args.legacy_out or os.path.join(os.path.dirname(args.out),
                                               "perf_params_2024.json")
        with open(path, "w") as f:
            json.dump(legacy, f, indent=1, sort_keys=True)
            f.write("\n")
        print(f"wrote {path}", file=sys.stderr)


def split_generations(result: dict, old: dict, fitted: set):
    """(the current file, the 2024 generation's overlay) from this script's ``result``, in
    which it fitted the GPUs ``fitted``.

    A GPU whose entry in the file records a ``library`` was fitted to today's libraries by
    ``bench/fit_aiconfigurator.py``: it keeps that entry (and its family keeps that
    source), and what this script fitted for it from the 2022-2024 sweeps goes to the 2024
    overlay (``fxshape.cost.gemm.LIBRARY_GENERATIONS``), with the families as this script
    maps them; a current GPU this script does not fit (the B200) gets there the entry its
    family borrowed then. None when no GPU is current."""
    current = {n: e for n, e in old.get("gpus", {}).items()
               if isinstance(e, dict) and e.get("library")}
    if not current:
        return result, None
    legacy = {"comment": "The 2024 library generation (params='2024'): written by "
                         "bench/fit_model.py; do not edit.",
              "gpus": {}, "measurement": {}, "families": {}}
    for name, entry in sorted(current.items()):
        if name in fitted:
            legacy["gpus"][name] = result["gpus"][name]
            legacy["measurement"][name] = result["measurement"].get(name, {})
        result["gpus"][name] = entry
        result["measurement"][name] = old.get("measurement", {}).get(name, {})
    for arch, fam in old.get("families", {}).items():
        if fam.get("from") in current:
            result["families"][arch] = fam
            legacy["families"][arch] = {"from": _FAMILY_FROM[arch]}
    for name in sorted(current):
        if name not in legacy["gpus"]:
            src = _FAMILY_FROM[get_gpu(name).arch]
            legacy["gpus"][name] = dict(legacy["gpus"][src], borrowed_from=src)
    return result, legacy


if __name__ == "__main__":
    main()
