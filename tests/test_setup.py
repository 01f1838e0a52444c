"""fxshape.Setup (issue 53): analyze's keywords as one frozen object, translated in one
place, each field checked by the object that owns it, the capture key derived from the
fields' metadata, and ``analyze(setup=)`` the same analysis as its keywords."""

import dataclasses
import inspect

import pytest
import torch

import fxshape
from fxshape import Kernels, Machine, Parallel, Setup, Workload
from fxshape.config.setup import KEYWORDS, keyword_defaults, keyword_docs


def test_keywords_translate_to_the_fields_that_own_them():
    s = Setup.from_keywords(mode="train", batch_size=2, gpu="a100", topology="pcie4",
                            dtype="fp16", execution="compiled", tp=2, dp=4,
                            sequence_parallel=True, recompute="selective", dedup=False,
                            provenance=None)
    assert s.workload == Workload(mode="train", batch_size=2)
    assert s.machine == Machine(gpu="a100", topology="pcie4")
    assert s.kernels == Kernels(dtype="fp16", execution="compiled")
    assert s.parallel == Parallel(tp=2, dp=4, sequence_parallel=True, recompute="selective")
    assert (s.dedup, s.provenance) == (False, None)
    # what differs from the defaults rebuilds it, and is what it prints
    assert Setup.from_keywords(**s.keywords()) == s
    assert repr(s).startswith("Setup(mode='train', batch_size=2, gpu='a100'")
    assert repr(Setup()) == "Setup()" and Setup().describe() == "defaults"


def test_the_plan_and_its_shorthands():
    # a plan beyond its shorthands is shown whole, its recomputation beside it (as
    # report.options names them)
    plan = Parallel(pp=2, microbatches=4)
    s = Setup.from_keywords(mode="train", parallel=plan, recompute="full")
    assert s.parallel == dataclasses.replace(plan, recompute="full")
    assert s.keywords() == {"mode": "train", "parallel": plan, "recompute": "full"}
    # a plan of tp and dp only is its shorthands
    assert Setup.from_keywords(parallel=Parallel(tp=2)).keywords() == {"tp": 2}
    # shorthands change the plan in place; replace keeps the rest
    assert s.replace(dp=2).parallel == Parallel(pp=2, dp=2, microbatches=4, recompute="full")
    with pytest.raises(ValueError, match="not both|both"):
        Setup.from_keywords(parallel=plan, tp=2)
    with pytest.raises(ValueError, match="disagree"):
        Setup.from_keywords(mode="train", parallel=Parallel(recompute="op"), recompute="full")


@pytest.mark.parametrize("keywords, message", [
    (dict(mode="fast"), "unknown mode 'fast'; accepted: 'inference'"),
    (dict(batch_size=0), "batch_size must be a positive integer"),
    (dict(seq_len="long"), "seq_len must be a positive integer"),
    (dict(page_size=-1), "page_size"),
    (dict(mode="decode", kv_dtype="fp3"), "fp3"),
    (dict(gpu="h900"), "h900"),
    (dict(gpu="mi300x", topology="dgx-h100"), "NVLink|NVIDIA"),
    (dict(dtype="int3"), "int3"),
    (dict(execution="jit"), "unknown execution 'jit'; accepted: 'eager', 'compiled'"),
    (dict(optimizer="adam"), "unknown optimizer 'adam'"),
    (dict(allreduce="ring"), "unknown all-reduce algorithm 'ring'"),
    (dict(gemv="cublas"), "unknown gemv 'cublas'"),
    (dict(provenance="guessed"), "unknown provenance 'guessed'"),
    (dict(recompute="half"), "unknown recompute 'half'"),
    (dict(tp=0), "tp must be a positive integer"),
    # the contradictions the setup owns
    (dict(context_len=64), "context_len is for mode='decode'"),
    (dict(mode="decode", sequence_parallel=True, tp=2), "sequence_parallel splits"),
    (dict(recompute="full"), "needs mode='train', not 'inference'"),
    (dict(float8="tensorwise", quantize="int8"), "give one of them"),
    (dict(gemv="inductor"), "gemv='inductor' is torch.compile's"),
    (dict(mode="inference", parallel=Parallel(pp=2)), "Parallel.pp=2"),
])
def test_each_bad_value_is_refused_in_one_line_by_its_owner(keywords, message):
    with pytest.raises(ValueError, match=message) as info:
        Setup.from_keywords(**keywords)
    assert "\n" not in str(info.value)


