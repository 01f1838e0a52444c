#!/usr/bin/env python
"""Whole-model latency, predicted against published measurements it was never fitted to.

    python bench/validate_e2e.py [--format github] [--gpu NAME ...]

Data: ``bench/e2e_published.csv`` (measured end-to-end latencies of BERT-large, GPT-2 large,
"GPT-3 XL", GPT-3 2.7B and OPT-1.3B on eleven GPUs: H100, A100-PCIe-40GB, V100-PCIe, T4, L4,
MI210, one MI250 GCD, A100-PCIe-80GB, P100, P4 and MI100, published with NeuSight; the file
says where from and how they were measured). The models are built from the same configs
(``_models``), captured on the meta device and analyzed as measured: fp32 (SIMT, no TF32),
``attention="math"`` (Hugging Face's eager attention), the row's ``execution`` (``"eager"``,
or ``"compiled"`` for the runs under ``torch.compile``), inference or a training step without
an optimizer. The error is predicted / measured - 1; the GEMM-and-attention sum alone (what
fxshape predicted before the step model) is shown beside it. Training rows also carry the
measured forward and backward times: the prediction is split between them in proportion to
its kernels' time per phase, and a second table compares each phase (the runs' forward is
timed right after ``torch.cuda.empty_cache()``, so it also pays the allocator's ``cudaMalloc``
of every activation it keeps; docs/validation.md). Held out: nothing in fxshape was fitted
to these rows. Deterministic; about five minutes.
"""


from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
from typing import NamedTuple

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


class Result(NamedTuple):
    """One row's prediction: ``error`` and ``gemm_error`` are predicted / measured - 1 (the
    step, and the GEMM and attention sum alone); ``forward_ms`` / ``backward_ms``: the step
    split in proportion to its kernels' time per phase (training; None for inference)."""

    row: dict
    predicted_ms: float
    error: float
    gemm_error: float
    step: object
    forward_ms: float | None
    backward_ms: float | None


def predict(r):
    """``(step ms, GEMM-and-attention ms, step, forward ms, backward ms)`` of row ``r``."""
    rep = fxshape.analyze(build(r["model"], r["mode"]), gpu=r["gpu"], dtype=torch.float32,
                          batch_size=int(r["batch"]), seq_len=int(r["seq"]), mode=r["mode"],
                          attention="math", optimizer=None, provenance=None,
                          execution=r.get("execution") or "eager")
    step_ms = rep.step.time_s * 1e3
    fw = sum(o.time_s for o in rep.ops if o.phase == "forward")
    bw = sum(o.time_s for o in rep.ops if o.phase == "backward")
    split = (step_ms * fw / (fw + bw), step_ms * bw / (fw + bw)) if bw else (None, None)
    return (step_ms, rep.total_time_s * 1e3, rep.step) + split


def errors(gpus=None):
    """A :class:`Result` for every row (of ``gpus``)."""
    out = []
    for r in rows():
        if gpus and r["gpu"] not in gpus:
            continue
        step_ms, gemm_ms, step, fw_ms, bw_ms = predict(r)
        meas = float(r["measured_ms"])
        out.append(Result(r, step_ms, step_ms / meas - 1, gemm_ms / meas - 1, step, fw_ms,
                          bw_ms))
    return out


def _pct(x):
    return f"{100 * x:+.1f}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--format", default="simple")
    ap.add_argument("--gpu", nargs="*", default=None)
    args = ap.parse_args(argv)
    body, errs, gemm_errs, phases = [], {}, {}, []
    results = errors(args.gpu)
    for res in results:
        r, e = res.row, res.error
        meas = float(r["measured_ms"])
        key = (r["gpu"], r["execution"])
        errs.setdefault(key, []).append(e)
        gemm_errs.setdefault(key, []).append(res.gemm_error)
        mem = res.step.by_class["memory"] / res.step.time_s
        body.append((r["gpu"], r["model"], r["mode"], r["execution"], r["seq"], r["batch"],
                     f"{meas:.1f}", f"{res.predicted_ms:.1f}", _pct(e), _pct(res.gemm_error),
                     f"{100 * mem:.0f}%"))
        if r["forward_ms"] and res.forward_ms is not None:
            fw, bw = float(r["forward_ms"]), float(r["backward_ms"])
            phases.append((r["gpu"], r["model"], r["batch"], f"{fw:.1f}", f"{res.forward_ms:.1f}",
                           _pct(res.forward_ms / fw - 1), f"{bw:.1f}",
                           f"{res.backward_ms:.1f}", _pct(res.backward_ms / bw - 1), _pct(e)))
    print(tabulate(body, headers=("GPU", "model", "mode", "execution", "seq", "batch",
                                  "measured ms", "predicted ms", "error %", "GEMMs only %",
                                  "memory-bound"),
                   tablefmt=args.format, disable_numparse=True))
    summary = [(g, ex, len(v), f"{100 * statistics.median(abs(x) for x in v):.1f}",
                f"{100 * max(abs(x) for x in v):.1f}", _pct(statistics.median(v)),
                _pct(statistics.median(gemm_errs[g, ex]))) for (g, ex), v in errs.items()]
    print("\nPer GPU and execution: median and largest |error| of the step, its median signed "
          "error, and the median signed error of the GEMM and attention sum alone")
    print(tabulate(summary, headers=("GPU", "execution", "runs", "median abs error %",
                                     "max %", "median signed %", "GEMMs only, median %"),
                   tablefmt=args.format, disable_numparse=True))
    key = lambda r: (r["gpu"], r["model"], r["mode"], r["seq"], r["batch"])  # noqa: E731
    eager = {key(res.row): res for res in results if res.row["execution"] == "eager"}
    speed = []
    for res in results:
        base = eager.get(key(res.row)) if res.row["execution"] == "compiled" else None
        if base is not None:
            meas = float(base.row["measured_ms"]) / float(res.row["measured_ms"])
            pred = base.predicted_ms / res.predicted_ms
            speed.append((res.row["gpu"], res.row["model"], res.row["batch"], f"{meas:.3f}",
                          f"{pred:.3f}", _pct(pred / meas - 1)))
    if speed:
        print("\nCompiled runs: speedup of torch.compile over eager, measured and predicted")
        print(tabulate(speed, headers=("GPU", "model", "batch", "measured", "predicted",
                                       "error %"), tablefmt=args.format,
                       disable_numparse=True))
    if phases:
        print("\nTraining runs by phase: measured and predicted ms, error % (the forward is "
              "timed after torch.cuda.empty_cache())")
        print(tabulate(phases, headers=("GPU", "model", "batch", "forward", "predicted",
                                        "error %", "backward", "predicted", "error %",
                                        "step error %"),
                       tablefmt=args.format, disable_numparse=True))
        by_gpu = {}
        for p in phases:
            by_gpu.setdefault(p[0], []).append((float(p[5]), float(p[8])))
        print("\nPer GPU, training runs: median |error| % of the forward and of the backward")
        print(tabulate([(g, len(v), f"{statistics.median(abs(f) for f, _ in v):.1f}",
                         f"{statistics.median(abs(b) for _, b in v):.1f}")
                        for g, v in by_gpu.items()],
                       headers=("GPU", "runs", "forward", "backward"), tablefmt=args.format,
                       disable_numparse=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
