"""Continuous batching (issue 31, third part): the ragged decode kernel, a mixed step priced
from one decode capture against fresh captures, vLLM's scheduler played with a step of
known cost (latencies by hand), the request generators and traces, a server under load end
to end; bad input."""

import json
import math

import pytest
import torch

import fxshape
from fxshape.cost.decode_attention import predict_decode, predict_decode_ragged
from fxshape.serving import (BatchStep, EngineConfig, Request, poisson_requests, read_trace,
                             run_engine, simulate_serving)
from fxshape.serving.batch import padded_tokens
from fxshape.serving.scheduler import percentile, weighted_percentile
from fxshape.serving.traffic import parse_length

transformers = pytest.importorskip("transformers")

from models import tiny_llama  # noqa: E402


_llama = tiny_llama


# --- the ragged decode kernel ------------------------------------------------------------

@pytest.mark.parametrize("batch,heads,kv,sq,ctx,d,page", [
    (1, 32, 8, 1, 100, 128, None), (8, 32, 8, 1, 1024, 128, 16), (300, 32, 8, 1, 4097, 128, 16),
    (64, 64, 8, 4, 2000, 128, None), (3, 16, 4, 1, 50, 64, 16), (2, 32, 32, 1, 777, 256, None)])
def test_ragged_decode_with_equal_contexts_is_the_uniform_kernel(batch, heads, kv, sq, ctx, d,
                                                                 page):
    a = predict_decode(batch, heads, kv, sq, ctx, d, gpu="h100", page_size=page)
    b = predict_decode_ragged([ctx] * batch, heads, kv, sq, d, gpu="h100", page_size=page)
    assert b.time_s == pytest.approx(a.time_s, rel=1e-12)
    assert (b.splits, b.ctas, b.waves, b.kernels, b.bytes) == \
        (a.splits, a.ctas, a.waves, a.kernels, a.bytes)


def test_ragged_decode_lies_between_its_shortest_and_longest_uniform_batches():
    ctx = [100] * 63 + [8000]
    t = predict_decode_ragged(ctx, 32, 8, 1, 128, gpu="h100", page_size=16).time_s
    short = predict_decode(64, 32, 8, 1, 100, 128, gpu="h100", page_size=16).time_s
    long = predict_decode(64, 32, 8, 1, 8000, 128, gpu="h100", page_size=16).time_s
    assert short < t < long
    # the KV bytes are each sequence's own: 63 x 100 + 8000 tokens x 8 KV heads x (128 + 128)
    # x 2 bytes
    b = predict_decode_ragged(ctx, 32, 8, 1, 128, gpu="h100")
    assert b.kv_bytes == (63 * 100 + 8000) * 8 * 256 * 2


@pytest.mark.parametrize("ctx", [[], [0], [3, -1], [2.5]])
def test_ragged_decode_bad_contexts(ctx):
    with pytest.raises(ValueError, match="context"):
        predict_decode_ragged(ctx, 32, 8, 1, 128)


# --- a mixed step from one capture --------------------------------------------------------

@pytest.mark.parametrize("tokens,expected", [(1, 1), (3, 4), (5, 8), (9, 16), (512, 512),
                                             (513, 528), (1000, 1008), (1008, 1008)])
def test_padded_tokens_by_hand(tokens, expected):
    # vLLM's graph sizes 1, 2, 4, 8, 16, ..., 512; beyond, multiples of 16
    assert padded_tokens(tokens) == expected


@pytest.fixture(scope="module")
def tiny_decode():
    model = _llama()
    rep = fxshape.analyze(model, mode="decode", batch_size=8, context_len=256,
                          page_size=16, provenance=None)
    return model, rep


def test_a_step_at_the_capture_is_the_capture(tiny_decode):
    _, rep = tiny_decode
    step = BatchStep(rep)
    assert step.time_s([256] * 8) == pytest.approx(rep.step.time_s, rel=1e-9)


@pytest.mark.parametrize("gpu,attention", [("b200", "vllm"), ("h100", "fa3")])
def test_a_step_under_todays_kernels_is_its_capture(gpu, attention):
    # the ragged decode under load takes the kernel's own constants (TRT-LLM on the B200,
    # FA3 on the H100), as the capture's attention rows do: at the capture, the same step
    model = _llama()
    rep = fxshape.analyze(model, mode="decode", batch_size=8, context_len=256, gpu=gpu,
                          page_size=16, provenance=None, attention=attention)
    assert BatchStep(rep).time_s([256] * 8) == pytest.approx(rep.step.time_s, rel=1e-9)
    flash = fxshape.analyze(model, mode="decode", batch_size=8, context_len=256, gpu=gpu,
                            page_size=16, provenance=None)
    assert BatchStep(flash).time_s([256] * 8) != pytest.approx(rep.step.time_s, rel=1e-3)


