#!/usr/bin/env python
"""Whole-model latency, predicted against published measurements it was never fitted to.

    python bench/validate_e2e.py [--format github] [--gpu NAME ...]

Data: ``bench/e2e_published.csv`` (measured end-to-end latencies of BERT-large, GPT-2 large,
"GPT-3 XL", GPT-3 2.7B and OPT-1.3B on ten GPUs: H100, A100-PCIe-40GB, V100-PCIe, T4, L4,
MI210, one MI250 GCD, A100-PCIe-80GB, P100 and P4, published with NeuSight; the file says
where from and how they were measured). The models are built from
the same configs (``_models``), captured on the meta device and analyzed as measured: fp32
(SIMT, no TF32), ``attention="math"`` (Hugging Face's eager attention), ``execution="eager"``,
inference or a training step without an optimizer. The error is predicted / measured - 1; the
GEMM-and-attention sum alone (what fxshape predicted before the step model) is shown beside it.
Held out: nothing in fxshape was fitted to these rows. Deterministic; about five minutes.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from tabulate import tabulate  # noqa: E402

import fxshape  # noqa: E402

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "e2e_published.csv")


def _models():
    """The published configs (scripts/asplos/data/DLmodel_configs/*.json of the same
    repository): name -> (kind, config)."""
    import transformers as tf

    def gpt(h, layers, heads, positions):
        return tf.GPT2Config(n_embd=h, n_layer=layers, n_head=heads, n_positions=positions,
                             activation_function="gelu_new", vocab_size=50257)

    return {
        "bert_large": ("bert", tf.BertConfig(hidden_size=1024, num_hidden_layers=24,
                                             num_attention_heads=16, intermediate_size=4096,
                                             vocab_size=30522)),
        "gpt2_large": ("causal", gpt(1280, 36, 20, 1024)),
        "gpt3_xl": ("causal", gpt(3072, 24, 24, 2048)),  # as published: n_embd 3072
        "gpt3_27": ("causal", gpt(2560, 32, 32, 2048)),
        "opt_13": ("causal", tf.OPTConfig(hidden_size=2048, ffn_dim=8192, num_hidden_layers=24,
                                          num_attention_heads=32, vocab_size=50272,
                                          max_position_embeddings=2048,
                                          word_embed_proj_dim=2048)),
    }


def build(name, mode):
    import transformers as tf

    kind, cfg = _models()[name]
    cfg._attn_implementation = "eager"
    with torch.device("meta"):
        if kind == "bert":
            cls = tf.BertForSequenceClassification if mode == "inference" \
                else tf.BertForPreTraining
            return cls(cfg)
        return tf.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")


def rows(path=DATA):
    with open(path) as f:
        lines = [ln for ln in f if not ln.startswith("#")]
    return list(csv.DictReader(lines))


def predict(r):
    rep = fxshape.analyze(build(r["model"], r["mode"]), gpu=r["gpu"], dtype=torch.float32,
                          batch_size=int(r["batch"]), seq_len=int(r["seq"]), mode=r["mode"],
                          attention="math", optimizer=None, provenance=None)
    return rep.step.time_s * 1e3, rep.total_time_s * 1e3, rep.step


def errors(gpus=None):
    """``(row, predicted ms, step error, GEMM-sum error, step)`` for every row (of ``gpus``)."""
    out = []
    for r in rows():
        if gpus and r["gpu"] not in gpus:
            continue
        step_ms, gemm_ms, step = predict(r)
        meas = float(r["measured_ms"])
        out.append((r, step_ms, step_ms / meas - 1, gemm_ms / meas - 1, step))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--format", default="simple")
    ap.add_argument("--gpu", nargs="*", default=None)
    args = ap.parse_args(argv)
    body, errs, gemm_errs = [], {}, {}
    for r, step_ms, e, g, step in errors(args.gpu):
        meas = float(r["measured_ms"])
        errs.setdefault(r["gpu"], []).append(abs(e))
        gemm_errs.setdefault(r["gpu"], []).append(g)
        mem = step.by_class["memory"] / step.time_s
        body.append((r["gpu"], r["model"], r["mode"], r["seq"], r["batch"], f"{meas:.1f}",
                     f"{step_ms:.1f}", f"{100 * e:+.1f}", f"{100 * g:+.1f}",
                     f"{100 * mem:.0f}%"))
    print(tabulate(body, headers=("GPU", "model", "mode", "seq", "batch", "measured ms",
                                  "predicted ms", "error %", "GEMMs only %", "memory-bound"),
                   tablefmt=args.format, disable_numparse=True))
    summary = [(g, len(v), f"{100 * statistics.median(v):.1f}", f"{100 * max(v):.1f}",
                f"{100 * statistics.median(gemm_errs[g]):+.1f}") for g, v in errs.items()]
    print("\nPer GPU: median and largest |error| of the step; median signed error of the GEMM "
          "and attention sum alone")
    print(tabulate(summary, headers=("GPU", "runs", "median |error| %", "max %",
                                     "GEMMs only, median %"), tablefmt=args.format,
                   disable_numparse=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
