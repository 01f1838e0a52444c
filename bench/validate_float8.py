#!/usr/bin/env python
"""torchtitan training runs (torchao's float8 under torch.compile) against published figures (held out).

    python bench/validate_float8.py [--format github]

Each row of ``bench/float8_published.csv`` is a torchtitan Llama training run (FSDP2,
torch.compile), in bf16 or with torchao's float8 recipe (``tensorwise`` with the float8
all-gather, ``rowwise`` with a bf16 one, as published; ``mxfp8`` on the B200, torchao's MX
training with cuBLAS's block-scaled GEMM): Llama-3-8B on 8 or 128 GPUs at 8k tokens, and
torchtitan's end-of-2024 H100 benchmark (``benchmarks/llama3_h100_202412_torchtitan.md``):
Llama 3.1 8B with context parallelism to 256k tokens, 70B with FSDP + TP on 256 GPUs, 405B
with FSDP + TP + PP (1F1B and interleaved) and + CP on 512 GPUs. Each is predicted with
``fxshape.analyze(mode="train", execution="compiled", parallel=Parallel(...), float8=recipe,
recompute=...)`` as published (the plan, the local batch, the micro-batches, the
checkpointing: torchtitan's op-level selective policy, ``recompute="op"``, or full) and
compared twice: the tokens per second per GPU, and the float8 run's speedup over the bf16
run of the same table (what float8 itself changes, apart from how well the bf16 step is
predicted).

torchtitan's H100s are 96 GB HBM2e parts (2.4 TB/s) at their default 500 W limit, the GPU
table's ``h100-sxm-hbm2e`` (the limit sets the clock their GEMMs sustain,
``fxshape.hardware.power``); torchao's B200s are power-limited to a figure its README does
not give (priced at the default 1000 W). The runs' PyTorch (end-2024 and 2025 builds, before
the bundled cuDNN passed 9.15) ran SDPA's FlashAttention-2 (``attention="fa2"``), not the
cuDNN kernel PyTorch 2.11+ prefers on Hopper and Blackwell. The runs with AsyncTP (the
70B's second, every 405B run) are priced with ``Parallel(async_tp=True)`` (column
``async_tp``). Not modelled: the interleaved schedule's
split (the benchmark does not give it: two stages a rank). Nothing is fitted. A few minutes
on two cores.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tabulate import tabulate  # noqa: E402

DATA = os.path.join(ROOT, "bench", "float8_published.csv")


#: Llama 3.1 shapes of torchtitan's benchmark runs (Meta's model cards: 8B 4096 x 32 layers,
#: 70B 8192 x 80, 405B 16384 x 126; 8 KV heads; vocabulary 128256), with room for the
#: context-parallel runs' 256k-token sequences
LLAMA31 = {"llama-3.1-8b": (4096, 14336, 32, 32), "llama-3.1-70b": (8192, 28672, 80, 64),
           "llama-3.1-405b": (16384, 53248, 126, 128)}


def build(name):
    """A preset, or one of :data:`LLAMA31` on the meta device."""
    from fxshape.presets import PRESETS, build_preset

    if name in PRESETS:
        return build_preset(name)
    import torch
    import transformers as tf

    h, ffn, layers, heads = LLAMA31[name]
    cfg = tf.LlamaConfig(hidden_size=h, intermediate_size=ffn, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=8, vocab_size=128256,
                         max_position_embeddings=262144, rope_theta=500000.0,
                         tie_word_embeddings=False)
    with torch.device("meta"):
        return tf.LlamaForCausalLM(cfg)


def plan_of(r):
    from fxshape import Parallel

    tp, pp, cp = int(r["tp"]), int(r["pp"]), int(r["cp"])
    dp = int(r["gpus"]) // (tp * pp * cp)
    return Parallel(tp=tp, pp=pp, virtual_stages=int(r["vp"]), cp=cp, dp=dp, zero=3,
                    microbatches=int(r["microbatches"]), sequence_parallel=tp > 1,
                    stage_layers="torchtitan" if pp > 1 else None,
                    async_tp=bool(int(r["async_tp"])))


def predict(model, r):
    """Predicted tokens per second per GPU of row ``r`` (fxshape.analyze as the run)."""
    import fxshape

    gpus = int(r["gpus"])
    topo = "dgx-h100" if gpus > 8 and r["gpu"].startswith("h100") else None
    plan = plan_of(r)
    rep = fxshape.analyze(model, mode="train", gpu=r["gpu"], seq_len=int(r["seq_len"]),
                          batch_size=int(r["batch_size"]), execution="compiled",
                          provenance=None, parallel=plan, topology=topo,
                          float8=r["recipe"] or None, recompute=r["recompute"] or None,
                          attention="fa2")
    # step.tokens: one data-parallel replica's (its tp x pp x cp GPUs'); all GPUs' per GPU
    return rep.step.tokens * plan.dp / (rep.step.time_s * gpus)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--format", default="simple")
    args = ap.parse_args(argv)
    with open(DATA, newline="") as f:
        rows = list(csv.DictReader(f))
    models, base, out = {}, {}, []
    abs_err, ratio_err = [], []
    for r in rows:
        if r["model"] not in models:
            models[r["model"]] = build(r["model"])
        m = models[r["model"]]
        key = (r["source"], r["gpu"], r["gpus"], r["batch_size"])
        pred, meas = predict(m, r), float(r["measured"])
        err = pred / meas - 1
        abs_err.append(abs(err))
        speed = ""
        if not r["recipe"]:
            base[key] = (meas, pred)
        elif key in base:
            mb, pb = base[key]
            sm, sp = meas / mb - 1, pred / pb - 1
            ratio_err.append((r, sm, sp))
            speed = f"{100 * sm:+.1f}% / {100 * sp:+.1f}%"
        out.append((r["source"], r["model"], r["gpu"], r["gpus"], _plan_text(r),
                    r["seq_len"], r["recipe"] or "bf16", f"{meas:,.0f}", f"{pred:,.0f}",
                    f"{100 * err:+.1f}%", speed))
    print(tabulate(out, headers=("source", "model", "gpu", "gpus", "plan", "seq", "recipe",
                                 "measured tok/s/GPU", "predicted", "error",
                                 "float8 speedup measured / predicted"),
                   tablefmt=args.format))
    print()
    print(f"tokens/s per GPU: median |error| {100 * statistics.median(abs_err):.1f}% over "
          f"{len(abs_err)} runs")
    for recipe in ("tensorwise", "rowwise", "mxfp8"):
        got = [abs(sp - sm) for r, sm, sp in ratio_err if r["recipe"] == recipe]
        if got:
            print(f"{recipe} speedup over bf16: median |predicted - measured| "
                  f"{100 * statistics.median(got):.1f} points over {len(got)} runs, worst "
                  f"{100 * max(got):.1f}")
    return 0


def _plan_text(r) -> str:
    p = plan_of(r)
    parts = [f"{k}{getattr(p, k)}" for k in ("tp", "pp", "cp") if getattr(p, k) > 1]
    if p.virtual_stages > 1:
        parts.append(f"v{p.virtual_stages}")
    parts += [f"FSDP{p.dp * p.cp}", f"b{r['batch_size']}"]
    if p.microbatches > 1:
        parts.append(f"m{p.microbatches}")
    parts.append(f"ac-{r['recompute'] or 'none'}")
    return " ".join(parts)


if __name__ == "__main__":
    sys.exit(main())