@pytest.mark.parametrize("batch,context", [(32, 100), (1, 400), (64, 256)])
def test_a_step_repriced_at_another_batch_matches_a_capture_there(tiny_decode, batch, context):
    model, rep = tiny_decode
    fresh = fxshape.analyze(model, mode="decode", batch_size=batch, context_len=context,
                            page_size=16, provenance=None)
    got = BatchStep(rep).time_s([context] * batch)
    assert got == pytest.approx(fresh.step.time_s, rel=0.01)


def test_a_prefill_chunk_matches_a_graphed_prefill_capture(tiny_decode):
    model, rep = tiny_decode
    ids = torch.zeros(1, 384, dtype=torch.long, device="meta")
    pre = fxshape.analyze(model, None, {"input_ids": ids, "logits_to_keep": 1},
                          mode="prefill", provenance=None, execution="cudagraphs")
    # the kernels' time, both replayed as CUDA graphs (one launch regime): the memory-bound
    # kernels are scaled from 8 tokens' bytes, so allow 10%
    got = BatchStep(rep).gpu_s([], [(384, 0)])
    assert got == pytest.approx(pre.step.gpu_s, rel=0.10)
    # launched by Inductor's wrapper instead, each GEMM and attention kernel (priced with
    # the H100's graph-timed constants) pays the eager gap: more GPU time, never less
    compiled = fxshape.analyze(model, None, {"input_ids": ids, "logits_to_keep": 1},
                               mode="prefill", provenance=None, execution="compiled")
    assert compiled.step.gpu_s > pre.step.gpu_s


def test_a_step_grows_with_its_decode_contexts_and_chunks(tiny_decode):
    _, rep = tiny_decode
    step = BatchStep(rep)
    assert step.time_s([100] * 8) < step.time_s([400] * 8)
    assert step.time_s([100] * 8) < step.time_s([100] * 8, [(200, 50)])
    with pytest.raises(ValueError, match="at least one"):
        step.time_s([], [])


def test_batch_step_refuses_other_reports():
    rep = fxshape.analyze(_llama(), mode="inference", batch_size=1, seq_len=16,
                          provenance=None)
    with pytest.raises(ValueError, match="decode"):
        BatchStep(rep)


# --- the scheduler with a step of known cost ---------------------------------------------

class LinearStep:
    """A step costing ``a + b x tokens`` (the scheduler's arithmetic by hand)."""

    def __init__(self, a=0.010, b=0.001):
        self.a, self.b, self.calls = a, b, []

    def time_s(self, decode, chunks=()):
        self.calls.append((list(decode), list(chunks)))
        return self.a + self.b * (len(decode) + sum(q for q, _ in chunks))


def _config(**kw):
    d = dict(max_num_seqs=256, max_num_batched_tokens=2048, block_size=16, kv_blocks=10_000)
    d.update(kw)
    return EngineConfig(**d)


def test_one_request_by_hand():
    # prompt 100, output 5: one prefill step of 100 tokens (10 + 100 ms), then 4 decode steps
    # of one token (11 ms each); the decode steps see 101..104 keys
    step = LinearStep()
    run = run_engine(step, [Request(0.0, 100, 5)], _config())
    r = run.requests[0]
    assert r.ttft_s == pytest.approx(0.110)
    assert r.latency_s == pytest.approx(0.110 + 4 * 0.011)
    assert r.tpot_s == pytest.approx(0.011)
    assert run.steps == 5 and run.preemptions == 0
    assert [c for c, _ in step.calls[1:]] == [[101], [102], [103], [104]]
    assert step.calls[0] == ([], [(100, 0)])


def test_chunked_prefill_by_hand():
    # prompt 10 under a budget of 4 tokens: chunks of 4, 4, 2 (the last over 8 cached), so
    # the first token comes after 3 steps: (10 + 4) + (10 + 4) + (10 + 2) ms
    step = LinearStep()
    run = run_engine(step, [Request(0.0, 10, 2)], _config(max_num_batched_tokens=4))
    assert [ch for _, ch in step.calls[:3]] == [[(4, 0)], [(4, 4)], [(2, 8)]]
    assert run.requests[0].ttft_s == pytest.approx(0.014 + 0.014 + 0.012)


