"""The plan search (``fxshape.planning``): only plans that divide the model and the GPUs,
ranked by the step ``fxshape.analyze`` predicts for each, memory respected; bad input."""

import dataclasses
import json

import pytest
import torch

import fxshape
from fxshape.planning import ModelShape, candidates, plan

transformers = pytest.importorskip("transformers")


def _llama(layers=2, **config):
    cfg = transformers.LlamaConfig(**{**dict(hidden_size=128, intermediate_size=256,
                                             num_hidden_layers=layers, num_attention_heads=4,
                                             num_key_value_heads=2, vocab_size=512,
                                             max_position_embeddings=256), **config})
    with torch.device("meta"):
        return transformers.LlamaForCausalLM(cfg).eval()


@pytest.mark.parametrize("gpus,batch", [(8, 16), (16, 32), (12, 24)])
def test_every_candidate_divides_the_model_and_the_gpus(gpus, batch):
    shape = ModelShape(layers=12, heads=8, kv_heads=2, experts=4)
    plans, dropped = candidates(shape, gpus=gpus, global_batch=batch, seq_len=1024,
                                gpus_per_node=8)
    assert plans
    for c in plans:
        p = c.parallel
        assert p.tp * p.cp * p.pp * p.dp == gpus
        assert 8 % p.tp == 0 and shape.heads % p.tp == 0  # inside a node, whole heads
        assert shape.kv_heads % p.tp == 0 or p.tp % shape.kv_heads == 0
        assert shape.layers % (p.pp * p.virtual_stages) == 0
        assert 1024 % (2 * p.cp) == 0 or p.cp == 1
        assert shape.experts % p.ep == 0 and (p.dp * p.cp) % p.ep == 0
        # the global batch: dp ranks x micro-batch size x micro-batches
        assert p.dp * c.micro_batch * p.microbatches == batch
        assert p.sequence_parallel == (p.tp > 1)
    labels = [c.label() for c in plans]
    assert len(set(labels)) == len(labels)  # no plan twice
    assert all(n > 0 for n in dropped.values())


def test_candidates_count_what_they_leave_out():
    # 3 GPUs: tp 2, 4, 8 do not divide them (not tried); cp 2 would need 6 GPUs
    shape = ModelShape(layers=1, heads=4, kv_heads=4)
    plans, dropped = candidates(shape, gpus=3, global_batch=6, seq_len=64, gpus_per_node=8,
                                micro_batches=(1, 4), recompute=(None,), zero=(0,),
                                max_cp=2)
    # the one shape that divides: tp1 cp1 pp1 dp3, micro-batch 1 (6 = 3 x 1 x 2); 4 does not
    assert [c.label() for c in plans] == ["tp1 pp1 dp3 zero0 mb1x2 rc-none"]
    assert dropped == {"tp x cp x pp does not divide the GPUs": 1,
                       "global batch not a multiple of dp x micro-batch": 1}


def test_search_ranks_the_plans_analyze_predicts():
    model = _llama()
    found = plan(model, gpus=2, global_batch=4, seq_len=64, micro_batches=(1, 2),
                 recompute=(None, "full"), zero=(0, 3), top=None, progress=False)
    times = [r.step_s for r in found.results]
    assert times == sorted(times) and len(times) >= 4
    assert all(r.fits for r in found.results)
    assert found.captures <= found.costed  # plans sharing shapes shared a capture
    # each number is analyze's for that plan, the capture cache notwithstanding
    for r in (found.results[0], found.results[-1]):
        c = r.candidate
        rep = fxshape.analyze(model, seq_len=64, batch_size=c.micro_batch, mode="train",
                              parallel=c.parallel, recompute=c.recompute, provenance=None,
                              topology="dgx-h100:1")
        assert rep.step.time_s == r.step_s and rep.memory.peak == r.peak_bytes
    # recomputation re-runs forwards: with all else equal it never wins
    def plan_of(c):  # the plan but its recomputation
        return dataclasses.replace(c.parallel, recompute=None), c.micro_batch

    by = {plan_of(r.candidate): {} for r in found.results}
    for r in found.results:
        by[plan_of(r.candidate)][r.candidate.recompute] = r.step_s
    pairs = [v for v in by.values() if len(v) == 2]
    assert pairs and all(v[None] < v["full"] for v in pairs)
    # tokens per GPU per second: the global batch's tokens over the step, over 2 GPUs
    best = found.best
    assert best.tokens_per_s_per_gpu == pytest.approx(4 * 64 / best.step_s / 2)


def test_search_with_nothing_that_fits():
    from fxshape.presets import build_preset

    found = plan(build_preset("llama-2-70b"), gpus=1, global_batch=1, seq_len=128,
                 micro_batches=(1,), progress=False)
    # 70B parameters with AdamW need ~1.1 TB of states: no 80 GB GPU holds them
    assert found.results == () and found.best is None and found.costed == 0
    # the 3 plans of one GPU (recompute none, selective, full) left out before any capture;
    # cp 2..8 and pp 2..80 need more GPUs than one
    assert dict(found.dropped)[
        "does not fit: parameters, gradients and optimizer state alone"] == 3 == found.enumerated


