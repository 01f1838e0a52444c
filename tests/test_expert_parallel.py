"""Expert parallelism (``Parallel(ep=N)``): the busiest rank's expert GEMMs, the all-to-all
bytes, expert parameters per rank and their reductions, by hand on a tiny Mixtral; bad
input."""

import pytest
import torch

import fxshape
from fxshape import Parallel
from fxshape.cost.comm import bus_bytes, predict_collective
from fxshape.parallelism.experts import (busiest_rank, capacity, check_ep, expert_blocks,
                                         expert_rows, rank_loads)

transformers = pytest.importorskip("transformers")

HIDDEN, WIDTH, EXPERTS, TOPK = 256, 512, 4, 2


def _mixtral(layers=1):
    """Mixtral with 4 experts, 2 per token: hidden 256, experts' width 512."""
    cfg = transformers.MixtralConfig(hidden_size=HIDDEN, intermediate_size=WIDTH,
                                     num_hidden_layers=layers, num_attention_heads=8,
                                     num_key_value_heads=2, vocab_size=1000,
                                     num_local_experts=EXPERTS, num_experts_per_tok=TOPK)
    with torch.device("meta"):
        return transformers.MixtralForCausalLM(cfg).eval()


def _train(model, plan, **kw):
    return fxshape.analyze(model, seq_len=64, batch_size=1, mode="train", parallel=plan,
                           provenance=None, **kw)


def test_blocks_and_loads_by_hand():
    assert [list(b) for b in expert_blocks(8, 4)] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    # experts 0,1 on rank 0 take 0.5 + 0.25; rank 1 the rest
    assert rank_loads([0.5, 0.25, 0.25, 0.0], 2) == [0.75, 0.25]
    assert busiest_rank([0.5, 0.25, 0.25, 0.0], 2) == 0
    assert busiest_rank([0.1, 0.1, 0.4, 0.4], 2) == 1
    assert busiest_rank([0.25] * 4, 2) == 0  # a tie: the lower rank
    # capacity: factor 1.25 x (2 ranks x 128 rows) / 4 experts = 80 rows each
    assert capacity(1.25, 128, 4, 2) == 80
    assert capacity(1.0, 3, 4, 1) == 1  # ceil(0.75)


def test_expert_rows_balanced_routed_and_capped():
    # 128 routed rows per rank, 2 ranks: 256 in the group, 64 per expert balanced
    assert expert_rows(128, 4, 2) == (0, [64, 64])
    # routed 0.5/0.25/0.25/0: rank 0 gets 128 + 64 of the 256
    assert expert_rows(128, 4, 2, [0.5, 0.25, 0.25, 0.0]) == (0, [128, 64])
    # padded to capacity whatever the routing
    assert expert_rows(128, 4, 2, [0.5, 0.25, 0.25, 0.0], capacity_factor=1.0) == (0, [64, 64])
    # the shares sum to the group's rows
    _, shares = expert_rows(100, 8, 1, [0.3, 0.2, 0.1, 0.1, 0.1, 0.1, 0.05, 0.05])
    assert sum(shares) == 100


def test_check_ep_lists_divisors():
    with pytest.raises(ValueError, match=r"ep=3 must divide the 8 experts.*1, 2, 4, 8"):
        check_ep(3, 8)


def test_all_to_all_bus_bytes_and_time():
    mib = 2 ** 20
    # each GPU keeps 1/n of its buffer: 7/8 of it leaves over the link
    assert bus_bytes("all_to_all", 8 * mib, 8) == 7 * mib
    one = predict_collective("all_to_all", 64 * mib, 8, topology="dgx-h100")
    two = predict_collective("all_to_all", 128 * mib, 8, topology="dgx-h100")
    assert one.link_class == "nvswitch"  # no in-switch reduction for an all-to-all
    assert one.time_s < two.time_s < 2 * one.time_s + 1e-9  # a latency plus bytes / bandwidth
    # across two nodes, half of each buffer goes through one 50 GB/s adapter per GPU: slower
    # than the whole buffer over NVLink (450 GB/s)
    across = predict_collective("all_to_all", 64 * mib, 16, topology="dgx-h100:2", per_node=8)
    assert across.link_class == "network" and across.time_s > 4 * one.time_s


def test_expert_gemms_per_rank_balanced():
    model = _mixtral()
    base = _train(model, Parallel(dp=2))
    ep = _train(model, Parallel(dp=2, ep=2))
    up0 = [r for r in base.rows if r.op == "grouped_mm" and r.k == HIDDEN]
    up = [r for r in ep.rows if r.op == "grouped_mm" and r.k == HIDDEN]
    # 64 tokens x top-2 = 128 routed rows per rank over 4 experts: 32 each, all 4 experts
    assert [(r.batch, r.m) for r in up0] == [(4, 32)]
    # ep 2: 2 experts per rank, the group's 256 rows over 4 experts: 64 each
    assert [(r.batch, r.m) for r in up] == [(2, 64)]
    # the same FLOPs per rank, on fewer and larger GEMMs
    assert sum(r.flops for r in up) == sum(r.flops for r in up0)
    # weight gradients reduce over the rows: K = 64
    dw = [r for r in ep.rows if r.op == "grouped_mm.dw"]
    assert {r.k for r in dw} == {64} and {r.batch for r in dw} == {2}