def test_requests_that_do_not_overlap_each_take_the_lone_latency():
    lone = run_engine(LinearStep(), [Request(0.0, 64, 8)], _config()).requests[0].latency_s
    reqs = [Request(10.0 * i, 64, 8) for i in range(5)]
    run = run_engine(LinearStep(), reqs, _config())
    for r in run.requests:
        assert r.latency_s == pytest.approx(lone)
    assert run.duration_s == pytest.approx(40.0 + lone)


def test_a_rate_far_above_capacity_grows_the_queue():
    # each request needs ~0.1 s of steps alone; 200 per second arrive
    reqs = poisson_requests(200, rate=200.0, prompt_len=64, output_len=16, seed=1)
    fast = run_engine(LinearStep(), reqs, _config(max_num_seqs=4))
    slow = run_engine(LinearStep(), poisson_requests(200, rate=0.5, prompt_len=64,
                                                     output_len=16, seed=1),
                      _config(max_num_seqs=4))
    ttft = [r.ttft_s for r in fast.requests]
    # the queue builds: the last requests wait far longer than the first
    assert statistics_mean(ttft[-20:]) > 10 * statistics_mean(ttft[:20])
    assert percentile(ttft, 99) > 10 * percentile([r.ttft_s for r in slow.requests], 99)


def statistics_mean(xs):
    return sum(xs) / len(xs)


def test_batching_shares_steps_between_requests():
    # 8 requests at once: their decode steps are shared, so the run takes far less than 8
    # lone requests back to back, and the steps carry 8 decode tokens each
    reqs = [Request(0.0, 32, 20)] * 8
    step = LinearStep()
    run = run_engine(step, reqs, _config())
    lone = run_engine(LinearStep(), reqs[:1], _config()).duration_s
    assert run.duration_s < 8 * lone / 3
    assert max(len(d) for d, _ in step.calls) == 8


def test_max_concurrency_one_serves_requests_back_to_back():
    reqs = [Request(0.0, 50, 4)] * 3
    run = run_engine(LinearStep(), reqs, _config(max_concurrency=1))
    lone = run.requests[0].latency_s
    # each request is sent when the one before finishes, and its times count from then
    assert [r.sent_s for r in run.requests] == pytest.approx([0.0, lone, 2 * lone])
    assert all(r.latency_s == pytest.approx(lone) for r in run.requests)


def test_preemption_recomputes_and_every_request_finishes():
    # 12 blocks of 16 tokens: four requests of 40 + 30 tokens cannot all hold their caches
    reqs = [Request(0.0, 40, 30)] * 4
    step = LinearStep()
    run = run_engine(step, reqs, _config(kv_blocks=12))
    assert run.preemptions > 0
    assert sum(r.preemptions for r in run.requests) == run.preemptions
    assert run.kv_peak <= 1.0
    # every output token sampled once: 4 x 30 samples; steps with a finished prompt and
    # recomputations count more tokens than 4 x (40 + 29) computed without preemption
    computed = sum(len(d) + sum(q for q, _ in ch) for d, ch in step.calls)
    assert computed > 4 * (40 + 29)
    for r in run.requests:
        assert r.latency_s > r.ttft_s > 0


def test_the_scheduler_is_deterministic():
    reqs = poisson_requests(300, rate=40.0, prompt_len=(16, 200), output_len=(1, 64), seed=3)
    a = run_engine(LinearStep(), reqs, _config(max_num_seqs=16, kv_blocks=200))
    b = run_engine(LinearStep(), reqs, _config(max_num_seqs=16, kv_blocks=200))
    assert a == b


@pytest.mark.parametrize("kw,match", [
    ({"max_num_seqs": 0}, "max_num_seqs"), ({"block_size": 1.5}, "block_size"),
    ({"kv_blocks": -1}, "kv_blocks"), ({"max_concurrency": 0}, "max_concurrency")])
def test_engine_config_bad_input(kw, match):
    with pytest.raises(ValueError, match=match):
        _config(**kw)


def test_a_request_larger_than_the_cache_is_refused():
    with pytest.raises(ValueError, match="request 0 .* KV blocks"):
        run_engine(LinearStep(), [Request(0.0, 100, 100)], _config(kv_blocks=5))


