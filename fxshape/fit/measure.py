"""Timing GEMMs on the local GPU: the built-in sweep, CUDA-event medians, rotating operands.

Used by ``fxshape calibrate``, ``bench/measure_gemm.py`` and ``bench/gpu_check.py``.

Timing: CUDA events around each call, after warm-up; the median of ``repeats`` timed calls.
Operands are random normal (non-zero) data, and each call uses the next of several operand
sets whose total size exceeds twice the GPU's L2 cache, so no call finds its inputs in L2 from
the previous one (the rotating-buffer method). Rows are tagged ``timing=cuda-event-median``.
"""

from __future__ import annotations

import statistics

from ..hardware.dtypes import canonical_dtype, itemsize

__all__ = ["default_sweep", "cuda_event_median", "CudaEventTimer", "measure", "SOURCE",
           "TIMING"]

SOURCE = "fxshape-measure"
TIMING = "cuda-event-median"


def default_sweep(quick: bool = False):
    """Shapes as (sweep, op, layout, batch, m, n, k): the effects the model must capture."""
    shapes = []
    # steps of 7 visit every residue mod 8 (odd, /2, /4, /8 ...) in a sixth of the shapes
    step = 7 if quick else 1
    # alignment, step 1: N and K from 4032 to 4160 (odd, /2, /4, /8, ... sizes)
    for x in range(4032, 4161, step):
        shapes.append(("align/n_step1", "mm", "nn", 1, 4096, x, 4096))
        shapes.append(("align/k_step1", "mm", "nn", 1, 4096, 4096, x))
        shapes.append(("align/linear_n_step1", "linear", "nt", 1, 4096, x, 4096))
    # wave quantization: M fixed, N in steps of 64
    for n in range(1536, 6145, 256 if quick else 64):
        shapes.append(("wave/n_sweep", "mm", "nn", 1, 2304, n, 4096))
    # decode to prefill: tokens from 1 to 8192 through a 4096 x 14336 projection
    for m in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192):
        shapes.append(("tokens/m_sweep", "linear", "nt", 1, m, 14336, 4096))
    # batched GEMMs (attention-like)
    for b in (1, 8, 32, 128):
        for s in (128, 512, 2048):
            shapes.append(("bmm/attention", "bmm", "nn", b, s, s, 128))
    # compute-bound batched GEMMs beside single ones of the same size: the library's
    # strided-batched kernels run at their own rate (ModelParams.batched_eff; the
    # attention-like ones above are memory-bound and cannot tell it)
    for b in (1, 2, 8):
        for s in (2048,) if quick else (2048, 4096):
            shapes.append(("bmm/square", "bmm", "nn", b, s, s, s))
    return shapes


def cuda_event_median(call, warmup: int, repeats: int) -> float:
    """Median seconds of ``call(i)`` for i = 0 .. repeats-1, each between two CUDA events,
    after ``call(i)`` for i = 0 .. warmup-1 and a synchronize."""
    import torch

    for i in range(warmup):
        call(i)
    torch.cuda.synchronize()
    times = []
    for i in range(repeats):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        call(i)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


class CudaEventTimer:
    """Median CUDA-event time of one GEMM, with warm-up and rotating operand buffers."""

    def __init__(self, dtype: str, warmup: int = 10, repeats: int = 50, seed: int = 0):
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("CUDA is not available")
        self.torch = torch
        self.dkey = canonical_dtype(dtype)
        self.tdtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32,
                       "tf32": torch.float32}[self.dkey] if self.dkey != "fp8" else None
        if self.tdtype is None:
            raise ValueError("measure_gemm does not time fp8 (torch._scaled_mm) yet")
        torch.backends.cuda.matmul.allow_tf32 = self.dkey == "tf32"
        self.warmup, self.repeats = warmup, repeats
        self.gen = torch.Generator(device="cuda").manual_seed(seed)
        self.l2_bytes = torch.cuda.get_device_properties(0).L2_cache_size

    def _operands(self, op, layout, b, m, n, k):
        torch = self.torch
        per_set = (b * m * k + b * k * n) * itemsize(self.dkey)
        sets = max(2, -(-2 * self.l2_bytes // max(per_set, 1)) + 1)
        sets = min(sets, 64)
        out = []
        for _ in range(sets):
            a = torch.randn((b, m, k) if op == "bmm" else (m, k), generator=self.gen,
                            device="cuda", dtype=self.tdtype)
            if op == "bmm" and layout[1] == "t":  # B stored (batch, N, K): Q @ K^T
                w = torch.randn((b, n, k), generator=self.gen, device="cuda", dtype=self.tdtype)
            elif op == "linear" or layout[1] == "t":
                w = torch.randn((n, k), generator=self.gen, device="cuda", dtype=self.tdtype)
            else:
                w = torch.randn((b, k, n) if op == "bmm" else (k, n), generator=self.gen,
                                device="cuda", dtype=self.tdtype)
            out.append((a, w))
        return out

    def __call__(self, op, layout, b, m, n, k) -> float:
        torch = self.torch
        ops = self._operands(op, layout, b, m, n, k)
        if op == "linear":
            fn = torch.nn.functional.linear
        elif op == "bmm":
            fn = torch.bmm if layout[1] == "n" else (
                lambda a, w: torch.bmm(a, w.transpose(1, 2)))  # noqa: E731
        elif layout[1] == "t":
            fn = lambda a, w: torch.mm(a, w.t())  # noqa: E731
        else:
            fn = torch.mm
        return cuda_event_median(lambda i: fn(*ops[i % len(ops)]), self.warmup, self.repeats)


def measure(shapes, timer, *, gpu_label: str, dtype: str, source: str = SOURCE):
    """Time every shape with ``timer(op, layout, b, m, n, k) -> seconds``; rows in schema order."""
    dname = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32", "tf32": "tf32",
             "fp8": "float8_e4m3fn"}[canonical_dtype(dtype)]
    rows = []
    for sweep, op, layout, b, m, n, k in shapes:
        t = float(timer(op, layout, b, m, n, k))
        if not t > 0:
            raise ValueError(f"timer returned {t!r} for {(op, layout, b, m, n, k)}")
        rows.append((source, sweep, gpu_label, op, layout, dname, b, m, n, k, t, TIMING))
    return rows