def test_plan_bad_input():
    model = _llama(layers=1)
    with pytest.raises(ValueError, match="gpus must be a positive integer"):
        plan(model, gpus=0, global_batch=4, seq_len=64)
    with pytest.raises(ValueError, match="top must be a positive integer"):
        plan(model, gpus=2, global_batch=4, seq_len=64, top=0)
    with pytest.raises(ValueError, match=r"no parallel plan divides .*global batch "
                                         r"not a multiple of dp x micro-batch"):
        plan(model, gpus=3, global_batch=2, seq_len=64, micro_batches=(1,))
    with pytest.raises(ValueError, match="exceed the 8 of the topology"):
        plan(model, gpus=16, global_batch=16, seq_len=64, topology="dgx-h100:1")
    with pytest.raises(ValueError, match="expected a torch.nn.Module"):
        plan("llama-3-8b", gpus=2, global_batch=4, seq_len=64)
    # one layer is no stack: selective recomputation has no layer to re-run (it was a no-op,
    # the search listed it as a plan of its own), refused as full recomputation is
    with pytest.raises(ValueError, match="recompute='selective' .* no stack of repeated"):
        fxshape.analyze(model, seq_len=64, mode="train", recompute="selective")
    found = plan(model, gpus=1, global_batch=1, seq_len=64, micro_batches=(1,), zero=(0,),
                 progress=False)
    assert [r.candidate.label() for r in found.results] == ["tp1 pp1 dp1 zero0 mb1x1 rc-none"]
    # refused by its rule (a typed refusal), counted once per recomputation
    assert dict(found.dropped)["refused: recompute without a stack of repeated layers"] == 2


def test_processes_do_not_change_the_result():
    # the groups of plans (one per capture) costed in two forked processes or in this one:
    # the same records, in the same order, byte for byte
    model = _llama()
    kw = dict(gpus=2, global_batch=4, seq_len=64, micro_batches=(1, 2), recompute=(None,),
              zero=(0, 1), top=None, progress=False)
    one = plan(model, workers=1, **kw)
    two = plan(model, workers=2, **kw)
    assert (one.workers, two.workers) == (1, 2)
    a, b = one.as_dict(), two.as_dict()
    a.pop("workers"), b.pop("workers")
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    with pytest.raises(ValueError, match="workers must be a positive integer or None"):
        plan(model, workers=0, **kw)


def test_advice_priced_on_a_plan():
    # a vocabulary of 32001 (odd: the LM head's rows lose 16-byte alignment and tile
    # unevenly); advise, given the plan, prices the change on that plan's whole step
    from fxshape.codesign.advise import advise

    sizes = dict(hidden_size=512, intermediate_size=1024, num_attention_heads=8,
                 num_key_value_heads=4, max_position_embeddings=1024)
    model = _llama(vocab_size=32001, **sizes)
    par = fxshape.Parallel(tp=2, pp=2, microbatches=2, sequence_parallel=True)
    adv = advise(model, batch_size=4, seq_len=512, mode="train", parallel=par,
                 topology="dgx-h100:1")
    assert adv.tp == 2  # the plan's
    vocab = [r for r in adv.recommendations if r.hyperparameter == "vocab_size"]
    # 64 x tp = 128: a multiple of 128 (32128 = 251 x 128 is the next)
    assert vocab and vocab[0].suggested % 128 == 0 and vocab[0].suggested > 32001
    # the gain is the step's under the plan: re-derive it from two analyses
    base = fxshape.analyze(model, batch_size=4, seq_len=512, mode="train", parallel=par,
                           topology="dgx-h100:1", provenance=None)
    changed = _llama(vocab_size=vocab[0].suggested, **sizes)
    new = fxshape.analyze(changed, batch_size=4, seq_len=512, mode="train", parallel=par,
                          topology="dgx-h100:1", provenance=None)
    assert vocab[0].predicted_speedup == pytest.approx(base.step.time_s / new.step.time_s - 1,
                                                     rel=1e-9)
    with pytest.raises(ValueError, match="tp given beside parallel="):
        advise(model, batch_size=1, seq_len=64, mode="train", parallel=par, tp=2)
    with pytest.raises(ValueError, match="price a training plan"):
        advise(model, batch_size=1, seq_len=64, mode="inference", parallel=par)