def test_expert_gemms_follow_the_busiest_rank():
    model = _mixtral()
    rep = _train(model, Parallel(dp=2, ep=2), moe_routing=[0.5, 0.25, 0.25, 0.0])
    up = sorted((r.batch, r.m) for r in rep.rows if r.op == "grouped_mm" and r.k == HIDDEN)
    # the group's 256 rows: expert 0 128, expert 1 64 (rank 0: 192); rank 1 gets 64
    assert up == [(1, 64), (1, 128)]
    capped = _train(model, Parallel(dp=2, ep=2, capacity_factor=1.5))
    up = [(r.batch, r.m) for r in capped.rows if r.op == "grouped_mm" and r.k == HIDDEN]
    # 1.5 x 256 / 4 = 96 rows for each of the rank's 2 experts
    assert up == [(2, 96)]


def test_all_to_all_records_and_step():
    model = _mixtral()
    rep = _train(model, Parallel(dp=2, ep=2))
    a2a = [o for o in rep.ops if o.op == "ep all_to_all"]
    # dispatch and combine in the forward, their gradients in the backward: one layer
    assert [o.phase for o in a2a] == ["forward", "forward", "backward", "backward"]
    # each moves the rank's 128 received rows x hidden 256 x 2 bytes (bf16)
    assert {o.bytes for o in a2a} == {128 * HIDDEN * 2}
    # in the order they run: dispatch before the experts' first GEMM, combine after the last
    ops = [o.op for o in rep.ops if o.phase == "forward" and
           (o.op == "ep all_to_all" or o.op.startswith("grouped"))]
    assert ops == ["ep all_to_all", "grouped_mm", "grouped_mm", "ep all_to_all"]
    coll = {(c.kind, c.op): c for c in rep.step.communication}
    ep = coll[("ep", "all_to_all")]
    assert ep.group == 2 and ep.count == 4 and ep.bytes == 4 * 128 * HIDDEN * 2
    assert ep.exposed_s == pytest.approx(ep.total_s)  # not overlapped
    assert ep.total_s == pytest.approx(sum(o.time_s for o in a2a))


def test_expert_parameters_per_rank_and_their_reduction():
    model = _mixtral()
    experts = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    total = sum(p.numel() for p in model.parameters())
    # 4 experts x (gate_up 2 x 512 x 256 + down 256 x 512)
    assert experts == 4 * (2 * WIDTH * HIDDEN + HIDDEN * WIDTH)
    plain = _train(model, Parallel(dp=4))
    ep = _train(model, Parallel(dp=4, ep=4))
    # fp32 master weights: 4 bytes per parameter; each rank holds 1 of 4 experts
    assert plain.memory.parameters == 4 * total
    assert ep.memory.parameters == 4 * (total - experts + experts // 4)
    # ZeRO-3 over dp 4: the dense parameters over 4, the experts over 4 / 4 = 1 rank: the
    # same 1/4 of everything per GPU
    z3 = _train(model, Parallel(dp=4, ep=4, zero=3))
    assert z3.memory.parameters == pytest.approx(4 * total / 4, abs=8)
    # DDP's gradient all-reduce: ep 4 leaves the experts' gradients nobody to share with
    dp = {(c.kind, c.op): c for c in plain.step.communication}[("dp", "all_reduce")]
    dpe = {(c.kind, c.op): c for c in ep.step.communication}[("dp", "all_reduce")]
    assert dpe.bytes == 4 * (total - experts + experts // 4)  # fp32 gradients, this rank's
    assert dpe.total_s < dp.total_s


def test_ep_bad_input():
    model = _mixtral()
    with pytest.raises(ValueError, match=r"ep=3 must divide the 4 experts"):
        _train(model, Parallel(dp=3, ep=3))
    with pytest.raises(ValueError, match=r"must divide dp × cp = 4; accepted: 1, 2, 4"):
        Parallel(dp=4, ep=8)
    with pytest.raises(ValueError, match="capacity_factor .* needs ep > 1"):
        Parallel(dp=2, capacity_factor=1.0)
    with pytest.raises(ValueError, match="capacity_factor must be a positive number"):
        Parallel(dp=2, ep=2, capacity_factor=0)
    with pytest.raises(ValueError, match="Parallel.ep=2: .* modelled for mode='train'"):
        fxshape.analyze(model, seq_len=64, mode="inference", parallel=Parallel(dp=2, ep=2))
    with pytest.raises(ValueError, match="ep must divide dp_shard|must divide dp_shard"):
        Parallel(dp=4, ep=4, zero=3, dp_shard=2)
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=4,
                                   vocab_size=100)
    with torch.device("meta"):
        dense = transformers.LlamaForCausalLM(cfg).eval()
    with pytest.raises(ValueError, match="ep=2 spreads MoE experts over ranks, but "
                                         "LlamaForCausalLM has no routed experts"):
        _train(dense, Parallel(dp=2, ep=2))
