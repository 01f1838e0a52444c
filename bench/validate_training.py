#!/usr/bin/env python
"""Training steps on 8 to 512 GPUs, predicted against published measurements never fitted to.

    python bench/validate_training.py [--format github] [--source NAME ...] [--memory]

Data: ``bench/training_published.csv`` (Megatron-LM's sequence-parallelism paper, MosaicML's
llm-foundry MPT benchmarks, torchtitan's FSDP2 runs; the file says where each figure is from
and how the step time is derived). Each run is rebuilt from its published shapes on the meta
device (GPT-2-style blocks for the GPT-3 and MPT models, Llama blocks for Llama) and analyzed
with the published plan as a ``fxshape.Parallel``: tensor, pipeline (with interleaving) and
data parallelism, ZeRO-3/FSDP, micro-batches, recomputation, sequence parallelism, over the
published number of DGX-style nodes. The error is predicted / measured - 1.

``--memory`` adds Korthikanti et al.'s per-GPU memory (their Figure 1, as Calculon's
validation quotes it): parameters + gradients + optimizer state, and activations, without
recomputation and with sequence parallelism + selective recomputation.

Held out: nothing in fxshape was fitted to these rows; the plans and shapes are the
published ones. Deterministic; a few minutes on two cores.

llm-foundry's FP8 rows (``dtype`` ``te-fp8``: Composer's ``amp_fp8``, Transformer Engine's
``te.Linear`` with delayed scaling) are priced with ``float8="te-delayed"``, their GPT-2
stand-in's ``Conv1D`` layers as the ``nn.Linear`` layers MPT has; a last table sets each
beside the bf16 run of the same model, sequence and GPUs (the FP8 speedup, measured and
predicted).
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
from fxshape import Parallel  # noqa: E402

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "training_published.csv")
_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "te-fp8": torch.bfloat16}
#: rows trained in FP8: the recipe each ran (llm-foundry's amp_fp8 is Composer's
#: te.fp8_autocast with Transformer Engine's DelayedScaling over te.Linear layers)
_FLOAT8 = {"te-fp8": "te-delayed"}
#: Megatron-LM's GPT-3 runs train with dropout 0.1 and (in 2022) no FlashAttention: its fused
#: scale-mask-softmax around two batched GEMMs, which fxshape's "math" attention prices.
#: MPT (llm-foundry) and torchtitan run flash attention and no dropout: llm-foundry's H100
#: runs Triton's FlashAttention on PyTorch 2.0.1, priced as FlashAttention-2 (the nearest
#: kernel modelled), torchtitan's A100 runs SDPA's FlashAttention-2 (what "flash" is on an
#: A100); neither ran the cuDNN kernel PyTorch 2.11+ prefers on Hopper.
_STYLE = {"megatron-sp": dict(dropout=0.1, attention="math"),
          "llm-foundry": dict(dropout=0.0, attention="fa2"),
          "torchtitan": dict(dropout=0.0, attention="fa2")}
#: Korthikanti et al. 2022, Figure 1 (GiB per GPU), as quoted by Calculon's validation
#: (calculon-ai/calculon, calculon/llm/validation.py, ``seqsel_fig1``): parameters +
#: gradients + optimizer state, and activations, for the Table 5 plans without
#: recomputation ("none") and with sequence parallelism + selective recomputation.
MEMORY = {"22B": {"none": (45.5625, 59.25), "seqsel": (45.5625, 9.5625)},
          "175B": {"none": (45.5625, 66.84375), "seqsel": (45.5625, 12.3515625)},
          "530B": {"none": (31.640625, 114.0234375), "seqsel": (31.640625, 23.076171875)},
          "1T": {"none": (32.958984375, 131.25), "seqsel": (32.958984375, 26.5625)}}


def rows(path=DATA):
    with open(path) as f:
        lines = [ln for ln in f if not ln.startswith("#")]
    return list(csv.DictReader(lines))


def measured_step(r) -> float:
    """The measured seconds of one optimizer step (``unit`` in the data file)."""
    if r["unit"] == "s":
        return float(r["measured"])
    if r["unit"] == "tok/s/gpu":
        tokens = int(r["batch"]) * int(r["microbatches"]) * int(r["seq"]) * int(r["dp"])
        return tokens / (float(r["measured"]) * int(r["gpus"]))
    raise ValueError(f"unit {r['unit']!r}: expected 's' or 'tok/s/gpu'")


_MODELS: dict = {}


def build(r):
    """The published shapes on the meta device (one model per shape, reused)."""
    import transformers as tf

    drop = _STYLE[r["source"]]["dropout"]
    linear = r["dtype"] in _FLOAT8
    key = (r["arch"], r["hidden"], r["layers"], r["heads"], r["kv_heads"], r["ffn"],
           r["vocab"], r["seq"], drop, linear)
    if key in _MODELS:
        return _MODELS[key]
    h, layers, heads, seq = int(r["hidden"]), int(r["layers"]), int(r["heads"]), int(r["seq"])
    if r["arch"] == "gpt":
        cfg = tf.GPT2Config(n_embd=h, n_layer=layers, n_head=heads, n_inner=int(r["ffn"]),
                            vocab_size=int(r["vocab"]), n_positions=seq,
                            activation_function="gelu", resid_pdrop=drop, embd_pdrop=drop,
                            attn_pdrop=drop)
        with torch.device("meta"):
            model = tf.GPT2LMHeadModel(cfg)
        if linear:
            _linearize(model)
    elif r["arch"] == "llama":
        cfg = tf.LlamaConfig(hidden_size=h, num_hidden_layers=layers,
                             num_attention_heads=heads, num_key_value_heads=int(r["kv_heads"]),
                             intermediate_size=int(r["ffn"]), vocab_size=int(r["vocab"]),
                             max_position_embeddings=seq, tie_word_embeddings=False)
        with torch.device("meta"):
            model = tf.LlamaForCausalLM(cfg)
    else:
        raise ValueError(f"arch {r['arch']!r}: expected 'gpt' or 'llama'")
    _MODELS[key] = model
    return model


def _linearize(model):
    """GPT-2's ``Conv1D`` layers as the ``nn.Linear`` layers MPT has (the same GEMMs), so
    that an FP8 recipe converts them as it converts MPT's (``te.Linear`` replaces MPT's
    ``nn.Linear`` layers; nothing converts a ``Conv1D``)."""
    from transformers.pytorch_utils import Conv1D

    for name, mod in list(model.named_modules()):
        if isinstance(mod, Conv1D):
            parent, _, leaf = name.rpartition(".")
            k, n = mod.weight.shape  # Conv1D's weight is [in, out]
            with torch.device("meta"):
                setattr(model.get_submodule(parent), leaf, torch.nn.Linear(k, n))


def plan_of(r, recompute=None, sp=None) -> tuple:
    pp, vp, m = int(r["pp"]), int(r["vp"]), int(r["microbatches"])
    sp = bool(int(r["sp"])) if sp is None else sp
    plan = Parallel(tp=int(r["tp"]), pp=pp, virtual_stages=vp, dp=int(r["dp"]),
                    zero=int(r["zero"]), microbatches=m, sequence_parallel=sp)
    rec = r["recompute"] if recompute is None else recompute
    return plan, (None if rec == "none" else rec)


def analyze(r, recompute=None, sp=None):
    plan, rec = plan_of(r, recompute, sp)
    return fxshape.analyze(build(r), gpu=r["gpu"], dtype=_DTYPES[r["dtype"]], mode="train",
                           batch_size=int(r["batch"]), seq_len=int(r["seq"]), parallel=plan,
                           recompute=rec, attention=_STYLE[r["source"]]["attention"],
                           topology=r["topology"], float8=_FLOAT8.get(r["dtype"]),
                           provenance=None)


def _plan_text(r) -> str:
    parts = [f"{k}{r[k]}" for k in ("tp", "pp", "dp") if int(r[k]) > 1]
    if int(r["vp"]) > 1:
        parts.append(f"v{r['vp']}")
    if int(r["zero"]):
        parts.append("FSDP" if r["zero"] == "3" else f"ZeRO-{r['zero']}")
    if int(r["sp"]):
        parts.append("SP")
    parts.append(f"m{r['microbatches']}")
    if r["recompute"] != "none":
        parts.append(r["recompute"])
    return " ".join(parts)


def _precision(r) -> str:
    """A row's precision as the summary groups it (``bf16``, ``fp16``, ``FP8 (te-delayed)``)."""
    return f"FP8 ({_FLOAT8[r['dtype']]})" if r["dtype"] in _FLOAT8 else r["dtype"]


