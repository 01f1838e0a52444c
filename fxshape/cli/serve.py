"""``fxshape serve``: a batch of requests end to end, a server under load, the capacity within SLOs, speculative decoding."""

from __future__ import annotations

import argparse

from tabulate import tabulate

from ..serving.batch import FUSE_CHOICES
from ..tracing.export import MAX_SIZE
from .args import _allreduce_arg, _gemv_arg, _int_list, _positive_int, _quantize_args, setup_flag
from .shared import _quantization


_SPEC_FLAGS = ("num_speculative_tokens", "acceptance", "acceptance_length")


_LOAD_FLAGS = ("num_requests", "rate", "trace", "max_concurrency", "max_num_seqs",
               "max_num_batched_tokens", "block_size", "gpu_memory_utilization", "seed")


def _length_arg(text: str):
    from ..serving.traffic import parse_length

    try:
        lo, hi = parse_length("length", text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer or a range lo:hi, got "
                                         f"{text!r}") from None
    if hi > MAX_SIZE:
        raise argparse.ArgumentTypeError(f"expected lengths up to {MAX_SIZE}, got {text!r}")
    return lo if lo == hi else (lo, hi)


def _float_arg(ok, expected: str):
    """An argparse type: a float for which ``ok`` holds, else "expected ``expected``"."""
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            v = float("nan")
        if not ok(v):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return v
    return parse


_rate_arg = _float_arg(lambda v: v > 0, "a positive number of requests per second or inf")


_unit_arg = _float_arg(lambda v: 0 <= v <= 1, "a probability in [0, 1]")


_fraction_arg = _float_arg(lambda v: 0 < v <= 1, "a fraction in (0, 1]")


_tokens_arg = _float_arg(lambda v: 1 <= v < float("inf"),
                         "a mean number of tokens per step of at least 1")


def run(args) -> int:
    from ..presets import load_target

    load = args.rate is not None or args.num_requests is not None or args.trace is not None
    if args.gemv is not None and (load or args.draft is not None or args.slo_ttft is not None
                                  or args.slo_itl is not None):
        raise ValueError("--gemv applies to one batch without --draft (gpt-fast's batch-1 "
                         "decode); under load, speculation or capacity planning the engine "
                         "runs the library's GEMMs")
    if args.slo_ttft is not None or args.slo_itl is not None:
        return _serve_capacity(args, load_target)
    slo = [f"--{f.replace('_', '-')}" for f in ("slo_percentile", "tp_choices")
           if getattr(args, f) is not None]
    if slo:
        raise ValueError(f"{', '.join(slo)}: only with --slo-ttft or --slo-itl (capacity "
                         "planning)")
    given = [f"--{f.replace('_', '-')}" for f in _LOAD_FLAGS
             if getattr(args, f) is not None]
    spec = [f"--{f.replace('_', '-')}" for f in _SPEC_FLAGS if getattr(args, f) is not None]
    if spec and args.draft is None:
        raise ValueError(f"{', '.join(spec)}: only with --draft (speculative decoding)")
    if not load and given:
        raise ValueError(f"{', '.join(given)}: only for a server under load; give --rate and "
                         "--num-requests, or --trace")
    if load:
        if args.batch_size is not None or args.page_size is not None:
            raise ValueError("--batch-size and --page-size apply to one batch; under load the "
                             "scheduler makes the batches (--max-num-seqs, "
                             "--max-num-batched-tokens) in KV blocks of --block-size")
        return _serve_load(args, load_target(args.target))
    for name in ("prompt_len", "output_len"):
        v = getattr(args, name)
        if v is None:
            raise ValueError(f"--{name.replace('_', '-')} is required (tokens per request)")
        if isinstance(v, tuple):
            raise ValueError(f"--{name.replace('_', '-')} {v[0]}:{v[1]}: a range applies to "
                             "a server under load (--rate, --num-requests); one batch takes "
                             "one length")
    if args.draft is not None:
        if args.page_size is not None:
            raise ValueError("--page-size: speculative decoding is priced with vLLM's 16-token "
                             "KV blocks")
        return _serve_speculative(args, load_target(args.target))
    return _serve_batch(args, load_target(args.target))


