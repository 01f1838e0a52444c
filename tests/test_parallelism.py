"""The parallel plan (issue 29): the pipeline schedules against their closed forms, FSDP's
overlap, the hierarchical collectives, the plan's validation, and the step and memory a plan
gives on a tiny GPT-2 (CPU, meta weights)."""

import dataclasses
import json

import pytest
import torch
import transformers

import fxshape
from fxshape import Parallel
from fxshape.cost.comm import predict_collective
from fxshape.hardware.topology import get_topology
from fxshape.parallelism.overlap import bucketed, prefetched
from fxshape.parallelism.plan import check_plan
from fxshape.parallelism.schedule import bubble_fraction, in_flight, orders, play


@pytest.mark.parametrize("schedule, p, m, v", [
    ("1f1b", 4, 8, 1), ("gpipe", 4, 8, 1), ("1f1b", 8, 3, 1), ("1f1b", 4, 8, 2),
    ("1f1b", 4, 16, 4), ("interleaved", 2, 4, 3), ("gpipe", 3, 1, 1)])
def test_bubble_is_the_closed_form(schedule, p, m, v):
    # equal stages, forward 1 and backward 2 per micro-batch through a rank's whole share
    # (1/v of it per chunk), free sends: the makespan is m (F + B) plus the bubble, whose
    # fraction of m (F + B) is (p - 1) / m, or (p - 1) / (v m) interleaved (Narayanan et
    # al. 2021)
    order = orders(schedule, p, m, v)
    out = play(order, [1.0 / v] * (p * v), [2.0 / v] * (p * v))
    ideal = 3.0 * m
    assert (out.makespan - ideal) / ideal == pytest.approx(bubble_fraction(schedule, p, m, v))
    # every rank computes the same m (F + B)
    assert all(b == pytest.approx(ideal) for b in out.busy)


def test_more_microbatches_never_raise_the_bubble():
    fwd, bwd = [1.0, 1.3, 0.8, 1.1], [2.0, 2.4, 1.9, 2.2]  # unequal stages
    for schedule in ("1f1b", "gpipe"):
        fractions = []
        for m in range(1, 17):
            out = play(orders(schedule, 4, m), fwd, bwd, send=0.05)
            work = m * (max(f + b for f, b in zip(fwd, bwd)))
            fractions.append((out.makespan - work) / work)
        assert all(a >= b - 1e-12 for a, b in zip(fractions, fractions[1:])), fractions


def test_in_flight_activations():
    # 1F1B: rank d holds p - d micro-batches at most (its warm-up plus one); GPipe: all m;
    # interleaved (p 4, v 2, m 8): rank 0 runs (p - 1) * 2 + (v - 1) * p = 10 warm-up
    # chunks, then holds one more: 11 chunks, 5.5 micro-batches (Megatron's p (1 + (p-1)/(pv)))
    assert in_flight(orders("1f1b", 4, 8)) == [4, 3, 2, 1]
    assert in_flight(orders("1f1b", 4, 2)) == [2, 2, 2, 1]
    assert in_flight(orders("gpipe", 4, 8)) == [8, 8, 8, 8]
    assert in_flight(orders("1f1b", 4, 8, 2))[0] == 11


def test_prefetched_overlap():
    # no communication: the compute alone
    assert prefetched([1, 2, 3], [0, 0, 0]).end == 6
    # gathers shorter than the block before them: only the first is exposed
    assert prefetched([1, 1, 1], [0.5, 0.5, 0.5]).exposed == pytest.approx(0.5)
    # gathers of 2 behind blocks of 1: the stream rules, 3 gathers of 2 then the last block
    assert prefetched([1, 1, 1], [2, 2, 2]).end == pytest.approx(7)
    # more communication never ends sooner
    ends = [prefetched([1, 1, 1, 1], [g] * 4, [g] * 4).end for g in (0, 0.2, 0.5, 1, 2)]
    assert ends == sorted(ends)
    # buckets: all ready at the end of a backward of 0 -> their sum
    assert bucketed(0.0, [1, 1], [0.3, 0.4]).end == pytest.approx(0.7)
    with pytest.raises(ValueError, match="one gather and one reduce per block"):
        prefetched([1, 2], [0])


