"""A generated hostile-input harness (issue 52): every file reader fed the files people
bring by mistake, and every option of every command fed values no option takes. Each must
end in one line naming what was wrong (a ValueError from a reader; exit status 2 from the
command line), never a raw exception (exit 1: "ExcType: ... (--verbose shows the
traceback)") or a hang. A new reader or option starts here: add it to READERS, and the
command-line matrix finds its options itself."""

import gzip
import json

import pytest

from fxshape.cli import build_parser, main

transformers = pytest.importorskip("transformers")


def _kineto(path):
    from fxshape.traces import read_trace

    return read_trace(path)


def _csv(path):
    from fxshape.serving import read_trace

    return read_trace(path)


def _titan_toml(path):
    from fxshape.torchtitan import read_torchtitan

    return read_torchtitan(path, gpus=8)


def _params(path):
    import fxshape

    return fxshape.predict_matmul(64, 64, 64, gpu="h100", params_path=path)


def _config(path):
    from fxshape.presets import load_target

    return load_target(path)


#: reader -> the file name it is given (its suffix selects the format where that matters)
READERS = {"kineto trace": (_kineto, "t.json"), "kineto trace (gz)": (_kineto, "t.json.gz"),
           "serving trace": (_csv, "t.csv"), "torchtitan toml": (_titan_toml, "job.toml"),
           "torchtitan json": (_titan_toml, "job.json"), "parameter file": (_params, "p.json"),
           "config.json": (_config, "config.json")}

#: what people hand a reader by mistake
HOSTILE = {
    "empty": b"",
    "binary": bytes(range(256)) * 4,
    "truncated gzip": gzip.compress(json.dumps({"traceEvents": [1] * 500}).encode())[:40],
    "a JSON list": b"[1, 2, 3]",
    "JSON null": b"null",
    "truncated JSON": b'{"traceEvents": [{"ph": "X", ',
    "wrong types": json.dumps({"traceEvents": "x", "model": 3, "training": [1],
                               "parallelism": "all", "gpus": 7, "model_type": 5}).encode(),
    "deep nesting": b"[" * 100_000 + b"]" * 100_000,
    "CSV of words": b"a,b,c\nd,e,f\n",
}


@pytest.mark.parametrize("reader", sorted(READERS))
@pytest.mark.parametrize("content", sorted(HOSTILE))
def test_every_reader_refuses_a_hostile_file_in_one_line(tmp_path, reader, content):
    fn, name = READERS[reader]
    path = tmp_path / name
    path.write_bytes(HOSTILE[content])
    with pytest.raises(ValueError) as err:
        fn(str(path))
    assert "\n" not in str(err.value) and str(err.value)


@pytest.mark.parametrize("reader", sorted(READERS))
def test_every_reader_refuses_a_directory_or_a_missing_file(tmp_path, reader):
    fn, _ = READERS[reader]
    for path in (tmp_path, tmp_path / "missing.json"):
        with pytest.raises(ValueError) as err:
            fn(str(path))
        assert "\n" not in str(err.value)


# -- every option of every command ---------------------------------------------------------

#: values no option takes (a count of zero or below, a word for a number, NaN, infinity,
#: overflow, nothing)
BAD_VALUES = ("0", "-3", "two", "nan", "1e400", "")
#: options whose argument is free text (a path, a name): looked up, so any string is
#: refused or used, and not a value to fuzz here (their bad values are the readers' above)
FREE_TEXT = {"target", "params", "trace", "out", "plot", "torchtitan", "draft"}
#: what each command needs besides the option under test
REQUIRED = {"predict": ["--m", "64", "--n", "64", "--k", "64"],
            "sweep": ["--param", "intermediate_size", "--range", "128:192:64"],
            "plan": ["--gpus", "2", "--global-batch", "4", "--seq-len", "32"],
            "serve": ["--prompt-len", "8", "--output-len", "3"]}
#: valid values of an option that a value above is (the seed may be 0; at least 0 drafts
#: accepted; the tolerance and speed-up thresholds may be 0; ZeRO stage 0 is plain data
#: parallelism)
VALID = {("serve", "seed", "0"), ("serve", "acceptance", "0"), ("advise", "tolerance", "0"),
         ("advise", "min_speedup", "0"), ("compare", "worst", "0"), ("analyze", "zero", "0"),
         ("plan", "zero", "0")}


def _cases():
    sub = next(a for a in build_parser()._subparsers._group_actions).choices
    for command, parser in sorted(sub.items()):
        for a in parser._actions:
            if not a.option_strings or a.dest in FREE_TEXT or a.dest == "help" or \
                    a.nargs == 0 or a.dest in [r.lstrip("-").replace("-", "_")
                                               for r in REQUIRED.get(command, [])[::2]]:
                continue
            for v in BAD_VALUES:
                if a.choices is not None and v in a.choices:
                    continue
                if (command, a.dest, v) not in VALID:
                    yield command, a.option_strings[0], v


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    path = tmp_path_factory.mktemp("cfg") / "config.json"
    transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                             num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                             max_position_embeddings=256).to_json_file(str(path))
    return str(path)


CASES = list(_cases())


def test_the_harness_reaches_every_command():
    commands = set(next(a for a in build_parser()._subparsers._group_actions).choices)
    # gpus and presets take no option with a value
    assert {c for c, _, _ in CASES} >= commands - {"gpus", "presets"}
    assert len(CASES) > 300


@pytest.mark.parametrize("command,option,value", CASES,
                         ids=[f"{c}{o}={v or 'EMPTY'}" for c, o, v in CASES])
def test_every_option_refuses_a_bad_value_in_one_line(target, capsys, command, option, value):
    argv = [command] + ([] if command in ("predict", "calibrate") else [target])
    argv += REQUIRED.get(command, []) + [f"{option}={value}"]
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's refusal: its usage and one error line
        code = exc.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, (argv, err[-1:] if err else "accepted")
    assert err and "error:" in err[-1] and "Error:" not in err[-1], (argv, err[-1:])
