"""Collectives that slow the compute they overlap (issue 51, item 2): NCCL's CTAs hold SMs."""

import random

import pytest

import fxshape
from fxshape import Parallel
from fxshape.hardware.gpus import get_gpu
from fxshape.parallelism.overlap import NCCL_CTAS, bucketed, prefetched, sm_share
from models import tiny_llama


def test_sm_share_by_hand():
    # 24 CTAs inside an NVSwitch node, 16 across DGX nodes (NVIDIA/nccl#1225, #689)
    assert sm_share(get_gpu("h100-sxm"), "nvswitch") == pytest.approx(24 / 132)
    assert sm_share(get_gpu("a100-sxm4-80gb"), "nvswitch") == pytest.approx(24 / 108)
    assert sm_share(get_gpu("h100-sxm"), "network") == pytest.approx(16 / 132)
    assert sm_share(get_gpu("h100-sxm"), "pcie") == pytest.approx(2 / 132)
    assert sm_share(get_gpu("mi300x"), "nvswitch") == 0.0  # RCCL not modelled
    with pytest.raises(ValueError, match="link class 'ethernet'; accepted: "):
        sm_share(get_gpu("h100-sxm"), "ethernet")
    assert set(NCCL_CTAS) == {"nvswitch", "nvswitch_nvls", "nvlink_pair", "network", "pcie"}


def test_prefetched_stretch_by_hand():
    # gathers of 0.5 s before three 1 s blocks, compute at 0.8 of its rate beside them:
    # block 0 waits 0.5 s for its gather, runs 0.5-1.0 beside gather 1 (0.4 s of work done)
    # and ends at 1.6; block 1 runs 1.6-2.1 beside gather 2, ends at 2.7; block 2 ends 3.7
    ov = prefetched([1, 1, 1], [0.5, 0.5, 0.5], slow=0.2)
    assert ov.end == pytest.approx(3.7)
    assert ov.stretch == pytest.approx(0.2)  # 0.1 for each of blocks 0 and 1
    assert ov.exposed == pytest.approx(0.5)  # the first gather only
    # without the SMs taken, the same schedule as before
    assert prefetched([1, 1, 1], [0.5, 0.5, 0.5]).end == pytest.approx(3.5)


def test_bucketed_stretch_by_hand():
    # a 3 s backward yields three equal buckets (at 1, 2, 3 s of work), each reduced in
    # 0.5 s at 0.8 of the backward's rate: bucket 1 runs 1.0-1.5, the backward reaches 2 s
    # of work at 2.1; bucket 2 runs 2.1-2.6, the backward ends at 3.2; bucket 3 ends 3.7
    ov = bucketed(3.0, [1, 1, 1], [0.5, 0.5, 0.5], slow=0.2)
    assert ov.end == pytest.approx(3.7)
    assert ov.stretch == pytest.approx(0.2)
    assert ov.exposed == pytest.approx(0.5)


def test_slow_must_be_a_rate():
    for bad in (-0.1, 1.0, 2):
        with pytest.raises(ValueError, match=r"slow must be in \[0, 1\)"):
            prefetched([1], [0], slow=bad)
        with pytest.raises(ValueError, match=r"slow must be in \[0, 1\)"):
            bucketed(1.0, [1], [1.0], slow=bad)


def test_an_overlapped_collective_never_makes_the_step_faster():
    rng = random.Random(0)
    for _ in range(300):
        n = rng.randint(1, 8)
        compute = [rng.uniform(0, 2) for _ in range(n)]
        gathers = [rng.choice([0, rng.uniform(0, 2)]) for _ in range(n)]
        reduces = [rng.choice([0, rng.uniform(0, 2)]) for _ in range(n)]
        ends = [prefetched(compute, gathers, reduces, slow=s).end for s in (0, 0.1, 0.3, 0.6)]
        assert ends[0] >= sum(compute) - 1e-12  # never faster than no collective
        assert all(a <= b + 1e-12 for a, b in zip(ends, ends[1:]))  # more SMs, never faster
        for s in (0, 0.3):
            ov = prefetched(compute, gathers, reduces, slow=s)
            # the parts add up: compute + its stretch + waiting
            assert ov.end == pytest.approx(ov.compute + ov.stretch + ov.exposed)
        sizes = [rng.randint(1, 5) for _ in range(n)]
        times = [rng.uniform(0, 1) for _ in range(n)]
        dur = rng.uniform(0, 5)
        b = [bucketed(dur, sizes, times, slow=s).end for s in (0, 0.2, 0.5)]
        assert b[0] >= dur and b == sorted(b)


