"""Serving (issue 31, first part): the small-message all-reduce algorithms by hand and by
property, vLLM's choice of them, NCCL's protocols; a request end to end (its latency is its
prefill plus its decode steps, each step at its own context equal to a fresh capture at that
context); bad input."""

import json

import pytest

import fxshape
from fxshape.cost.allreduce import (NCCL_TUNING, allreduce_params, multimem_s,
                                    nccl_protocols, predict_allreduce, vllm_choice)
from fxshape.cost.memops import kernel_time

transformers = pytest.importorskip("transformers")

from models import tiny_llama  # noqa: E402

MiB = 2**20


_llama = tiny_llama


# --- all-reduce algorithms -------------------------------------------------------------

def test_one_shot_and_two_shot_bytes_and_stages_by_hand():
    # 8 GPUs, 1 MiB each: one-shot reads the 7 peers' whole buffers (7 MiB through each
    # GPU's link) in one stage; two-shot a reduce-scatter and an all-gather, 2 x 7/8 = 1.75
    # MiB, in two stages. So the byte terms are 7 / 1.75 = 4 to 1, and an empty buffer
    # costs two-shot twice one-shot's single stage, whatever the fitted constants.
    def t(alg, nbytes):
        return predict_allreduce(nbytes, 8, algorithm=alg, topology="dgx-h100").time_s

    one = t("one-shot", MiB) - t("one-shot", 0)
    two = t("two-shot", MiB) - t("two-shot", 0)
    assert one / two == pytest.approx(4.0, rel=1e-9)
    assert t("two-shot", 0) == pytest.approx(2 * t("one-shot", 0), rel=1e-12)
    # and the byte term is the link's: 7 MiB over peer_efficiency x 450 GB/s (NVLink 4)
    p = allreduce_params()
    assert one == pytest.approx(7 * MiB / (p.peer_efficiency * 450e9), rel=1e-9)


def test_two_shot_wins_only_for_large_buffers():
    small = [predict_allreduce(8192, 8, algorithm=a).time_s for a in ("one-shot", "two-shot")]
    big = [predict_allreduce(8 * MiB, 8, algorithm=a).time_s for a in ("one-shot", "two-shot")]
    assert small[0] < small[1] and big[1] < big[0]


@pytest.mark.parametrize("nbytes,n,expected", [
    (4 * MiB, 2, "one-shot"),          # two GPUs: always one stage (under 8 MiB)
    (255 * 1024, 8, "one-shot"),       # 8 GPUs: one stage under 256 KiB
    (256 * 1024, 8, "two-shot"),
    (511 * 1024, 4, "one-shot"),       # up to 4 GPUs: under 512 KiB
    (512 * 1024, 4, "two-shot"),
    (8 * MiB, 8, "nccl"),              # beyond the custom kernel's 8 MiB buffer
    (8192, 3, "nccl"),                 # world sizes 2, 4, 6, 8 only
])
def test_vllm_choice(nbytes, n, expected):
    assert vllm_choice(nbytes, n, nvlink_all=True)[0] == expected


def test_multimem_bytes_and_stage_by_hand():
    # 8 GPUs, 8 MiB each: each GPU's 1 MiB slice is read from all 8 by the switch and summed
    # (8 MiB up each link), the sum stored back to all 8 (1 MiB up, 8 MiB down): 9/8 x 8
    # MiB each way, in one stage; two-shot moves 2 x 7/8 x 8 MiB in two. So the byte terms
    # are 9 to 14 and an empty buffer costs multimem one stage, whatever the constants.
    p, link = allreduce_params(), 450.0
    mm = multimem_s(p, 8 * MiB, 8, link) - multimem_s(p, 0, 8, link)
    two = predict_allreduce(8 * MiB, 8, algorithm="two-shot").time_s - \
        predict_allreduce(0, 8, algorithm="two-shot").time_s
    assert mm / two == pytest.approx(9 / 14, rel=1e-9)
    assert multimem_s(p, 0, 8, link) == pytest.approx(p.stage_s, rel=1e-12)
    # vLLM's symmetric memory copies the buffer in and out: two copies of 8 MiB read and
    # 8 MiB written, priced as the H100's memory-bound copies
    got = predict_allreduce(8 * MiB, 8, algorithm="multimem", topology="dgx-h100")
    copy = kernel_time("copy", 16 * MiB, gpu="h100-sxm").time_s
    assert got.time_s == pytest.approx(multimem_s(p, 8 * MiB, 8, link) + 2 * copy, rel=1e-12)