def _summary(errs) -> tuple:
    a = [abs(e) for e in errs]
    return (len(a), f"{100 * statistics.mean(a):.1f}%", f"{100 * max(a):.1f}%",
            f"{100 * statistics.median(errs):+.1f}%",
            f"{sum(x <= 0.15 for x in a)}/{len(a)}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--format", default="github")
    ap.add_argument("--source", nargs="*", help="only these sources")
    ap.add_argument("--memory", action="store_true", help="also Korthikanti et al.'s memory")
    args = ap.parse_args(argv)
    table, by_source, tps = [], {}, {}
    for r in rows():
        if args.source and r["source"] not in args.source:
            continue
        rep = analyze(r)
        meas = measured_step(r)
        pred = rep.step.time_s
        tokens = int(r["batch"]) * int(r["microbatches"]) * int(r["seq"]) * int(r["dp"])
        tps[r["model"]] = (tokens / meas, tokens / pred)
        err = pred / meas - 1
        by_source.setdefault((r["source"], r["gpu"], _precision(r)), []).append(err)
        cls = rep.step.by_class
        comm = cls.get("communication", 0) / pred
        bubble = cls.get("pipeline_bubble", 0) / pred
        table.append([r["source"], r["model"], r["gpus"], r["gpu"], _plan_text(r),
                      f"{meas:.3f}", f"{pred:.3f}", f"{100 * err:+.1f}%",
                      f"{100 * comm:.0f}%", f"{100 * bubble:.0f}%",
                      f"{rep.memory.peak / 2**30:.1f}"])
    if table:
        print(tabulate(table, headers=["source", "run", "GPUs", "GPU", "plan", "measured s",
                                       "predicted s", "error", "comm exposed", "bubble",
                                       "peak GiB"], tablefmt=args.format))
        print()
        summary = [[s, g, p, *_summary(e)] for (s, g, p), e in sorted(by_source.items())]
        summary.append(["all", "", "", *_summary([e for v in by_source.values() for e in v])])
        print(tabulate(summary, headers=["source", "GPU", "precision", "runs", "mean |error|",
                                         "max |error|", "median signed", "within 15%"],
                       tablefmt=args.format))
        _speedups(tps, args.format)
    if args.memory:
        print()
        _memory(args.format)


