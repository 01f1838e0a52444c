"""Pipelines split unevenly, as frameworks split them (issue 51, item 5): torchtitan's split
of the layers (the embedding and the head weighed as a layer each), explicit layer counts
per chunk, the step and the plan search under them."""

import pytest
import torch
import transformers

import fxshape
from fxshape import Parallel
from fxshape.hardware.topology import get_topology
from fxshape.parallelism.plan import (check_plan, layer_chunks, stage_layer_counts,
                                      torchtitan_split)
from fxshape.planning.space import ModelShape, candidates
from models import tiny_llama


def test_torchtitans_split_by_hand():
    # Llama-3.1-405B, 126 layers on 8 stages: 126 + 1 (embedding) + 1 (head) = 128
    # effective layers, 16 a stage; the first and last give one to the embedding and head
    assert torchtitan_split(126, 8) == (15, 16, 16, 16, 16, 16, 16, 15)
    # 32 layers on 4: 34 effective = 4 x 8 + 2, the first two stages one more (9, 9, 8, 8),
    # then the first and last one fewer
    assert torchtitan_split(32, 4) == (8, 9, 8, 7)
    # 61 layers (DeepSeek-V3) on 16: 63 = 16 x 3 + 15 -> fifteen 4s and a 3; then -1, -1
    assert torchtitan_split(61, 16) == (3,) + (4,) * 14 + (2,)
    assert sum(torchtitan_split(61, 16)) == 61
    # one stage holds everything
    assert torchtitan_split(12, 1) == (12,)


def test_a_chunk_without_layers_is_refused():
    # 2 layers on 4 stages: 4 effective, 1 a stage, the first and last left with none
    with pytest.raises(ValueError, match="leaves a chunk without a layer .0/1/1/0"):
        torchtitan_split(2, 4)
    topo = get_topology("dgx-h100")
    with pytest.raises(ValueError, match="without a layer"):
        check_plan(Parallel(pp=4, stage_layers="torchtitan"), layers=2, topology=topo)


def test_stage_layers_counts_and_chunks():
    # equal chunks by default; counts as given; the chunk of each layer in order
    assert stage_layer_counts(Parallel(pp=4), 32) == (8, 8, 8, 8)
    assert stage_layer_counts(Parallel(pp=2, stage_layers=(3, 5)), 8) == (3, 5)
    assert stage_layer_counts(Parallel(pp=2, virtual_stages=2, microbatches=2,
                                       stage_layers="torchtitan"), 8) == (2, 3, 2, 1)
    assert layer_chunks((2, 3)) == (0, 0, 1, 1, 1)
    # a list is kept as a tuple (the plan is frozen and hashable)
    assert Parallel(pp=2, stage_layers=[3, 5]).stage_layers == (3, 5)
    assert "layers per chunk 3/5" in Parallel(pp=2, stage_layers=(3, 5)).describe()


@pytest.mark.parametrize("bad,match", [
    ((3,), "must be None, 'torchtitan' or 2 layer counts of at least 1"),
    ((3, 0), "at least 1"),
    ((True, 3), "at least 1"),
    ("megatron", "unknown stage_layers 'megatron'; accepted: None"),
    (3.5, "must be None"),
])
def test_bad_stage_layers(bad, match):
    with pytest.raises(ValueError, match=match):
        Parallel(pp=2, stage_layers=bad)


def test_stage_layers_need_a_pipeline_and_must_cover_the_layers():
    with pytest.raises(ValueError, match="needs pp > 1"):
        Parallel(stage_layers="torchtitan")
    topo = get_topology("dgx-h100")
    with pytest.raises(ValueError, match=r"sums to 7, but the model has 8 layers; accepted: "
                                         r"2 counts of at least 1 summing to 8"):
        check_plan(Parallel(pp=2, stage_layers=(3, 4)), layers=8, topology=topo)
    # equal chunks that do not divide say what would
    with pytest.raises(ValueError, match="stage_layers='torchtitan'"):
        check_plan(Parallel(pp=3), layers=8, topology=topo)


def _gpt2(n_layer):
    cfg = transformers.GPT2Config(n_layer=n_layer, n_embd=64, n_head=4, vocab_size=320,
                                  n_positions=64)
    with torch.device("meta"):
        return transformers.GPT2LMHeadModel(cfg)


def _step(model, plan):
    return fxshape.analyze(model, mode="train", batch_size=1, seq_len=32, gpu="h100",
                           provenance=None, parallel=plan)


