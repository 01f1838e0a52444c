"""The command line's plan flags are generated from fxshape.Parallel's fields (issue 53):
one flag per field, its type, choices and help from the field, so that a new field is a new
flag without touching the parser."""

import argparse
import dataclasses

import pytest

from fxshape import Parallel
from fxshape.cli import build_parser
from fxshape.cli.args import PLAN_SHORTHANDS, field_docs, plan_fields, plan_flags, plan_of_flags


def _analyze_parser():
    sub = next(a for a in build_parser()._subparsers._group_actions)
    return sub.choices["analyze"]


def test_every_field_of_the_plan_has_a_flag_with_its_docstring_help():
    actions = {a.dest: a for a in _analyze_parser()._actions}
    docs = field_docs(Parallel)
    for f in dataclasses.fields(Parallel):
        assert f.name in actions, f.name  # the shorthands' flags are hand-written, shared
        if f.name in PLAN_SHORTHANDS:
            continue
        # the help is the Args: line of Parallel's docstring, markup dropped
        assert actions[f.name].help.endswith(docs[f.name]), f.name
        assert "``" not in actions[f.name].help and ":func:" not in actions[f.name].help
    assert actions["zero"].choices == (0, 1, 2, 3)
    assert actions["schedule"].choices == ("1f1b", "interleaved", "gpipe", "zbv")
    # a boolean that defaults to True is switched off
    assert actions["reshard_after_forward"].option_strings == ["--no-reshard-after-forward"]


def test_the_flags_build_the_plan():
    args = _analyze_parser().parse_args(
        ["gpt2", "--pp", "2", "--zero", "3", "--dp", "2", "--microbatches", "4",
         "--stage-layers", "5,7", "--ep", "2", "--capacity-factor", "1.5",
         "--no-reshard-after-forward"])
    got = plan_of_flags(args)
    assert set(got) == {f.name for f in plan_fields()}
    plan = Parallel(dp=2, **got)
    assert (plan.pp, plan.zero, plan.microbatches, plan.stage_layers) == (2, 3, 4, (5, 7))
    assert plan.capacity_factor == 1.5 and plan.reshard_after_forward is False
    # nothing given: the default plan
    assert Parallel(**plan_of_flags(_analyze_parser().parse_args(["gpt2"]))) == Parallel()


@pytest.mark.parametrize("argv, message", [
    (["--pp", "0"], "--pp: expected a positive integer"),
    (["--zero", "4"], "--zero: invalid choice: 4"),
    (["--stage-layers", "5,x"], "--stage-layers: expected torchtitan or layer counts"),
    (["--capacity-factor", "big"], "--capacity-factor: invalid float value"),
])
def test_a_bad_flag_is_one_line_naming_it(argv, message, capsys):
    with pytest.raises(SystemExit):
        _analyze_parser().parse_args(["gpt2"] + argv)
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert message in err


def test_a_field_of_a_type_without_a_rule_is_refused_when_the_parser_is_built(monkeypatch):
    # a field the generator cannot read from text must say so, not become a string flag
    @dataclasses.dataclass(frozen=True)
    class Odd:
        ratio: complex = 1j

    monkeypatch.setattr("fxshape.cli.args.plan_fields", lambda: dataclasses.fields(Odd))
    with pytest.raises(TypeError, match="Parallel.ratio .*no flag is generated"):
        plan_flags(argparse.ArgumentParser())


def test_the_setup_flags_are_generated_from_its_fields():
    # every keyword of analyze that a command line can say (all but the inputs, the MoE
    # routing, the dedup switch and the plan's fields, above) is a flag of fxshape analyze
    # whose choices, type and help come from its field
    from fxshape.config.setup import KEYWORDS, setup_field
    from fxshape.cli.args import _plain

    actions = {a.dest: a for a in _analyze_parser()._actions}
    said = [k for k, section in KEYWORDS.items() if section != "parallel"
            and k not in ("example_inputs", "example_kwargs", "moe_routing", "dedup")]
    assert len(said) == 19  # 7 of the workload, 3 of the machine, 9 of the kernels
    for name in said:
        f = setup_field(name)
        assert actions[name].help == _plain(f.metadata["doc"]), name
        if "choices" in f.metadata:  # None is said "none" on a command line
            assert actions[name].choices == tuple("none" if c is None else c
                                                  for c in f.metadata["choices"]), name
    assert actions["execution"].choices == ("eager", "compiled", "cudagraphs")
    assert actions["optimizer"].choices == ("adamw", "adamw-fused", "sgd", "none")
    assert actions["group_size"].choices == (32, 64, 128, 256)
    # the command's own defaults where they differ from the field's (the dtype as text)
    assert actions["dtype"].default == "bf16" and actions["provenance"].default == "traced"
    args = _analyze_parser().parse_args(["gpt2", "--group-size", "64", "--context-len", "8",
                                         "--topology", "dgx-h100:2", "--gemv", "inductor"])
    assert (args.group_size, args.context_len, args.topology, args.gemv) == \
        (64, 8, "dgx-h100:2", "inductor")


@pytest.mark.parametrize("argv, message", [
    (["--execution", "jit"], "--execution: invalid choice: 'jit'"),
    (["--group-size", "48"], "--group-size: invalid choice: 48"),
    (["--page-size", "0"], "--page-size: expected a positive integer"),
    (["--topology", "dgx-z"], "--topology: unknown topology 'dgx-z'"),
])
def test_a_bad_setup_flag_is_one_line_naming_it(argv, message, capsys):
    with pytest.raises(SystemExit):
        _analyze_parser().parse_args(["gpt2"] + argv)
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert message in err