def _speedups(tps, fmt):
    """FP8 against bf16: each FP8 run beside the bf16 run of the same model, sequence and
    GPUs (the name without " fp8"), tokens per second measured and predicted."""
    table = []
    for name, (m8, p8) in tps.items():
        base = tps.get(name.removesuffix(" fp8")) if name.endswith(" fp8") else None
        if base is None:
            continue
        ms, ps = m8 / base[0], p8 / base[1]
        table.append([name.removesuffix(" fp8"), f"{ms:.3f}x", f"{ps:.3f}x",
                      f"{100 * (ps / ms - 1):+.1f}%"])
    if table:
        print()
        print(tabulate(table, headers=["run", "FP8 / bf16 measured", "predicted",
                                       "error"], tablefmt=fmt))


def _memory(fmt):
    """Korthikanti et al.'s Figure 1 against the analysis of the Table 5 plans."""
    runs = {r["model"].split()[0]: r for r in rows()
            if r["source"] == "megatron-sp" and r["model"].endswith("full")}
    table, errs = [], []
    for name, modes in MEMORY.items():
        r = runs[name]
        for mode, (par_opt, act) in modes.items():
            rep = analyze(r, recompute="selective" if mode == "seqsel" else "none",
                          sp=mode == "seqsel")
            m = rep.memory
            p_par = (m.parameters + m.gradients + m.optimizer_state) / 2**30
            p_act = m.activations / 2**30
            e_par, e_act = p_par / par_opt - 1, p_act / act - 1
            errs += [e_par, e_act]
            table.append([name, mode, f"{par_opt:.2f}", f"{p_par:.2f}", f"{100 * e_par:+.1f}%",
                          f"{act:.2f}", f"{p_act:.2f}", f"{100 * e_act:+.1f}%"])
    print(tabulate(table, headers=["model", "plan", "params+grads+optimizer GiB (published)",
                                   "predicted", "error", "activations GiB (published)",
                                   "predicted", "error"], tablefmt=fmt))


if __name__ == "__main__":
    main()