@pytest.mark.parametrize("nbytes,n,link,expected", [
    (255 * 1024, 8, "nvlink4", "one-shot"),    # H100, 8 GPUs: the custom kernel to 256 KiB
    (256 * 1024, 8, "nvlink4", "multimem"),    # then symmetric memory's multimem ...
    (64 * MiB, 8, "nvlink4", "multimem"),
    (64 * MiB + 2, 8, "nvlink4", "nccl"),      # ... to 64 MiB, then NCCL
    (16 * MiB, 4, "nvlink4", "two-shot"),      # 4 GPUs: the custom kernel to 32 MiB
    (32 * MiB, 4, "nvlink4", "multimem"),
    (32 * MiB, 2, "nvlink4", "one-shot"),      # 2 GPUs: one stage to 64 MiB
    (64 * MiB, 2, "nvlink4", "symm-two-shot"),  # where symmetric memory runs two-shot
    (512 * 1024, 6, "nvlink4", "multimem"),
    (4 * MiB, 4, "nvlink5", "symm-two-shot"),  # B200: multimem for 6 and 8 GPUs only
    (4 * MiB, 8, "nvlink5", "multimem"),
    (512 * 1024, 8, "nvlink5", "two-shot"),    # under its 1 MiB custom-kernel limit
])
def test_vllm_choice_where_symmetric_memory_has_multicast(nbytes, n, link, expected):
    assert vllm_choice(nbytes, n, nvlink_all=True, multicast=link)[0] == expected


def test_auto_runs_symmetric_memory_on_hopper_only():
    # 1 MiB over 8 GPUs: multimem on an H100 node; the custom two-shot on an A100 node (its
    # NVSwitch has no multicast); multimem asked for there is refused in one line
    assert predict_allreduce(MiB, 8, topology="dgx-h100").algorithm == "multimem"
    assert predict_allreduce(MiB, 8, topology="dgx-b200").algorithm == "multimem"
    assert predict_allreduce(MiB, 8, topology="dgx-a100").algorithm == "two-shot"
    with pytest.raises(ValueError, match="multimem all-reduce needs an NVSwitch"):
        predict_allreduce(MiB, 8, algorithm="multimem", topology="dgx-a100")


def test_auto_falls_back_to_nccl_without_nvlink_between_all_gpus():
    # pairs of NVLink-bridged GPUs over PCIe: four GPUs do not all reach each other
    a = predict_allreduce(8192, 4, topology="pairwise-a100")
    assert a.algorithm.startswith("nccl-") and "NVLink" in a.why
    with pytest.raises(ValueError, match="one-shot all-reduce reads peers"):
        predict_allreduce(8192, 4, algorithm="one-shot", topology="pairwise-a100")


def test_nccl_protocols_by_size_and_ll_latency_by_hand():
    # NCCL's own model, ring LL over 8 GPUs: 6.6 us + 2 x 7 hops x 0.6 us = 15.0 us, plus
    # 2 x 7/8 x 8 KiB over at most 87.7 GB/s (0.16 us)
    t = nccl_protocols(8192, 8, 500.0, "nvlink")
    assert NCCL_TUNING["base_us"]["LL"] == 6.6
    assert t["LL"] == pytest.approx(15.0e-6 + 2 * 7 / 8 * 8192 / 87.7e9, rel=1e-9)
    assert min(t, key=t.get) == "LL"
    big = nccl_protocols(2**30, 8, 500.0, "nvlink")
    assert min(big, key=big.get) == "Simple"
    a = predict_allreduce(8192, 8, algorithm="nccl")
    assert a.algorithm == "nccl-LL"