def test_an_unknown_keyword_names_the_accepted_ones():
    with pytest.raises(TypeError, match="unexpected keyword 'gpus'; accepted: allreduce"):
        Setup.from_keywords(gpus=8)
    with pytest.raises(TypeError, match="'gpus'"):
        fxshape.analyze(torch.nn.Linear(4, 4), gpus=8)
    with pytest.raises(ValueError, match="Setup.machine must be a Machine, got str"):
        Setup(machine="h100")


def test_the_capture_key_follows_the_fields_metadata():
    base = Setup.from_keywords(mode="train", seq_len=64)
    key = base.capture_key()
    # every field marked `capture` moves the key; the others (how the captured step is
    # played: the plan's pipeline and data parallelism, the optimizer, the all-reduce, the
    # provenance) do not
    moves = dict(batch_size=2, seq_len=32, gpu="a100", dtype="fp16", execution="compiled",
                 attention="math", dedup=False, tp=2, parallel=Parallel(cp=2, dp=1))
    stays = dict(dp=8, optimizer="sgd", allreduce="nccl", provenance=None,
                 recompute="full", parallel=Parallel(pp=2, microbatches=4))
    for name, value in moves.items():
        assert base.replace(**{name: value}).capture_key() != key, name
    for name, value in stays.items():
        assert base.replace(**{name: value}).capture_key() == key, name
    # spellings of one thing are one key: an alias and its GPU, "bf16" and torch.bfloat16
    assert base.replace(gpu="h100-sxm", dtype="bf16").capture_key() == key
    # given inputs are never shared
    assert base.replace(seq_len=None, example_inputs=(torch.zeros(1, 4),)).capture_key() \
        is None


def test_analyze_signature_and_docstring_come_from_the_fields():
    sig = inspect.signature(fxshape.analyze).parameters
    for name, default in keyword_defaults().items():
        assert sig[name].kind == inspect.Parameter.KEYWORD_ONLY
        assert sig[name].default == default or sig[name].default is default
    docs = keyword_docs()
    assert set(docs) == set(KEYWORDS)
    for name in ("gpu", "float8", "page_size", "recompute"):
        assert f"{name}: " in fxshape.analyze.__doc__


def _tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                      max_position_embeddings=128)
    with torch.device("meta"):
        return LlamaForCausalLM(cfg)


def test_analyze_with_a_setup_is_analyze_with_its_keywords():
    pytest.importorskip("transformers")
    model = _tiny_llama()
    kw = dict(mode="train", seq_len=32, gpu="a100", recompute="full", provenance=None,
              optimizer="sgd")
    by_keywords = fxshape.analyze(model, **kw)
    setup = Setup.from_keywords(**kw)
    by_setup = fxshape.analyze(model, setup=setup)
    assert by_setup.to_json() == by_keywords.to_json()
    # keywords beside a setup change its fields
    changed = fxshape.analyze(model, setup=setup, gpu="h100")
    assert changed.to_json() == fxshape.analyze(model, **{**kw, "gpu": "h100"}).to_json()
    assert changed.gpu != by_keywords.gpu
    # report.options: every keyword given but the mode (a default is not an option given)
    assert {o.name for o in by_setup.options} == set(kw) - {"mode"}


