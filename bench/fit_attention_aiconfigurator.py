#!/usr/bin/env python
"""Fit the attention kernels of today's libraries on aiconfigurator's vLLM 0.24 tables, and
report their error on the attention shapes the fit never saw.

    python bench/fit_attention_aiconfigurator.py [--calibration-dir DIR] [--check]
                                                 [--format github]

Data: ``<calibration dir>/aiconfigurator/{h100_sxm,b200_sxm}_{context,generation}_attention
_perf.csv`` (README there): vLLM's attention layer timed under CUDA graphs, prefill
(``context``: ``isl`` query tokens per sequence, causal, no cached prefix) and decode
(``generation``: one query token over ``step`` cached tokens), bf16 queries with a bf16 or
fp8 KV cache, full or sliding-window attention. The kernels vLLM ran: FlashAttention-3 on
the H100 (``vllm_flash_attn_fa3``; FlashAttention-4 at head_dim 512), FlashInfer's
TensorRT-LLM kernels on the B200 (``vllm_flashinfer_trtllmprefill`` / ``...decode``; its
Triton kernel at head_dim 192).

What is fitted (``fxshape.cost.attention.predict_with`` and
``fxshape.cost.decode_attention.predict_decode``: the model that is fitted is the model that
ships; the GPU enters through its SMs, clocks, tensor-core and SFU rates, L2 and DRAM, and the
GEMM fit's constants for the same GPU):

- **prefill**, per kernel, :class:`~fxshape.cost.attention.KernelParams`: the MMAs' fraction
  of the GEMM rate, the fixed clocks per K/V block and per CTA, and a fixed cost per call;
- **decode**, per kernel, the decode model's constants
  (:class:`~fxshape.cost.decode_attention.DecodeAttentionParams`, with a fixed cost per CTA),
  for a paged cache of vLLM's 16-token blocks.

Held out: every row of one attention layer shape in four (query heads, KV heads, head
dimension), chosen by a hash of the shape, as the GEMM fit holds out weight shapes; the
constants are fitted on ``FIT_ROWS`` of the other shapes' rows, chosen by a hash. Rows of the
kernels vLLM runs beside the main one (FA4, Triton, the B200's one-token prefill through the
decode kernel) are not fitted: a last table prices them as ``attention="vllm"`` does (the
nearest modelled kernel) and says how far that is.

``--check`` recomputes the held-out errors with the packaged constants (fits nothing, writes
nothing). Without it, the constants are written into the ``kernels`` sections of
``fxshape/data/attention_params.json`` and ``decode_attention_params.json`` (the other
constants in those files are ``bench/fit_attention.py``'s and
``bench/fit_decode_attention.py``'s, which keep these sections). Deterministic; about two
minutes on two cores.
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import math
import os
import statistics
import sys
import zlib
from dataclasses import asdict, dataclass

import numpy as np
from scipy.optimize import least_squares
from tabulate import tabulate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

from fit_aiconfigurator import table_path, write_json  # noqa: E402

from fxshape.cost.attention import (AttentionShape, KernelParams, attention_params,  # noqa: E402
                                    forget_params_files, kernel_params, predict_with)
from fxshape.cost.decode_attention import (DecodeAttentionParams,  # noqa: E402
                                           decode_attention_params, predict_decode)
from fxshape.hardware.gpus import get_gpu  # noqa: E402

ATTENTION_OUT = os.path.join(ROOT, "fxshape", "data", "attention_params.json")
DECODE_OUT = os.path.join(ROOT, "fxshape", "data", "decode_attention_params.json")
SOURCE = "ai-dynamo/aiconfigurator@095f58a51 (vLLM 0.24.0)"
#: (GPU, table prefix, model kernel, prefill kernel_source, decode kernel_source)
PLAN = (("h100-sxm", "h100_sxm", "fa3", "vllm_flash_attn_fa3", "vllm_flash_attn_fa3"),
        ("b200", "b200_sxm", "trtllm", "vllm_flashinfer_trtllmprefill",
         "vllm_flashinfer_trtllmdecode"))
HELD_OUT_MOD = 4  # one attention layer shape in four is held out
FIT_ROWS = 1200
PAGE = 16  # vLLM's default KV block: tokens per page
_KV = {"bfloat16": "bf16", "fp8": "fp8"}

_PREFILL_BOUNDS = dict(mma_frac=(0.3, 1.0), block_cycles=(0.0, 4000.0),
                       cta_cycles=(0.0, 40000.0), call_s=(0.0, 3e-5), row_cycles=(0.0, 1000.0),
                       layer_kv_bytes=(0.0, 64.0))
_PREFILL_START = dict(mma_frac=0.8, block_cycles=300.0, cta_cycles=2000.0, call_s=5e-6,
                      row_cycles=50.0, layer_kv_bytes=4.0)
_DECODE_NAMES = ("fixed_s", "combine_s", "dram_efficiency", "cta_bytes_per_clk", "page_s",
                 "cta_s", "fp8_kv_cost")
_DECODE_BOUNDS = dict(fixed_s=(0.0, 5e-5), combine_s=(0.0, 5e-5), dram_efficiency=(0.3, 1.0),
                      cta_bytes_per_clk=(1.0, 512.0), page_s=(0.0, 1e-6), cta_s=(0.0, 2e-5),
                      fp8_kv_cost=(0.5, 2.0))
_DECODE_START = dict(fixed_s=8e-6, combine_s=2e-6, dram_efficiency=0.8, cta_bytes_per_clk=32.0,
                     page_s=1e-8, cta_s=5e-7, fp8_kv_cost=1.0)
#: the occupancies (CTAs per SM) and split caps tried for the decode kernel: integers, so
#: a grid, each point with the other constants fitted
_CTAS_PER_SM = (1, 2, 4)
_DECODE_GRID = ("ctas_per_sm", "max_splits")
_MAX_SPLITS = (16, 32, 64, 128)


@dataclass(frozen=True)
class Row:
    """One timed attention call of a table."""

    gpu: str
    phase: str  # "prefill" or "decode"
    source: str  # the table's kernel_source
    batch: int
    heads: int
    kv_heads: int
    head_dim: int
    seq: int  # prefill: query (= key) tokens per sequence; decode: context tokens
    window: int
    kv: str  # "bf16" or "fp8"
    time_s: float

    @property
    def layer(self) -> tuple:
        return (self.heads, self.kv_heads, self.head_dim)

    @property
    def held_out(self) -> bool:
        """A hash of the layer shape, not a random draw: the same on every machine."""
        return zlib.crc32("{}x{}x{}".format(*self.layer).encode()) % HELD_OUT_MOD == 0

    def shape(self) -> AttentionShape:
        return AttentionShape(self.batch, self.heads, self.kv_heads, self.seq, self.seq,
                              self.head_dim, self.head_dim, causal=True, window=self.window)


@functools.lru_cache(maxsize=None)
def read_table(gpu: str, prefix: str, phase: str, directory=None) -> tuple[Row, ...]:
    """The bf16 rows of one prefill (``context``) or decode (``generation``) table, read
    once per process (the fit, the held-out check and the other-kernels table share it)."""
    name = "context" if phase == "prefill" else "generation"
    path = table_path(f"{prefix}_{name}_attention_perf", directory)
    out = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            if r["attn_dtype"] != "bfloat16" or r["kv_cache_dtype"] not in _KV:
                continue
            seq = int(r["isl"]) if phase == "prefill" else int(r["step"]) + 1
            out.append(Row(gpu, phase, r["kernel_source"], int(r["batch_size"]),
                           int(r["num_heads"]), int(r["num_key_value_heads"]),
                           int(r["head_dim"]), seq, int(r["window_size"]),
                           _KV[r["kv_cache_dtype"]], float(r["time_s"])))
    return tuple(out)


def _sample(rows, n=FIT_ROWS):
    key = (lambda r: (zlib.crc32(repr(asdict(r)).encode()), r.batch, r.seq))
    return sorted(rows, key=key)[:n]


# ---------------------------------------------------------------------------------------
# Prefill
# ---------------------------------------------------------------------------------------

def cache_write_s(r: Row, kp: KernelParams) -> float:
    """vLLM's attention layer writes the new keys and values into the paged KV cache
    (``reshape_and_cache_flash``) beside the attention kernel: a memory-bound pass of
    ``kp.layer_kv_bytes`` per new K/V element, at the GEMM fit's DRAM efficiency, and one
    launch."""
    from fxshape.cost.gemm import model_params

    spec = get_gpu(r.gpu)
    gp = model_params(spec)
    tokens = r.batch * (r.seq if r.phase == "prefill" else 1)
    nbytes = tokens * r.kv_heads * 2 * r.head_dim * kp.layer_kv_bytes
    return nbytes / (spec.memory_bandwidth_gbs * 1e9 * gp.dram_eff) + gp.launch_s


def predict_prefill(r: Row, kernel: str, kp: KernelParams | None = None,
                    attention: str | None = None) -> float:
    """The layer: the cache write, then the attention kernel (with, for an fp8 cache, the
    query's quantization)."""
    spec = get_gpu(r.gpu)
    kp = kp or kernel_params(kernel)
    p = predict_with(attention_params(), r.shape(), "forward", attention or kernel, "bf16",
                     spec, kernels={kernel: kp}, kv_key=r.kv)
    return p.time_s + cache_write_s(r, kp)


def _u(lo, hi, v):
    x = min(max((v - lo) / (hi - lo), 1e-6), 1 - 1e-6)
    return math.log(x / (1 - x))


def _v(lo, hi, u):
    return lo + (hi - lo) / (1 + math.exp(-max(min(u, 50), -50)))


def _fit(names, bounds, start, residual):
    def values(x):
        return {n: _v(*bounds[n], u) for n, u in zip(names, x)}

    x0 = np.array([_u(*bounds[n], start[n]) for n in names])
    sol = least_squares(lambda x: residual(values(x)), x0, diff_step=1e-3, max_nfev=300,
                        loss="soft_l1", f_scale=0.1)
    # five significant digits; a constant the fit drove onto its lower bound is written as
    # the bound (a 1e-28 is a zero the optimizer did not reach)
    out = {}
    for n, v in values(sol.x).items():
        lo, hi = bounds[n]
        out[n] = float(f"{lo if v - lo < 1e-6 * (hi - lo) else v:.5g}")
    return out


def fit_prefill(rows, kernel: str) -> KernelParams:
    train = _sample(rows)
    names = KernelParams.FIELDS

    def residual(vals):
        kp = KernelParams(**vals)
        return np.array([math.log(predict_prefill(r, kernel, kp) / r.time_s) for r in train])

    return KernelParams(**_fit(names, _PREFILL_BOUNDS, _PREFILL_START, residual),
                        source=f"fitted by bench/fit_attention_aiconfigurator.py on {SOURCE}: "
                               f"{rows[0].gpu} {kernel} prefill, {len(train)} rows of the "
                               "layer shapes not held out")


# ---------------------------------------------------------------------------------------
# Decode
# ---------------------------------------------------------------------------------------

def predict_dec(r: Row, kernel: str, params: DecodeAttentionParams | None = None,
                kp: KernelParams | None = None) -> float:
    """The layer: the cache write (the prefill fit's ``layer_kv_bytes``), then the decode
    kernel."""
    spec = get_gpu(r.gpu)
    context = min(r.seq, r.window) if r.window else r.seq
    p = predict_decode(r.batch, r.heads, r.kv_heads, 1, context, r.head_dim, gpu=spec,
                       itemsize=2, kv_itemsize=1 if r.kv == "fp8" else 2, page_size=PAGE,
                       params=params, kernel=kernel)
    return p.time_s + cache_write_s(r, kp or kernel_params(kernel))


def fit_decode(rows, kernel: str, kp: KernelParams) -> DecodeAttentionParams:
    train = _sample(rows)

    def residual(vals):
        p = DecodeAttentionParams(**vals)
        return np.array([math.log(predict_dec(r, kernel, p, kp) / r.time_s) for r in train])

    best = None
    for occ in _CTAS_PER_SM:
        for cap in _MAX_SPLITS:
            grid = {"ctas_per_sm": float(occ), "max_splits": cap}

            def res_grid(vals, grid=grid):
                return residual({**vals, **grid})

            vals = {**_fit(_DECODE_NAMES, _DECODE_BOUNDS, _DECODE_START, res_grid), **grid}
            score = float(np.mean(np.abs(residual(vals))))
            if best is None or score < best[0]:
                best = (score, vals)
    vals = best[1]
    return DecodeAttentionParams(**vals, source=(
        f"fitted by bench/fit_attention_aiconfigurator.py on {SOURCE}: {rows[0].gpu} {kernel} "
        f"decode, {len(train)} rows of the layer shapes not held out; paged cache, "
        f"{PAGE}-token pages"))


# ---------------------------------------------------------------------------------------
# Tables
# ---------------------------------------------------------------------------------------

def _stats(errs) -> tuple:
    a = sorted(abs(e) for e in errs)
    n = len(a)
    return n, a[n // 2], a[min(n - 1, int(0.9 * n))], statistics.median(errs)


def _row(label, errs):
    n, med, p90, signed = _stats(errs)
    return [*label, n, f"{100 * med:.1f}%", f"{100 * p90:.1f}%", f"{100 * signed:+.1f}%"]


def main_rows(rows, phase: str, source: str) -> list[Row]:
    """The rows of the kernel the model is fitted to: its kernel_source, the head
    dimensions it runs (not FA4's 512 on the H100, which vLLM sends elsewhere)."""
    out = [r for r in rows if r.source == source]
    if phase == "prefill" and source.endswith("fa3"):
        out = [r for r in out if r.head_dim <= 256]
    return out


def held_out_errors(phase: str, kernel: str, rows, params, kp: KernelParams) -> list[tuple]:
    """``[(row, signed error)]`` of the held-out rows under ``params`` (prefill: ``kp``)."""
    out = []
    for r in rows:
        if not r.held_out:
            continue
        t = predict_prefill(r, kernel, kp) if phase == "prefill" else \
            predict_dec(r, kernel, params, kp)
        out.append((r, t / r.time_s - 1))
    return out


def breakdown(results) -> list[list]:
    """Per GPU, phase, KV dtype and window: the held-out rows' error."""
    body = []
    groups: dict = {}
    for r, e in results:
        groups.setdefault((r.gpu, r.phase, r.kv), []).append(e)
        groups.setdefault((r.gpu, r.phase, "all"), []).append(e)
    for key in sorted(groups):
        body.append(_row(key, groups[key]))
    return body


def others_table(directory=None) -> list[list]:
    """The rows of the kernels vLLM runs that the model does not have, priced as
    ``attention="vllm"`` prices them."""
    body = []
    for gpu, prefix, kernel, psrc, dsrc in PLAN:
        for phase in ("prefill", "decode"):
            rows = read_table(gpu, prefix, phase, directory)
            main = set(id(r) for r in main_rows(rows, phase, psrc if phase == "prefill" else dsrc))
            other = [r for r in rows if id(r) not in main]
            groups: dict = {}
            for r in other:
                if phase == "prefill" and r.seq == 1:
                    continue  # one-token prefill (the B200 runs it through the decode kernel)
                if phase == "prefill":
                    t = predict_prefill(r, kernel, attention="vllm")
                else:
                    t = predict_dec(r, kernel)
                groups.setdefault((gpu, phase, r.source, r.head_dim), []).append(t / r.time_s - 1)
            for key in sorted(groups):
                body.append(_row(key, groups[key]))
    return body


def paper_check() -> list[list]:
    """Today's FA3 forward constants on another source they were not fitted to: the
    FlashAttention-3 paper's H100 forward figures (standalone FA3 of 2024, bf16; the rows
    ``bench/fit_attention.py`` reads), beside the shared constants fitted on them."""
    import fit_attention as fa

    rows = [r for r in fa.read_rows() if r.kernel == "fa3" and r.direction == "forward"]
    with open(fa._CAUSAL, newline="") as fh:
        rows += [r for r in (fa.Row(d) for d in csv.DictReader(fh)) if r.kernel == "fa3"]
    body = []
    for label, kernels in (("today's FA3 forward (held out)", None),
                           ("the paper's own fit (in sample)", {})):
        errs = [r.shape.flops() / predict_with(attention_params(), r.shape, "forward", "fa3",
                                               r.dtype, r.spec, kernels=kernels).time_s
                / 1e12 / r.tflops - 1 for r in rows]
        # errors in time: measured TFLOP/s over predicted, less one
        body.append(_row((label,), [1 / (1 + e) - 1 for e in errs]))
    return body


def published_decode_check() -> list[list]:
    """Today's decode constants on published kernel timings they were not fitted to
    (``bench/decode_attention_published.csv``: FA3 on Hopper GPUs, TensorRT-LLM's kernels on
    the B200, standalone kernels without vLLM's layer), beside the default constants
    (FlashAttention-2's split-KV fit, whose fit rows include some of these)."""
    import fit_decode_attention as fd

    body = []
    for r in fd.rows():
        spec = get_gpu(r["gpu"])
        kernel = {"fa3": "fa3" if spec.arch == "hopper" else None,
                  "trtllm-gen": "trtllm" if spec.tcgen05 else None}.get(r["kernel"])
        if kernel is None or r["split"] == "excluded":
            continue
        args = (int(r["batch"]), int(r["heads"]), int(r["kv_heads"]), int(r["q_len"]),
                int(r["context"]), int(r["head_dim"]))
        kw = dict(gpu=spec, itemsize=fd._ITEM[r["dtype"]], page_size=int(r["page"]) or None)
        meas = float(r["time_us"]) * 1e-6
        now = predict_decode(*args, **kw, kernel=kernel).time_s / meas - 1
        default = predict_decode(*args, **kw).time_s / meas - 1
        body.append([r["gpu"], r["kernel"], r["split"], "x".join(map(str, args)), r["page"],
                     f"{meas * 1e6:.1f}", f"{100 * now:+.0f}", f"{100 * default:+.0f}"])
    return body


def run(directory=None, check: bool = False):
    """Fit (or with ``check`` read) the constants; returns ``(fitted, held-out results,
    before)``: ``fitted`` ``{(phase, kernel): params}``, the held-out ``[(row, error)]``,
    and the errors of what the same calls cost before (FA2-era shared constants)."""
    fitted, results, before = {}, [], []
    for gpu, prefix, kernel, psrc, dsrc in PLAN:
        for phase, source in (("prefill", psrc), ("decode", dsrc)):
            rows = main_rows(read_table(gpu, prefix, phase, directory), phase, source)
            train = [r for r in rows if not r.held_out]
            if phase == "prefill":
                kp = kernel_params(kernel) if check else fit_prefill(train, kernel)
                params = kp
            else:
                params = decode_attention_params(kernel=kernel) if check else \
                    fit_decode(train, kernel, kp)
            fitted[(phase, kernel)] = params
            results += held_out_errors(phase, kernel, rows, params, kp)
            # before: the kernels' shared constants (FA3's 2024 fit on the H100; FA2's on
            # the B200, which had no model of its own kernel); decode: FlashAttention-2's
            # split-KV fit. The layer's cache write is priced as now in both, so the two
            # tables compare the kernel models.
            old = "fa3" if kernel == "fa3" else "flash"
            for r in rows:
                if r.held_out:
                    if phase == "prefill":
                        t = predict_with(attention_params(), r.shape(), "forward", old, "bf16",
                                         get_gpu(gpu), kernels={}, kv_key=None).time_s \
                            + cache_write_s(r, kp)
                    else:
                        t = predict_dec(r, None, decode_attention_params(), kp)
                    before.append((r, t / r.time_s - 1))
    return fitted, results, before


def write(fitted) -> None:
    with open(ATTENTION_OUT) as f:
        att = json.load(f)
    att["kernels"] = {k: {**{n: getattr(p, n) for n in KernelParams.FIELDS}, "source": p.source}
                      for (phase, k), p in sorted(fitted.items()) if phase == "prefill"}
    write_json(ATTENTION_OUT, att)
    with open(DECODE_OUT) as f:
        dec = json.load(f)
    dec["kernels"] = {k: {**{n: getattr(p, n) for n in _DECODE_NAMES + _DECODE_GRID},
                          "source": p.source}
                      for (phase, k), p in sorted(fitted.items()) if phase == "decode"}
    write_json(DECODE_OUT, dec)
    forget_params_files()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--calibration-dir", default=None)
    ap.add_argument("--check", action="store_true",
                    help="the packaged constants' held-out errors; fit and write nothing")
    ap.add_argument("--format", default="simple")
    args = ap.parse_args(argv)
    fitted, results, before = run(args.calibration_dir, check=args.check)
    if not args.check:
        write(fitted)
    print("constants:")
    for (phase, kernel), p in sorted(fitted.items()):
        names = KernelParams.FIELDS if phase == "prefill" else \
            _DECODE_NAMES + _DECODE_GRID
        print(f"  {phase} {kernel}: " + ", ".join(f"{n}={getattr(p, n):.4g}" for n in names))
    head = ("gpu", "phase", "KV cache", "rows", "median |error|", "p90", "median signed")
    print("\nheld-out layer shapes, today's constants (+: predicted slower):")
    print(tabulate(breakdown(results), headers=head, tablefmt=args.format,
                   disable_numparse=True))
    print("\nthe same rows with the constants they had before (FA3: the FA3 paper's fit; "
          "B200: FlashAttention-2's; decode: FlashAttention-2's split-KV fit):")
    print(tabulate(breakdown(before), headers=head, tablefmt=args.format,
                   disable_numparse=True))
    print("\nthe FA3 paper's H100 forward figures (standalone FA3 of 2024, 30 rows; "
          "bench/attention_published*.csv):")
    print(tabulate(paper_check(), headers=("constants", "rows", "median |error|", "p90",
                                           "median signed"),
                   tablefmt=args.format, disable_numparse=True))
    print("\npublished decode kernel timings (bench/decode_attention_published.csv; "
          "'fit': the default constants' fit rows), error % with the kernel's constants and "
          "with the default ones:")
    print(tabulate(published_decode_check(),
                   headers=("gpu", "kernel", "split", "b x h x kv x q x ctx x d", "page",
                            "measured us", "kernel's", "default"),
                   tablefmt=args.format, disable_numparse=True))
    print("\nkernels vLLM runs that the model prices as another (attention='vllm'), every "
          "row (none fitted):")
    print(tabulate(others_table(args.calibration_dir),
                   headers=("gpu", "phase", "kernel_source", "head_dim", "rows",
                            "median |error|", "p90", "median signed"),
                   tablefmt=args.format, disable_numparse=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
