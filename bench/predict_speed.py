#!/usr/bin/env python
"""How fast predict_matmul scores shapes: 100k distinct shapes cold, then again from the cache.

    python bench/predict_speed.py [--count 100000] [--gpu h100]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fxshape import predict_matmul  # noqa: E402
from fxshape.cost.gemm import _predict_cached  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=100_000)
    ap.add_argument("--gpu", default="h100")
    args = ap.parse_args(argv)
    rng = random.Random(0)
    shapes = [(rng.randint(1, 16384), rng.randint(1, 65536), rng.randint(1, 16384),
               rng.choice((1, 1, 1, 8, 32))) for _ in range(args.count)]
    _predict_cached.cache_clear()
    t0 = time.perf_counter()
    for m, n, k, b in shapes:
        predict_matmul(m, n, k, batch=b, gpu=args.gpu)
    cold = time.perf_counter() - t0
    t0 = time.perf_counter()
    for m, n, k, b in shapes:
        predict_matmul(m, n, k, batch=b, gpu=args.gpu)
    warm = time.perf_counter() - t0
    print(f"{args.count} distinct shapes on {args.gpu}: {cold:.2f} s cold "
          f"({1e6 * cold / args.count:.1f} us/shape), {warm:.2f} s from the cache "
          f"({1e6 * warm / args.count:.2f} us/shape)")


if __name__ == "__main__":
    main()
