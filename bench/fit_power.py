#!/usr/bin/env python
"""The sustained-clock curves of ``fxshape.hardware.power``: writes fxshape/data/power_params.json.

    python bench/fit_power.py [--check]

Published measurements (quoted here, read nowhere else):

- Maximum achievable / sustainable matmul FLOPS, bf16 (stas00/ml-engineering,
  compute/accelerator/README.md, the MAMF and MSMF tables, measured with
  ``compute/accelerator/benchmarks/mamf-finder.py``; the same figures are read out in the
  repository's FLOPs explainer, ``Counting FLOPs``): H200 SXM (700 W) MAMF 834, MSMF 755
  TFLOP/s; B200 SXM (1000 W) MAMF 1745, MSMF 1429 (its clock settles near 1450 MHz from
  1965 at the limit).
- MAMF of the H100 SXM and the H100 PCIe (350 W) in one table, same method and CUDA 12.1:
  792.1 and 499.5 TFLOP/s bf16 (mag-/gpu_benchmark README, "Stats"; the SXM's figure is
  also stas00's CUDA-12.1 one). A 350 W board runs a large GEMM at its limit from its
  first milliseconds (as mamf-finder's notes say of the 750 W MI300X), so its MAMF is a
  sustained rate.

What is derived (one number per family, nothing fitted to a step):

- The exponent of the clock in the dynamic power is 3 (``P = C V² f`` with the voltage
  following the clock over the DVFS range): physics, not fitted.
- ``fixed_w`` (Hopper): the power that does not follow the SM clock, solved so that the
  model's own rule (``sustained_ratio``) gives the H100 PCIe's fattest GEMM the sustained
  fraction its MAMF shows (499.5 over the SXM's 792.1 per unit of peak), with the H200's
  measurement as the Hopper reference. The same die on two boards (132 SMs at 700 W, 114 at
  350 W) is what separates the fixed part from the part that follows the clock.
- Blackwell's ``fixed_w`` is Hopper's share of its board power (an assumption: no second
  Blackwell board is measured); it matters only for limits other than 1000 W.

``--check`` recomputes and compares with the packaged file (exit 1 on a difference).
Under a second.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from fxshape.hardware.gpus import get_gpu  # noqa: E402
from fxshape.hardware.power import PARAMS_PATH, ClockCurve, sustained_ratio  # noqa: E402

EXPONENT = 3.0
#: (GPU, limit W, MAMF, MSMF) bf16 TFLOP/s, stas00/ml-engineering
REFERENCES = {
    "hopper": ("h200-sxm", 700.0, 834.0, 755.0,
               "stas00/ml-engineering compute/accelerator MAMF/MSMF tables: H200 SXM bf16 "
               "MAMF 834, MSMF 755 TFLOP/s at 700 W"),
    "blackwell": ("b200", 1000.0, 1745.0, 1429.0,
                  "stas00/ml-engineering compute/accelerator MAMF/MSMF tables: B200 SXM bf16 "
                  "MAMF 1745, MSMF 1429 TFLOP/s at 1000 W"),
}
#: (GPU, limit W, MAMF TFLOP/s) of the board whose MAMF is a sustained rate, and the MAMF of
#: the family's full-power board in the same table (mag-/gpu_benchmark, CUDA 12.1)
THROTTLED = ("h100-pcie", 350.0, 499.5, "h100-sxm", 792.1)


def curve(family: str, fixed_w: float) -> ClockCurve:
    gpu, limit, mamf, msmf, source = REFERENCES[family]
    spec = get_gpu(gpu)
    return ClockCurve(family=family, reference=gpu, limit_w=limit, burst_tflops=mamf,
                      sustained_tflops=msmf, peak_tflops=spec.peak_tflops("bf16"),
                      sms=spec.sm_count, fixed_w=fixed_w, exponent=EXPONENT, source=source)


def hopper_fixed_w() -> float:
    """The fixed power at which the model's rule reproduces the throttled board's MAMF."""
    gpu, limit, mamf, full_gpu, full_mamf = THROTTLED
    spec = dataclasses.replace(get_gpu(gpu), power_limit_w=limit)
    burst = full_mamf / get_gpu(full_gpu).peak_tflops("bf16")  # its GEMM's activity at boost
    target = mamf / (burst * spec.peak_tflops("bf16"))  # the fraction of that it keeps

    def kept(fixed):
        return sustained_ratio(spec, burst, curve("hopper", fixed))

    lo, hi = 0.0, limit - 1.0  # kept() falls as the fixed part grows: bisect
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if kept(mid) > target else (lo, mid)
    return round((lo + hi) / 2, 1)


def params() -> dict:
    fixed = hopper_fixed_w()
    share = fixed / REFERENCES["hopper"][1]
    fams = {}
    for family in REFERENCES:
        c = curve(family, fixed if family == "hopper" else round(share * REFERENCES[family][1], 1))
        fams[family] = {"reference": c.reference, "limit_w": c.limit_w,
                        "burst_tflops": c.burst_tflops, "sustained_tflops": c.sustained_tflops,
                        "peak_tflops": c.peak_tflops, "sms": c.sms, "fixed_w": c.fixed_w,
                        "source": c.source}
    fams["hopper"]["fixed_w_from"] = (
        "bench/fit_power.py: the H100 PCIe's MAMF (499.5 TFLOP/s at 350 W) against the H100 "
        "SXM's (792.1) in one table (mag-/gpu_benchmark, CUDA 12.1)")
    fams["blackwell"]["fixed_w_from"] = "Hopper's share of the board power (assumed)"
    return {"comment": "Written by bench/fit_power.py; do not edit.", "exponent": EXPONENT,
            "families": fams}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true",
                    help="recompute and compare with the packaged file")
    args = ap.parse_args(argv)
    got = params()
    for family, p in got["families"].items():
        print(f"{family}: reference {p['reference']} at {p['limit_w']:g} W, sustained "
              f"{p['sustained_tflops'] / p['burst_tflops']:.3f} of burst, fixed "
              f"{p['fixed_w']:g} W ({p['fixed_w_from']})")
    if args.check:
        with open(PARAMS_PATH) as f:
            packaged = json.load(f)
        if packaged != got:
            print(f"{PARAMS_PATH} differs from what this script computes")
            return 1
        print(f"{PARAMS_PATH} matches")
        return 0
    from fit_aiconfigurator import write_json

    write_json(PARAMS_PATH, got)
    print(f"wrote {PARAMS_PATH}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
