#!/usr/bin/env python
"""Does the plan search find the plans people published, and nothing it thinks is much
better? (issue 30: the search's best plan for published multi-node runs is at least as fast,
predicted, as the plan the run used, and the published plan is in its top ten.)

    python bench/validate_plan_search.py [--rows 175B,530B,...] [--workers N]

For each multi-node run of ``bench/training_published.csv`` chosen below, the search runs on
the same GPUs, global batch and sequence length (its default space, with the run's
micro-batch size and Megatron's interleaving of 3 added where the default lacks them, so
that the published plan is in the space), and the table says the published plan's rank among the plans that fit, its predicted step against
the search's best, and the measured step. Every plan, the published one among them, is
costed with the run's attention (Megatron-LM 2022: unfused softmax attention and dropout, as
bench/validate_training.py prices it; MPT and torchtitan: flash), so the rank compares like
with like; nothing is fitted to these runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tabulate import tabulate  # noqa: E402

from validate_training import _STYLE, build, measured_step, plan_of, rows  # noqa: E402

#: the multi-node runs searched: (source, model column)
RUNS = (("megatron-sp", "175B seqsel"), ("megatron-sp", "530B seqsel"),
        ("megatron-sp", "1T seqsel"), ("torchtitan", "Llama-2-13B bs2 none"),
        ("torchtitan", "Llama-3-70B bs1 full"), ("llm-foundry", "MPT-13b seq2048 64xh100"),
        ("llm-foundry", "MPT-70b seq2048 64xh100"))


def label_of(r) -> str:
    from fxshape.planning.space import Candidate

    plan, rec = plan_of(r)
    return Candidate(dataclasses.replace(plan, recompute=rec), int(r["batch"])).label()


def main(argv=None):
    from fxshape.planning import plan

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default=None,
                    help="comma-separated model names (column 'model') to search; default "
                         "all of RUNS")
    ap.add_argument("--workers", type=int, default=None)
    args = ap.parse_args(argv)
    chosen = None if args.rows is None else {x.strip() for x in args.rows.split(",")}
    table = []
    for r in rows():
        if (r["source"], r["model"]) not in RUNS:
            continue
        if chosen is not None and r["model"].split()[0] not in chosen \
                and r["model"] not in chosen:
            continue
        mine = label_of(r)
        gpus, seq = int(r["gpus"]), int(r["seq"])
        batch = int(r["batch"]) * int(r["microbatches"]) * int(r["dp"])
        vp = (1, 2, 3, 4) if int(r["vp"]) == 3 else (1, 2, 4)
        mbs = tuple(sorted({1, 2, 4, int(r["batch"])}))
        t = time.perf_counter()
        found = plan(build(r), gpus=gpus, gpu=r["gpu"], dtype=r["dtype"], global_batch=batch,
                     seq_len=seq, topology=r["topology"], virtual_stages=vp, top=None,
                     micro_batches=mbs,
                     attention=_STYLE[r["source"]]["attention"], progress=False,
                     workers=args.workers)
        secs = time.perf_counter() - t
        labels = [x.candidate.label() for x in found.results]
        best = found.best
        if mine in labels:
            rank = labels.index(mine) + 1
            pub = found.results[rank - 1]
            where = f"{rank} of {len(labels)}"
            pub_s = f"{pub.step_s:.2f}"
            gap = f"{100 * (pub.step_s / best.step_s - 1):+.1f}%"
        else:
            where = "not among the fitting plans"
            pub_s = gap = "-"
        table.append((f"{r['source']} {r['model']}", f"{gpus} x {r['gpu']}", mine, where,
                      f"{measured_step(r):.2f}", pub_s,
                      best.candidate.label() if best else "-",
                      f"{best.step_s:.2f}" if best else "-", gap,
                      f"{found.costed} / {secs:.0f} s"))
        print(table[-1], flush=True)
    print(tabulate(table, headers=("run", "GPUs", "published plan", "its rank",
                                   "measured s", "predicted s", "search's best",
                                   "best s", "published vs best", "plans / time")))


if __name__ == "__main__":
    main()
