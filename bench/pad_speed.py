#!/usr/bin/env python
"""What padding costs and gains, measured.

    python bench/pad_speed.py [--gpu a100] [--repeats 30]

On CPU: a model whose plan pads nothing (aligned MLP) timed as the original and as returned by
``fxshape.pad`` (target: <= 2% overhead), and the PaddedLinear overhead when the plan does pad.
On a CUDA machine, additionally: GPT-2's LM head (8192 x 50257 x 768, fp16) and a sweep of
misaligned GEMMs, original vs fxshape-padded vs Inductor's pad_mm (``torch.compile`` with
``shape_padding``), with the speedup fxshape predicted next to the one measured.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from torch import nn  # noqa: E402

import fxshape  # noqa: E402


class _MLP(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, h), nn.Linear(h, d)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def _paired_cpu(fa, fb, repeats):
    """Median times of fa and fb measured alternately (this machine's noise is shared)."""
    for _ in range(3):
        fa(), fb()
    ta, tb = [], []
    for _ in range(repeats):
        for f, ts in ((fa, ta), (fb, tb)):
            t0 = time.perf_counter()
            f()
            ts.append(time.perf_counter() - t0)
    return statistics.median(ta), statistics.median(tb)


def cpu_part(args):
    torch.manual_seed(0)
    torch.set_num_threads(1)  # one core: less scheduling noise on a shared machine
    x = torch.randn(256, 1024)
    with torch.no_grad():
        model = _MLP(1024, 4096)
        padded = fxshape.pad(model, (x,), gpu=args.gpu, dtype="fp16")
        assert padded.padding_report == "nothing padded"
        a, b = _paired_cpu(lambda: model(x), lambda: padded(x), args.repeats)
        print(f"CPU, plan pads nothing (MLP 1024-4096-1024, 256 tokens): original "
              f"{a * 1e3:.3f} ms, fxshape.pad {b * 1e3:.3f} ms, overhead {100 * (b / a - 1):+.1f}%")
        odd = _MLP(1024, 4095)
        with torch.device("meta"):
            big = _MLP(4096, 4095)
        plan = fxshape.plan_padding(big, (torch.zeros(4096, 4096, device="meta"),),
                                    gpu=args.gpu, dtype="fp16")
        layer = fxshape.PaddedLinear(odd.fc1, pad_n=4096, pad_k=1024)
        a, b = _paired_cpu(lambda: odd.fc1(x), lambda: layer(x), args.repeats)
        print(f"CPU, a padded layer (N 4095 -> 4096; planned for {args.gpu}: "
              f"{len(plan.padded)} GEMMs padded): nn.Linear {a * 1e3:.3f} ms, PaddedLinear "
              f"{b * 1e3:.3f} ms ({100 * (b / a - 1):+.1f}%)")


def _time_cuda(fn, repeats):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(repeats):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e) / 1e3)
    return statistics.median(ts)


def cuda_part(args):
    dev, dt = "cuda", torch.float16
    shapes = [(8192, 50257, 768)] + [(4096, n, 4096) for n in (4095, 4097, 4100, 4104)] + \
        [(4096, 4096, k) for k in (4095, 4097, 4100)]
    print(f"\n{'M x N x K':>22}  {'orig us':>9}  {'fxshape us':>10}  {'pad_mm us':>9}  "
          f"{'measured':>8}  {'predicted':>9}")
    for m, n, k in shapes:
        lin = nn.Linear(k, n, bias=False, device=dev, dtype=dt)
        x = torch.randn(m, k, device=dev, dtype=dt)
        padded = fxshape.pad(nn.Sequential(lin), (x,), gpu=args.gpu, dtype="fp16")
        plan = padded.padding_plan
        d = plan.decisions[0]
        with torch.no_grad():
            t0 = _time_cuda(lambda f=lin, a=x: f(a), args.repeats)
            t1 = _time_cuda(lambda f=padded, a=x: f(a), args.repeats)
            with torch._inductor.config.patch(shape_padding=True):
                comp = torch.compile(lin)
                t2 = _time_cuda(lambda f=comp, a=x: f(a), args.repeats)
        pred = d.time_s / d.padded_time_s if d.pads else 1.0
        print(f"{m:>6} x {n:>6} x {k:>5}  {t0 * 1e6:9.1f}  {t1 * 1e6:10.1f}  {t2 * 1e6:9.1f}  "
              f"{t0 / t1:7.2f}x  {pred:8.2f}x")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", default="a100", help="GPU to plan for (default a100)")
    ap.add_argument("--repeats", type=int, default=40)
    args = ap.parse_args(argv)
    cpu_part(args)
    if torch.cuda.is_available():
        cuda_part(args)
    else:
        print("no CUDA device: the GPU measurements (GPT-2 LM head, misaligned sweep, "
              "pad_mm comparison) were skipped")


if __name__ == "__main__":
    main()
