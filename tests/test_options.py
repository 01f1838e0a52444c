"""Every option does what it says, or is refused (issue 28).

Two generated matrices, neither hand-picked:

- ``analyze`` in Python: every option of its signature alone in every mode, and every pair of
  options together (the pairs take the modes in turn). Each run is a one-line refusal or a
  report whose ``options`` name exactly the options given; an option said to have effect
  changes the report against the run without it, and one said to have none leaves its numbers
  (rows, step, memory, capacity) exactly as without it. Which combinations must be refused
  is written down in :func:`_refused` (the contradictions): nothing else may be.
- the command line (in tests/test_bad_inputs.py, the bad-input sweep): for every subcommand
  and every option of it, a pairwise covering array (``matrix.covering_array``); a case is a
  one-line error where it is a contradiction, else an answer that states each option it was
  given.

A tiny Llama (one layer, two where ``dedup`` is tested; 4 heads over 2 KV heads) keeps each
analysis to a fraction of a second.
"""

import functools
import inspect
import json

import pytest
import torch
from matrix import _BASE, _CFG, MODES, VALUES, _params_file, _refused

import fxshape

transformers = pytest.importorskip("transformers")

@functools.lru_cache(maxsize=None)
def _model(layers=1):
    with torch.device("meta"):
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(
            **dict(_CFG, num_hidden_layers=layers)))


@functools.lru_cache(maxsize=None)
def _run(mode, names, layers=1):
    """("ok", report) or ("refused", message) of analyze with the options ``names``."""
    kw = {n: (_params_file() if VALUES[n] == "PARAMS" else VALUES[n]) for n in names}
    for n, v in _BASE[mode].items():
        kw.setdefault(n, v)
    try:
        return "ok", fxshape.analyze(_model(layers), mode=mode, **kw)
    except ValueError as exc:
        return "refused", str(exc)


def _content(report) -> str:
    d = report.to_dict()
    d.pop("options")
    return json.dumps(d, sort_keys=True, default=str)


def _numbers(report) -> str:
    """What a prediction is: every GEMM, the step's times and FLOPs, the memory, what fits."""
    d = report.to_dict()
    step = {k: d["step"][k] for k in ("time_s", "by_class", "model_flops", "tokens", "kernels",
                                      "floor_s", "execution")}
    memory = {k: v for k, v in d["memory"].items() if k != "notes"}
    rows = [(r["op"], r["batch"], r["m"], r["n"], r["k"], r["time_s"], r["flops"])
            for r in d["rows"]]
    return json.dumps([d["gpu"], d["dtype"], rows, step, memory, d["capacity"]],
                      sort_keys=True)


def _check(mode, names):
    """The run of ``names`` in ``mode`` against the runs without each of them."""
    names = tuple(sorted(names))
    # one layer keeps each run to one capture; dedup needs two identical layers to trace one,
    # the matrix's plan (pp=2) two layers to split into stages, recomputation a layer stack
    layers = 2 if {"dedup", "parallel", "recompute"} & set(names) else 1
    status, got = _run(mode, names, layers)
    if _refused(mode, names):
        assert status == "refused", f"{names} in {mode} should be refused"
        assert got and "\n" not in got and len(got) < 600, got
        return
    assert status == "ok", f"{names} in {mode} was refused: {got}"
    report = got
    stated = {o.name: o for o in report.options}
    # the matrix's own base options are given (and stated) too
    expected = set(names) | set(_BASE[mode])
    assert set(stated) == expected, (mode, names, report.options)
    text = str(report)
    for name in names:
        o = stated[name]
        assert f"{name}={o.value}" in text and o.effect  # the table's options line says it
        without = tuple(n for n in names if n != name)
        status0, base = _run(mode, without, layers)
        if status0 != "ok":
            continue
        if o.applied:
            assert _content(report) != _content(base), f"{o.describe()} changed nothing"
        else:
            assert _numbers(report) == _numbers(base), f"{o.describe()}, yet it did"


def test_the_matrix_covers_every_option_of_analyze():
    # an option added to analyze without a value here (and a rule in
    # fxshape.report.options) fails this test
    from fxshape.report.options import RULES

    from fxshape.config.setup import KEYWORDS

    sig = inspect.signature(fxshape.analyze).parameters
    options = {n for n, p in sig.items() if p.kind == p.KEYWORD_ONLY} - {"mode", "setup"}
    assert options == set(VALUES) == set(RULES)
    # the signature is the setup's keywords (the inputs are positional)
    assert options | {"mode", "example_inputs", "example_kwargs"} == set(KEYWORDS)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", sorted(VALUES))
def test_every_option_alone_in_every_mode(mode, name):
    _check(mode, (name,))


_PAIRS = [(a, b) for i, a in enumerate(sorted(VALUES)) for b in sorted(VALUES)[i + 1:]]


@pytest.mark.parametrize("i, pair", list(enumerate(_PAIRS)), ids=lambda x: str(x))
def test_every_pair_of_options(i, pair):
    _check(MODES[i % len(MODES)], pair)


def test_the_base_of_the_matrix_is_stated():
    # in every mode, the matrix's run without options states its base options only
    for mode in MODES:
        status, base = _run(mode, ())
        assert status == "ok"
        assert {o.name for o in base.options} == set(_BASE[mode])
    # and with nothing given at all, nothing is stated
    assert fxshape.analyze(_model(), mode="decode").options == ()