def test_states_bound_follows_the_optimizer():
    """Issue 52: the search pruned plans with AdamW's state whatever the optimizer."""
    from fxshape.planning.search import _states_lower_bound
    from fxshape.planning.space import ModelShape, candidates

    plans, _ = candidates(ModelShape(layers=2, heads=4, kv_heads=4, experts=0), gpus=1,
                          global_batch=1, seq_len=64, gpus_per_node=8, micro_batches=(1,),
                          recompute=(None,), zero=(0,))
    n = 1_000_000
    # one GPU, no sharding: fp32 master 4 + fp32 gradient 4 + state (AdamW 8, SGD 0) a param
    assert _states_lower_bound(plans[0], n, 0, "adamw") == 16 * n
    assert _states_lower_bound(plans[0], n, 0, "sgd") == 8 * n


def test_sgd_plans_are_not_pruned_with_adamw_state():
    from fxshape.presets import build_preset

    # llama-2-7b: 6.74e9 parameters; AdamW's 16 B each (108 GB) exceed an 80 GB H100, SGD's
    # 8 B (54 GB) do not: the one-GPU plan is costed, not dropped before its capture
    model = build_preset("llama-2-7b")
    kw = dict(gpus=1, global_batch=1, seq_len=64, micro_batches=(1,), recompute=("full",),
              progress=False)
    adamw = plan(model, **kw)
    assert dict(adamw.dropped).get(
        "does not fit: parameters, gradients and optimizer state alone") == 1
    sgd = plan(model, optimizer="sgd", **kw)
    assert "does not fit: parameters, gradients and optimizer state alone" not in dict(
        sgd.dropped)
    assert sgd.costed == 1
    with pytest.raises(ValueError, match="unknown optimizer"):
        plan(model, optimizer="lion", **kw)


def test_plan_options_are_checked_and_deduplicated():
    """Issue 52: --micro-batches 0 raised ZeroDivisionError, 2,2 listed every plan twice, an
    unknown recompute gave an empty search, and a sequence beyond the positions headlined
    "no plan fits"."""
    model = _llama(layers=1)
    kw = dict(gpus=2, global_batch=4, seq_len=64, progress=False)
    for opts, match in (({"micro_batches": (0,)}, "micro_batches has 0; accepted: positive"),
                        ({"micro_batches": ()}, "micro_batches is empty"),
                        ({"recompute": ("bogus",)}, "recompute has 'bogus'; accepted: None"),
                        ({"zero": (4,)}, "zero has 4; accepted: 0, 1, 2 or 3"),
                        ({"virtual_stages": (True,)}, "virtual_stages has True"),
                        ({"max_cp": 0}, "max_cp must be a positive integer")):
        with pytest.raises(ValueError, match=match):
            plan(model, **opts, **kw)
    with pytest.raises(ValueError, match="seq_len 4096 exceeds the model's "
                                         "max_position_embeddings"):
        plan(model, gpus=2, global_batch=4, seq_len=4096, progress=False)
    once = plan(model, micro_batches=(1,), recompute=(None,), zero=(0,), top=None, **kw)
    twice = plan(model, micro_batches=(1, 1), recompute=(None, None), zero=(0, 0), top=None,
                 **kw)
    assert [r.candidate for r in twice.results] == [r.candidate for r in once.results]
    assert twice.enumerated == once.enumerated


def test_a_pipeline_with_too_many_micro_batches_is_refused_not_simulated():
    from fxshape.parallelism.plan import MAX_PIPELINE_MICROBATCHES, Parallel

    # a schedule is simulated pass by pass: 2^31 micro-batches would run for hours
    with pytest.raises(ValueError, match="at most 65,536"):
        Parallel(pp=2, microbatches=2**31)
    assert Parallel(pp=2, microbatches=MAX_PIPELINE_MICROBATCHES).microbatches == 65536
    assert Parallel(dp=2, microbatches=2**31).microbatches == 2**31  # accumulation: a product


def test_shared_captures_capture_once_and_price_as_analyze(monkeypatch):
    # analyses sharing a SharedCaptures capture each rank's shapes once (the second plan of
    # the same tp and micro-batch is only re-costed) and give what analyze gives
    import fxshape.report.build as build
    from fxshape import Parallel
    from fxshape.config.setup import Setup
    from fxshape.report.build import SharedCaptures

    from models import tiny_llama

    model = tiny_llama()
    base = Setup.from_keywords(mode="train", seq_len=64, batch_size=2, provenance=None)
    plans = (Parallel(dp=2), Parallel(dp=2, zero=3), Parallel(dp=4, zero=1))
    calls = []
    real = build._executed

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(build, "_executed", counted)
    shared = SharedCaptures()
    got = [shared.analyze(model, base.replace(parallel=p)) for p in plans]
    monkeypatch.undo()
    assert len(calls) == 1  # dp and zero do not change what one rank captures
    for p, rep in zip(plans, got):
        alone = fxshape.analyze(model, setup=base.replace(parallel=p))
        assert rep.to_json() == alone.to_json()
    # what holds for every capture of the model goes on to the next SharedCaptures
    assert any(k[0] == "stacks" for k in shared.model_facts())
    with pytest.raises(TypeError, match="setup must be a fxshape.Setup"):
        shared.analyze(model, {"mode": "train"})
