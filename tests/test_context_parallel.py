"""Context parallelism (``Parallel(cp=N)``): ring attention's kernels, bytes and overlap by
hand, one rank's share of the model, and bad input."""

import pytest
import torch

import fxshape
from fxshape import Parallel
from fxshape.cost.attention import AttentionShape
from fxshape.parallelism.context import (ring_blocks, ring_exposed, ring_step_bytes,
                                         ring_steps)

transformers = pytest.importorskip("transformers")


def _scores(blocks):
    """Score elements the blocks compute (a causal square block counts half: the papers'
    convention, as ``AttentionShape.causal_fraction``)."""
    return sum(n * b.seq_q * b.seq_k * b.causal_fraction for b, n in blocks)


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_ring_blocks_split_the_scores_evenly(cp):
    s = 64 * cp  # the whole sequence; each rank holds s / cp tokens
    local = AttentionShape(1, 4, 4, s // cp, s // cp, 32, 32, causal=True)
    # causal: the whole matrix's s^2 / 2 scores, shared by cp ranks
    assert _scores(ring_blocks(local, cp)) == s * s / 2 / cp
    # unmasked: s^2 / cp each
    full = AttentionShape(1, 4, 4, s // cp, s // cp, 32, 32, causal=False)
    assert _scores(ring_blocks(full, cp)) == s * s / cp
    # one kernel per ring step
    assert sum(n for _, n in ring_blocks(local, cp)) == cp
    assert ring_steps(cp) == cp - 1


def test_ring_blocks_one_rank_is_the_call_itself():
    shape = AttentionShape(2, 8, 2, 128, 128, 64, 64, causal=True)
    assert ring_blocks(shape, 1) == [(shape, 1)]


def test_ring_step_bytes_by_hand():
    # K and V of one chunk pair: batch 2 x 4 KV heads x 8 tokens x (16 + 16) dims x 2 bytes
    shape = AttentionShape(2, 8, 4, 8, 8, 16, 16, causal=True)
    kv = 2 * 4 * 8 * (16 + 16) * 2
    assert ring_step_bytes(shape, 2, "forward") == kv == 4096
    # the backward passes dK and dV along with K and V
    assert ring_step_bytes(shape, 2, "backward") == 2 * kv
    with pytest.raises(ValueError, match="direction"):
        ring_step_bytes(shape, 2, "sideways")


def test_ring_exposed_is_what_outlasts_each_block():
    # three blocks of 1 s: transfers 0 and 1 overlap blocks 0 and 1
    assert ring_exposed([1.0, 1.0, 1.0], 1.5) == pytest.approx(1.0)  # 0.5 + 0.5
    assert ring_exposed([1.0, 1.0, 1.0], 0.5) == 0.0
    assert ring_exposed([2.0], 5.0) == 0.0  # one rank: no transfer


def test_ring_blocks_bad_input():
    cross = AttentionShape(1, 4, 4, 16, 32, 32, 32)
    with pytest.raises(ValueError, match="self-attention"):
        ring_blocks(cross, 2)
    with pytest.raises(ValueError, match="positive integer"):
        ring_blocks(AttentionShape(1, 4, 4, 16, 16, 32, 32), 0)


def _llama(attn="sdpa"):
    cfg = transformers.LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                   num_attention_heads=8, num_key_value_heads=4,
                                   vocab_size=512, max_position_embeddings=1024,
                                   attn_implementation=attn)
    with torch.device("meta"):
        return transformers.LlamaForCausalLM(cfg)


def _train(model, plan, seq=256, **kw):
    return fxshape.analyze(model, mode="train", batch_size=1, seq_len=seq, parallel=plan,
                           gpu="h100", provenance=None, **kw)


@pytest.fixture(scope="module")
def cp_reports():
    model = _llama()
    return {cp: _train(model, Parallel(cp=cp)) for cp in (1, 2)}


def test_each_rank_runs_its_share_and_attention_sees_every_key(cp_reports):
    one, two = cp_reports[1], cp_reports[2]
    qk = [r for r in two.rows if r.op == "sdpa.qk"]
    assert qk, "no attention rows"
    # each rank's queries are half the sequence, its keys the whole of it
    assert {(r.m, r.n) for r in qk} == {(128, 256)}
    # the GEMMs outside attention run on half the tokens: M halves
    proj = {r.module: r.m for r in one.rows if r.op == "linear" and r.phase == "forward"}
    for r in two.rows:
        if r.op == "linear" and r.phase == "forward":
            assert 2 * r.m == proj[r.module]
    # a causal rank computes half of its s/cp x s scores: 128 x 256 / 2 per head
    assert qk[0].flops == 2 * 1 * 8 * 128 * 256 * 32 // 2
    # the whole sequence is still one data-parallel replica's tokens
    assert one.step.tokens == two.step.tokens == 256


def test_ring_bytes_in_the_step_by_hand(cp_reports):
    rep = cp_reports[2]
    ring = [c for c in rep.step.communication if c.kind == "cp"]
    assert len(ring) == 1 and ring[0].op == "send_recv" and ring[0].group == 2
    # per attention call one transfer (cp - 1) of K and V as the call gets them (Hugging
    # Face's Llama repeats its 4 KV heads to the 8 query heads before SDPA, and an SDPA-level
    # ring, torchtitan's, passes those): 1 x 8 heads x 128 tokens x (32 + 32) x 2 bytes =
    # 131,072; 2 layers forward, and in the backward K, V, dK, dV (twice)
    per = 8 * 128 * 64 * 2
    assert ring[0].bytes == 2 * per + 2 * 2 * per == 786432
    assert ring[0].count == 4
    assert 0 <= ring[0].exposed_s <= ring[0].total_s
    assert "context parallel over 2" in " ".join(rep.step.notes)
    assert "cp 2" in rep.workload.parallel


def test_activations_shrink_with_cp(cp_reports):
    a1, a2 = cp_reports[1].memory.activations, cp_reports[2].memory.activations
    # every saved activation is per token except none: half the tokens, at most ~half
    assert a2 < 0.6 * a1
    # the parameters do not shard without ZeRO
    assert cp_reports[1].memory.parameters == cp_reports[2].memory.parameters


def test_zero_shards_over_the_context_parallel_ranks():
    plan = Parallel(cp=4, zero=3)
    # dp 1: ZeRO shards over the cp ranks, which hold the same parameters
    assert plan.shard == 4 and plan.replicate == 1 and plan.gpus == 4
    assert Parallel(tp=2, cp=2, dp=2, pp=2).gpus == 16
    with pytest.raises(ValueError, match="dp_shard=3 must divide dp × cp = 4"):
        Parallel(cp=2, dp=2, zero=3, dp_shard=3)


def test_cp_bad_input():
    model = _llama()
    with pytest.raises(ValueError, match=r"Parallel.cp must be an integer >= 1"):
        Parallel(cp=0)
    with pytest.raises(ValueError, match=r"multiple of 8.*accepted: 8, 16, 24"):
        _train(model, Parallel(cp=4), seq=100)
    with pytest.raises(ValueError, match="mode='train'"):
        fxshape.analyze(model, batch_size=1, seq_len=256, parallel=Parallel(cp=2))
    with pytest.raises(ValueError, match="fused kernel"):
        _train(model, Parallel(cp=2), attention="math")
    with pytest.raises(ValueError, match="no fused attention call"):
        _train(_llama("eager"), Parallel(cp=2))
    with pytest.raises(ValueError, match="example inputs"):
        fxshape.analyze(model, (torch.zeros(1, 256, dtype=torch.long),), mode="train",
                        parallel=Parallel(cp=2), provenance=None)


def test_ring_merges_by_hand(cp_reports):
    from fxshape.execution.ring import merge_kernels

    # one rank's call at cp = 2: 1 sequence x 8 heads x 128 tokens x 32 dims = 32,768 output
    # elements. Forward: the first output cast to fp32 (2 + 4 bytes each), one later step
    # (its cast, 6; out - block_out and the final subtraction, 12 each: two fp32 reads and a
    # write; the product by the per-row factor, 8), the result cast back (6)
    shape = AttentionShape(1, 8, 8, 128, 128, 32, 32, causal=True)
    out = 1 * 8 * 128 * 32
    assert merge_kernels(shape, 2, "forward", 2) == [6 * out, 6 * out, 12 * out, 8 * out,
                                                     12 * out, 6 * out]
    # backward: per step dQ (q elements) and dK + dV (k and v) added into fp32 (2 + 4 + 4),
    # then both cast back (2 + 4)
    q, kv = out, 1 * 8 * 128 * 64
    assert merge_kernels(shape, 2, "backward", 2) == [10 * q, 10 * kv] * 2 + [6 * q, 6 * kv]
    assert merge_kernels(shape, 1, "forward", 2) == []
    # in the step: one merge record per attention call and direction, 2 layers
    rep = cp_reports[2]
    merges = [o for o in rep.ops if o.op == "cp merge"]
    assert len(merges) == 4 and {o.phase for o in merges} == {"forward", "backward"}
    assert sum(o.bytes for o in merges) == 2 * (50 * out) + 2 * (2 * 10 * (q + kv)
                                                                  + 6 * (q + kv))
    assert not [o for o in cp_reports[1].ops if o.op == "cp merge"]


def test_the_ring_is_dispatched_by_the_host(cp_reports):
    """Issue 52: the ring's kernels and transfers added no host time (a host-bound cp 2 step
    equalled its dp twin to the last digit)."""
    from fxshape.cost.host import host_params

    hp = host_params()
    one, two = cp_reports[1], cp_reports[2]

    def host(rep, op):
        return [(o.phase, o.host_s) for o in rep.ops if o.op == op]

    # each attention call's record: cp = 2 kernels, each an op the host dispatches
    assert host(two, "sdpa.qk") == [(p, 2 * h) for p, h in host(one, "sdpa.qk")]
    assert host(two, "sdpa.bwd.qk") == [(p, 2 * h) for p, h in host(one, "sdpa.bwd.qk")]
    # each transfer (cp - 1 = 1 a call) one launch; each merge kernel one
    for o in two.ops:
        if o.op in ("cp send_recv", "cp merge"):
            assert o.host_s == pytest.approx(o.kernels * hp.op_s("kernel", o.phase))
    ring = sum(o.host_s for o in two.ops if o.op in ("cp send_recv", "cp merge"))
    extra = sum(h for _, h in host(one, "sdpa.qk") + host(one, "sdpa.bwd.qk"))
    assert sum(o.host_s for o in two.ops) == pytest.approx(
        sum(o.host_s for o in one.ops) + ring + extra)
