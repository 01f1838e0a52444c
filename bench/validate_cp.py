#!/usr/bin/env python
"""Context parallelism against published measured runs, never fitted to.

    python bench/validate_cp.py [--format github]

Source: pytorch/torchtitan, ``benchmarks/llama3_h100_202412_torchtitan.md`` (commit
31a17bfdb70bab6f62a13d21816a5339b911d6e3; the same table is in docs/performance.md at
eaea6f6a2fa940f03a10906be1df3489cf30af85), Table 2: "FSDP + CP + torch.compile + Float8.
Llama 3.1 8B model. 8 GPUs. Local batch size 1. Full activation checkpointing." TPS/GPU:

    FSDP 8, CP 1, seq 32768: 3,890 (83.9 GiB)   FSDP 4, CP 2, seq 65536: 2,540 (84.2 GiB)
    FSDP 2, CP 4, seq 131072: 1,071 (84.0 GiB)  FSDP 1, CP 8, seq 262144: 548 (84.5 GiB)

(the memory is the table's "Memory(GiB)", the most loaded GPU's, as torchtitan logs it:
``torch.cuda.max_memory_reserved``, the allocator's reserve, which exceeds what is
allocated).

As run: the GPUs are the source's H100s with 96 GB of HBM2e (2.4 TB/s) at their default
500 W limit (``gpu="h100-sxm-hbm2e"``); torchao's float8 linear layers, tensorwise with the
float8 all-gather (torchtitan's "Float8", ``float8="tensorwise"``); torch.compile
(``execution="compiled"``); SDPA's FlashAttention-2, what the end-2024 PyTorch build ran
(``attention="fa2"``). Each row is one optimizer step of one sequence per FSDP rank:
``FSDP × CP = 8`` GPUs, ``zero=3`` over the eight (FSDP shards over dp × cp),
``recompute="full"``. Not modelled: the ring's output merges (a few memory-bound passes a
step, about 1% here). Nothing is fitted; a minute on two cores.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tabulate import tabulate  # noqa: E402

import fxshape  # noqa: E402
from fxshape import Parallel  # noqa: E402
from validate_float8 import build  # noqa: E402  (Llama 3.1 8B as the benchmark ran it)

#: (FSDP ranks, CP ranks, sequence length, measured tokens per second per GPU, GiB)
TORCHTITAN_TABLE2 = ((8, 1, 32768, 3890, 83.9), (4, 2, 65536, 2540, 84.2),
                     (2, 4, 131072, 1071, 84.0), (1, 8, 262144, 548, 84.5))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--format", default="github")
    args = ap.parse_args(argv)
    model = build("llama-3.1-8b")
    table, errs = [], []
    for dp, cp, seq, measured, gib in TORCHTITAN_TABLE2:
        plan = Parallel(dp=dp, cp=cp, zero=3)
        rep = fxshape.analyze(model, mode="train", batch_size=1, seq_len=seq, parallel=plan,
                              gpu="h100-sxm-hbm2e", recompute="full", execution="compiled",
                              float8="tensorwise", attention="fa2", provenance=None)
        step = rep.step
        tps = step.tokens_per_s * step.replicas / plan.gpus
        err = measured / tps - 1  # predicted step time / measured - 1
        errs.append(err)
        ring = next((c for c in step.communication if c.kind == "cp"), None)
        table.append([f"FSDP {dp}, CP {cp}", seq, measured, f"{tps:,.0f}", f"{100 * err:+.1f}%",
                      f"{100 * step.by_class['attention'] / step.time_s:.0f}%",
                      "-" if ring is None else f"{ring.bytes / 2**30:.1f} GiB, "
                      f"{ring.exposed_s * 1e3:.1f} ms exposed",
                      gib, f"{rep.memory.peak / 2**30:.1f}"])
    print(tabulate(table, headers=["plan (8 GPUs)", "seq", "measured TPS/GPU",
                                   "predicted TPS/GPU", "step time error", "attention share",
                                   "ring send/recv", "memory GiB (measured, reserved)",
                                   "peak GiB (predicted, allocated)"],
                   tablefmt=args.format))
    mean = sum(abs(e) for e in errs) / len(errs)
    print(f"\nmean |error| {100 * mean:.1f}%, max {100 * max(abs(e) for e in errs):.1f}% "
          f"(step time predicted / measured - 1; too fast: {sum(e < 0 for e in errs)} of "
          f"{len(errs)})")


if __name__ == "__main__":
    main()