def _serve_capacity(args, load_target) -> int:
    import json

    from ..serving import plan_capacity

    bad = [f"--{f.replace('_', '-')}" for f in ("trace", "max_concurrency", "batch_size",
                                                 "page_size")
           if getattr(args, f) is not None]
    if args.tp != 1:
        bad.append("--tp (give the degrees to try with --tp-choices)")
    if bad:
        raise ValueError(f"{', '.join(bad)}: not with --slo-ttft / --slo-itl (capacity "
                         "planning tries --tp-choices, each with Poisson arrivals)")
    for name in ("prompt_len", "output_len"):
        if getattr(args, name) is None:
            raise ValueError(f"capacity planning needs --{name.replace('_', '-')}")
    engine = {k: getattr(args, k) for k in ("max_num_seqs", "max_num_batched_tokens")
              if getattr(args, k) is not None}
    if args.block_size is not None:
        engine["block_size"] = args.block_size
    if args.gpu_memory_utilization is not None:
        engine["gpu_memory_utilization"] = args.gpu_memory_utilization
    engine.update(_draft_options(args, load_target))
    if args.quantize is not None:
        engine["quantize"] = _quantization(args)
    engine["fuse"] = args.fuse or "all"
    r = plan_capacity(
        load_target(args.target), gpu=args.gpu, prompt_len=args.prompt_len,
        output_len=args.output_len, slo_ttft=args.slo_ttft, slo_itl=args.slo_itl,
        percentile=99 if args.slo_percentile is None else args.slo_percentile,
        rate=None if args.rate is None else args.rate,
        tp=args.tp_choices or (1, 2, 4, 8),
        num_requests=300 if args.num_requests is None else args.num_requests,
        seed=0 if args.seed is None else args.seed, dtype=args.dtype,
        allreduce=args.allreduce, topology=args.topology, attention=args.attention,
        kv_dtype=args.kv_dtype, **engine)
    if args.format == "json":
        print(json.dumps(r.to_dict(), indent=1, sort_keys=True))
        return 0
    print(f"{r.model} on {r.gpu}: p{r.percentile} SLOs"
          + (f" TTFT {r.slo_ttft_s * 1e3:g} ms" if r.slo_ttft_s else "")
          + (f" ITL {r.slo_itl_s * 1e3:g} ms" if r.slo_itl_s else "")
          + (f", target {r.rate:g} requests/s" if r.rate is not None else "")
          + f"; {r.num_requests} Poisson requests a trial; GEMMs fused: {r.fuse}"
          + (f"; speculative decoding: {r.draft}, k {r.num_speculative_tokens}" if r.draft
             else ""))
    rows = []
    for o in r.options:
        rows.append((o.tp, f"{o.max_rate:.2f}" if o.possible else "-",
                     f"{o.max_rate / o.tp:.2f}" if o.possible else "-",
                     f"{o.ttft_s * 1e3:.1f}" if o.possible else "-",
                     f"{o.itl_s * 1e3:.2f}" if o.possible else "-",
                     o.replicas if o.replicas is not None else "-",
                     o.gpus if o.gpus is not None else "-", o.note))
    print(tabulate(rows, headers=("tp", "requests/s", "per GPU", "TTFT ms", "ITL ms",
                                  "replicas", "GPUs", "note")))
    print(r.summary())
    return 0


