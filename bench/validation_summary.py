#!/usr/bin/env python
"""Per GPU and regime, how far fxshape's predictions are from published measurements they
were not fitted to; writes ``fxshape/data/validation.json``, which ``fxshape gpus``, the
report's notes and ``report.step.error_band`` read.

    python bench/validation_summary.py [--format github] [--out PATH]

Regimes and where their errors come from (every row held out: see each script's docstring):

- ``gemm``: fp16/bf16 tensor-core GEMMs. ``bench/validate_heldout.py``'s held-out errors
  (each calibration row predicted by a fit that left its TP degree or sweep out; the
  calibration data under ``../shared/calibration``), and the bf16 rows of
  ``bench/validate_block_formats.py`` (vLLM's kernel benchmarks: B200, H100). For a GPU
  whose packaged constants were refitted to today's libraries (``bench/fit_aiconfigurator.py``:
  H100 SXM, B200) the leave-one-out folds of its 2022-2024 sweeps validate the 2024
  generation, not what it predicts now: its rows are instead the packaged constants' errors
  on the aiconfigurator rows that fit held out (a quarter of the weight shapes);
- ``gemm-fp8``, ``gemm-nvfp4``: the FP8 and NVFP4 rows of ``bench/validate_block_formats.py``
  (the GEMM with its activation quantization, as vLLM runs it), and the rows of
  aiconfigurator's FP8 (H100, B200) and NVFP4 (B200) tables that
  ``bench/fit_quant_aiconfigurator.py`` holds out (a quarter of the weight shapes);
- ``step-fp32``, ``step-fp32-compiled``: ``bench/validate_e2e.py`` (whole Hugging Face
  models in fp32, eager (inference and training; NeuSight's eleven GPUs) and under
  ``torch.compile`` (inference; H100, A100 PCIe 40 GB, L4));
- ``step-train``: ``bench/validate_training.py`` (multi-GPU bf16/fp16 training steps:
  Megatron-LM, torchtitan and others; llm-foundry's Transformer Engine FP8 runs) and the
  bf16 runs of ``bench/validate_float8.py``
  (torchtitan Llama-3-8B on H100, MI300X and B200);
- ``serving``: ``bench/validate_serving.py``'s rows (gpt-fast decode, vLLM latency), each
  predicted with the row's own engine options;
- ``step-inference``: the unquantized rows of ``bench/quantized_published.csv``
  (TensorRT-LLM's FP16 time to the first token);
- ``collectives``: the half of aiconfigurator's nccl-tests tables (DGX H100, DGX B200)
  that ``bench/fit_comm_aiconfigurator.py`` holds out;
- ``allreduce-custom``: ``bench/fit_allreduce_aiconfigurator.py``'s held-out rows (vLLM's
  custom all-reduce under CUDA graphs: every DGX H100 row, the half of the DGX B200's its
  constants were not fitted to);
- ``attention-prefill``, ``attention-decode``: ``bench/fit_attention_aiconfigurator.py``'s
  held-out layer shapes (vLLM 0.24's attention layer: FlashAttention-3 on the H100,
  FlashInfer's TensorRT-LLM kernels on the B200; bf16 and fp8 KV caches).

A record holds the rows' count, the median, 90th percentile and largest absolute error, and
the median signed error (+: predicted slower than measured; None where any row has only its
absolute error). Deterministic; about ten minutes on two cores (the GEMM folds
refit the model).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

from tabulate import tabulate  # noqa: E402

from fxshape.hardware.gpus import get_gpu  # noqa: E402
from fxshape.hardware.validation import REGIMES, VALIDATION_PATH  # noqa: E402
from fxshape.serving.scheduler import percentile  # noqa: E402

SOURCES = {
    "gemm": "bench/validate_heldout.py (leave one group out), bench/fit_aiconfigurator.py "
            "(held-out weight shapes) and bench/validate_block_formats.py",
    "gemm-fp8": "bench/validate_block_formats.py and bench/fit_quant_aiconfigurator.py "
                "(held-out weight shapes)",
    "gemm-nvfp4": "bench/validate_block_formats.py and bench/fit_quant_aiconfigurator.py "
                  "(held-out weight shapes)",
    "step-fp32": "bench/validate_e2e.py",
    "step-fp32-compiled": "bench/validate_e2e.py (compiled runs)",
    "step-train": "bench/validate_training.py and bench/validate_float8.py (bf16 runs)",
    "serving": "bench/validate_serving.py",
    "step-inference": "bench/validate_quantized.py (unquantized rows)",
    "collectives": "bench/fit_comm_aiconfigurator.py (the held-out half)",
    "allreduce-custom": "bench/fit_allreduce_aiconfigurator.py (held-out rows)",
    "attention-prefill": "bench/fit_attention_aiconfigurator.py (held-out layer shapes)",
    "attention-decode": "bench/fit_attention_aiconfigurator.py (held-out layer shapes)",
}
#: the GPU of each machine the aiconfigurator tables measured
_MACHINE_GPU = {"dgx-h100": "h100-sxm", "dgx-b200": "b200"}


def _gemm(out):
    import validate_heldout

    from fxshape.cost.gemm import CURRENT_LIBRARY, constants_library

    for sku, (_, _, held, _) in validate_heldout.heldout().items():
        if constants_library(sku) == CURRENT_LIBRARY:
            continue  # its sweeps validate the 2024 generation: _aiconfigurator below
        out.setdefault((sku, "gemm"), []).extend((float(e), None) for e in held)


def _aiconfigurator(out):
    import fit_aiconfigurator as f

    from fxshape.cost.gemm import model_params

    for name, prefix in f.PLAN:
        _, held = f.split(f.read_gemm_table(prefix))
        err, _ = f.errors(get_gpu(name), model_params(name), held)
        out.setdefault((name, "gemm"), []).extend((abs(float(e)), float(e)) for e in err)


def _block(out):
    import validate_block_formats as v

    regime = {"bf16": "gemm", "fp8": "gemm-fp8", "nvfp4": "gemm-nvfp4"}
    for r in v.rows():
        if r["kernel"] not in regime:  # the -noquant rows: the GEMM alone, not a layer
            continue
        e = v.predict(r["kernel"], int(r["m"]), int(r["n"]), int(r["k"]), r["gpu"]) \
            / v.measured_s(r) - 1
        out.setdefault((get_gpu(r["gpu"]).name, regime[r["kernel"]]), []).append((abs(e), e))


def _quant(out):
    import fit_quant_aiconfigurator as f

    from fxshape.cost.quant import predict_quantized_times

    for name, prefix, method, dtype, kernel in f.PLAN:
        m, n, k, t = f.read_rows(prefix, dtype, kernel)
        _, held = f.split(m, n, k)
        err = predict_quantized_times(name, method, m[held], n[held], k[held]) / t[held] - 1
        out.setdefault((name, f"gemm-{method}"), []).extend((abs(float(e)), float(e))
                                                            for e in err)


def _e2e(out):
    import validate_e2e

    for res in validate_e2e.errors():
        regime = "step-fp32" if res.row["execution"] == "eager" else "step-fp32-compiled"
        out.setdefault((get_gpu(res.row["gpu"]).name, regime), []).append((abs(res.error),
                                                                           res.error))


def _training(out):
    import validate_training as v

    for r in v.rows():
        e = v.analyze(r).step.time_s / v.measured_step(r) - 1
        out.setdefault((get_gpu(r["gpu"]).name, "step-train"), []).append((abs(e), e))


def _serving(out):
    import fxshape
    import validate_serving as v

    with open(v.DATA, newline="") as f:
        rows = list(csv.DictReader(f))
    models = {}
    for r in rows:
        m = models.setdefault(r["model"], v.model_of(r["model"]))
        got = fxshape.serve(m, allreduce=r["allreduce"], fuse=r["fuse"], gemv=r["gemv"],
                            **v.serve_kwargs(r))
        meas = float(r["measured"])
        e = (getattr(got, r["metric"]) - meas) / meas
        out.setdefault((get_gpu(r["gpu"]).name, "serving"), []).append((abs(e), e))


def _inference(out):
    import fxshape
    import validate_quantized as v
    from fxshape.presets import build_preset

    with open(v.DATA, newline="") as f:
        rows = [r for r in csv.DictReader(f) if not r["quantize"]]
    for r in rows:
        got = fxshape.serve(build_preset(r["model"]), **v.serve_kwargs(r))
        meas = float(r["measured"])
        e = (getattr(got, r["metric"]) - meas) / meas
        out.setdefault((get_gpu(r["gpu"]).name, "step-inference"), []).append((abs(e), e))


def _float8(out):
    import validate_float8 as v
    from fxshape.presets import build_preset

    with open(v.DATA, newline="") as f:
        rows = [r for r in csv.DictReader(f) if not r["recipe"]]  # the bf16 runs
    models = {}
    for r in rows:
        m = models.setdefault(r["model"], build_preset(r["model"]))
        # tokens per second per GPU: the step's time error is measured / predicted - 1
        e = float(r["measured"]) / v.predict(m, r) - 1
        out.setdefault((get_gpu(r["gpu"]).name, "step-train"), []).append((abs(e), e))


def _collectives(out):
    import fit_comm_aiconfigurator as f

    constants = f.packaged()  # the shipped constants' errors, not a refit's
    for machine, prefix in f.PLAN:
        held = f.held_out(machine, prefix, constants[machine])
        out.setdefault((_MACHINE_GPU[machine], "collectives"), []).extend(
            (abs(e), e) for _, e in held)


def _custom_allreduce(out):
    import fit_allreduce_aiconfigurator as f

    for r, e in f.held_out(f.load()):
        out.setdefault((_MACHINE_GPU[r["machine"]], "allreduce-custom"), []).append((abs(e), e))


def _attention(out):
    import fit_attention_aiconfigurator as f

    _, results, _ = f.run(check=True)
    for r, e in results:
        out.setdefault((get_gpu(r.gpu).name, f"attention-{r.phase}"), []).append((abs(e), e))


COLLECTORS = (_gemm, _aiconfigurator, _block, _quant, _e2e, _training, _float8, _serving, _inference,
              _collectives, _custom_allreduce, _attention)


def summarize(errors) -> dict:
    """``{gpu: {regime: record}}`` from ``{(gpu, regime): [(|error|, signed or None)]}``."""
    gpus: dict = {}
    for (gpu, regime), pairs in sorted(errors.items()):
        absolute = [a for a, _ in pairs]
        # a sign only where every row has one (the GEMM folds keep absolute errors)
        signed = [s for _, s in pairs] if all(s is not None for _, s in pairs) else []
        gpus.setdefault(gpu, {})[regime] = {
            "n": len(absolute),
            "median": round(statistics.median(absolute), 6),
            "p90": round(percentile(absolute, 90), 6),
            "max": round(max(absolute), 6),
            "signed_median": round(statistics.median(signed), 6) if signed else None,
            "source": SOURCES[regime],
        }
    return gpus


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--format", default="simple")
    ap.add_argument("--out", default=VALIDATION_PATH)
    args = ap.parse_args(argv)
    errors: dict = {}
    for collect in COLLECTORS:
        collect(errors)
        print(f"{collect.__name__.strip('_')}: done", file=sys.stderr, flush=True)
    gpus = summarize(errors)
    doc = {"comment": "Held-out error of fxshape's predictions per GPU and regime, written by "
                      "bench/validation_summary.py: do not edit by hand. Fractions.",
           "regimes": dict(REGIMES), "gpus": gpus}
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write("\n")
    table = [(g, reg, r["n"], f"{100 * r['median']:.1f}%", f"{100 * r['p90']:.1f}%",
              "" if r["signed_median"] is None else f"{100 * r['signed_median']:+.1f}%")
             for g, regs in gpus.items() for reg, r in regs.items()]
    print(tabulate(table, headers=("GPU", "regime", "rows", "median abs error", "p90",
                                   "median signed"), tablefmt=args.format,
                   disable_numparse=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