# --- percentiles, requests, traces -------------------------------------------------------

def test_percentiles_by_hand():
    # numpy's linear interpolation: rank q/100 x (n - 1)
    assert percentile([1, 2, 3, 4], 50) == pytest.approx(2.5)
    assert percentile([1, 2, 3, 4], 100) == 4
    assert percentile([5.0], 99) == 5.0
    # (1, twice), (3, twice) is [1, 1, 3, 3]: the median 2, the 1/3 rank 1
    assert weighted_percentile([(1, 2), (3, 2)], 50) == pytest.approx(2.0)
    assert weighted_percentile([(3, 2), (1, 2)], 100 / 3) == pytest.approx(1.0)
    assert percentile([], 50) == 0.0


def test_poisson_requests():
    reqs = poisson_requests(2000, rate=10.0, prompt_len=(10, 20), output_len=7, seed=0)
    gaps = [b.arrival_s - a.arrival_s for a, b in zip(reqs, reqs[1:])]
    # exponential gaps of mean 1/10 s: the sample mean within 10% for 2000 draws
    assert sum(gaps) / len(gaps) == pytest.approx(0.1, rel=0.1)
    assert {r.output_len for r in reqs} == {7}
    assert {r.prompt_len for r in reqs} == set(range(10, 21))
    assert poisson_requests(5, rate=math.inf, prompt_len=3, output_len=3) == \
        tuple(Request(0.0, 3, 3) for _ in range(5))
    assert reqs == poisson_requests(2000, rate=10.0, prompt_len=(10, 20), output_len=7)


@pytest.mark.parametrize("kw,match", [
    ({"n": 0}, "number of requests"), ({"rate": 0}, "rate"), ({"rate": "fast"}, "rate"),
    ({"prompt_len": (5, 2)}, "prompt_len"), ({"output_len": "a:b"}, "output_len"),
    ({"prompt_len": 0}, "prompt_len")])
def test_poisson_requests_bad_input(kw, match):
    args = dict(n=3, rate=1.0, prompt_len=10, output_len=10)
    args.update(kw)
    n = args.pop("n")
    with pytest.raises(ValueError, match=match):
        poisson_requests(n, **args)


def test_parse_length():
    assert parse_length("x", "12") == (12, 12)
    assert parse_length("x", "3:9") == (3, 9)
    assert parse_length("x", (3, 9)) == (3, 9)
    with pytest.raises(ValueError, match="x must be"):
        parse_length("x", "9:3")


@pytest.mark.parametrize("kw,match", [({"arrival_s": -1.0}, "arrival_s"),
                                      ({"arrival_s": math.nan}, "arrival_s"),
                                      ({"prompt_len": 0}, "prompt_len"),
                                      ({"output_len": 2.0}, "output_len")])
def test_request_bad_input(kw, match):
    args = dict(arrival_s=0.0, prompt_len=1, output_len=1)
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        Request(**args)


