#!/usr/bin/env python
"""The prepared GPU check: measure a representative set on this machine's GPU, beside
fxshape's predictions, in one command (about 5 minutes on an H100; ``--budget-s`` caps it).

    python bench/gpu_check.py [--out-dir docs/gpu_check] [--gpu NAME] [--budget-s 420]

Sections, in order (a section that would start past the budget is listed as skipped):
1. ``align``: step-1 sweeps of F.linear's N and of K around 4096 (odd, 2-, 4-, 8-aligned
   sizes), a bmm batch sweep, and attention's two bmms (scores Q @ K^T and P @ V, 64 x 2048
   x 2048) at head_dim 64, 65, 80, 96, 128 and 129, in bf16.
2. ``llama``: Llama-3-8B's four linear layers (QKV 4096->6144, O 4096->4096, gate+up
   4096->28672, down 14336->4096) at 1, 16, 128, 512, 2048 and 8192 tokens (decode to
   prefill), bf16.
3. ``fp32``: a few F.linear and bmm shapes in fp32 (TF32 off: SIMT sgemm) and in TF32.
4. ``sdpa``: scaled_dot_product_attention forward and backward (bf16; seq_len 512-8192,
   head_dim 64/128, causal and not).
5. ``lm_head``: GPT-2's LM head, 8192 tokens x 768 -> 50257 vs 50304.
6. ``memops``: memory-bound kernels beside ``predict_memop``: elementwise add, scale and
   gelu, LayerNorm, and softmax over 1,024 (warp kernel) and 4,096 elements (block kernel),
   bf16, 64-256 MB per tensor.
7. ``gpt2_step``: one GPT-2 (124M) training step, 8 x 1024 tokens, bf16 autocast, SGD:
   eager, ``fxshape.pad`` (eager), ``torch.compile`` (Inductor), Inductor with
   ``shape_padding``, and ``torch.compile(backend="fxshape")`` -- measured step times beside
   fxshape's predicted step (eager, compiled) and its GEMM time alone; ``memory``: the
   measured peak (``torch.cuda.max_memory_allocated``) beside ``report.memory.peak``;
   ``sustained``: an 8192^3 bf16 GEMM cold and after 10 s back-to-back (the clock a
   training step's GEMMs run at: cold beside the short-benchmark constants the model is
   fitted to, hot beside ``fxshape.hardware.power``'s sustained clock at the power limit
   ``nvidia-smi`` reports); ``llama_layer``: one Llama-3-8B-shaped layer's forward (bf16, 4 x 2048), eager;
   ``host``: the CPU time per eager op (a tiny add, a view) beside the host model;
   ``decode_attention``: SDPA's flash backend on decode shapes (one query over a GQA cache,
   batch 1-64, 1k-16k tokens) beside ``fxshape.cost.decode_attention``; ``low_precision``:
   ``torch._scaled_mm`` (FP8, per-tensor scales, bf16 out) at Llama-3-8B's shapes on a GPU
   with FP8 (the FP8 GEMM constants are the fp16 fit's and unvalidated:
   docs/quantization.md), tinygemm's int4 ``_weight_int4pack_mm`` at 1, 16 and 128 rows,
   and the eager int8 weight-only linear, beside ``fxshape.cost.quant``; ``launch``: 200
   small GEMMs queued eagerly and the same in a CUDA graph (the launch regimes, beside the
   GEMM prediction with and without the eager gap); ``trace``: one
   eager and one compiled step recorded with ``torch.profiler`` and read back by
   ``fxshape.compare_trace`` (the traces, their comparisons and the predicted steps as
   Chrome traces are written beside the tables: issue 34's held-out traces).

Writes ``gpu_check.csv`` (section, name, dtype, predicted_s, measured_s) and ``gpu_check.md``
(one table per section, median and p90 |error|) into ``--out-dir``. GEMMs are timed with
``fxshape.fit.measure`` (CUDA events, median, rotating operands). Without CUDA it says so and
exits with status 2.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fxshape import predict_matmul  # noqa: E402
from fxshape.cost.attention import AttentionShape, predict_attention  # noqa: E402

COLUMNS = ("section", "name", "dtype", "predicted_s", "measured_s")


def gemm_shapes():
    """(section, name, op, layout, b, m, n, k, dtype) of the GEMM sections."""
    out = []
    for x in range(4088, 4105):
        out.append(("align", f"linear N={x}", "linear", "nt", 1, 4096, x, 4096, "bf16"))
        out.append(("align", f"linear K={x}", "linear", "nt", 1, 4096, 4096, x, "bf16"))
    for b in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64):
        out.append(("align", f"bmm b={b}", "bmm", "nn", b, 1024, 1024, 1024, "bf16"))
    for d in (64, 65, 80, 96, 128, 129):  # issue 20: odd head_dim through the bmms
        out.append(("align", f"scores bmm d={d}", "bmm", "nt", 64, 2048, 2048, d, "bf16"))
        out.append(("align", f"P@V bmm d={d}", "bmm", "nn", 64, 2048, d, 2048, "bf16"))
    layers = (("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096),
              ("down", 4096, 14336))
    for m in (1, 16, 128, 512, 2048, 8192):
        for name, n, k in layers:
            out.append(("llama", f"{name} M={m}", "linear", "nt", 1, m, n, k, "bf16"))
    for dt in ("fp32", "tf32"):
        for m, n, k in ((4096, 4096, 4096), (1000, 3000, 777), (128, 4096, 4096),
                        (8, 11008, 4096)):
            out.append(("fp32", f"linear {m}x{n}x{k}", "linear", "nt", 1, m, n, k, dt))
        out.append(("fp32", "bmm 48x512x512x64", "bmm", "nn", 48, 512, 512, 64, dt))
    for n in (50257, 50304):
        out.append(("lm_head", f"GPT-2 LM head N={n}", "linear", "nt", 1, 8192, n, 768,
                    "bf16"))
    return out


def sdpa_shapes():
    """(batch, heads, kv_heads, seq_len, head_dim, causal)."""
    return [(16384 // s, 2048 // d, 2048 // d, s, d, c)
            for s in (512, 2048, 8192) for d in (64, 128) for c in (False, True)]


def memop_shapes():
    """(name, kind, rows, cols, full-size inputs) of the memory-bound section (bf16)."""
    return [("add", "elementwise", 32768, 4096, 2), ("scale", "elementwise", 32768, 4096, 1),
            ("gelu", "elementwise", 32768, 4096, 1), ("layer_norm", "layer_norm", 32768, 4096, 1),
            ("softmax 1024", "softmax", 131072, 1024, 1),
            ("softmax 4096", "softmax", 32768, 4096, 1)]


def run_memops(shapes, timer, gpu, budget_end):
    from fxshape import predict_memop

    rows = []
    for name, kind, r, c, inputs in shapes:
        if time.monotonic() > budget_end:
            return rows, True
        p = predict_memop(kind, r, c, dtype="bf16", gpu=gpu, inputs=inputs)
        rows.append(("memops", f"{name} {r}x{c} ({p.family})", "bf16", p.time_s,
                     float(timer(name, kind, r, c))))
    return rows, False


def memop_timer(name, kind, r, c):  # pragma: no cover - needs CUDA
    """Median CUDA-event time of one memory-bound kernel on bf16 tensors."""
    import torch
    import torch.nn.functional as F

    from fxshape.fit.measure import cuda_event_median

    x = torch.randn(r, c, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(r, c, device="cuda", dtype=torch.bfloat16)
    w = torch.ones(c, device="cuda", dtype=torch.bfloat16)
    fn = {"add": lambda: torch.add(x, y), "scale": lambda: x * 0.5, "gelu": lambda: F.gelu(x),
          "layer_norm": lambda: F.layer_norm(x, (c,), w, w)}.get(
              name, lambda: torch.softmax(x, dim=-1))
    return cuda_event_median(lambda i: fn(), 3, 20)


def run_gemms(shapes, timer_for, budget_end):
    rows = []
    for sec, name, op, lay, b, m, n, k, dt in shapes:
        if time.monotonic() > budget_end:
            return rows, True
        p = predict_matmul(m, n, k, batch=b, dtype=dt, gpu=timer_for.gpu, layout=lay)
        rows.append((sec, name, dt, p.time_s, float(timer_for(dt)(op, lay, b, m, n, k))))
    return rows, False


def run_sdpa(shapes, timer, gpu, budget_end):
    rows = []
    for b, h, kvh, s, d, causal in shapes:
        if time.monotonic() > budget_end:
            return rows, True
        shape = AttentionShape(b, h, kvh, s, s, d, d, causal)
        for direction, t in zip(("forward", "backward"), timer(b, h, kvh, s, d, causal)):
            p = predict_attention(shape, direction=direction, gpu=gpu, dtype="bf16")
            rows.append(("sdpa", f"{direction} b={b} h={h} s={s} d={d} causal={causal}",
                         "bf16", p.time_s, float(t)))
    return rows, False


def traced_steps(gpu, out_dir, cases, step_of):  # pragma: no cover - needs CUDA
    """One profiled training step per ``(label, model, report)`` of ``cases``
    (``torch.profiler``, ``record_shapes=True``), written to ``trace_gpt2_<label>.json.gz``
    in ``out_dir`` and compared with the model (``fxshape.compare_trace``:
    ``trace_gpt2_<label>.md``); the step ``report`` predicted, drawn beside it
    (``predicted_gpt2_<label>.json.gz``). Rows: per class,
    the predicted and measured kernel time of the trace's operators; the device time
    attributed to operators (predicted column 1)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    import fxshape

    rows = []
    os.makedirs(out_dir, exist_ok=True)
    for label, model, report in cases:
        step = step_of(model)
        for i in range(2):  # warm the allocator (a compiled model is warm already)
            step(i)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                     record_shapes=True) as prof:
            step(0)
            torch.cuda.synchronize()
        path = os.path.join(out_dir, f"trace_gpt2_{label}.json.gz")
        prof.export_chrome_trace(path)
        c = fxshape.compare_trace(path, gpu=gpu)
        with open(os.path.join(out_dir, f"trace_gpt2_{label}.md"), "w") as f:
            f.write(c.to_markdown(worst=15))
        for k in c.by_class:
            rows.append(("trace", f"gpt2 {label} {k.cls} ({k.ops} ops, median |err| "
                         f"{100 * k.median:.0f}%)", "bf16", k.predicted_s, k.measured_s))
        rows.append(("trace", f"gpt2 {label} attributed fraction", "", 1.0,
                     c.attributed_fraction))
        report.to_chrome_trace(os.path.join(out_dir, f"predicted_gpt2_{label}.json.gz"))
    return rows


