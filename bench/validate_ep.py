#!/usr/bin/env python
"""Expert parallelism against published measurements, never fitted to.

    python bench/validate_ep.py [--format github]

1. **A MoE training step** — NVIDIA NeMo AutoModel's performance summary, "Pre-Training
   Performance, System: DGX-H100, Precision: BF16" (docs.nvidia.com/nemo/automodel/nightly/
   performance-summary.html; the same table in NVIDIA-NeMo/Automodel docs/performance-summary.md,
   April 2026): Qwen3 MoE 30B on 8 GPUs, GBS 512, MBS 4, GA 16, sequence 4096, TP 1, PP 1,
   CP 1, EP 8, FSDP 8, "TE + DeepEP": 21.773 s per global step, 277 model TFLOP/s per GPU,
   12,040 tokens/s per GPU. Predicted here as the Hugging Face Qwen3-30B-A3B
   (``fxshape.presets``: hidden 2048, 48 layers, 128 experts of width 768, top 8) under
   ``Parallel(dp=8, ep=8, zero=3, microbatches=16)`` with ``batch_size=4``: the same plan,
   but the model as Transformers runs it (its eager MoE layer: gathers, index_add, the
   grouped_mm fallback), not Transformer Engine's fused permutation and DeepEP's kernels.
   The table does not say whether activations were checkpointed; both are shown.

   The table's DeepSeek-V3 rows (256 and 1,024 GPUs, PP 4, VP 8) are not predicted: 61
   layers do not split into 4 × 8 equal stages, and fxshape's pipelines need equal ones.

2. **One all-to-all** — DeepEP's normal-mode intranode dispatch on 8 H100s over NVLink
   (4,096 tokens, hidden 7,168, top 8 of 32 experts, bf16): 1.0045 ms at 328.97 GB/s, the
   combine 1.1552 ms at 287.14 GB/s, as the TileScale DeepEP example's README quotes them
   (search corpus; "8xH100 on NVL, 10 channels, 8 ranks"). DeepEP's bandwidth counts the
   bytes each rank moves over NVLink; fxshape's all-to-all of the buffer that moves as many
   bytes ((n − 1) / n of it) is compared with the time. DeepEP is not NCCL: a comparison of
   the link model, not of a kernel fxshape claims to price.

Nothing is fitted. A minute or two on two cores.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tabulate import tabulate  # noqa: E402

import fxshape  # noqa: E402
from fxshape import Parallel  # noqa: E402
from fxshape.cost.comm import predict_collective  # noqa: E402
from fxshape.presets import build_preset  # noqa: E402

#: NeMo AutoModel, DGX-H100 BF16: (seconds per step, tokens/s per GPU, model TFLOP/s per GPU)
QWEN3_30B = (21.773, 12040, 277)
#: DeepEP intranode, 8 H100: (dispatch ms, dispatch GB/s, combine ms, combine GB/s)
DEEPEP = (1.0045, 328.97, 1.1552, 287.14)


def step_rows():
    model = build_preset("qwen3-30b-a3b")
    plan = Parallel(dp=8, ep=8, zero=3, microbatches=16)
    secs, tps, tflops = QWEN3_30B
    rows = []
    for recompute in (None, "full"):
        rep = fxshape.analyze(model, seq_len=4096, batch_size=4, mode="train", parallel=plan,
                              gpu="h100", recompute=recompute, provenance=None)
        step = rep.step
        coll = {(c.kind, c.op): c for c in step.communication}
        a2a = coll.get(("ep", "all_to_all"))
        rows.append([f"Qwen3-30B-A3B, 8 H100, EP 8 FSDP 8, recompute {recompute or 'none'}",
                     f"{secs:.2f}", f"{step.time_s:.2f}",
                     f"{100 * (step.time_s - secs) / secs:+.1f}%",
                     f"{tps:,}", f"{step.tokens_per_s / plan.gpus * plan.dp:,.0f}",
                     f"{a2a.exposed_s:.2f}" if a2a else "-",
                     f"{rep.memory.peak / 2**30:.1f}"])
    return rows


def a2a_rows():
    d_ms, d_gbs, c_ms, c_gbs = DEEPEP
    rows = []
    for what, ms, gbs in (("dispatch", d_ms, d_gbs), ("combine", c_ms, c_gbs)):
        moved = gbs * 1e9 * ms * 1e-3  # the bytes each rank moved over NVLink
        buffer = int(moved * 8 / 7)  # an all-to-all moves 7/8 of each rank's buffer
        p = predict_collective("all_to_all", buffer, 8, topology="dgx-h100")
        rows.append([f"DeepEP {what}, 8 H100 (NVLink)", f"{moved / 2**20:.0f}",
                     f"{ms:.3f}", f"{p.time_s * 1e3:.3f}",
                     f"{100 * (p.time_s * 1e3 - ms) / ms:+.1f}%"])
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--format", default="github")
    args = ap.parse_args(argv)
    print(tabulate(a2a_rows(), headers=["all-to-all", "MiB moved", "measured ms",
                                        "predicted ms", "error"], tablefmt=args.format))
    print()
    print(tabulate(step_rows(), headers=["run", "measured s", "predicted s", "error",
                                         "measured tok/s/GPU", "predicted tok/s/GPU",
                                         "all-to-all s", "predicted peak GiB"],
                   tablefmt=args.format))
    print("\nThe measured run used Transformer Engine and DeepEP; fxshape prices the Hugging "
          "Face model's own MoE layer and NCCL-style all-to-alls. The DeepSeek-V3 rows of the "
          "same table are not predicted (61 layers, PP 4 x VP 8: unequal stages).")


if __name__ == "__main__":
    main()
