"""Zero-bubble pipelines (issue 51, item 5): torchtitan's ZBVZeroBubble schedule (Qi et al.,
ICLR 2024, ZB-V) — its orders, its bubble against 1F1B's, the backward split into input- and
weight-gradient passes, its placement (the first rank holds the embedding and the head),
and bad input."""

import pytest

import fxshape
from fxshape import Parallel
from fxshape.execution.pipeline import weight_grad_s
from fxshape.execution.step import OpRecord
from fxshape.parallelism.schedule import (frozen_orders, in_flight, play, rank_of_stage,
                                          stages_of_rank)

from models import tiny_llama


def test_zbv_orders_run_every_pass_once():
    for p in (2, 3, 4):
        for m in range(1, 3 * p + 1):
            orders = frozen_orders("zbv", p, m, 2)
            for seq in orders:
                # every micro-batch through both chunks: a forward, an input-gradient and a
                # weight-gradient pass each, the W after its I
                for kind in "FIW":
                    for chunk in (0, 1):
                        assert sorted(x.micro for x in seq
                                      if x.kind == kind and x.chunk == chunk) == list(range(m))
                for x in seq:
                    if x.kind == "W":
                        i = seq.index(type(x)("I", x.micro, x.chunk))
                        assert i < seq.index(x)
            # and they never wait on each other for ever
            stages = 2 * p
            play(orders, [1.0] * stages, [2.0] * stages, wgrad=[1.0] * stages, schedule="zbv")


def test_the_v_placement():
    # rank d holds stages d and 2p - 1 - d: with p = 4, rank 0 the first and the last
    assert stages_of_rank("zbv", 0, 4, 2) == [0, 7]
    assert stages_of_rank("zbv", 3, 4, 2) == [3, 4]
    assert [rank_of_stage("zbv", s, 4) for s in range(8)] == [0, 1, 2, 3, 3, 2, 1, 0]
    # Megatron's loop for the interleaved 1F1B
    assert stages_of_rank("interleaved", 0, 4, 2) == [0, 4]


def test_zbv_fills_the_bubble_1f1b_leaves():
    # equal passes (forward 1, input gradient 1, weight gradient 1 per chunk, free sends),
    # 4 ranks, 8 micro-batches: each rank computes 8 x 2 chunks x 3 = 48 units
    p, m = 4, 8
    zbv = play(frozen_orders("zbv", p, m, 2), [1.0] * 8, [2.0] * 8, wgrad=[1.0] * 8,
               schedule="zbv")
    assert zbv.busy == (48.0,) * p
    # 1F1B with the same model as one chunk a rank (forward 2, backward 4): its bubble is
    # (p - 1) of a forward and a backward, (p - 1) x 6 = 18
    one = play(frozen_orders("1f1b", p, m, 1), [2.0] * 4, [4.0] * 4)
    assert one.makespan == pytest.approx(48.0 + 18.0)
    # interleaved 1F1B with two chunks a rank halves it: (p - 1) x 3 = 9
    inter = play(frozen_orders("interleaved", p, m, 2), [1.0] * 8, [2.0] * 8)
    assert inter.makespan == pytest.approx(48.0 + 9.0)
    # ZB-V moves the weight gradients into the rest: only the first forward's way down the
    # ranks and back is left idle, under half of the interleaved schedule's bubble
    assert zbv.makespan - 48.0 < 0.5 * 9.0
    # the weight gradients do fill it: the same order without them split off (W = 0,
    # the whole backward in I) idles more
    whole = play(frozen_orders("zbv", p, m, 2), [1.0] * 8, [2.0] * 8, wgrad=[0.0] * 8,
                 schedule="zbv")
    assert whole.makespan - 32.0 > zbv.makespan - 48.0  # busy 32: no W passes


def test_zbv_holds_as_many_activations_as_1f1b():
    # Qi et al.: ZB-V's peak activation memory is 1F1B's. A rank holds at most 2p
    # chunk-activations of half a rank's layers = p micro-batches of the whole, 1F1B's
    # first rank; a chunk's activations are kept until its weight-gradient pass
    p, m = 4, 8
    zbv = in_flight(frozen_orders("zbv", p, m, 2))
    one = in_flight(frozen_orders("1f1b", p, m, 1))
    assert max(zbv) <= 2 * max(one) and one[0] == p


def _record(phase, shape, module="fc", time_s=1.0):
    return OpRecord(node="n", op="mm", module=module, phase=phase, cls="gemm", kernels=1,
                    bytes=0, flops=0, time_s=time_s, host_s=0.0, shape=shape)