def _traced(gpu, out_dir, cases, step_of):  # pragma: no cover - needs CUDA
    """:func:`traced_steps` where an output folder is given; a profiler problem is printed
    and loses no other row."""
    if out_dir is None:
        return []
    try:
        return traced_steps(gpu, out_dir, cases, step_of)
    except Exception as exc:
        print(f"gpu_check: traced steps skipped ({type(exc).__name__}: {exc})",
              file=sys.stderr)
        return []


def gpt2_step(gpu, out_dir=None):  # pragma: no cover - needs CUDA and transformers
    """Measured training steps of GPT-2 (124M, 8 x 1024 tokens, bf16 autocast, SGD) under
    each way of running it, beside fxshape's predicted step (``report.step``: eager or
    compiled) where it predicts one; the measured peak memory beside ``report.memory``; one
    Llama-shaped layer's forward; and the host's time per eager op."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    import fxshape
    from fxshape.fit.measure import cuda_event_median

    torch.manual_seed(0)
    cfg = GPT2Config()
    x = torch.randint(0, cfg.vocab_size, (8, 1024), device="cuda")

    def step_fn(model):
        opt = torch.optim.SGD(model.parameters(), lr=1e-4)

        def step(_i):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(input_ids=x, labels=x).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return step

    def predicted(model, execution):
        rep = fxshape.analyze(model, gpu=gpu, mode="train", batch_size=8, seq_len=1024,
                              execution=execution, optimizer="sgd", provenance=None)
        return rep

    rows, reports = [], {}
    base = GPT2LMHeadModel(cfg).cuda()
    padded = fxshape.pad(base, gpu=gpu, mode="train", batch_size=8, seq_len=1024)
    for name, model in (("eager", base), ("fxshape.pad eager", padded)):
        rep = reports[name] = predicted(model, "eager")
        torch.cuda.reset_peak_memory_stats()
        t = cuda_event_median(step_fn(model), 3, 10)
        rows.append(("gpt2_step", name, "bf16", rep.step.time_s, t))
        rows.append(("gpt2_step", name + " (GEMMs only)", "bf16", rep.total_time_s, t))
        rows.append(("memory", name + " peak", "bf16", float(rep.memory.peak),
                     float(torch.cuda.max_memory_allocated())))
    import torch._inductor.config as icfg

    rows += _traced(gpu, out_dir, (("eager", base, reports["eager"]),), step_fn)
    compiled_rep = predicted(base, "compiled")
    compiled_pred = compiled_rep.step.time_s
    for name, kw, flag in (("torch.compile inductor", {}, False),
                           ("inductor shape_padding", {}, True),
                           ("torch.compile backend=fxshape", {"backend": "fxshape"}, False)):
        torch._dynamo.reset()
        old = icfg.shape_padding
        icfg.shape_padding = flag
        try:
            model = torch.compile(GPT2LMHeadModel(cfg).cuda(), **kw)
            pred = compiled_pred if name == "torch.compile inductor" else float("nan")
            rows.append(("gpt2_step", name, "bf16", pred,
                         cuda_event_median(step_fn(model), 3, 10)))
            if name == "torch.compile inductor":  # traced while compiled and warm
                rows += _traced(gpu, out_dir, (("compiled", model, compiled_rep),), step_fn)
        finally:
            icfg.shape_padding = old
    rows += sustained_gemm(gpu)
    rows += llama_layer(gpu)
    rows += host_ops()
    rows += launch_gap(gpu)
    rows += decode_attention(gpu)
    try:  # a kernel this torch build lacks must not lose the rows above
        rows += low_precision(gpu)
    except Exception as exc:
        print(f"gpu_check: low_precision skipped ({type(exc).__name__}: {exc})",
              file=sys.stderr)
    return rows


def low_precision(gpu):  # pragma: no cover - needs CUDA
    """Quantized kernels beside ``fxshape.cost.quant``: FP8 ``torch._scaled_mm`` (per-tensor
    scales of 1, e4m3 operands, bf16 out; static activation scales: no quantization kernel),
    tinygemm's int4 GEMM (group 128) and eager PyTorch's int8 weight-only linear (a
    conversion kernel, then the bf16 GEMM). Each kernel that fails on this build is left
    out and said on stderr."""
    import torch
    import torch.nn.functional as F

    from fxshape.cost.quant import predict_quantized, quantization_of
    from fxshape.fit.measure import cuda_event_median
    from fxshape.hardware.gpus import get_gpu

    rows = []

    def add(name, dt, pred, fn):
        try:
            rows.append(("low_precision", name, dt, pred, cuda_event_median(fn, 3, 20)))
        except Exception as exc:
            print(f"gpu_check: {name} skipped ({type(exc).__name__}: {exc})",
                  file=sys.stderr)

    if get_gpu(gpu).peaks.fp8 is not None:
        static = quantization_of("fp8", activations="static")
        one = torch.ones((), device="cuda", dtype=torch.float32)
        for m, n, k in ((16, 6144, 4096), (512, 6144, 4096), (2048, 28672, 4096),
                        (8192, 6144, 4096), (8192, 4096, 14336)):
            a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
            b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn).t()  # column-major

            def mm(_i, a=a, b=b):
                torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
            add(f"_scaled_mm {m}x{n}x{k}", "fp8",
                predict_quantized(m, n, k, static, gpu=gpu).prediction.time_s, mm)
    n, k, g = 4096, 4096, 128
    int4 = quantization_of("int4", g)
    try:
        w = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device="cuda")
        packed = torch.ops.aten._convert_weight_to_int4pack(w, 8)
        sz = torch.ones(k // g, n, 2, dtype=torch.bfloat16, device="cuda")
    except Exception as exc:
        print(f"gpu_check: int4 packing skipped ({type(exc).__name__}: {exc})",
              file=sys.stderr)
        packed = None
    for m in (1, 16, 128):
        x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
        if packed is not None:
            def int4mm(_i, x=x):
                torch.ops.aten._weight_int4pack_mm(x, packed, g, sz)
            add(f"tinygemm int4 g{g} {m}x{n}x{k}", "int4",
                predict_quantized(m, n, k, int4, gpu=gpu).prediction.time_s, int4mm)
        w8 = torch.randint(-128, 127, (n, k), dtype=torch.int8, device="cuda")
        s8 = torch.ones(n, dtype=torch.bfloat16, device="cuda")

        def int8(_i, x=x, w8=w8, s8=s8):
            F.linear(x, w8.to(torch.bfloat16)) * s8
        add(f"eager int8 weight-only {m}x{n}x{k}", "int8",
            predict_quantized(m, n, k, quantization_of("int8"), gpu=gpu).prediction.time_s,
            int8)
    return rows


def decode_attention(gpu):  # pragma: no cover - needs CUDA
    """SDPA's flash backend on decode shapes (one query token over a GQA cache, Llama-3-8B's
    32/8 heads of 128), against fxshape.cost.decode_attention: a held-out check on this GPU."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from fxshape.fit.measure import cuda_event_median

    rows = []
    for b, ctx in ((1, 1024), (1, 4096), (1, 16384), (16, 4096), (64, 4096)):
        q = torch.randn(b, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, 8, ctx, 128, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)

        def call(_i):
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        p = predict_attention(AttentionShape(b, 32, 8, 1, ctx, 128, 128), gpu=gpu,
                              dtype="bf16")
        rows.append(("decode_attention", f"b={b} 32/8 heads ctx={ctx} ({p.decode.splits} "
                     "splits)", "bf16", p.time_s, cuda_event_median(call, 3, 20)))
    return rows