def _serve_speculative(args, model) -> int:
    import json

    from ..presets import load_target
    from ..serving import speculate

    draft = "eagle" if args.draft == "eagle" else load_target(args.draft)
    r = speculate(model, prompt_len=args.prompt_len, output_len=args.output_len,
                  draft=draft, k=3 if args.num_speculative_tokens is None
                  else args.num_speculative_tokens, acceptance=args.acceptance,
                  acceptance_length=args.acceptance_length, batch_size=args.batch_size or 1,
                  gpu=args.gpu, tp=args.tp, dtype=args.dtype, allreduce=args.allreduce,
                  topology=args.topology, attention=args.attention, kv_dtype=args.kv_dtype,
                  fuse=args.fuse or "all", quantize=_quantization(args))
    if args.format == "json":
        print(json.dumps(r.to_dict(), indent=1, sort_keys=True))
        return 0
    print(f"{r.model} on {r.tp} x {r.gpu}, batch {r.batch_size}, {r.draft} draft, k {r.k}, "
          f"acceptance {r.acceptance:.3f} ({r.tokens_per_step:.2f} tokens a step), "
          f"all-reduce {args.allreduce}, GEMMs fused: {r.fuse}")
    print(tabulate([("verify step", f"{r.verify_s * 1e3:.2f} ms"),
                    ("draft passes", f"{r.draft_s * 1e3:.2f} ms"),
                    ("time per output token", f"{r.tpot_s * 1e3:.2f} ms"),
                    ("plain decode, per token", f"{r.plain_tpot_s * 1e3:.2f} ms"),
                    ("speedup", f"{r.speedup:.2f}x"),
                    ("output tokens/s", f"{r.output_tokens_per_s:,.1f}")],
                   headers=("", "predicted")))
    print()
    print(tabulate([(b, f"{x:.2f}x") for b, x in r.by_batch], headers=("batch", "speedup")))
    print("speculation " + ("pays at every batch that fits" if r.breakeven_batch is None
                            else f"stops paying at batch {r.breakeven_batch}"))
    for n in r.notes:
        print(f"note: {n}")
    return 0


def _draft_options(args, load_target) -> dict:
    """Speculative decoding's options of a server under load (none without --draft)."""
    if args.draft is None:
        return {}
    return {"draft": "eagle" if args.draft == "eagle" else load_target(args.draft),
            "num_speculative_tokens": 3 if args.num_speculative_tokens is None
            else args.num_speculative_tokens, "acceptance": args.acceptance,
            "acceptance_length": args.acceptance_length}


def _serve_load(args, model) -> int:
    import json

    from ..presets import load_target
    from ..serving import simulate_serving

    trace = args.trace
    if trace is not None and (args.num_requests is not None or args.rate is not None
                              or args.prompt_len is not None or args.output_len is not None):
        raise ValueError("--trace gives the requests: drop --num-requests, --rate, "
                         "--prompt-len and --output-len")
    if trace is None:
        missing = [f for f, v in (("--num-requests", args.num_requests),
                                  ("--prompt-len", args.prompt_len),
                                  ("--output-len", args.output_len)) if v is None]
        if missing:
            raise ValueError(f"a server under load needs {', '.join(missing)} (or --trace)")
    r = simulate_serving(
        model, gpu=args.gpu, tp=args.tp, requests=trace, num_requests=args.num_requests,
        rate=args.rate, prompt_len=args.prompt_len, output_len=args.output_len,
        seed=0 if args.seed is None else args.seed, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_concurrency=args.max_concurrency,
        block_size=16 if args.block_size is None else args.block_size,
        gpu_memory_utilization=(0.9 if args.gpu_memory_utilization is None
                                else args.gpu_memory_utilization),
        dtype=args.dtype, allreduce=args.allreduce, topology=args.topology,
        attention=args.attention, kv_dtype=args.kv_dtype, fuse=args.fuse or "all",
        quantize=_quantization(args), **_draft_options(args, load_target))
    if args.format == "json":
        print(json.dumps(r.to_dict(), indent=1, sort_keys=True))
        return 0
    c = r.config
    print(f"{r.model} on {r.tp} x {r.gpu}, {r.num_requests:,} requests, all-reduce "
          f"{r.allreduce}, GEMMs fused: {r.fuse}; max_num_seqs {c.max_num_seqs}, "
          "max_num_batched_tokens "
          f"{c.max_num_batched_tokens:,}, {r.kv_blocks:,} KV blocks of {c.block_size} tokens "
          f"(gpu_memory_utilization {r.gpu_memory_utilization:g})"
          + (f", at most {c.max_concurrency} in flight" if c.max_concurrency else "")
          + (f"; requests drawn with seed {r.seed}" if r.seed is not None else ""))
    print(tabulate([("duration", f"{r.duration_s:,.2f} s"),
                    ("requests/s", f"{r.request_throughput:,.2f}"),
                    ("output tokens/s", f"{r.output_tokens_per_s:,.1f}"),
                    ("total tokens/s", f"{r.total_tokens_per_s:,.1f}"),
                    ("steps", f"{r.steps:,}"),
                    ("requests running (mean)", f"{r.mean_running:,.1f}"),
                    ("KV cache in use (mean / peak)", f"{r.kv_mean:.0%} / {r.kv_peak:.0%}"),
                    ("preemptions", f"{r.preemptions:,}")]
                   + ([("speculative decoding", f"{r.draft}, k {r.num_speculative_tokens}, "
                                                f"acceptance {r.acceptance:.3f}"),
                       ("tokens per verification (drawn)", f"{r.acceptance_length:.2f}"
                        if r.acceptance_length else "-")] if r.draft else []),
                   headers=("", "predicted")))
    print()
    rows = [(name, *(f"{getattr(s, k) * 1e3:,.2f}" for k in ("mean", "p50", "p90", "p99")))
            for name, s in (("time to first token", r.ttft_s),
                            ("time per output token", r.tpot_s),
                            ("inter-token latency", r.itl_s),
                            ("end-to-end latency", r.latency_s))]
    print(tabulate(rows, headers=("ms", "mean", "p50", "p90", "p99")))
    for n in r.notes:
        print(f"note: {n}")
    return 0


