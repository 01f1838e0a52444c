"""No wrong answer without a word (issue 19): every bad input gets a one-line error that
names the value and what is accepted, impossible models are refused before they are
analyzed, and no traceback reaches a user of the command line.

The sweeps at the end try each CLI option and each public function's arguments with zero,
negative, huge and wrong-typed values; and every option of every command, pairwise, with the
mode and with each other (issue 28: a generated matrix, a one-line error or an answer that
states each option's effect).
"""

import contextlib
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from matrix import _CFG, _params_file, _refused, covering_array

import fxshape
from fxshape.cli import main
from fxshape.presets import build_preset

transformers = pytest.importorskip("transformers")


def _err(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return err


def _one_line(capsys, *argv) -> str:
    """Run the CLI, expect a failure, return its single error line."""
    assert main(list(argv)) != 0
    err = _err(capsys).strip()
    assert err.count("\n") == 0, err
    return err


def _meta(cls, cfg):
    with torch.device("meta"):
        return cls(cfg)


# -- impossible configs are refused, one line naming the field and the rule -----------------

@pytest.mark.parametrize("changes, expected", [
    (dict(num_key_value_heads=3), "LlamaConfig.num_key_value_heads = 3 does not divide "
                                  "num_attention_heads = 4: each KV head serves a whole group "
                                  "of query heads"),
    (dict(vocab_size=0), "LlamaConfig.vocab_size = 0: must be a positive integer"),
    (dict(hidden_size=-64), "LlamaConfig.hidden_size = -64: must be a positive integer"),
    (dict(num_experts_per_tok=3, num_local_experts=2),
     "LlamaConfig.num_experts_per_tok = 3 exceeds num_local_experts = 2: a token is routed "
     "to at most every expert"),
])
def test_impossible_llama_configs(changes, expected):
    from fxshape.tracing.configs import check_config

    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=4,
                                   vocab_size=256)
    for k, v in changes.items():
        setattr(cfg, k, v)
    with pytest.raises(ValueError) as info:
        check_config(cfg)
    assert str(info.value) == expected


def test_every_default_config_of_transformers_passes():
    # no false alarm on the library's own defaults (860 config classes in transformers 5.24)
    from fxshape.tracing.configs import check_config

    checked, refused = 0, []
    for name in sorted(dir(transformers)):
        cls = getattr(transformers, name, None)
        if not (name.endswith("Config") and isinstance(cls, type)):
            continue
        try:
            cfg = cls()
        except Exception:  # noqa: BLE001 - configs that need arguments
            continue
        checked += 1
        try:
            check_config(cfg)
        except ValueError as exc:
            refused.append(f"{name}: {exc}")
    assert checked > 100 and refused == []


@pytest.mark.parametrize("value", [64.5, "64", True, None])
def test_sizes_of_the_wrong_type(value):
    # transformers' own configs refuse a float or a string at assignment; any other config
    # object is checked the same way (None means unset and is not checked)
    from types import SimpleNamespace

    from fxshape.tracing.configs import check_config

    cfg = SimpleNamespace(hidden_size=value, num_attention_heads=4)
    if value is None:
        check_config(cfg)
        return
    with pytest.raises(ValueError) as info:
        check_config(cfg)
    assert str(info.value) == f"SimpleNamespace.hidden_size = {value!r}: must be a positive " \
                              "integer"


def test_a_config_file_with_a_float_size(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama", "hidden_size": 64.5}))
    err = _one_line(capsys, "analyze", str(path))
    assert "transformers rejects the config" in err and "hidden_size" in err


def test_an_impossible_model_is_not_analyzed():
    # the real forward raises for 3 KV heads under 4 query heads; analyze must not report it
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=4,
                                   vocab_size=256)
    model = _meta(transformers.LlamaForCausalLM, cfg)
    model.config.num_key_value_heads = 3
    with pytest.raises(ValueError, match="num_key_value_heads = 3 does not divide"):
        fxshape.analyze(model, seq_len=16)
    model.config.num_key_value_heads, model.config.vocab_size = 4, 0
    with pytest.raises(ValueError, match=r"vocab_size = 0: must be a positive integer"):
        fxshape.analyze(model, seq_len=16)
    with pytest.raises(ValueError, match=r"vocab_size = 0: must be a positive integer"):
        fxshape.advise(model.config)


@pytest.mark.parametrize("cfg, expected", [
    # GPT-2's head split: said as such, not as "no transformers model class for 'gpt2'"
    ({"model_type": "gpt2", "n_embd": 770, "n_head": 12},
     "GPT2Config.n_embd = 770 is not divisible by n_head = 12"),
    ({"model_type": "llama", "num_key_value_heads": 3, "num_attention_heads": 4,
      "hidden_size": 64}, "LlamaConfig.num_key_value_heads = 3 does not divide"),
    ({"model_type": "gpt2", "vocab_size": 0}, "GPT2Config.vocab_size = 0"),
])
def test_cli_config_file_errors_name_the_field(tmp_path, capsys, cfg, expected):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    assert expected in _one_line(capsys, "analyze", str(path))


def test_unknown_model_type_and_remote_code_are_short(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "no-such-type"}))
    err = _one_line(capsys, "analyze", str(path))
    # one short line, not the list of every type transformers knows
    assert "unknown model_type 'no-such-type'" in err and len(err) < 300
    path.write_text(json.dumps({"model_type": "my-remote",
                                "auto_map": {"AutoModel": "modeling_x.MyModel"}}))
    assert "remote code, which fxshape does not run" in _one_line(capsys, "analyze", str(path))
    # a known model_type with an auto_map: built with transformers' own classes, and said so
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=4,
                                   vocab_size=256).to_dict()
    cfg["auto_map"] = {"AutoModelForCausalLM": "modeling_x.MyLlama"}
    path.write_text(json.dumps(cfg))
    assert main(["analyze", str(path), "--seq-len", "16", "--provenance", "none"]) == 0
    err = _err(capsys)
    assert "remote code, which fxshape does not run: built with transformers' own 'llama' " \
           "classes" in err


# -- Python inputs: integers where sizes are meant; integer GEMMs are not bf16 --------------