def test_an_uneven_pipeline_step():
    model = _gpt2(6)
    even = _step(model, Parallel(pp=2, microbatches=4))
    same = _step(model, Parallel(pp=2, microbatches=4, stage_layers=(3, 3)))
    # counts equal to the default split are the default split
    assert same.step.time_s == even.step.time_s
    uneven = _step(model, Parallel(pp=2, microbatches=4, stage_layers=(1, 5)))
    ranks = uneven.step.stages
    # each rank says which layers it runs: (first, last) per chunk
    assert [r.layers for r in ranks] == [((0, 0),), ((1, 5),)]
    # five layers and the head against one layer and the embedding: the last stage is
    # the busier and names itself so, and the pipeline is slower than the even one
    assert ranks[1].busy_s > 2 * ranks[0].busy_s
    assert uneven.step.time_s > even.step.time_s
    assert any("2 chunks of 1/5 layers; the slowest stage is 1 of 2" in n
               for n in uneven.step.notes)


def test_a_pipeline_that_does_not_divide_the_layers_runs_torchtitans_split():
    # 6 layers on 4 stages: 8 effective, 2 a stage, minus the embedding and the head:
    # (1, 2, 2, 1)
    r = _step(_gpt2(6), Parallel(pp=4, microbatches=4, stage_layers="torchtitan"))
    assert [s.layers for s in r.step.stages] == [((0, 0),), ((1, 2),), ((3, 4),), ((5, 5),)]
    assert any("4 chunks of 1/2/2/1 layers" in n for n in r.step.notes)


def test_the_plan_search_tries_the_deep_pipelines_a_big_model_needs():
    # 126 layers on 16 GPUs: pipelines of 4, 8 and 16 stages do not divide 126; they are
    # candidates with torchtitan's split, where only pp 1 and 2 were before
    plans, dropped = candidates(ModelShape(126, 128, 8), gpus=16, global_batch=16,
                                seq_len=2048, gpus_per_node=8, micro_batches=(1,),
                                recompute=(None,), zero=(0,), virtual_stages=(1,),
                                context_parallel=False)
    pps = {(c.parallel.pp, c.parallel.stage_layers) for c in plans}
    assert {(1, None), (2, None), (4, "torchtitan"), (8, "torchtitan"),
            (16, "torchtitan")} <= pps
    assert all(p.stage_layers is None for p in (c.parallel for c in plans)
               if 126 % p.stages == 0)
    assert any("(tt)" in c.label() for c in plans)


# --- torchtitan's op-level selective checkpointing (recompute="op") -----------------------

def _llama_tiny():
    return tiny_llama(positions=4096, hidden_size=512, intermediate_size=2048,
                      vocab_size=4096)


def test_op_checkpointing_reruns_every_second_matmul_and_the_memory_ops():
    import fxshape

    model = _llama_tiny()
    kw = dict(gpu="h100", mode="train", batch_size=2, seq_len=1024, provenance=None)
    reps = {rc: fxshape.analyze(model, recompute=rc, **kw) for rc in (None, "op", "full")}
    again = [r for r in reps["op"].ops if r.node.endswith("@recompute")]
    # a Llama layer's forward matmuls in order: q, k, v, o, gate, up, down; torchtitan's
    # policy saves the 1st, 3rd, 5th and 7th and recomputes k_proj, o_proj and up_proj
    gemms = sorted({(r.module.split(".")[2], r.module.rsplit(".", 1)[1])
                    for r in again if r.cls == "gemm"})
    assert gemms == [(lay, p) for lay in ("0", "1")
                     for p in ("k_proj", "o_proj", "up_proj")]
    assert not any(r.cls == "attention" for r in again)  # the attention kernel is saved
    memory_fwd = {r.node for r in reps["op"].ops
                  if r.phase == "forward" and r.cls == "memory" and ".layers." in r.module}
    assert {r.node.removesuffix("@recompute") for r in again if r.cls == "memory"} \
        == memory_fwd
    assert all(r.flops == 0 for r in again)  # not useful work
    t = {rc: rep.step.time_s for rc, rep in reps.items()}
    assert t[None] < t["op"] < t["full"]
    act = {rc: rep.memory.activations for rc, rep in reps.items()}
    assert act["op"] < act[None]  # (with two layers, full keeps less than op: one layer
    # whole again besides the inputs)
    assert any("op-level selective checkpointing" in n for n in reps["op"].step.notes)
    assert any(n.startswith("op-level selective checkpointing:") for n in
               reps["op"].memory.notes)


def test_op_checkpointing_is_accepted_where_recompute_is():
    import fxshape
    from fxshape.parallelism.plan import check_recompute

    check_recompute("op", "train")
    with pytest.raises(ValueError, match="accepted: None, 'full', 'selective', 'op'"):
        check_recompute("ops", "train")
    with pytest.raises(ValueError, match="needs mode='train'"):
        fxshape.analyze(_llama_tiny(), gpu="h100", recompute="op", batch_size=1, seq_len=128)