def test_read_trace(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("prompt_len,arrival_s,output_len\n10,0.5,3\n20,0.0,4\n\n")
    assert read_trace(str(p)) == (Request(0.0, 20, 4), Request(0.5, 10, 3))


@pytest.mark.parametrize("text,match", [
    ("arrival_s,prompt_len\n0,1\n", "missing output_len"),
    ("arrival_s,prompt_len,output_len,user\n0,1,1,a\n", "unknown user"),
    ("arrival_s,prompt_len,output_len\n0,1,1\n0,x,1\n", r"t.csv:3: prompt_len 'x'"),
    ("arrival_s,prompt_len,output_len\n0,1,1\n-2,1,1\n", r"t.csv:3: arrival_s"),
    ("arrival_s,prompt_len,output_len\nsoon,1,1\n", r"t.csv:2: arrival_s 'soon'"),
    ("arrival_s,prompt_len,output_len\n0,1\n", r"t.csv:2: 2 values"),
    ("arrival_s,prompt_len,output_len\n", "no requests"), ("", "empty")])
def test_read_trace_bad_rows_are_named_by_line(tmp_path, text, match):
    p = tmp_path / "t.csv"
    p.write_text(text)
    with pytest.raises(ValueError, match=match):
        read_trace(str(p))


def test_read_trace_missing_file(tmp_path):
    with pytest.raises(ValueError, match="cannot read the trace"):
        read_trace(str(tmp_path / "none.csv"))


def test_read_trace_binary_or_a_directory_is_refused_in_one_line(tmp_path):
    p = tmp_path / "t.csv.gz"
    p.write_bytes(b"\x1f\x8b\x08\x00\xfd\xff" + bytes(range(256)))  # a gzip header, bytes
    with pytest.raises(ValueError, match="is not a text CSV .*accepted: a CSV with the header "
                                         "arrival_s,prompt_len,output_len"):
        read_trace(str(p))
    with pytest.raises(ValueError, match="cannot read the trace .*directory"):
        read_trace(str(tmp_path))


def test_speculation_needs_a_budget_of_one_verification():
    """Issue 52: a token budget below k + 1 left every decode unscheduled ("a bug")."""
    step = LinearStep()
    with pytest.raises(ValueError, match="max_num_batched_tokens 3 is below one speculative "
                                         "decode's 4 tokens.*accepted: at least 4"):
        run_engine(step, [Request(0.0, 8, 4)], _config(max_num_batched_tokens=3), spec_k=3)


def test_a_draft_of_another_vocabulary_is_refused():
    from fxshape.serving.speculative import draft_model

    with pytest.raises(ValueError, match="vocabulary of 2,000 tokens and the target "
                                         "LlamaForCausalLM 1,000"):
        draft_model(_llama(), _llama(vocab_size=2000))
    assert draft_model(_llama(), _llama(layers=1))[1] == "LlamaForCausalLM"


def test_a_block_larger_than_the_positions_names_block_size():
    with pytest.raises(ValueError, match=r"block_size=1024 \(--block-size\) exceeds the "
                                         "model's 512 positions"):
        simulate_serving(_llama(), requests=[Request(0.0, 8, 4)], block_size=1024)


# --- a server under load, end to end -----------------------------------------------------

def test_one_request_under_load_is_fxshape_serve_with_vllms_fused_gemms():
    model = _llama()
    sim = simulate_serving(model, num_requests=1, prompt_len=200, output_len=16)
    one = fxshape.serve(model, prompt_len=200, output_len=16, page_size=16, fuse="none")
    fused_one = fxshape.serve(model, prompt_len=200, output_len=16, page_size=16)
    r = sim.run.requests[0]
    # the prefill: one chunk of 200 tokens, a CUDA-graph size, so the engine's step never
    # takes longer than serve's compiled prefill, launched kernel by kernel (a model this
    # small is bound by those launches; the kernels alone are compared above)
    assert r.ttft_s <= one.time_to_first_token_s
    assert sim.run.steps == 16
    # the decode steps: serve's re-priced steps, but with Q/K/V and gate/up as one GEMM
    # each (what vLLM runs): never slower, and exactly the fused BatchStep at each context
    decode = r.latency_s - r.ttft_s
    assert decode < sum(one.decode_steps_s)
    fused = BatchStep(sim.decode, fuse=True)
    assert decode == pytest.approx(sum(fused.time_s([200 + k]) for k in range(1, 16)),
                                   rel=1e-12)
    # and serve fuses them the same way by default (its own capture: within 1%)
    assert fused_one.fuse == "all"
    assert decode == pytest.approx(sum(fused_one.decode_steps_s), rel=0.01)
    assert sim.num_requests == 1 and sim.preemptions == 0


def test_fusing_the_gemms_that_share_an_input(tiny_decode):
    _, rep = tiny_decode
    plain, fused = BatchStep(rep), BatchStep(rep, fuse=True)
    qkv = BatchStep(rep, fuse="qkv")
    assert qkv.fused == 2 * 2  # Q, K, V -> 1 in each of the 2 layers; gate and up apart
    # a Llama layer: Q, K, V read the normed hidden state (3 GEMMs -> 1), gate and up the
    # other (2 -> 1): 3 merged away per layer, 2 layers; O, down and the LM head alone
    assert fused.fused == 3 * 2
    assert len(fused.gemms) == len(plain.gemms) - 6 == 2 * 7 - 6
    # the same work: the summed N of the GEMMs of each K is kept
    def widths(step):
        out = {}
        for _, n, k in step.gemms:
            out[k] = out.get(k, 0) + n
        return out
    assert widths(fused) == widths(plain)
    for batch in (1, 8, 64):
        assert fused.time_s([256] * batch) < qkv.time_s([256] * batch) < \
            plain.time_s([256] * batch)
    with pytest.raises(ValueError, match="fuse must be one of"):
        BatchStep(rep, fuse="mlp")


def test_simulate_serving_is_deterministic_and_reports_what_bench_serve_does():
    model = _llama()
    kw = dict(num_requests=40, rate=50.0, prompt_len="20:200", output_len="1:40", seed=2,
              gpu="a100")
    a = simulate_serving(model, **kw)
    b = simulate_serving(model, **kw)
    assert json.dumps(a.to_dict(), sort_keys=True) == json.dumps(b.to_dict(), sort_keys=True)
    # A100: vLLM's smaller defaults
    assert (a.config.max_num_batched_tokens, a.config.max_num_seqs) == (2048, 256)
    assert a.ttft_s.p50 <= a.ttft_s.p99 <= a.ttft_s.max
    assert a.output_tokens_per_s == pytest.approx(
        sum(r.output_len for r in a.run.requests) / a.duration_s)
    assert "time to first token" in a.describe()


@pytest.mark.parametrize("kw,match", [
    ({}, "give num_requests"),
    ({"num_requests": 2, "prompt_len": 5, "output_len": 5, "requests": "x.csv"}, "not both"),
    ({"requests": [1, 2]}, "Request"),
    ({"num_requests": 1, "prompt_len": 400, "output_len": 200}, "positions"),
    ({"num_requests": 1, "prompt_len": 5, "output_len": 5, "gpu_memory_utilization": 0},
     "gpu_memory_utilization"),
    ({"num_requests": 1, "prompt_len": 5, "output_len": 5, "gpu_memory_utilization": 1e-9},
     "no room for a KV cache"),
    ({"num_requests": 1, "prompt_len": 5, "output_len": 5, "allreduce": "ring"}, "all-reduce")])
def test_simulate_serving_bad_input(kw, match):
    with pytest.raises(ValueError, match=match):
        simulate_serving(_llama(), **kw)


def test_serve_cli_under_load(tmp_path, capsys):
    from fxshape.cli import main

    cfg = tmp_path / "config.json"
    cfg.write_text(_llama().config.to_json_string())
    trace = tmp_path / "trace.csv"
    trace.write_text("arrival_s,prompt_len,output_len\n0,30,5\n0.01,40,6\n")
    assert main(["serve", str(cfg), "--trace", str(trace), "--format", "json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["num_requests"] == 2 and d["block_size"] == 16
    assert main(["serve", str(cfg), "--rate", "inf", "--num-requests", "3",
                 "--prompt-len", "10:20", "--output-len", "4"]) == 0
    assert "inter-token latency" in capsys.readouterr().out


# --- speculative decoding ----------------------------------------------------------------

from fxshape.serving.speculative import (DEFAULT_ACCEPTANCE, acceptance_from_length,  # noqa: E402
                                         expected_tokens, speculate)


def test_expected_tokens_by_hand():
    # 1 + α + α² for k = 2: 1.75 at α = 0.5; all k + 1 at α = 1; one token at α = 0
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.0, 7) == 1.0
    assert acceptance_from_length(1.75, 2) == pytest.approx(0.5, abs=1e-9)
    # the default: 1 + α + α² = 1.89 (the published EAGLE figure it comes from)
    assert expected_tokens(DEFAULT_ACCEPTANCE, 2) == pytest.approx(1.89, abs=0.01)


def test_a_one_token_verification_is_a_decode_step(tiny_decode):
    _, rep = tiny_decode
    step = BatchStep(rep)
    ctx = [100, 250, 37]
    assert step.verify_s(ctx, 1) == pytest.approx(step.time_s([c + 1 for c in ctx]),
                                                  rel=1e-12)
    assert step.verify_s(ctx, 4) > step.verify_s(ctx, 1)


def test_speculation_pays_with_acceptance_and_never_at_zero():
    model = _llama(layers=12)  # a one-layer draft is a twelfth of the target
    none = speculate(model, prompt_len=64, output_len=64, k=3, acceptance=0.0)
    most = speculate(model, prompt_len=64, output_len=64, k=3, acceptance=0.9)
    # nothing accepted: one token a step for a verification and the draft's passes
    assert none.tokens_per_step == 1.0
    assert all(s < 1 for _, s in none.by_batch) and none.breakeven_batch == 1
    assert none.speedup < 1 < most.speedup
    # the step does not depend on the acceptance: the speedup scales with E alone
    assert most.step_s == pytest.approx(none.step_s, rel=1e-12)
    assert most.speedup == pytest.approx(none.speedup * expected_tokens(0.9, 3), rel=1e-12)
    assert most.tpot_s == pytest.approx(most.step_s / most.tokens_per_step)
    assert most.step_s == pytest.approx(most.verify_s + most.draft_s)


def test_a_draft_as_large_as_the_target_does_not_pay_at_modest_acceptance():
    model = _llama()
    r = speculate(model, prompt_len=32, output_len=32, draft=_llama(), k=2,
                  acceptance_length=1.75)
    # each step: a verification (>= a decode step) and two passes of the same model over
    # 1.75 tokens
    assert r.draft == "LlamaForCausalLM" and r.speedup < 1


@pytest.mark.parametrize("kw,match", [
    ({"k": 0}, "k"), ({"k": 16}, "k"), ({"acceptance": 1.5}, "acceptance"),
    ({"acceptance": 0.5, "acceptance_length": 2.0}, "not both"),
    ({"acceptance_length": 9.0}, "acceptance_length"), ({"draft": "medusa"}, "draft"),
    ({"draft": 3}, "draft"), ({"prompt_len": 500}, "positions"),
    ({"attention": "math"}, "fused attention")])
def test_speculate_bad_input(kw, match):
    args = dict(prompt_len=16, output_len=16)
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        speculate(_llama(), **args)


# --- capacity planning -------------------------------------------------------------------

from fxshape.serving import Server, plan_capacity  # noqa: E402
from fxshape.serving.capacity import parse_duration  # noqa: E402


@pytest.mark.parametrize("text,seconds", [("200ms", 0.2), ("0.2s", 0.2), ("150us", 1.5e-4),
                                          (200, 0.2), ("30", 0.03), (" 5MS ", 0.005)])
def test_parse_duration(text, seconds):
    assert parse_duration("x", text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["fast", "-3ms", "0", "ms", "inf"])
def test_parse_duration_bad(text):
    with pytest.raises(ValueError, match="x must be a positive duration"):
        parse_duration("x", text)


def test_capacity_plan_finds_the_edge_of_the_slo():
    model = _llama()
    kw = dict(prompt_len="32:128", output_len="8:32", num_requests=40, seed=1)
    plan = plan_capacity(model, slo_ttft="3ms", slo_itl="1ms", tp=(1, 2), rate=5000.0, **kw)
    best = plan.best
    assert best is not None and best.max_rate > 0
    # the replicas for the target rate by hand, and the fewest GPUs of the degrees tried
    for o in plan.options:
        assert o.replicas == math.ceil(5000.0 / o.max_rate) and o.gpus == o.replicas * o.tp
    assert best.gpus == min(o.gpus for o in plan.options)
    # the rate found meets the SLOs; half again as much (unless past saturation) does not
    server = Server(model, tp=best.tp)
    at = server.run(poisson_requests(40, rate=best.max_rate, prompt_len=(32, 128),
                                     output_len=(8, 32), seed=1))
    assert at.ttft_s.p99 <= 3e-3 and at.itl_s.p99 <= 1e-3
    sat = server.run(poisson_requests(40, rate=math.inf, prompt_len=(32, 128),
                                      output_len=(8, 32), seed=1))
    if best.max_rate < 0.99 * sat.request_throughput:
        above = server.run(poisson_requests(40, rate=1.5 * best.max_rate,
                                            prompt_len=(32, 128), output_len=(8, 32), seed=1))
        assert above.ttft_s.p99 > 3e-3 or above.itl_s.p99 > 1e-3


def test_capacity_plan_says_the_closest_when_no_degree_meets():
    plan = plan_capacity(_llama(), slo_ttft="1us", prompt_len=64, output_len=8, tp=(1, 2),
                         num_requests=10)
    assert plan.best is None and plan.closest is not None
    assert not any(o.meets for o in plan.options)
    assert plan.summary().startswith("no degree meets p99 TTFT <= 0.001 ms")
    # tp 3 does not divide the heads: said, not dropped
    plan = plan_capacity(_llama(), slo_ttft="1s", prompt_len=64, output_len=8, tp=(3,),
                         num_requests=10)
    assert plan.options[0].note.startswith("not possible") and plan.best is None


@pytest.mark.parametrize("kw,match", [
    ({}, "give an SLO"), ({"slo_ttft": "soon"}, "slo_ttft"),
    ({"slo_itl": "1ms", "percentile": 75}, "percentile"),
    ({"slo_itl": "1ms", "rate": 0}, "rate"), ({"slo_itl": "1ms", "tp": (0,)}, "tp"),
    ({"slo_itl": "1ms", "prompt_len": "9:3"}, "prompt_len"),
    ({"slo_itl": "1ms", "attention": "math"}, "math")])
def test_plan_capacity_bad_input(kw, match):
    args = dict(prompt_len=16, output_len=4)
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        plan_capacity(_llama(), **args)


# --- speculative decoding under load -----------------------------------------------------

class SpecStep(LinearStep):
    """``a + b x tokens`` with q tokens per decode request."""

    def time_s(self, decode, chunks=(), q=1):
        self.calls.append((list(decode), list(chunks), q))
        return self.a + self.b * (q * len(decode) + sum(n for n, _ in chunks))


def test_speculation_in_the_scheduler_by_hand():
    # prompt 10, output 7, k = 2 drafts all accepted: the prefill gives the first token,
    # then each verification of 3 tokens (the last one and 2 drafts) gives 3: 2 steps
    step = SpecStep()
    run = run_engine(step, [Request(0.0, 10, 7)], _config(), spec_k=2, acceptance=1.0)
    assert [c[2] for c in step.calls] == [3, 3, 3] and step.calls[0][1] == [(10, 0)]
    # the verifications see the 10 cached tokens plus 3, then 13 plus 3
    assert [c[0] for c in step.calls[1:]] == [[13], [16]]
    r = run.requests[0]
    assert r.ttft_s == pytest.approx(0.010 + 0.010)  # 10 ms + 10 tokens x 1 ms
    assert r.latency_s == pytest.approx(0.020 + 2 * (0.010 + 0.003))
    assert run.drafts == 4 and run.accepted == 4
    # nothing accepted: one token a verification, six of them
    step = SpecStep()
    run = run_engine(step, [Request(0.0, 10, 7)], _config(), spec_k=2, acceptance=0.0)
    assert run.steps == 7 and run.accepted == 0


def test_speculation_in_the_scheduler_draws_the_expected_acceptance():
    reqs = [Request(0.0, 16, 200)] * 40
    run = run_engine(SpecStep(), reqs, _config(), spec_k=3, acceptance=0.6, seed=5)
    proposals = run.drafts / 3
    # tokens a verification: 1 + the drafts accepted, against 1 + 0.6 + 0.36 + 0.216
    assert 1 + run.accepted / proposals == pytest.approx(expected_tokens(0.6, 3), rel=0.03)
    again = run_engine(SpecStep(), reqs, _config(), spec_k=3, acceptance=0.6, seed=5)
    assert again == run


def test_a_request_whose_drafts_overflow_the_cache_is_refused():
    # 3 blocks of 16 = 48 slots: 40 + 9 - 1 = 48 tokens fit; with 2 drafts' slots, 50 do not
    run_engine(SpecStep(), [Request(0.0, 40, 9)], _config(kv_blocks=3))
    with pytest.raises(ValueError, match="needs 4 KV blocks"):
        run_engine(SpecStep(), [Request(0.0, 40, 9)], _config(kv_blocks=3), spec_k=2)


@pytest.mark.parametrize("kw,match", [({"spec_k": 16}, "spec_k"), ({"spec_k": -1}, "spec_k"),
                                      ({"acceptance": 1.5}, "acceptance")])
def test_run_engine_speculation_bad_input(kw, match):
    with pytest.raises(ValueError, match=match):
        run_engine(SpecStep(), [Request(0.0, 4, 4)], _config(), **kw)


def test_a_server_under_load_with_speculation():
    model = _llama(layers=12)  # a one-layer draft is a twelfth of the target
    kw = dict(num_requests=16, prompt_len=64, output_len=48, max_concurrency=4)
    plain = simulate_serving(model, **kw)
    spec = simulate_serving(model, draft="eagle", num_speculative_tokens=3, acceptance=0.8,
                            **kw)
    assert spec.draft == "EAGLE (one layer)" and spec.num_speculative_tokens == 3
    assert spec.tpot_s.mean < plain.tpot_s.mean
    assert spec.acceptance_length == pytest.approx(expected_tokens(0.8, 3), rel=0.1)
    # the draft's weights and cache come out of the KV blocks
    assert spec.kv_blocks < plain.kv_blocks
    with pytest.raises(ValueError, match="give a draft"):
        simulate_serving(model, acceptance=0.5, **kw)