@pytest.mark.parametrize("kw, shown", [
    (dict(seq_len=64.7), "seq_len must be a positive integer up to 2147483647, got 64.7 "
                         "(float)"),
    (dict(seq_len="64"), "got '64' (str)"),
    (dict(seq_len=True), "seq_len must be a positive integer up to 2147483647, got True"),
    (dict(batch_size=0), "batch_size must be a positive integer up to 2147483647, got 0"),
    (dict(batch_size=-2), "got -2"),
    (dict(batch_size=10**20), "got 100000000000000000000"),
])
def test_sizes_are_integers(kw, shown):
    model = build_preset("gpt2")
    with pytest.raises(ValueError) as info:
        fxshape.analyze(model, **kw)
    assert shown in str(info.value) and "\n" not in str(info.value)


class _IntMatmul(torch.nn.Module):
    def forward(self, a, b):
        return torch.matmul(a, b)


def test_an_integer_matmul_is_unsupported_not_bf16():
    a = torch.ones(64, 64, dtype=torch.long)
    rep = fxshape.analyze(_IntMatmul(), (a, a))
    # not predicted as a bf16 tensor-core GEMM: reported, with the dtype
    assert rep.rows == ()
    assert [u.reason for u in rep.unsupported] == [
        "integer matmul (int64): fxshape models floating-point GEMMs only"]
    # a float one of the same shape is a GEMM
    f = torch.ones(64, 64)
    assert len(fxshape.analyze(_IntMatmul(), (f, f)).rows) == 1


@pytest.mark.parametrize("model, expected", [
    ("gpt2", "expected a torch.nn.Module, got str (for a preset: from fxshape.presets import "
             "build_preset; build_preset('gpt2'), or the CLI: fxshape analyze gpt2)"),
    (None, "expected a torch.nn.Module, got NoneType"),
    (42, "expected a torch.nn.Module, got int"),
])
def test_analyze_needs_a_module(model, expected):
    with pytest.raises(ValueError) as info:
        fxshape.analyze(model)
    assert str(info.value) == expected


def test_example_inputs_of_the_wrong_kind():
    model = build_preset("gpt2")
    with pytest.raises(ValueError, match="example_inputs must be a tensor or a tuple of the "
                                         "forward's positional arguments, got int"):
        fxshape.analyze(model, example_inputs=5)
    with pytest.raises(ValueError, match="example_kwargs must be a dict"):
        fxshape.analyze(model, example_kwargs=[1, 2])


def test_sizes_for_synthesized_inputs_are_not_dropped_silently():
    # with the inputs given, seq_len would have no effect: said, not ignored
    model = build_preset("gpt2")
    ids = torch.zeros(2, 64, dtype=torch.long, device="meta")
    with pytest.raises(ValueError, match="seq_len sets the size of synthesized inputs, but "
                                         "example inputs "
                                         "were given"):
        fxshape.analyze(model, (ids,), seq_len=128)
    with pytest.raises(ValueError, match="batch_size and seq_len set the sizes of "
                                         "synthesized inputs"):
        fxshape.analyze(model, example_kwargs={"input_ids": ids}, batch_size=2, seq_len=64)


def test_sweep_values_must_be_positive():
    # a sweep over n_head including 0 divided by zero before
    with pytest.raises(ValueError, match="sweep values of n_head must be positive integers, "
                                         "got 0"):
        fxshape.sweep(transformers.GPT2Config(n_layer=1), "n_head", [0, 12])
    with pytest.raises(ValueError, match="got -768"):
        fxshape.sweep(transformers.GPT2Config(n_layer=1), "n_embd", [-768, 768])


# -- the CLI: factories with inputs, --input, Hub ids ------------------------------------------

_FACTORY = textwrap.dedent('''
    import torch


    class Mlp(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.up = torch.nn.Linear(1024, 4096)

        def forward(self, x):
            return self.up(x)


    def plain():
        return Mlp()


    def with_inputs():
        return Mlp(), (torch.zeros(8, 1024),)


    def broken():
        class Boom(torch.nn.Module):
            def forward(self, x):
                raise RuntimeError("boom: this forward always fails")
        return Boom(), (torch.zeros(2),)
''')


@pytest.fixture()
def factory_dir(tmp_path, monkeypatch):
    (tmp_path / "my_models.py").write_text(_FACTORY)
    monkeypatch.chdir(tmp_path)  # importable from the current directory, as python -m
    yield tmp_path
    sys.modules.pop("my_models", None)


def test_factory_with_inputs_and_the_input_option(factory_dir, capsys):
    assert main(["analyze", "my_models:with_inputs", "--format", "json",
                 "--provenance", "none"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [(r["m"], r["n"], r["k"]) for r in rows] == [(8, 4096, 1024)]
    # a plain module needs inputs: --input gives them (shape and dtype)
    assert main(["analyze", "my_models:plain", "--input", "4x16x1024:float",
                 "--format", "json", "--provenance", "none"]) == 0
    d = json.loads(capsys.readouterr().out)
    # 4 x 16 tokens through the linear layer
    assert [(r["m"], r["n"], r["k"]) for r in d["rows"]] == [(64, 4096, 1024)]
    assert d["workload"]["inputs"] == [{"name": "x", "shape": [4, 16, 1024],
                                        "dtype": "float32"}]
    err = _one_line(capsys, "analyze", "my_models:plain")
    assert "Mlp is not a Hugging Face model: pass example_inputs" in err


def test_input_option_is_checked(capsys):
    for bad, said in (("8x0", "positive sizes"), ("axb", "expected SHAPE[:DTYPE]"),
                      ("8x1024:complex", "unknown dtype 'complex'")):
        with pytest.raises(SystemExit) as info:  # argparse's usage line and error line
            main(["analyze", "gpt2", "--input", bad])
        assert info.value.code == 2
        err = _err(capsys)
        assert said in err and "--input" in err


def test_capture_failure_says_why(factory_dir, capsys):
    err = _one_line(capsys, "analyze", "my_models:broken")
    assert "could not capture Boom" in err and "boom: this forward always fails" in err
    assert main(["analyze", "my_models:broken", "--verbose"]) == 2
    assert "torch.export (strict)" in _err(capsys)  # every path with --verbose


def test_hub_id_from_the_local_cache_only(tmp_path):
    # a Hub id whose config.json is in the local Hugging Face cache is analyzed offline; one
    # that is not there is a one-line error saying so (nothing is fetched)
    cache = tmp_path / "hub"
    snap = cache / "models--acme--tiny-llama" / "snapshots" / "0123abc"
    snap.mkdir(parents=True)
    (cache / "models--acme--tiny-llama" / "refs").mkdir()
    (cache / "models--acme--tiny-llama" / "refs" / "main").write_text("0123abc")
    transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                             num_attention_heads=4, num_key_value_heads=4,
                             vocab_size=256).to_json_file(str(snap / "config.json"))
    env = dict(os.environ, HF_HUB_CACHE=str(cache), HF_HUB_OFFLINE="1")
    run = [sys.executable, "-m", "fxshape", "analyze"]
    ok = subprocess.run(run + ["acme/tiny-llama", "--seq-len", "16", "--provenance", "none"],
                        capture_output=True, text=True, env=env, timeout=300)
    assert ok.returncode == 0, ok.stderr
    assert "mlp.down_proj" in ok.stdout and "batch 1 x seq_len 16" in ok.stdout
    bad = subprocess.run(run + ["meta-llama/Llama-3.1-8B"], capture_output=True, text=True,
                         env=env, timeout=300)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "looks like a Hugging Face Hub id, but its config.json is not in the local " \
           "Hugging Face cache" in bad.stderr


# -- crashes that were tracebacks -------------------------------------------------------------

def test_plot_path_is_checked_before_the_analysis(tmp_path, capsys, monkeypatch):
    err = _one_line(capsys, "analyze", "gpt2", "--plot", str(tmp_path / "no" / "x.svg"))
    assert "does not exist" in err
    # without matplotlib: a non-zero exit naming the extra, not a note and exit 0
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "matplotlib" else real(name, *a))
    err = _one_line(capsys, "analyze", "gpt2", "--plot", str(tmp_path / "x.svg"))
    assert "--plot needs matplotlib" in err and "pip install 'fxshape[plot]'" in err
    err = _one_line(capsys, "sweep", "gpt2", "--param", "n_embd", "--range", "768:776:8",
                    "--out", str(tmp_path / "s.svg"))
    assert "--out needs matplotlib" in err