def _model():
    return tiny_llama(positions=2048, hidden_size=1024, intermediate_size=4096,
                      vocab_size=8192, num_key_value_heads=8)


def test_step_shows_the_stretch_and_is_never_faster_than_without_the_collective():
    model = _model()
    kw = dict(gpu="h100", mode="train", batch_size=2, seq_len=2048, provenance=None)
    alone = fxshape.analyze(model, **kw).step
    ddp = fxshape.analyze(model, parallel=Parallel(dp=8), **kw).step
    # DDP on 8 GPUs runs one GPU's step plus its gradient all-reduce: never faster
    assert ddp.time_s >= alone.time_s
    (ar,) = [c for c in ddp.communication if c.kind == "dp"]
    assert ar.stretch_s > 0 and ar.exposed_s >= 0
    assert ar.as_dict()["stretch_s"] == ar.stretch_s
    # the communication class holds the exposed part and the stretch
    assert ddp.by_class["communication"] == pytest.approx(ar.exposed_s + ar.stretch_s)
    fsdp = fxshape.analyze(model, parallel=Parallel(dp=8, zero=3), **kw).step
    zero = [c for c in fsdp.communication if c.kind == "zero"]
    assert {c.op for c in zero} == {"all_gather", "reduce_scatter"}
    assert sum(c.stretch_s for c in zero) > 0


# --- async tensor parallelism (issue 51, item 2) ------------------------------------------

def _tp(async_tp, execution="compiled"):
    plan = Parallel(tp=2, sequence_parallel=True, async_tp=async_tp)
    return fxshape.analyze(tiny_llama(num_hidden_layers=1), mode="train", gpu="h100",
                           seq_len=512, parallel=plan, execution=execution,
                           provenance=None)


def test_async_tp_hides_all_but_the_first_chunk_by_hand():
    sync, fused = _tp(False), _tp(True)
    s_ops = [o for o in sync.ops if o.op.startswith("tp ")]
    a_ops = [o for o in fused.ops if o.op.startswith("tp ")]
    assert s_ops and [o.op for o in s_ops] == [o.op for o in a_ops]
    gemm = {}
    for o in fused.ops:  # each collective follows the row-parallel GEMM it is fused with
        if o.cls == "gemm":
            gemm[(o.module, o.phase)] = o.time_s
    from fxshape.cost.memops import kernel_time

    for s, a in zip(s_ops, a_ops):
        t = s.time_s  # the same collective, whole
        assert a.time_s + a.overlapped_s >= t
        # tp = 2 chunks: the first chunk's copy (t / 2) exposed, the other under the
        # GEMM as far as its time lasts
        g = next(v for (m, ph), v in gemm.items() if m == a.module and ph == a.phase)
        # a reduce-scatter then sums the 2 partials copied in: one kernel reading both
        # (the buffer) and writing the rank's half, 1.5 x the buffer's bytes
        red = kernel_time("reduction", int(s.bytes * 1.5), gpu="h100").time_s \
            if a.op == "tp reduce_scatter" else 0.0
        assert a.time_s == pytest.approx(t / 2 + max(0.0, t / 2 - g) + red)
        assert a.overlapped_s == pytest.approx(min(t / 2, g))
    # less communication on the critical path; this tiny step waits on the host, so its
    # time can only stay or shrink
    assert fused.step.by_class["communication"] < sync.step.by_class["communication"]
    assert fused.step.time_s <= sync.step.time_s
    (c,) = [x for x in fused.step.communication if x.op == "all_gather"]
    assert c.exposed_s < c.total_s
    assert any("async TP: each fused with its GEMM" in n for n in fused.step.notes)


def test_async_tp_bad_input():
    with pytest.raises(ValueError, match="needs tp > 1 and sequence_parallel=True"):
        Parallel(tp=2, async_tp=True)
    with pytest.raises(ValueError, match="Parallel.async_tp must be True or False"):
        Parallel(tp=2, sequence_parallel=True, async_tp=1)
    with pytest.raises(ValueError, match="give execution='compiled'"):
        _tp(True, execution="eager")
