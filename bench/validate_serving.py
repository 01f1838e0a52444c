#!/usr/bin/env python
"""Serving predictions against published measurements (held out: nothing here is fitted).

    python bench/validate_serving.py [--format github]

Each row of ``bench/serving_published.csv`` is predicted with ``fxshape.serve`` (the prefill,
then every decode step at its own context; bf16; CUDA graphs) and the all-reduce the
engine ran: gpt-fast's batch-1 decode on A100s at tp 1-8 (PyTorch's intra-node one-shot
all-reduce, ``ENABLE_INTRA_NODE_COMM=1``) and on one MI250X GCD; vLLM 0.2's end-to-end
latency of 64 requests (256 in, 256 out) with its custom all-reduce and with NCCL. Each
row is also predicted with NCCL's model (``allreduce="nccl"``) for comparison. Llama 33B is
LLaMA-1's published sizes. The GEMMs are fused as each engine's model runs them (the
``fuse`` column: gpt-fast's ``model.py`` has one ``wqkv`` linear and separate ``w1``, ``w3``:
``"qkv"``; vLLM's Llama has ``QKVParallelLinear`` and ``MergedColumnParallelLinear``:
``"all"``); each row is also predicted unfused. The ``gemv`` column says how the engine's
batch-1 matrix-vector products run (``fxshape.cost.gemv``): gpt-fast's ``generate.py`` sets
``torch._inductor.config.coordinate_descent_tuning = True``, under which Inductor
decomposes every ``M = 1`` GEMM into a Triton reduction (``"inductor"``); vLLM runs the
BLAS library's GEMM (``"library"``); those rows are also predicted with the library's
kernel. About two minutes on two cores.
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

DATA = os.path.join(ROOT, "bench", "serving_published.csv")


def model_of(name):
    from fxshape.presets import build_preset

    if name != "llama-33b":
        return build_preset(name)
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=6656, intermediate_size=17920, num_hidden_layers=60,
                      num_attention_heads=52, num_key_value_heads=52, vocab_size=32000,
                      max_position_embeddings=2048)
    with torch.device("meta"):
        return LlamaForCausalLM(cfg)


def serve_kwargs(r) -> dict:
    """``fxshape.serve``'s arguments for a row, but the engine options (all-reduce, fusion,
    matrix-vector kernel), which the rows vary."""
    return dict(gpu=r["gpu"], topology=r["topology"], tp=int(r["tp"]),
                batch_size=int(r["batch_size"]), prompt_len=int(r["prompt_len"]),
                output_len=int(r["output_len"]),
                page_size=16 if r["source"].startswith("vllm") else None)


def main(argv=None) -> int:
    import fxshape

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--format", default="simple")
    args = ap.parse_args(argv)
    with open(DATA, newline="") as f:
        rows = list(csv.DictReader(f))
    models, out, errs = {}, [], {}
    for r in rows:
        m = models.setdefault(r["model"], model_of(r["model"]))
        kw = serve_kwargs(r)
        a, f, g = r["allreduce"], r["fuse"], r["gemv"]
        got = {o: fxshape.serve(m, allreduce=o[0], fuse=o[1], gemv=o[2], **kw)
               for o in dict.fromkeys(((a, f, g), ("nccl", f, g), (a, "none", g),
                                       (a, f, "library")))}
        metric, meas = r["metric"], float(r["measured"])
        pred = getattr(got[(a, f, g)], metric)
        err = (pred - meas) / meas
        errs.setdefault(r["source"], []).append(abs(err))

        def error(o):
            return f"{100 * (getattr(got[o], metric) - meas) / meas:+.1f}%"

        out.append([r["source"], r["model"], r["gpu"], r["tp"], r["batch_size"], a, f, g,
                    metric, f"{meas:g}", f"{pred:.4g}", f"{100 * err:+.1f}%",
                    error(("nccl", f, g)), error((a, "none", g)),
                    error((a, f, "library")) if g != "library" else ""])
    print(tabulate(out, headers=["source", "model", "gpu", "tp", "batch", "all-reduce",
                                 "fused", "gemv", "metric", "measured", "predicted", "error",
                                 "error with nccl", "error unfused",
                                 "error with the library's gemv"], tablefmt=args.format))
    for src, e in errs.items():
        print(f"{src}: median |error| {100 * statistics.median(e):.1f}% over {len(e)} rows, "
              f"worst {100 * max(e):.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