def test_cross_node_all_reduce_is_hierarchical():
    dgx = get_topology("dgx-h100")
    one_rail = dataclasses.replace(dgx, rails=1)
    t8 = predict_collective("all_reduce", 2 ** 30, 16, topology=dgx).time_s
    t1 = predict_collective("all_reduce", 2 ** 30, 16, topology=one_rail).time_s
    # with one adapter per node each GPU gets 1/8 of it: the network part is 8x slower,
    # so the whole is several times slower (the NVLink part does not change)
    assert t1 > 4 * t8
    # more inter-node bandwidth is never slower (HDR -> NDR, everything else equal)
    hdr = dataclasses.replace(dgx, inter="ib_hdr")
    for n in (16, 32, 64):
        assert predict_collective("all_reduce", 2 ** 28, n, topology=dgx).time_s <= \
            predict_collective("all_reduce", 2 ** 28, n, topology=hdr).time_s
    # a cluster of 2 nodes holds 16 GPUs, not 32
    with pytest.raises(ValueError, match="32 GPUs exceed the 16 of 2 dgx-h100 nodes"):
        predict_collective("all_reduce", 2 ** 20, 32, topology="dgx-h100:2")
    with pytest.raises(ValueError, match="unknown topology 'dgx-h100:x'"):
        get_topology("dgx-h100:x")


@pytest.mark.parametrize("kw, match", [
    (dict(zero=4, dp=2), "zero must be one of 0, 1, 2, 3"),
    (dict(microbatches=0), "microbatches must be an integer >= 1"),
    (dict(pp=2, virtual_stages=2, microbatches=3), "multiple of pp=2"),
    (dict(sequence_parallel=True), "sequence_parallel splits .* it needs tp > 1, got tp=1"),
    (dict(zero=3), "nothing to shard over"),
    (dict(dp=8, zero=3, dp_shard=3), "dp_shard=3 must divide dp × cp = 8"),
    (dict(schedule="zigzag"), "unknown pipeline schedule 'zigzag'"),
    (dict(schedule="gpipe"), "needs pp > 1"),
    (dict(pp=2, schedule="gpipe", virtual_stages=2, microbatches=2), "GPipe has one chunk"),
    (dict(pp=2, schedule="interleaved"), "needs virtual_stages > 1"),
    (dict(virtual_stages=2), "needs pp > 1"),
    (dict(grad_dtype="int8"), "grad_dtype must be one of 'fp32', 'bf16', 'fp16'"),
    (dict(grad_dtype=torch.bfloat16), "grad_dtype must be one of"),
])
def test_bad_plans(kw, match):
    with pytest.raises(ValueError, match=match):
        Parallel(**kw)


def test_plan_against_model_and_machine():
    topo = get_topology("dgx-h100:1")
    with pytest.raises(ValueError, match="does not divide the 12 layers into equal chunks; "
                                         "accepted products: 1, 2, 3, 4, 6, 12; or an uneven "
                                         "split"):
        check_plan(Parallel(pp=5), layers=12, topology=topo)
    with pytest.raises(ValueError, match="the plan needs 16 GPUs"):
        check_plan(Parallel(pp=2, dp=8), layers=12, topology=topo)


def _gpt2(n_layer=4, attn=None):
    cfg = transformers.GPT2Config(n_layer=n_layer, n_embd=64, n_head=4, vocab_size=320,
                                  n_positions=128)
    if attn:
        cfg._attn_implementation = attn
    with torch.device("meta"):
        return transformers.GPT2LMHeadModel(cfg)


def _train(model, **kw):
    return fxshape.analyze(model, mode="train", batch_size=2, seq_len=32, provenance=None,
                           **kw)


@pytest.fixture(scope="module")
def gpt2():
    return _gpt2()


def test_zero_shards_by_hand(gpt2):
    P = sum(p.numel() for p in gpt2.parameters())  # tied lm_head counted once
    base = _train(gpt2, dp=8)
    z3 = _train(gpt2, parallel=Parallel(dp=8, zero=3))
    z1 = _train(gpt2, parallel=Parallel(dp=8, zero=1))
    # ZeRO-3: fp32 master weights, gradients, and the AdamW state (2 fp32 moments: 8 bytes)
    # each 1/8 per GPU; ZeRO-1: only the state
    assert z3.memory.parameters == 4 * P // 8
    assert z3.memory.gradients == 4 * P // 8
    assert z3.memory.optimizer_state == 8 * P // 8
    assert z1.memory.parameters == 4 * P and z1.memory.optimizer_state == 8 * P // 8
    assert z3.memory.peak <= z1.memory.peak <= base.memory.peak
    kinds = {(c.kind, c.op) for c in z3.step.communication}
    assert kinds == {("zero", "all_gather"), ("zero", "reduce_scatter")}
    # FSDP gathers every parameter twice (forward, and again for the backward of every
    # layer: the root stays gathered) in bf16, and reduce-scatters fp32 gradients once
    rs = next(c for c in z3.step.communication if c.op == "reduce_scatter")
    assert rs.bytes == 4 * P
    assert all(c.exposed_s <= c.total_s + 1e-15 for c in z3.step.communication)