def _serve_batch(args, model) -> int:
    import json

    from ..serving import serve

    r = serve(model, gpu=args.gpu, prompt_len=args.prompt_len, output_len=args.output_len,
              batch_size=args.batch_size or 1, tp=args.tp, dtype=args.dtype,
              allreduce=args.allreduce, topology=args.topology, attention=args.attention,
              kv_dtype=args.kv_dtype, page_size=args.page_size, fuse=args.fuse,
              gemv=args.gemv or "library", quantize=_quantization(args))
    if args.format == "json":
        print(json.dumps(r.to_dict(), indent=1, sort_keys=True))
        return 0
    steps = r.decode_steps_s
    rows = [("time to first token", f"{r.time_to_first_token_s * 1e3:.2f} ms"),
            ("inter-token latency (mean)", f"{r.inter_token_latency_s * 1e3:.2f} ms")]
    if steps:
        rows += [(f"first decode step ({r.prompt_len + 1:,} tokens)", f"{steps[0] * 1e3:.2f} ms"),
                 (f"last decode step ({r.prompt_len + r.output_len - 1:,} tokens)",
                  f"{steps[-1] * 1e3:.2f} ms")]
    rows += [("request latency", f"{r.latency_s * 1e3:.1f} ms"),
             ("output tokens/s (batch)", f"{r.output_tokens_per_s:,.1f}"),
             ("output tokens/s per request", f"{r.output_tokens_per_s / r.batch_size:,.1f}")]
    print(f"{r.model} on {r.tp} x {r.gpu}, batch {r.batch_size}, prompt {r.prompt_len:,}, "
          f"output {r.output_len:,}, all-reduce {r.allreduce}, GEMMs fused: {r.fuse}")
    print(tabulate(rows, headers=("", "predicted")))
    for n in r.notes:
        print(f"note: {n}")
    return 0