def test_a_closed_pipe_is_no_traceback():
    # `fxshape gpus | head -1`: the reader goes away after one line
    proc = subprocess.Popen([sys.executable, "-m", "fxshape", "gpus"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read().decode()
    proc.wait(timeout=60)
    assert "Traceback" not in err and "BrokenPipe" not in err


def test_an_unexpected_error_is_one_line(capsys, monkeypatch):
    import fxshape.cli as cli

    def boom(args):
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(cli.gpus, "run", boom)
    parser = cli.build_parser
    monkeypatch.setattr(cli, "build_parser", lambda: _rebind(parser(), "gpus", boom))
    err = _one_line(capsys, "gpus")
    assert err == ("fxshape: error: ZeroDivisionError: division by zero (--verbose shows "
                   "the traceback)")


def _rebind(parser, command, fn):
    for action in parser._subparsers._group_actions:
        action.choices[command].set_defaults(func=fn)
    return parser


def test_compile_backend_options_are_checked_where_the_backend_is_made():
    import fxshape.padding.compile as fc

    # make_backend checks its options at once, in one line
    with pytest.raises(ValueError) as info:
        fc.make_backend(gpuu="h100")
    assert str(info.value) == ("unknown fxshape backend option(s) ['gpuu']; accepted: gpu, "
                               "dtype, min_gain, multiples, inner")
    with pytest.raises(ValueError, match="unknown GPU 'h300'"):
        fc.make_backend(gpu="h300")
    with pytest.raises(ValueError, match="min_gain must be in"):
        fc.make_backend(min_gain=-1)
    with pytest.raises(ValueError, match="power of two"):
        fc.make_backend(multiples=(3,))
    with pytest.raises(ValueError, match="unknown dtype"):
        fc.make_backend(dtype="fp7")


# -- sweeps of bad values over every CLI option and public function --------------------------

_BAD_SIZES = ("0", "-1", "99999999999999999999", "1.5", "x")


def _cli_cases():
    cases = []
    for opt in ("--m", "--n", "--k", "--batch"):
        base = {"--m": "8", "--n": "8", "--k": "8"}
        for bad in _BAD_SIZES:
            argv = ["predict"] + [x for k, v in base.items() if k != opt for x in (k, v)]
            cases.append(argv + [opt, bad])
    cases += [["predict", "--m", "8", "--n", "8", "--k", "8", "--gpu", "h300"],
              ["predict", "--m", "8", "--n", "8", "--k", "8", "--dtype", "int3"],
              ["predict", "--m", "8", "--n", "8", "--k", "8", "--layout", "zz"],
              ["predict", "--m", "8", "--n", "8", "--k", "8", "--params", "/no/such.json"]]
    for opt in ("--batch-size", "--seq-len", "--tp"):
        for bad in _BAD_SIZES:
            cases.append(["analyze", "gpt2", opt, bad])
    cases += [["analyze", "gpt2", "--seq-len", "4096"],  # beyond GPT-2's 1024 positions
              ["analyze", "gpt2", "--tp", "5"],  # does not divide 12 heads
              ["analyze", "gpt2", "--gpu", ""], ["analyze", "gpt2", "--dtype", "fp4"],
              ["analyze", "gpt2", "--attention", "fa9"], ["analyze", "gpt2", "--format", "x"],
              ["analyze", "gpt2", "--provenance", "x"], ["analyze", "gpt2", "--plot", "x.pdf"],
              ["analyze", "gpt2", "--params", "/no/such.json"], ["analyze", ""],
              ["analyze", "gpt2", "--attention", "fa3", "--gpu", "a100"]]
    for opt, bads in (("--tolerance", ("-0.5", "1.5", "x")), ("--min-speedup", ("-1", "x")),
                      ("--mode", ("x",)), ("--tp", ("0", "x"))):
        cases += [["advise", "gpt2", opt, b] for b in bads]
    cases += [["sweep", "gpt2", "--param", "n_embd", "--range", r]
              for r in ("0:10", "10:5", "a:b", "1:100000", "5")]
    cases += [["sweep", "gpt2", "--param", "no_such", "--range", "8:16:8"],
              ["sweep", "gpt2", "--param", "n_embd", "--range", "768:776:8", "--out", "x.pdf"],
              ["calibrate", "--dtype", "fp4"], ["calibrate", "--gpu", "h300"],
              ["calibrate", "--out", "/no/such/dir/p.json"], ["gpus", "--x"],
              ["presets", "extra"], ["nope"], []]
    return cases


@pytest.mark.parametrize("argv", _cli_cases(), ids=lambda a: " ".join(a) or "(none)")
def test_cli_bad_values_fail_without_a_traceback(argv, capsys):
    with pytest.raises(SystemExit) if _argparse_rejects(argv) else contextlib.nullcontext():
        code = main(argv)
        assert code != 0
    err = _err(capsys)
    last = err.strip().splitlines()[-1]
    assert "error" in last, err
    assert len(last) < 600


def _argparse_rejects(argv) -> bool:
    """Is the bad value one argparse itself refuses (exit 2 through SystemExit)?"""
    from fxshape.cli import build_parser

    try:
        build_parser().parse_args(argv)
    except SystemExit:
        return True
    return False


def _tiny_llama():
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=4,
                                   vocab_size=256)
    return _meta(transformers.LlamaForCausalLM, cfg)


_WRONG = (0, -1, 2**40, 1.5, "8", True, None)


def _use_params(path):
    with fxshape.use_params(path):
        pass


def _api_cases():
    m = _tiny_llama()
    cases = []
    for name in ("batch_size", "seq_len"):
        cases += [(fxshape.analyze, (m,), {name: v}) for v in _WRONG if v is not None]
    cases += [(fxshape.analyze, (m,), {"tp": v}) for v in (0, -1, 1.5, "2", True, 3)]
    cases += [(fxshape.analyze, (m,), kw) for kw in (
        {"gpu": "h300"}, {"gpu": 5}, {"dtype": "fp4"}, {"dtype": 3}, {"mode": "training"},
        {"attention": "fa9"}, {"provenance": "x"}, {"params": "/no/such.json"},
        {"moe_routing": [0.5, 0.5]}, {"seq_len": 4096})]
    for dim in ("m", "n", "k"):
        for v in (0, -1, 1.5, "8", True, None):  # 2**40 is a large GEMM, not a wrong one
            size = {**dict(m=8, n=8, k=8), dim: v}
            cases.append((fxshape.predict_matmul, (size["m"], size["n"], size["k"]), {}))
    cases += [(fxshape.predict_matmul, (8, 8, 8), kw) for kw in (
        {"batch": 0}, {"batch": 1.5}, {"gpu": "h300"}, {"dtype": "fp4"}, {"layout": "zz"})]
    cases += [(fxshape.get_gpu, (v,), {}) for v in ("h300", 5, None, "")]
    cases += [(fxshape.canonical_dtype, (v,), {}) for v in ("fp4", 3, None)]
    cases += [(fxshape.AttentionShape, (), dict(batch=v, heads=4, kv_heads=4, seq_q=8,
                                                seq_k=8, head_dim=64, head_dim_v=64))
              for v in (0, -1, 1.5, "8")]
    cases += [(fxshape.AttentionShape, (), dict(batch=1, heads=4, kv_heads=3, seq_q=8,
                                                seq_k=8, head_dim=64, head_dim_v=64))]
    cases += [(fxshape.plan_padding, (m,), kw) for kw in (
        {"min_gain": -1}, {"min_gain": 1.5}, {"multiples": (3,)}, {"multiples": (0,)},
        {"seq_len": 0})]
    cases += [(fxshape.advise, (m.config,), kw) for kw in (
        {"param_tolerance": -1}, {"min_speedup": 2}, {"tp": 0}, {"seq_len": -1},
        {"mode": "x"})]
    cases += [(fxshape.advise, (v,), {}) for v in ("gpt2", None, 5)]
    cases += [(fxshape.sweep, (m.config, "hidden_size", v), {}) for v in ([], [0], [64.5])]
    cases += [(fxshape.sweep, (m.config, "no_such", [8]), {})]
    cases += [(fxshape.capture, (v,), {}) for v in ("gpt2", None)]
    cases += [(fxshape.capture, (m,), {k: v}) for k in ("batch_size", "seq_len")
              for v in (0, 1.5, "8")]
    cases += [(fxshape.pad, (v,), {}) for v in ("gpt2", None)]
    cases += [(fxshape.pad, (m,), kw) for kw in ({"min_gain": -1}, {"multiples": (3,)},
                                                 {"seq_len": 0}, {"gpu": "h300"})]
    shape = fxshape.AttentionShape(batch=1, heads=4, kv_heads=4, seq_q=8, seq_k=8,
                                   head_dim=64, head_dim_v=64)
    cases += [(fxshape.predict_attention, (shape,), kw) for kw in (
        {"gpu": "h300"}, {"dtype": "fp4"}, {"direction": "sideways"}, {"attention": "fa9"},
        {"attention": "fa3", "gpu": "a100"})]
    cases += [(fxshape.predict_attention, (v,), {}) for v in (None, (1, 4, 8))]
    cases += [(_use_params, ("/no/such/params.json",), {})]
    report = fxshape.analyze(m, seq_len=16, provenance=None)
    cases += [(report.plot, (v,), {}) for v in ("x.pdf", "/no/such/dir/x.svg", 5)]
    return cases


@pytest.mark.parametrize("fn, args, kw", _api_cases(),
                         ids=lambda x: getattr(x, "__name__", None) or repr(x)[:40])
def test_public_functions_refuse_bad_values_in_one_line(fn, args, kw):
    # a ValueError (or, for a wrong type, a TypeError) with a one-line message that shows the
    # value, never an AttributeError, ZeroDivisionError or a traceback from deep inside
    with pytest.raises((ValueError, TypeError)) as info:
        fn(*args, **kw)
    msg = str(info.value)
    assert msg and "\n" not in msg and len(msg) < 600, msg


def test_compile_options_given_to_torch_compile_name_the_typo():
    # torch.compile hands options to the backend only when it first compiles, and dynamo
    # wraps what the backend raises (BackendCompilerFailed); the message still names the
    # option and what is accepted. make_backend (above) fails at once instead.
    compiled = torch.compile(torch.nn.Linear(8, 8), backend="fxshape",
                             options={"gpuu": "h100"})
    with pytest.raises(Exception) as info:
        compiled(torch.randn(2, 8))
    assert "unknown fxshape backend option(s) ['gpuu']; accepted: gpu, dtype, min_gain, " \
           "multiples, inner" in str(info.value)


# -- every option of every command, pairwise (issue 28) ---------------------------------------
# a pairwise covering array (tests/matrix.py) over every option of every subcommand, read off
# the argument parser, so a command or option added later is in the matrix, or this test
# fails until it has a value: each case is a one-line error where it is a contradiction,
# else an answer that states each option it was given


def test_the_covering_array_covers_every_pair():
    factors = {"a": [1, 2], "b": ["x", "y", "z"], "c": [True], "d": [0, 5]}
    conflict = lambda c: c.get("a") == 2 and c.get("b") == "z"  # noqa: E731
    cases = covering_array(factors, conflict)
    for (a, va), (b, vb) in [((a, va), (b, vb)) for a in factors for b in factors if a < b
                             for va in factors[a] for vb in factors[b]]:
        assert any(c.get(a) == va and c.get(b) == vb for c in cases), (a, va, b, vb)
    # the conflicting pair is a case of its own; no other case holds a conflict
    assert {"a": 2, "b": "z"} in cases
    assert sum(conflict(c) for c in cases) == 1
    # a value refused alone is a case of its own, and its pairs are left to it (but for the
    # deciders')
    alone = lambda c: c.get("c") is True  # noqa: E731
    cases = covering_array(factors, alone, deciders=("d",))
    assert {"c": True} in cases and {"c": True, "d": 0} in cases and {"c": True, "d": 5} in cases
    assert not any(alone(c) and set(c) & {"a", "b"} for c in cases)
    # far fewer cases than pairs (3 x 4 x ... = 29 pairs)
    assert len(cases) < 15


@pytest.fixture(scope="module")
def tiny_config(tmp_path_factory):
    path = tmp_path_factory.mktemp("cfg") / "config.json"
    transformers.LlamaConfig(**dict(_CFG, num_hidden_layers=1)).to_json_file(str(path))
    return str(path)


#: the workload options analyze, advise and sweep share (cli.args._workload_args, _step_args,
#: _kv_args, --params): one value other than the default each
_SHARED = {"gpu": ["a100"], "dtype": ["fp16"], "batch_size": ["2"], "seq_len": ["32"],
           "tp": ["2"], "verbose": [True], "attention": ["math"], "execution": ["compiled"],
           "optimizer": ["sgd"], "context_len": ["64"], "kv_dtype": ["fp8"],
           "page_size": ["16"], "params": ["PARAMS"]}
#: one value other than the default for every option of every command (argparse dests);
#: "@out" is a file in the case's folder
CLI_VALUES = {
    "analyze": {**_SHARED, "input": ["1x16:long"], "pad": [True], "train": [True],
                "format": ["json", "table", "csv", "ops-csv", "markdown"],
                "mode": ["inference", "prefill", "train", "decode"], "dp": ["2"],
                "topology": ["pcie4"], "sequence_parallel": [True],
                "provenance": ["matched", "none"], "plot": ["@out.png"],
                "pp": ["2"], "zero": ["1"], "dp_shard": ["2"], "microbatches": ["2"],
                "virtual_stages": ["2"], "schedule": ["gpipe"], "recompute": ["selective"],
                "grad_dtype": ["bf16"], "cp": ["2"], "ep": ["2"], "capacity_factor": ["1.25"],
                "stage_layers": ["torchtitan", "1,2"], "torchtitan": ["@job.toml"], "gpus": ["8"], "allreduce": ["nccl"],
                "gemv": ["inductor"], "quantize": ["int8"], "group_size": ["32"],
                "activation_scales": ["static"], "float8": ["tensorwise"],
                "async_tp": [True],
                # generated from fxshape.Parallel (--no-reshard-after-forward)
                "reshard_after_forward": [True]},
    "serve": {"gpu": ["a100"], "dtype": ["fp16"], "batch_size": ["2"], "tp": ["2"],
              "topology": ["pcie4"], "attention": ["math"], "kv_dtype": ["fp8"],
              "page_size": ["16"], "allreduce": ["nccl", "one-shot"],
              "format": ["json", "table"], "verbose": [True],
              # a server under load (--num-requests switches it on)
              "num_requests": ["3"], "rate": ["50"], "trace": ["@trace.csv"],
              "max_concurrency": ["2"], "max_num_seqs": ["2"],
              "max_num_batched_tokens": ["16"], "block_size": ["8"],
              "gpu_memory_utilization": ["0.5"], "seed": ["7"],
              # speculative decoding (--draft switches it on)
              "draft": ["eagle"], "num_speculative_tokens": ["2"], "acceptance": ["0.6"],
              "acceptance_length": ["2.5"],
              # capacity planning (--slo-ttft or --slo-itl switch it on)
              "slo_ttft": ["200ms"], "slo_itl": ["30ms"], "slo_percentile": ["90"],
              "tp_choices": ["1,2"], "fuse": ["qkv", "none"], "gemv": ["inductor"],
              "quantize": ["int8"], "group_size": ["32"], "activation_scales": ["static"]},
    "advise": {**_SHARED, "mode": ["inference", "train", "decode"], "tolerance": ["0.05"],
               "min_speedup": ["0.02"], "format": ["json", "table", "markdown"],
               "quantize": ["int8"], "group_size": ["32"], "activation_scales": ["static"],
               "float8": ["tensorwise"]},
    "sweep": {**_SHARED, "mode": ["inference", "train", "decode"], "out": ["@out.svg"],
              "quantize": ["int8"], "group_size": ["32"], "activation_scales": ["static"],
              "float8": ["tensorwise"]},
    "compare": {"gpu": ["a100"], "format": ["json", "csv"], "worst": ["1"],
                "params": ["PARAMS"]},
    "predict": {"batch": ["2"], "gpu": ["a100"], "dtype": ["fp16"], "layout": ["nt"],
                "json": [True], "params": ["PARAMS"]},
    "calibrate": {"quick": [True], "out": ["@params.json"], "gpu": ["h100"],
                  "dtype": ["fp16"], "trace": ["@no-such-trace.json"]},
    "gpus": {}, "presets": {},
    "plan": {"gpu": ["a100"], "dtype": ["fp16"], "topology": ["dgx-a100"],
             "micro_batches": ["1,2"], "zero": ["0,1"], "recompute": ["none"], "top": ["3"],
             "format": ["json", "table"], "verbose": [True], "torchtitan": ["@job.toml"],
             "advise": [True]},
}
#: the options of fxshape serve under load
_SERVE_LOAD = ("num_requests", "rate", "trace", "max_concurrency", "max_num_seqs",
               "max_num_batched_tokens", "block_size", "gpu_memory_utilization", "seed")
#: what every case of a command is given (required options, the target)
_REQUIRED = {"predict": ["--m", "64", "--n", "64", "--k", "64"],
             "sweep": ["--param", "intermediate_size", "--range", "128:192:64"],
             "plan": ["--gpus", "2", "--global-batch", "4", "--seq-len", "32"],
             "serve": ["--prompt-len", "8", "--output-len", "3"]}
_WORKLOAD = {"gpu", "dtype", "batch_size", "seq_len", "tp", "attention", "execution",
             "optimizer", "context_len", "kv_dtype", "page_size", "dp", "topology",
             "sequence_parallel", "provenance", "params", "recompute", "allreduce", "gemv"}
#: the options the command line builds a fxshape.Parallel plan from (stated as parallel=)
_PLAN = {"pp", "zero", "dp_shard", "microbatches", "virtual_stages", "schedule",
         "grad_dtype", "cp", "ep", "capacity_factor", "stage_layers", "async_tp",
         "reshard_after_forward"}


def _plan_refused(case, mode) -> bool:
    """The plans the command line cannot build or run (fxshape.parallelism.plan): each
    refused in one line."""
    get = lambda k, d: int(case.get(k, d))  # noqa: E731
    pp, zero, dp, v, m, cp = (get("pp", 1), get("zero", 0), get("dp", 1),
                              get("virtual_stages", 1), get("microbatches", 1), get("cp", 1))
    schedule = case.get("schedule", "1f1b")
    if "ep" in case or "capacity_factor" in case:
        return True  # the tiny config is dense (no experts); a capacity factor needs ep
    if zero and dp * cp == 1:
        return True  # nothing to shard over
    if "dp_shard" in case and (not zero or (dp * cp) % int(case["dp_shard"])):
        return True  # hybrid sharding needs ZeRO and a divisor of dp x cp
    if cp > 1 and ("input" in case or case.get("attention") == "math"):
        return True  # ring attention: synthesized sequences, a fused attention kernel
    if pp == 1 and (v > 1 or schedule != "1f1b" or "stage_layers" in case):
        return True  # a schedule, virtual stages or a stage split without a pipeline
    if schedule == "gpipe" and v > 1:
        return True  # interleaving is a 1F1B schedule
    if v > 1 and m % pp:
        return True  # Megatron: micro-batches a multiple of pp when interleaved
    if mode != "train" and (pp > 1 or zero or m > 1 or cp > 1 or "grad_dtype" in case):
        return True  # pipelines, CP, ZeRO, micro-batches, gradients are a training step's
    if "async_tp" in case and not (case.get("sequence_parallel") and int(case.get("tp", 1)) > 1
                                   and case.get("execution") == "compiled"):
        return True  # async TP fuses SP's collectives under torch.compile
    if "recompute" in case:
        return True  # the tiny config's one layer is no stack: nothing to recompute by layer
    return pp > 1  # the tiny config has 1 layer: no pipeline splits it


def _parser_options(command) -> dict:
    """dest -> option string of every option of ``command``'s parser (help left out)."""
    from fxshape.cli import build_parser

    sub = next(a for a in build_parser()._subparsers._group_actions).choices[command]
    return {a.dest: a.option_strings[0] for a in sub._actions
            if a.option_strings and a.dest != "help"}


def test_the_cli_matrix_covers_every_option_of_every_command():
    from fxshape.cli import build_parser

    commands = set(next(a for a in build_parser()._subparsers._group_actions).choices)
    assert commands == set(CLI_VALUES)
    for command in commands:
        required = {a.lstrip("-").replace("-", "_") for a in _REQUIRED.get(command, [])[::2]}
        assert set(_parser_options(command)) == set(CLI_VALUES[command]) | required, command


def _cli_conflict(command, case) -> bool:
    """The contradictions of the command line (refused in one line)."""
    mode = case.get("mode") or ("train" if case.get("train") else None)
    if command == "calibrate":
        return True  # no GPU here: every case is the one-line "needs a GPU"
    if command in ("analyze", "serve", "advise", "sweep") and \
            set(case) & {"group_size", "activation_scales"}:
        return True  # int4's group size, fp8's scales: the matrix quantizes int8 (or not)
    if command in ("analyze", "advise", "sweep") and "quantize" in case and \
            (mode or {"advise": "train"}.get(command)) == "train":
        return True  # quantized layers are priced for inference
    if command in ("analyze", "advise", "sweep") and "float8" in case and (
            (mode or {"advise": "train"}.get(command)) != "train"
            or case.get("execution") != "compiled" or "quantize" in case
            or set(case) & {"gpu", "dtype"}):
        return True  # FP8 training: compiled, bf16, on a GPU with FP8 (not the A100)
    if command == "serve":
        # one-shot reads peers over NVLink; PCIe GPUs have none
        if case.get("allreduce") == "one-shot" and case.get("topology") == "pcie4" \
                and "tp" in case:
            return True
        if "trace" in case:
            return True  # the trace gives the requests: --prompt-len is always given here
        if "gemv" in case and set(case) & {"num_requests", "draft", "slo_ttft", "slo_itl"}:
            return True  # Inductor's GEMVs are gpt-fast's batch-1 decode: one batch only
        spec = set(case) & {"num_speculative_tokens", "acceptance", "acceptance_length"}
        if "draft" not in case and spec:
            return True  # speculation's options without a draft
        if "draft" in case and ("page_size" in case or case.get("attention") == "math"
                                or {"acceptance", "acceptance_length"} <= set(case)):
            # vLLM's KV blocks, a fused kernel; one way to give the acceptance
            return True
        if case.get("attention") == "math" and case.get("fuse", "none") != "none":
            return True  # fusing re-prices the step with a fused attention kernel
        if "slo_ttft" in case or "slo_itl" in case:
            # capacity planning: Poisson trials over --tp-choices, one batch size each step
            return bool(set(case) & {"trace", "max_concurrency", "batch_size", "page_size",
                                     "tp"}) or case.get("attention") == "math"
        if set(case) & {"slo_percentile", "tp_choices"}:
            return True  # capacity planning's options without an SLO
        load = "num_requests" in case
        if "draft" in case and not load and set(case) & set(_SERVE_LOAD):
            return True  # the options of a server under load, for one batch
        if not load:  # the options of a server under load, for one batch
            return bool(set(case) & set(_SERVE_LOAD))
        # one batch's options under load; a fused kernel is what engines run
        return "batch_size" in case or "page_size" in case or case.get("attention") == "math"
    if command in ("analyze", "plan") and "torchtitan" in case:
        return True  # the job sets the model: a target beside it is refused
    if command == "analyze" and "gpus" in case:
        return True  # the world size of a torchtitan job, given without one
    if command not in ("analyze", "advise", "sweep"):
        return False
    mode = mode or {"advise": "train"}.get(command, "inference")
    names = {k for k in case if k in _WORKLOAD}
    if case.get("train") and case.get("mode") not in (None, "train"):
        return True
    if case.get("pad") and case.get("format") == "ops-csv":
        return True  # the op list has no place for the padding plan
    if "input" in case and (mode == "decode" or {"batch_size", "seq_len"} & set(case)):
        return True  # decode builds its inputs; sizes are for synthesized inputs
    if _refused(mode, names):
        return True
    if command == "analyze" and _plan_refused(case, mode):
        return True
    # a config file's target has no positions to cap a decode page (none here) ... and tp
    # splits 4 heads over 2 KV heads: fine; SP needs tp (in _refused)
    return False


def _tiny_trace(folder) -> str:
    """A profiler trace of one fp16 GEMM on an H100 (deviceProperties name it)."""
    ev = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0,
           "dur": 50, "args": {"Input Dims": [[256, 512], [512, 128]],
                               "Input type": ["c10::Half", "c10::Half"]}},
          {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
           "ts": 10, "dur": 5, "args": {"correlation": 1}},
          {"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm_f16f16_f16f32_f32_nn_n_kernel",
           "pid": 0, "tid": 7, "ts": 100, "dur": 9, "args": {"correlation": 1, "device": 0,
                                                              "stream": 7}}]
    path = os.path.join(folder, "trace.json")
    with open(path, "w") as f:
        json.dump({"traceEvents": ev, "deviceProperties": [
            {"id": 0, "name": "NVIDIA H100 80GB HBM3", "numSms": 132}]}, f)
    return path