def test_one_gpu_costs_nothing():
    assert predict_allreduce(MiB, 1).time_s == 0.0


@pytest.mark.parametrize("kw,match", [
    (dict(algorithm="ring"), "unknown all-reduce algorithm 'ring'"),
    (dict(gpus=16), "inside one node"),
    (dict(gpus=0), "gpus must be an integer >= 1"),
    (dict(nbytes=-1), "bytes must be an integer >= 0"),
])
def test_allreduce_bad_input(kw, match):
    args = dict(nbytes=1024, gpus=8)
    args.update(kw)
    nbytes, gpus = args.pop("nbytes"), args.pop("gpus")
    with pytest.raises(ValueError, match=match):
        predict_allreduce(nbytes, gpus, **args)


# --- the step -----------------------------------------------------------------------------

def test_decode_runs_the_engines_all_reduce_and_training_keeps_nccl():
    m = _llama()
    auto = fxshape.analyze(m, gpu="h100", mode="decode", batch_size=2, context_len=64, tp=2,
                           provenance=None)
    nccl = fxshape.analyze(m, gpu="h100", mode="decode", batch_size=2, context_len=64, tp=2,
                           provenance=None, allreduce="nccl")
    comm = lambda r: [o for o in r.ops if o.op == "tp all_reduce"]  # noqa: E731
    assert {o.family for o in comm(auto)} == {"one-shot"}
    assert {o.family for o in comm(nccl)} == {"nccl-LL"}
    # a 2 x 256 x 2-byte buffer: NCCL's LL latency (6.6 + 2 x 0.6 us) exceeds one stage
    assert sum(o.time_s for o in comm(nccl)) > sum(o.time_s for o in comm(auto))
    assert any(e.name == "allreduce" and e.applied for e in nccl.options)
    train = fxshape.analyze(m, gpu="h100", mode="train", batch_size=1, seq_len=32, tp=2,
                            provenance=None)
    assert {o.family for o in comm(train)} == {"nvswitch"}  # the measured NCCL model


def test_allreduce_option_refused_when_unknown():
    with pytest.raises(ValueError, match="unknown all-reduce algorithm"):
        fxshape.analyze(_llama(), mode="decode", allreduce="fast")


# --- a request end to end ------------------------------------------------------------------

def test_request_latency_is_prefill_plus_its_decode_steps():
    r = fxshape.serve(_llama(), gpu="h100", prompt_len=40, output_len=9, batch_size=2)
    assert len(r.decode_steps_s) == 8  # the first token comes from the prefill
    assert r.latency_s == pytest.approx(r.time_to_first_token_s + sum(r.decode_steps_s),
                                        rel=1e-12)
    assert r.time_to_first_token_s == r.prefill.step.time_s
    assert r.output_tokens_per_s == pytest.approx(2 * 9 / r.latency_s)
    assert r.inter_token_latency_s == pytest.approx(sum(r.decode_steps_s) / 8)
    # the cache grows a token a step: no step is faster than the one before
    assert all(b >= a for a, b in zip(r.decode_steps_s, r.decode_steps_s[1:]))
    d = json.loads(json.dumps(r.to_dict()))
    assert d["decode_steps_s"] == list(r.decode_steps_s)