def test_a_plan_refusal_is_typed_with_its_rule():
    import pickle

    from fxshape.analysis.parallel import check_tp
    from fxshape.parallelism.plan import PlanRefused, check_cp_seq

    with pytest.raises(PlanRefused) as info:
        check_tp(3, 32, 8)
    # the message as it always was (a ValueError), the rule in a few fixed words
    assert isinstance(info.value, ValueError)
    assert str(info.value).startswith("tp=3 does not divide the 32 attention heads")
    assert info.value.reason == "tp does not split the attention heads evenly"
    with pytest.raises(PlanRefused) as info:
        check_cp_seq(100, 4)  # 100 is not a multiple of 2 x 4 = 8
    assert info.value.reason == "seq_len not a multiple of 2 x cp"
    # it crosses a process boundary whole (the plan search forks)
    back = pickle.loads(pickle.dumps(info.value))
    assert (str(back), back.reason) == (str(info.value), info.value.reason)


def test_the_plan_search_counts_refusals_by_rule_and_raises_the_rest(monkeypatch):
    pytest.importorskip("transformers")
    from fxshape.parallelism.plan import PlanRefused
    from fxshape.planning import search

    model = _tiny_llama()

    def refuse(*args, **kwargs):
        raise PlanRefused("tp=2 does not fit the reasons of this test", "a rule of this test")

    monkeypatch.setattr(search, "_SHARED", {})
    monkeypatch.setattr("fxshape.report.build.SharedCaptures.analyze", refuse)
    found = search.plan(model, gpus=2, global_batch=4, seq_len=32, micro_batches=(1,),
                        recompute=(None,), zero=(0,), progress=False, workers=1)
    # every candidate costed was refused, each counted under the rule, none parsed
    assert found.results == () and found.costed > 0
    assert dict(found.dropped)["refused: a rule of this test"] == found.costed

    def bug(*args, **kwargs):
        raise ValueError("a bug")

    monkeypatch.setattr("fxshape.report.build.SharedCaptures.analyze", bug)
    with pytest.raises(ValueError, match=r"^plan tp\d.*: a bug$"):
        search.plan(model, gpus=2, global_batch=4, seq_len=32, micro_batches=(1,),
                    recompute=(None,), zero=(0,), progress=False, workers=1)


def test_analyze_refuses_a_setup_that_is_not_one():
    with pytest.raises(TypeError, match="setup must be a fxshape.Setup .*got dict"):
        fxshape.analyze(torch.nn.Linear(4, 4), setup={"gpu": "a100"})


def test_the_serving_and_design_apis_take_a_setup():
    # every API that runs analyses takes setup= beside the keywords of it it uses, and its
    # signature shows them with the API's own defaults (serve's all-reduce is vLLM's "auto")
    from fxshape.serving.simulate import Server

    for api in (fxshape.serve, fxshape.speculate, fxshape.simulate_serving, Server,
                fxshape.advise, fxshape.sweep, fxshape.plan):
        params = inspect.signature(api).parameters
        taken = getattr(api, "__init__", api).setup_keywords if api is Server else \
            api.setup_keywords
        assert params["setup"].default is None, api
        assert set(taken) <= set(params), api
        assert set(taken) <= set(KEYWORDS), api
    assert inspect.signature(fxshape.serve).parameters["allreduce"].default == "auto"
    assert inspect.signature(fxshape.serve).parameters["gemv"].default == "library"


def test_serve_with_a_setup_is_serve_with_its_keywords():
    pytest.importorskip("transformers")
    model = _tiny_llama()
    kw = dict(gpu="a100", tp=2, kv_dtype="fp8", allreduce="nccl")
    by_keywords = fxshape.serve(model, prompt_len=16, output_len=4, batch_size=2, **kw)
    setup = Setup.from_keywords(mode="decode", **kw)
    by_setup = fxshape.serve(model, prompt_len=16, output_len=4, batch_size=2, setup=setup)
    assert by_setup == by_keywords
    assert by_setup.decode.to_json() == by_keywords.decode.to_json()
    # a keyword beside the setup changes its field
    from fxshape.hardware.gpus import get_gpu
    assert fxshape.serve(model, prompt_len=16, output_len=4, batch_size=2, setup=setup,
                         gpu="h100").gpu == get_gpu("h100").label != by_setup.gpu
    # the decode report keeps the setup it was asked; BatchStep re-prices under it
    assert by_setup.decode.setup.kernels.allreduce == "nccl"
    from fxshape.serving.batch import BatchStep
    assert BatchStep(by_setup.decode).allreduce == "nccl"