def _argv(command, case, folder, target):
    argv = [command] + ([target] if command in ("analyze", "advise", "sweep", "plan", "serve")
                        else [_tiny_trace(folder)] if command == "compare" else [])
    argv += _REQUIRED.get(command, [])
    opts = _parser_options(command)
    for dest, value in case.items():
        if value is True:
            argv.append(opts[dest])
        else:
            v = _params_file() if value == "PARAMS" else value
            v = os.path.join(folder, v[1:]) if isinstance(v, str) and v.startswith("@") else v
            argv += [opts[dest], v]
    if command in ("analyze", "advise") and "format" not in case:
        argv += ["--format", "json"]
    if command == "analyze" and "seq_len" not in case and "input" not in case and \
            (case.get("mode") != "decode"):
        argv += ["--seq-len", "16"]
    return argv


def _cases():
    out = []
    for command, factors in CLI_VALUES.items():
        for i, case in enumerate(covering_array(factors,
                                                lambda c, cmd=command: _cli_conflict(cmd, c),
                                                deciders=("mode", "train"))):
            out.append(pytest.param(command, case, id=f"{command}-{i}"))
    return out


def _stated(command, case, out: str, folder) -> None:
    """Each option of ``case`` is stated in the output ``out`` (or did what it says)."""
    fmt = case.get("format", "json" if command in ("analyze", "advise") else "table")
    if command == "predict":
        if case.get("json"):
            d = json.loads(out)
            text = json.dumps(d)
        else:
            text = out
        for dest, value in case.items():
            if dest == "params":
                # a calibrated file for the H100 only: with --gpu a100 it changes nothing
                assert case.get("gpu") == "a100" or "GEMM model constants from" in out \
                    or case.get("json")
            elif value is not True:
                assert str(value) in text, (dest, value)
        return
    if command in ("gpus", "presets"):
        assert out.strip()
        return
    if command == "compare":
        gpu = "a100-sxm4-80gb" if case.get("gpu") == "a100" else "h100-sxm"
        if case.get("format") == "json":
            d = json.loads(out)
            assert d["gpu"] == gpu and [o["name"] for o in d["ops"]] == ["aten::mm"]
        elif case.get("format") == "csv":
            assert out.splitlines()[0].startswith("index,name,class") and "aten::mm" in out
        else:
            assert f"on {gpu} (" in out.splitlines()[0] and "| gemm" in out
        return
    if command == "serve":  # the GEMMs' fusion stated in every mode
        fused = case.get("fuse") or ("none" if case.get("attention") == "math" else "all")
        assert f'"fuse": "{fused}"' in out or f"GEMMs fused: {fused}" in out, out[:400]
    if command == "serve" and ("slo_ttft" in case or "slo_itl" in case):
        d = json.loads(out) if case.get("format") == "json" else None
        first = out.splitlines()[0]
        pct = int(case.get("slo_percentile", 99))
        assert (d["percentile"] if d else int(first.split(": p")[1].split()[0])) == pct
        for dest, key, label in (("slo_ttft", "slo_ttft_s", "TTFT"),
                                 ("slo_itl", "slo_itl_s", "ITL")):
            if dest in case:
                ms = float(case[dest].rstrip("ms"))
                if d:
                    assert d[key] == pytest.approx(ms / 1e3)
                else:
                    assert f"{label} {ms:g} ms" in first, first
        if "draft" in case:  # every trial speculates: the draft and its k stated
            k = int(case.get("num_speculative_tokens", 3))
            assert (d["num_speculative_tokens"] if d else
                    int(first.split("speculative decoding")[1].split(", k ")[1].split(";")[0])) \
                == k
        tried = sorted(int(x) for x in case.get("tp_choices", "1,2,4,8").split(","))
        if d:
            assert [o["tp"] for o in d["options"]] == tried
            assert ("a100" in d["gpu"]) == (case.get("gpu") == "a100")
            if "rate" in case:
                assert d["rate"] == float(case["rate"])
        else:
            assert ("a100" in first) == (case.get("gpu") == "a100")
            if "rate" in case:
                assert f"target {float(case['rate']):g} requests/s" in first
        return
    if command == "serve" and "num_requests" in case:
        d = json.loads(out) if case.get("format") == "json" else None
        text = json.dumps(d) if d else out
        assert ("a100" in text) == (case.get("gpu") == "a100"), text[:500]
        assert (d["tp"] if d else int(out.split(" on ")[1].split(" x ")[0])) == \
            int(case.get("tp", 1))
        assert (d["num_requests"] if d else int(out.split(" x ")[1].split(", ")[1].split()[0])) \
            == int(case["num_requests"])
        assert case.get("allreduce", "auto") in text
        if "draft" in case:  # speculative decoding under load: the draft and its k stated
            k = int(case.get("num_speculative_tokens", 3))
            assert (d["num_speculative_tokens"] if d else
                    int(out.split("speculative decoding")[1].split(", k ")[1].split(",")[0])) \
                == k
        for dest, label in (("max_num_seqs", "max_num_seqs"), ("block_size", "block_size"),
                            ("max_concurrency", "max_concurrency"),
                            ("max_num_batched_tokens", "max_num_batched_tokens"),
                            ("gpu_memory_utilization", "gpu_memory_utilization"),
                            ("seed", "seed")):
            if dest in case:
                if d:
                    assert float(d[label]) == float(case[dest]), (dest, d[label])
                else:
                    assert case[dest] in out.splitlines()[0], (dest, out.splitlines()[0])
        return
    if command == "serve" and "draft" in case:
        d = json.loads(out) if case.get("format") == "json" else None
        text = json.dumps(d) if d else out
        assert ("a100" in text) == (case.get("gpu") == "a100"), text[:500]
        k = int(case.get("num_speculative_tokens", 3))
        assert (d["k"] if d else int(out.split(", k ")[1].split(",")[0])) == k
        assert (d["batch_size"] if d else int(out.split("batch ")[1].split(",")[0])) == \
            int(case.get("batch_size", 1))
        alpha = d["acceptance"] if d else float(out.split("acceptance ")[1].split()[0])
        if "acceptance" in case:
            assert alpha == pytest.approx(float(case["acceptance"]), abs=1e-3)
        if "acceptance_length" in case:  # 1 + α + ... + α^k = the length given
            assert sum(alpha ** i for i in range(k + 1)) == \
                pytest.approx(float(case["acceptance_length"]), abs=1e-2)
        return
    if command == "serve":
        d = json.loads(out) if case.get("format") == "json" else None
        text = json.dumps(d) if d else out
        assert ("a100" in text) == (case.get("gpu") == "a100"), text[:500]
        assert (d["tp"] if d else int(out.split(" on ")[1].split(" x ")[0])) == \
            int(case.get("tp", 1))
        assert (d["batch_size"] if d else int(out.split("batch ")[1].split(",")[0])) == \
            int(case.get("batch_size", 1))
        assert case.get("allreduce", "auto") in text
        if "gemv" in case:
            assert '"gemv": "inductor"' in text or "as Inductor's reductions" in text
        if "quantize" in case:
            assert "int8 weight-only" in text
        return
    if command == "plan":
        if case.get("format") == "json":
            d = json.loads(out)
            labels = [r["plan"] for r in d["results"]]
            gpu = d["gpu"]
        else:
            labels = [ln.split()[1:9] for ln in out.splitlines() if ln.strip()[:1].isdigit()]
            labels = [" ".join(x) for x in labels]
            gpu = out.splitlines()[0]
        assert labels, out
        assert ("a100" in gpu) == (case.get("gpu") == "a100"), gpu
        assert len(labels) <= int(case.get("top", 10))
        if "zero" in case:
            assert all("zero3" not in lb for lb in labels)
        if "recompute" in case:
            assert all("rc-none" in lb for lb in labels)
        if "micro_batches" in case:
            assert all("mb4" not in lb for lb in labels)
        if case.get("advise"):
            assert ("advice" in d) if case.get("format") == "json" else \
                ("advice for the best plan" in out), out[-2000:]
        return
    for dest, value in case.items():
        if isinstance(value, str) and value.startswith("@"):
            assert os.path.getsize(os.path.join(folder, value[1:])) > 0, dest
    if fmt == "json":
        d = json.loads(out)
        notes = json.dumps(d.get("options", [])) + json.dumps(d.get("notes", []))
    else:
        notes = out
    for dest in case:
        name = {"tolerance": "param_tolerance"}.get(dest, dest)
        if dest in _PLAN:  # the plan built from them is the option stated
            assert "parallel=" in notes or '"parallel"' in notes, (dest, notes[:3000])
        if dest in _WORKLOAD or dest in ("tolerance", "min_speedup"):
            # the options line of a table, a CSV's options column, JSON's options or notes
            assert f"{name}=" in notes or f'"{name}"' in notes, (dest, notes[:3000])
    mode = case.get("mode") or ("train" if case.get("train") else None)
    if mode and fmt == "json" and command == "analyze":
        assert d["workload"]["mode"] == mode and not d["workload"]["mode_default"]
    elif mode and command == "advise" and fmt == "json":
        assert d["mode"] == mode
    elif mode:
        assert mode in out
    if case.get("pad"):
        assert "padding" in out or "pad" in out.splitlines()[0]
    if fmt in ("csv", "ops-csv"):
        assert out.splitlines()[0].endswith(",options")
    if fmt == "markdown":  # a table, but for advice with nothing to recommend
        assert "|" in out or "no change is predicted to pay" in out


@pytest.mark.parametrize("command, case", _cases())
def test_cli_matrix(command, case, tiny_config, tmp_path, capsys):
    from fxshape.cli import main

    code = main(_argv(command, case, str(tmp_path), tiny_config))
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    if _cli_conflict(command, case):
        assert code == 2, (case, captured.out[-500:])
        last = captured.err.strip().splitlines()
        assert len(last) == 1 and last[0].startswith(("fxshape: error:",
                                                       "fxshape calibrate: error:")), last
        return
    assert code == 0, (case, captured.err[-1000:])
    _stated(command, case, captured.out, str(tmp_path))
    if case.get("verbose"):  # --verbose shows warnings on stderr; the answer is the same
        quiet = {k: v for k, v in case.items() if k != "verbose"}
        for f in os.listdir(tmp_path):
            os.remove(tmp_path / f)
        assert main(_argv(command, quiet, str(tmp_path), tiny_config)) == 0
        assert capsys.readouterr().out == captured.out