def test_a_step_repriced_at_its_context_equals_a_capture_there():
    m = _llama()
    r = fxshape.serve(m, gpu="a100", prompt_len=100, output_len=300, batch_size=4,
                      fuse="none")
    # step k runs over 100 + k cached tokens; step 50 re-priced from the one capture (at
    # 399 tokens) against a decode analysis captured at 150 tokens (the GEMMs as captured)
    fresh = fxshape.analyze(m, gpu="a100", mode="decode", batch_size=4, context_len=150,
                            provenance=None)
    assert r.decode_steps_s[49] == pytest.approx(fresh.step.time_s, rel=1e-3)
    steps = fxshape.serving.DecodeSteps(r.decode)
    assert steps.time_s(r.decode.workload.context_len) == r.decode.step.time_s
    assert steps.attention_s(r.decode.workload.context_len) == pytest.approx(
        r.decode.step.by_class["attention"], rel=1e-9)


def test_tensor_parallel_request_is_faster_per_token():
    m = _llama()
    one = fxshape.serve(m, gpu="h100", prompt_len=16, output_len=4, tp=1)
    two = fxshape.serve(m, gpu="h100", prompt_len=16, output_len=4, tp=2)
    assert two.tp == 2 and two.decode.workload.tp == 2
    assert one.inter_token_latency_s > 0 and two.inter_token_latency_s > 0


@pytest.mark.parametrize("kw,match", [
    (dict(prompt_len=500, output_len=20), "exceed LlamaForCausalLM's 512 positions"),
    (dict(prompt_len=10, output_len=0), "output_len must be a positive integer"),
    (dict(prompt_len=-3, output_len=2), "prompt_len must be a positive integer"),
    (dict(prompt_len=10, output_len=2, batch_size=True), "batch_size must be a positive"),
    (dict(prompt_len=10, output_len=2, allreduce="ring"), "unknown all-reduce algorithm"),
])
def test_serve_bad_input(kw, match):
    with pytest.raises(ValueError, match=match):
        fxshape.serve(_llama(), **kw)


def test_serve_refuses_a_batch_that_does_not_fit():
    m = tiny_llama(positions=65536, hidden_size=4096, intermediate_size=8192,
                   num_attention_heads=32, num_key_value_heads=32)
    # 2 layers x 2 (K, V) x 4096 x 2 bytes = 32 KiB a token; 64 x 60,000 tokens = 117 GiB
    with pytest.raises(ValueError, match="do not fit on h100"):
        fxshape.serve(m, gpu="h100", prompt_len=59_000, output_len=1000, batch_size=64)


def test_serve_cli_json(capsys):
    from fxshape.cli import main

    assert main(["serve", "gpt2", "--prompt-len", "8", "--output-len", "3", "--format",
                 "json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["output_len"] == 3 and len(d["decode_steps_s"]) == 2
    assert main(["serve", "gpt2", "--prompt-len", "1020", "--output-len", "10"]) == 2
    assert "exceed" in capsys.readouterr().err


def test_the_packaged_allreduce_constants_are_what_the_bench_fit_gives():
    pytest.importorskip("scipy")
    import fit_allreduce  # bench/ is on sys.path (conftest.py)

    rows = fit_allreduce.rows()
    got = fit_allreduce.fit([r for r in rows if r["role"] == "fit"])
    p = allreduce_params()
    assert got.stage_s == pytest.approx(p.stage_s, rel=1e-3)
    assert got.peer_efficiency == pytest.approx(p.peer_efficiency, rel=1e-3)
    # the held-out rows (vLLM's kernels, without and with CUDA graphs) are not in the fit,
    # and the fit rows are one source's
    assert {r["role"] for r in rows} == {"fit", "held-out", "held-out-graphs"}
    assert {r["source"] for r in rows if r["role"] == "fit"} == {"sglang-pr-2904"}
    # multimem has no constant of its own: the graphed benchmark's multimem rows are
    # predicted within 20% each with the fitted two
    mm = [r for r in rows if r["kernel"] == "vllm-symm-multimem"]
    assert len(mm) == 12
    for r in mm:
        t, _ = fit_allreduce.predict(p, r)
        assert t * 1e6 == pytest.approx(float(r["time_us"]), rel=0.2), r["bytes"]