def power_limit_w():  # pragma: no cover - needs nvidia-smi
    """The power limit in force on GPU 0 (``nvidia-smi``), or None where it cannot be read."""
    import subprocess

    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=power.limit",
                              "--format=csv,noheader,nounits", "-i", "0"],
                             capture_output=True, text=True, timeout=10).stdout
        return float(out.strip().splitlines()[0])
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return None


def sustained_gemm(gpu, seconds=10.0):  # pragma: no cover - needs CUDA
    """One 8192^3 bf16 GEMM (randn operands) timed cold (the first 20 calls after 3
    warm-up calls) and again after ``seconds`` of back-to-back calls: how far a power- or
    thermally-limited clock takes a training step's GEMMs below short benchmarks. The cold
    row is compared with the GEMM model (burst clock), the hot one with it at the clock the
    GPU sustains under the power limit in force (``fxshape.hardware.power``, the limit read
    from ``nvidia-smi`` where it can be)."""
    import torch

    from fxshape.hardware.gpus import get_gpu
    from fxshape.hardware.power import power_limit_range, sustained_ratio

    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    spec = get_gpu(gpu)
    limit = power_limit_w()
    try:
        low, high = power_limit_range(spec)
        if limit is not None and low <= limit <= high:
            spec = spec.with_power_limit(limit)
    except ValueError:  # no board power recorded for this GPU: its default
        pass
    pred = predict_matmul(n, n, n, dtype="bf16", gpu=spec, layout="nn").time_s
    activity = 2 * n ** 3 / (pred * spec.peak_tflops("bf16") * 1e12)
    pred_hot = pred / sustained_ratio(spec, activity)

    def timed(count):
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(2 * count)]
        for i in range(count):
            ev[2 * i].record()
            a @ b
            ev[2 * i + 1].record()
        torch.cuda.synchronize()
        return statistics.median(ev[2 * i].elapsed_time(ev[2 * i + 1]) / 1e3
                                 for i in range(count))
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    cold = timed(20)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(50):
            a @ b
        torch.cuda.synchronize()
    hot = timed(20)
    at = f" at {spec.power_w:g} W" if spec.power_w else ""
    return [("sustained", "8192^3 bf16, cold (first 20 calls)", "bf16", pred, cold),
            ("sustained", f"8192^3 bf16, after {seconds:.0f} s back-to-back{at} (predicted "
                          "at the sustained clock)", "bf16", pred_hot, hot)]