def test_weight_gradient_gemms_by_hand():
    # a linear 256 -> 512 over 128 tokens: forward [128, 256] x [256, 512]; its backward
    # runs the input gradient [128, 512] x [512, 256] (K = 512) and the weight gradient
    # [512, 128] x [128, 256] (K = 128, the tokens): only the second is W
    tokens = {"fc": 128}
    recs = [_record("backward", (1, 128, 256, 512), time_s=2.0),
            _record("backward", (1, 512, 256, 128), time_s=3.0),
            _record("forward", (1, 128, 512, 256), time_s=5.0)]
    assert weight_grad_s(recs, tokens) == 3.0
    # a square case (tokens = in = out = 128): both backward GEMMs are [128, 128] x
    # [128, 128] and cannot be told apart: half of each
    sq = [_record("backward", (1, 128, 128, 128), time_s=2.0)] * 2
    assert weight_grad_s(sq, tokens) == 2.0
    # another module's GEMMs are not this one's
    assert weight_grad_s([_record("backward", (1, 512, 256, 128), module="x")], tokens) == 0


def _train(plan):
    return fxshape.analyze(tiny_llama(num_hidden_layers=4), mode="train", gpu="h100",
                           batch_size=1, seq_len=256, parallel=plan, provenance=None)


def test_analyze_a_zbv_pipeline():
    base = dict(pp=2, dp=1, microbatches=8)
    zbv = _train(Parallel(virtual_stages=2, schedule="zbv", **base))
    inter = _train(Parallel(virtual_stages=2, **base))
    one = _train(Parallel(**base))
    # the same work, less idle: ZB-V's bubble is below both 1F1B schedules'
    bz, bi, bo = (r.step.by_class["pipeline_bubble"] for r in (zbv, inter, one))
    assert bz < bi < bo
    ranks = zbv.step.stages
    # the first rank holds the embedding and the head (stages 0 and 3 of 4): more work than
    # the other, which it does not have under 1F1B (this tiny model's head and loss weigh
    # as much as a layer: the step is not faster for it, which the docs say)
    assert ranks[0].holds == "the embedding, the head and the loss"
    assert ranks[1].holds == "layers only"
    assert ranks[0].busy_s > ranks[1].busy_s
    assert inter.step.stages[0].holds == "the embedding"
    assert any("zero bubble ZB-V" in o.effect for o in zbv.options)
    # the trace draws the split backward's passes by name
    from fxshape.report.chrome import chrome_trace

    names = {e["name"] for e in chrome_trace(zbv)["traceEvents"] if e.get("ph") == "X"}
    assert "backward (weight gradient) micro-batch 0" in names
    assert "backward (input gradient) micro-batch 0 (chunk 1)" in names


@pytest.mark.parametrize("kwargs, match", [
    (dict(pp=2, dp=1, schedule="zbv"), "give virtual_stages=2"),
    (dict(pp=2, dp=1, virtual_stages=4, schedule="zbv"), "give virtual_stages=2"),
    (dict(pp=1, dp=2, schedule="zbv"), "needs pp > 1"),
    (dict(pp=2, dp=1, schedule="zb"), "accepted: '1f1b', 'interleaved', 'gpipe', 'zbv'"),
])
def test_zbv_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Parallel(**kwargs)


def test_zbv_has_no_closed_form_bubble():
    from fxshape.parallelism.schedule import bubble_fraction

    with pytest.raises(ValueError, match="no closed form"):
        bubble_fraction("zbv", 4, 8, 2)


def test_the_plan_search_tries_zbv():
    from fxshape.planning import ModelShape, candidates

    # 2 GPUs, 4 layers, 3 sequences a step, micro-batch 1, two chunks a rank: pp 2 x dp 1
    # runs 3 micro-batches, which Megatron's interleaving refuses (not a multiple of pp =
    # 2) and ZB-V takes; pp 1 has no chunks to place
    plans, dropped = candidates(ModelShape(layers=4, heads=4, kv_heads=4), gpus=2,
                                global_batch=3, seq_len=64, gpus_per_node=8,
                                micro_batches=(1,), recompute=(None,), zero=(0,),
                                virtual_stages=(2,), max_cp=1)
    assert [c.label() for c in plans] == ["tp1 pp2x2v dp1 zero0 mb1x3 rc-none"]
    assert plans[0].parallel.schedule == "zbv"
    assert dropped["interleaved: micro-batches not a multiple of pp"] == 1