def add_parser(sub) -> argparse.ArgumentParser:
    """The ``serve`` command's parser."""
    pw = sub.add_parser("serve", help="a batch of requests end to end, or a server under "
                                      "load: time to first token, inter-token latency, "
                                      "latency, throughput",
                        description="Predict batch-size requests of --prompt-len tokens "
                                    "generating --output-len tokens each, as a serving "
                                    "engine runs them: the prefill (time to the first "
                                    "token), then every decode step at its own context. "
                                    "With --rate / --num-requests or --trace: a server "
                                    "under load, requests played through vLLM's continuous "
                                    "batching with chunked prefill (throughput, TTFT, "
                                    "TPOT, ITL and latency percentiles, KV cache, "
                                    "preemptions).")
    pw.add_argument("target", help="a causal LM: preset name, config.json path, cached Hub id "
                                   "or package.module:factory")
    setup_flag(pw, "gpu")
    setup_flag(pw, "dtype")
    pw.add_argument("--prompt-len", type=_length_arg, default=None,
                    help="prompt tokens per request (under load also a range lo:hi, drawn "
                         "uniformly)")
    pw.add_argument("--output-len", type=_length_arg, default=None,
                    help="tokens each request generates (under load also a range lo:hi)")
    pw.add_argument("--batch-size", type=_positive_int, default=None,
                    help="requests run together (default 1; one batch only)")
    pw.add_argument("--num-requests", type=_positive_int, default=None,
                    help="under load: requests sent")
    pw.add_argument("--rate", type=_rate_arg, default=None,
                    help="under load: requests per second, a Poisson process (default inf: "
                         "all at once)")
    pw.add_argument("--trace", default=None,
                    help="under load: a CSV of requests with columns arrival_s, prompt_len, "
                         "output_len")
    pw.add_argument("--max-concurrency", type=_positive_int, default=None,
                    help="under load: at most this many requests in flight (the client's cap)")
    pw.add_argument("--max-num-seqs", type=_positive_int, default=None,
                    help="under load: requests running at once (default vLLM's: 1024 on "
                         "GPUs of 70 GiB or more but the A100, else 256)")
    pw.add_argument("--max-num-batched-tokens", type=_positive_int, default=None,
                    help="under load: tokens per step, the chunked prefill budget (default "
                         "vLLM's: 8192 / 2048 as for --max-num-seqs)")
    pw.add_argument("--block-size", type=_positive_int, default=None,
                    help="under load: tokens per KV block (default 16)")
    pw.add_argument("--gpu-memory-utilization", type=_fraction_arg, default=None,
                    help="under load: the share of GPU memory the engine takes (default 0.9)")
    pw.add_argument("--seed", type=int, default=None,
                    help="under load: seed of the arrivals and lengths (default 0)")
    pw.add_argument("--slo-ttft", default=None,
                    help="capacity planning: the time-to-first-token SLO (200ms, 0.2s; a bare "
                         "number is milliseconds)")
    pw.add_argument("--slo-itl", default=None,
                    help="capacity planning: the inter-token latency SLO (30ms)")
    pw.add_argument("--slo-percentile", type=int, choices=(50, 90, 99), default=None,
                    help="capacity planning: the percentile the SLOs hold at (default 99)")
    pw.add_argument("--tp-choices", type=_int_list, default=None,
                    help="capacity planning: tensor-parallel degrees to try (default 1,2,4,8)")
    pw.add_argument("--fuse", choices=FUSE_CHOICES, default=None,
                    help="which GEMMs reading one activation run as one: all (engines': "
                         "Q/K/V and gate/up, the default), qkv (gpt-fast's wqkv), none (as "
                         "the Hugging Face model is written)")
    pw.add_argument("--draft", default=None,
                    help="speculative decoding: 'eagle' (one decoder layer of the target's "
                         "shapes) or a draft causal LM (preset, config.json, ...)")
    pw.add_argument("--num-speculative-tokens", type=_positive_int, default=None,
                    help="speculative decoding: draft tokens per step, k (default 3)")
    pw.add_argument("--acceptance", type=_unit_arg, default=None,
                    help="speculative decoding: the probability a draft token is accepted "
                         "(default 0.57, a published EAGLE figure)")
    pw.add_argument("--acceptance-length", type=_tokens_arg, default=None,
                    help="speculative decoding: the measured mean tokens per step instead "
                         "of --acceptance")
    pw.add_argument("--tp", type=_positive_int, default=1,
                    help="tensor-parallel GPUs (default 1)")
    for name in ("topology", "attention", "kv_dtype", "page_size"):
        setup_flag(pw, name)
    _allreduce_arg(pw, "auto")
    _gemv_arg(pw)
    _quantize_args(pw)
    pw.add_argument("--format", choices=("table", "json"), default="table")
    pw.add_argument("--verbose", action="store_true",
                    help="show warnings and log lines from torch and transformers")
    pw.set_defaults(func=run)
    return pw