def test_a_setup_field_an_api_does_not_use_is_refused():
    model = torch.nn.Linear(4, 4)
    # serve runs its own prefill and decode: a training setup's mode is not its to take
    with pytest.raises(ValueError, match=r"^serve\(\) does not use the setup's mode; the "
                                         r"fields it takes from a setup: gpu, "):
        fxshape.serve(model, prompt_len=8, output_len=2, setup=Setup.from_keywords(
            mode="train"))
    # a plan beyond tp (the plan search searches plans; serving takes tp only)
    with pytest.raises(ValueError, match=r"^serve\(\) does not use the setup's mode, "
                                         r"parallel;"):
        fxshape.serve(model, prompt_len=8, output_len=2,
                      setup=Setup.from_keywords(mode="train", parallel=Parallel(pp=2)))
    with pytest.raises(ValueError, match=r"^plan\(\) does not use the setup's tp;"):
        fxshape.plan(model, gpus=2, global_batch=2, seq_len=8,
                     setup=Setup.from_keywords(tp=2))
    with pytest.raises(TypeError, match="setup must be a fxshape.Setup .*got str"):
        fxshape.advise(model, setup="h100")
    # the setup's own refusals as ever (kv_dtype outside decode: the Workload's)
    with pytest.raises(ValueError, match="kv_dtype is for mode='decode'"):
        fxshape.sweep(model, "hidden_size", [64], setup=Setup.from_keywords(kv_dtype="fp8"))


def test_sweep_with_a_setup_is_sweep_with_its_keywords():
    pytest.importorskip("transformers")
    cfg = _tiny_llama().config
    kw = dict(gpu="a100", seq_len=32, mode="train", optimizer="sgd")
    by_keywords = fxshape.sweep(cfg, "intermediate_size", [128], **kw)
    by_setup = fxshape.sweep(cfg, "intermediate_size", [128], setup=Setup.from_keywords(**kw))
    assert by_setup == by_keywords and by_setup[0].time_s > 0
    # a keyword beside the setup wins over its field (the A100 setup priced on the H100)
    on_h100 = fxshape.sweep(cfg, "intermediate_size", [128], setup=Setup.from_keywords(**kw),
                            gpu="h100")
    assert on_h100 == fxshape.sweep(cfg, "intermediate_size", [128], **{**kw, "gpu": "h100"})
    assert on_h100[0].time_s != by_keywords[0].time_s


def test_analyze_builds_its_report_once_and_never_patches_it(monkeypatch):
    # the phases turn ReportParts into the next parts; the Report is built once at the end
    # (Report.of) and no dataclasses.replace is ever applied to a finished Report, in any
    # mode: a decode step with int4 weights (decode, quantized parts) and FP8 training
    # (float8 parts) included
    import dataclasses

    from fxshape.report.report import Report

    from models import tiny_llama

    real_replace, real_of = dataclasses.replace, Report.of.__func__
    patched, built = [], []

    def replace(obj, **changes):
        if isinstance(obj, Report):
            patched.append(sorted(changes))
        return real_replace(obj, **changes)

    def of(cls, parts, options=(), setup=None):
        built.append(type(parts).__name__)
        return real_of(cls, parts, options, setup)

    monkeypatch.setattr(dataclasses, "replace", replace)
    monkeypatch.setattr(Report, "of", classmethod(of))
    model = tiny_llama()
    runs = (dict(mode="train", seq_len=64), dict(mode="decode", context_len=128,
                                                 quantize="int4", group_size=64),
            dict(mode="train", seq_len=64, float8="tensorwise", execution="compiled"))
    for kw in runs:
        rep = fxshape.analyze(model, gpu="h100", **kw)
        assert isinstance(rep, Report) and rep.options is not None
    assert patched == []
    assert built == ["ReportParts"] * len(runs)