def test_half_precision_gradients_by_hand(gpt2):
    # bf16 gradients: 2 bytes a parameter where fp32 has 4, in memory and in what the
    # data-parallel reduction moves (DDP's all-reduce, FSDP's reduce-scatter of 1/8 each)
    P = sum(p.numel() for p in gpt2.parameters())
    for plan, per_gpu in ((Parallel(dp=8), P), (Parallel(dp=8, zero=3), P // 8)):
        fp32 = _train(gpt2, parallel=plan)
        bf16 = _train(gpt2, parallel=dataclasses.replace(plan, grad_dtype="bf16"))
        assert (fp32.memory.gradients, bf16.memory.gradients) == (4 * per_gpu, 2 * per_gpu)
        red = [c for c in bf16.step.communication if c.op != "all_gather"]
        assert [c.bytes for c in red] == [2 * P]
        assert bf16.memory.peak <= fp32.memory.peak  # less, unless activations rule it
        assert "gradients in bf16" in bf16.workload.parallel
    with pytest.raises(ValueError, match="gradients exist in mode='train' only"):
        fxshape.analyze(gpt2, parallel=Parallel(grad_dtype="bf16"), provenance=None)


def test_pipeline_step(gpt2):
    few = _train(gpt2, parallel=Parallel(pp=2, microbatches=2))
    many = _train(gpt2, parallel=Parallel(pp=2, microbatches=8))
    for r in (few, many):
        assert sum(r.step.by_class.values()) == pytest.approx(r.step.time_s)
        assert len(r.step.stages) == 2 and r.step.critical.startswith("stage ")
    share = [r.step.by_class["pipeline_bubble"] / r.step.time_s for r in (few, many)]
    assert share[1] < share[0]
    # the global batch: 2 sequences x 8 micro-batches x dp 1
    assert many.workload.global_batch == 16
    # the step processes 8 micro-batches of 2 x 32 tokens
    assert many.step.tokens == 8 * 2 * 32
    j = json.loads(many.to_json())
    assert j["workload"]["microbatches"] == 8 and len(j["step"]["stages"]) == 2
    assert many.to_json() == _train(gpt2, parallel=Parallel(pp=2, microbatches=8)).to_json()


def test_micro_batches_without_a_pipeline(gpt2):
    one = _train(gpt2, dp=2)
    four = _train(gpt2, parallel=Parallel(dp=2, microbatches=4))
    # four micro-batches, one gradient reduction: more than 3x and less than 4x + the
    # optimizer's share of one step
    assert 3 * one.step.time_s < four.step.time_s < 4 * one.step.time_s
    assert four.step.by_class["pipeline_bubble"] == 0.0
    assert four.memory.activations <= one.memory.activations * 1.01


def test_recompute_lowers_activations():
    eager = _gpt2(2, attn="eager")
    none = _train(eager)
    sel = _train(eager, recompute="selective")
    full = _train(eager, recompute="full")
    assert full.memory.activations < sel.memory.activations < none.memory.activations
    assert full.step.time_s > none.step.time_s and sel.step.time_s > none.step.time_s
    # recomputed work is not useful work: the model FLOPs do not change
    assert sel.step.model_flops == none.step.model_flops == full.step.model_flops


def test_plan_bad_input(gpt2):
    with pytest.raises(ValueError, match="modelled for mode='train', not 'inference'"):
        fxshape.analyze(gpt2, parallel=Parallel(pp=2), provenance=None)
    with pytest.raises(ValueError, match="tp given beside parallel="):
        fxshape.analyze(gpt2, tp=2, parallel=Parallel(), provenance=None)
    with pytest.raises(ValueError, match="parallel must be a fxshape.Parallel plan"):
        fxshape.analyze(gpt2, parallel={"pp": 2}, provenance=None)
    with pytest.raises(ValueError, match="unknown recompute 'some'"):
        fxshape.analyze(gpt2, mode="train", recompute="some", provenance=None)
    with pytest.raises(ValueError, match="recompute='full' re-runs forwards"):
        fxshape.analyze(gpt2, recompute="full", provenance=None)
    with pytest.raises(ValueError, match="does not divide the 4 layers"):
        _train(gpt2, parallel=Parallel(pp=3))