def llama_layer(gpu):  # pragma: no cover - needs CUDA and transformers
    """One Llama-3-8B-shaped decoder layer (and its norm and head cut off: a 1-layer model
    with a 128-word vocabulary), forward, bf16, 4 x 2048 tokens, eager."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    import fxshape
    from fxshape.fit.measure import cuda_event_median

    cfg = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                      num_key_value_heads=8, num_hidden_layers=1, vocab_size=128,
                      max_position_embeddings=4096)
    model = LlamaForCausalLM(cfg).to("cuda", torch.bfloat16).eval()
    x = torch.randint(0, 128, (4, 2048), device="cuda")
    rep = fxshape.analyze(model, gpu=gpu, batch_size=4, seq_len=2048, provenance=None)

    def fwd(_i):
        with torch.no_grad():
            model(input_ids=x, use_cache=False)
    return [("llama_layer", "Llama-3-8B layer forward 4x2048", "bf16", rep.step.time_s,
             cuda_event_median(fwd, 3, 10))]


def host_ops():  # pragma: no cover - needs CUDA
    """The host's time per eager op: 2,000 back-to-back tiny adds (the GPU waits on the
    host) and 2,000 views, CPU wall time per op, beside fxshape's ``kernel_s`` and
    ``view_s``."""
    import torch

    from fxshape.cost.host import host_params

    hp = host_params()
    a = torch.ones(16, device="cuda")
    out = []
    for name, fn, pred in (("add (one kernel)", lambda t: t.add(1.0), hp.kernel_s),
                           ("view (no kernel)", lambda t: t.view(4, 4), hp.view_s)):
        for _ in range(200):
            fn(a)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(2000):
            fn(a)
        torch.cuda.synchronize()
        out.append(("host", name, "fp32", pred, (time.perf_counter() - t0) / 2000))
    return out


def launch_gap(gpu, n=200):  # pragma: no cover - needs CUDA
    """The launch regimes (``fxshape.cost.host.launch_gap_s``): ``n`` small GEMMs (64 tokens,
    4096 -> 4096, bf16) queued behind a long sleep kernel so the host is ahead of the GPU,
    launched eagerly, then the same ``n`` captured in a CUDA graph and replayed; GPU time
    per GEMM from CUDA events, beside the GEMM prediction with and without the eager gap."""
    import torch

    from fxshape.execution.step import regime_gaps

    x = torch.randn(64, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    pred = predict_matmul(64, 4096, 4096, dtype="bf16", gpu=gpu, layout="nt").time_s
    gaps = {ex: regime_gaps(ex, gpu)["gemm"] for ex in ("eager", "cudagraphs")}

    def per_kernel(launch, before=None):
        """GPU seconds per GEMM of ``launch`` (n GEMMs), events around it; ``before`` runs
        first, outside the events."""
        def once():
            if before is not None:
                before()
            start = torch.cuda.Event(enable_timing=True)
            stop = torch.cuda.Event(enable_timing=True)
            start.record()
            launch()
            stop.record()
            torch.cuda.synchronize()
            return start.elapsed_time(stop) * 1e-3 / n
        for _ in range(3):
            once()
        return statistics.median(once() for _ in range(5))

    def queue_behind_sleep():
        torch.cuda._sleep(50_000_000)  # ~25 ms: the host queues all n launches meanwhile
        torch.nn.functional.linear(x, w)  # the first one starts right after the sleep

    def linears():
        for _ in range(n):
            torch.nn.functional.linear(x, w)

    t_eager = per_kernel(linears, queue_behind_sleep)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            torch.nn.functional.linear(x, w)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        linears()
    t_graph = per_kernel(graph.replay)
    return [("launch", f"{n} queued eager linears 64x4096x4096", "bf16",
             pred + gaps["eager"], t_eager),
            ("launch", f"{n} linears in a CUDA graph 64x4096x4096", "bf16",
             pred + gaps["cudagraphs"], t_graph)]


def markdown(rows, skipped) -> str:
    out = []
    for sec in dict.fromkeys(r[0] for r in rows):
        sel = [r for r in rows if r[0] == sec]
        unit, scale = ("MiB", 2 ** -20) if sec == "memory" else ("us", 1e6)
        out.append(f"### {sec}\n\n| name | dtype | predicted {unit} | measured {unit} | "
                   "error % |\n|---|---|---|---|---|")
        errs = []
        for _, name, dt, p, t in sel:
            ok = p == p  # nan: nothing predicted for this row
            err = 100 * (p / t - 1) if ok else float("nan")
            if ok:
                errs.append(abs(err))
            out.append(f"| {name} | {dt} | {p * scale:.1f} | {t * scale:.1f} | {err:+.1f} |"
                       if ok else f"| {name} | {dt} | - | {t * scale:.1f} | - |")
        if errs:
            errs.sort()
            p90 = errs[min(len(errs) - 1, int(0.9 * len(errs)))]
            out.append(f"\nmedian |error| {statistics.median(errs):.1f}%, p90 {p90:.1f}% "
                       f"({len(errs)} rows)\n")
    if skipped:
        out.append("skipped (time budget): " + ", ".join(skipped))
    return "\n".join(out) + "\n"


def write(out_dir, rows, skipped):
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "gpu_check.csv"), "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(COLUMNS)
        for r in rows:
            w.writerow(list(r[:3]) + [f"{r[3]:.6e}", f"{r[4]:.6e}"])
    with open(os.path.join(out_dir, "gpu_check.md"), "w") as f:
        f.write(markdown(rows, skipped))


class _Timers:
    """One fxshape.fit.measure timer per dtype, created on first use."""

    def __init__(self, gpu, make):
        self.gpu, self.make, self.cache = gpu, make, {}

    def __call__(self, dt):
        if dt not in self.cache:
            self.cache[dt] = self.make(dt)
        return self.cache[dt]


def run(gpu, out_dir, budget_s, gemm_timer_factory, sdpa_timer, step_fn=gpt2_step,
        memop_timer=None):
    end = time.monotonic() + budget_s
    rows, skipped = [], []
    got, over = run_gemms(gemm_shapes(), _Timers(gpu, gemm_timer_factory), end)
    rows += got
    if over:
        skipped.append("part of the GEMM sections")
    got, over = run_sdpa(sdpa_shapes(), sdpa_timer, gpu, end)
    rows += got
    if over:
        skipped.append("part of sdpa")
    if memop_timer is None:
        skipped.append("memops (no timer)")
    else:
        got, over = run_memops(memop_shapes(), memop_timer, gpu, end)
        rows += got
        if over:
            skipped.append("part of memops")
    if time.monotonic() < end - 60 and step_fn is not None:
        try:
            rows += step_fn(gpu, out_dir=out_dir)
        except Exception as exc:  # report, do not lose the measured sections
            skipped.append(f"gpt2_step ({type(exc).__name__}: {str(exc)[:200]})")
    else:
        skipped.append("gpt2_step")
    write(out_dir, rows, skipped)
    return rows, skipped


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", default=os.path.join("docs", "gpu_check"))
    ap.add_argument("--gpu", default=None, help="fxshape GPU name (default: detected)")
    ap.add_argument("--budget-s", type=float, default=420.0)
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("gpu_check: needs a CUDA GPU visible to PyTorch (torch.cuda.is_available() is "
              "False)", file=sys.stderr)
        return 2
    from fxshape.fit.calibrate import detect_gpu
    from fxshape.fit.measure import CudaEventTimer
    from measure_attention import CudaTimer

    gpu = args.gpu or detect_gpu(torch.cuda.get_device_name(0))
    t0 = time.monotonic()
    rows, skipped = run(gpu, args.out_dir, args.budget_s,
                        lambda dt: CudaEventTimer(dt, warmup=5, repeats=20),
                        CudaTimer("bf16", warmup=3, repeats=10), memop_timer=memop_timer)
    print(markdown(rows, skipped))
    print(f"{len(rows)} rows in {time.monotonic() - t0:.0f} s; wrote {args.out_dir}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
