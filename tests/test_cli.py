import json
import subprocess
import sys

import pytest

from fxshape.cli import main


def test_predict_table(capsys):
    assert main(["predict", "--m", "8192", "--n", "51201", "--k", "14336", "--gpu", "a100",
                 "--dtype", "fp16"]) == 0
    out = capsys.readouterr().out
    assert "predicted TFLOP/s" in out and "wave efficiency" in out
    assert "a100-sxm4-80gb" in out
    # 51201 is odd: N is flagged with the next multiple of 8 (51208)
    assert "N=51201 (misaligned, next aligned 51208)" in out


def test_predict_json(capsys):
    assert main(["predict", "--m", "1", "--n", "4096", "--k", "4096", "--gpu", "h100",
                 "--layout", "nt", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["m"] == 1 and d["n"] == 4096 and d["gpu"] == "h100-sxm"
    assert d["flops"] == 2 * 1 * 4096 * 4096
    assert d["bound"] in ("memory", "latency")
    assert set(d) >= {"time_s", "tflops", "efficiency", "tile", "tile_efficiency", "waves",
                      "wave_efficiency", "alignment", "bound"}


def test_gpus_listing(capsys):
    assert main(["gpus"]) == 0
    out = capsys.readouterr().out
    assert "h100-sxm" in out and "mi250x-gcd" in out and "a100" in out
    # each GPU's power limit and default machine: torchtitan's H100s run at 500 of 700 W,
    # an MI300X in AMD's Infinity Fabric platform
    rows: dict = {}
    for ln in out.splitlines():  # the GPU table's line, the first of each GPU's
        if ln.split():
            rows.setdefault(ln.split()[0], ln)
    assert "500 of 700" in rows["h100-sxm-hbm2e"] and "dgx-h100" in rows["h100-sxm-hbm2e"]
    assert rows["mi300x"].rstrip().endswith("mi300x-platform")


def test_bad_input_one_line_no_traceback(capsys):
    assert main(["predict", "--m", "8", "--n", "8", "--k", "8", "--dtype", "fp8",
                 "--gpu", "a100"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no tensor-core path for fp8" in err
    assert "Traceback" not in err
    assert main(["predict", "--m", "8", "--n", "8", "--k", "8", "--gpu", "nope"]) == 2
    assert "unknown GPU 'nope'" in capsys.readouterr().err


def test_bad_size_is_an_argparse_error():
    proc = subprocess.run([sys.executable, "-m", "fxshape", "predict", "--m", "0", "--n", "8",
                           "--k", "8"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "expected a positive integer up to 2147483647, got 0" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_python_dash_m():
    proc = subprocess.run([sys.executable, "-m", "fxshape", "predict", "--m", "4096", "--n",
                           "4096", "--k", "4096", "--json"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["k"] == 4096


def test_analyze_preset_table(capsys):
    import pytest

    pytest.importorskip("transformers")
    assert main(["analyze", "gpt2", "--gpu", "h100", "--seq-len", "128"]) == 0
    out = capsys.readouterr().out
    # 12 layers collapse to one row each; the LM head's vocab is flagged
    assert "transformer.h.*.mlp.c_fc x12" in out
    assert "N=50257->50264" in out
    assert "FLOP-weighted efficiency" in out


def test_analyze_json_and_csv(capsys):
    import pytest

    pytest.importorskip("transformers")
    assert main(["analyze", "bert-base", "--seq-len", "64", "--format", "json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["gpu"] == "h100-sxm" and all(r["m"] == 64 for r in d["rows"] if r["op"] == "linear"
                                          and "pooler" not in r["module"])
    assert main(["analyze", "bert-base", "--seq-len", "64", "--format", "csv"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("node,module,module_type,op")
    assert len(lines) == 1 + len(d["rows"])


def test_analyze_pad_carries_the_plan_in_every_format(capsys):
    import pytest

    pytest.importorskip("transformers")
    base = ["analyze", "gpt2", "--seq-len", "64", "--pad"]
    assert main(base + ["--format", "json"]) == 0
    d = json.loads(capsys.readouterr().out)
    plan = d["padding_plan"]
    assert len(plan["decisions"]) == len(d["rows"])  # one decision per GEMM row
    head = [x for x in plan["decisions"] if x["module"] == "lm_head"]
    # GPT-2's vocabulary 50257 is odd: the plan pads the LM head's N
    assert head and head[0]["pads"] and head[0]["pad_n"] > 50257
    assert plan["padded"] == sum(x["pads"] for x in plan["decisions"])
    assert main(base + ["--format", "csv"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("node,module,op,phase,batch,m,n,k,pad_m,pad_n,pad_k,pads")
    assert len(lines) == 1 + len(plan["decisions"])
    assert any(ln.split(",")[1] == "lm_head" and ",True," in ln for ln in lines[1:])
    assert main(base + ["--format", "markdown"]) == 0
    out = capsys.readouterr().out
    assert "padding plan" in out and "| lm_head" in out


def test_analyze_bad_targets(capsys, tmp_path):
    assert main(["analyze", "no-such-model"]) == 2
    assert "unknown target 'no-such-model'" in capsys.readouterr().err
    assert main(["analyze", str(tmp_path / "missing" / "config.json")]) == 2
    assert "config file not found" in capsys.readouterr().err
    assert main(["analyze", "json:JSONDecoder"]) == 2
    assert "did not return a torch.nn.Module" in capsys.readouterr().err
    assert main(["analyze", "json:dumps"]) == 2
    assert "calling json:dumps() failed: TypeError" in capsys.readouterr().err
    assert main(["analyze", "no_such_pkg_xyz:f"]) == 2
    assert "cannot import 'no_such_pkg_xyz'" in capsys.readouterr().err
    assert main(["analyze", "gpt2", "--gpu", "h300"]) == 2
    assert "unknown GPU" in capsys.readouterr().err


def test_analyze_config_file(tmp_path, capsys):
    import pytest

    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=4,
                                   vocab_size=1000)
    cfg.save_pretrained(tmp_path)
    assert main(["analyze", str(tmp_path / "config.json"), "--seq-len", "32"]) == 0
    out = capsys.readouterr().out
    assert "model.layers.*.mlp.down_proj x2" in out
    # intermediate 688 = 16 x 43: 32-byte aligned in bf16, past the 16-byte rule but not a
    # multiple of 64, so the down projection's K is "ok", not "best", and not misaligned
    # (M = 32 tokens = 64 bytes is "ok" too; N = 256 is "best")
    from fxshape.cost.gemm import predict_matmul

    p = predict_matmul(32, 256, 688, dtype="bf16", gpu="h100", layout="nt")
    assert [a.status for a in p.alignment] == ["ok", "best", "ok"]
    assert main(["analyze", str(tmp_path / "config.json"), "--seq-len", "32",
                 "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    down = [r for r in rows if r["module"].endswith("down_proj")]
    assert down and all(r["k"] == 688 and not r["misaligned"] for r in down)


def test_presets_listing(capsys):
    assert main(["presets"]) == 0
    out = capsys.readouterr().out
    for name in ("gpt2", "gpt2-xl", "llama-2-7b", "llama-2-70b", "llama-3-8b", "mistral-7b",
                 "pythia-2.8b", "bert-base", "t5-base", "vit-base", "mixtral-8x7b"):
        assert name in out


def test_analyze_train_flag(capsys):
    import pytest

    pytest.importorskip("transformers")
    assert main(["analyze", "gpt2", "--seq-len", "32", "--train", "--format", "json"]) == 0
    d = json.loads(capsys.readouterr().out)
    phases = {r["phase"] for r in d["rows"]}
    assert phases == {"forward", "backward"}


def test_cli_prints_no_warnings_or_tracebacks(tmp_path):
    # a user sees the table, not torch's or transformers' warnings and logs (--verbose shows
    # them): this config's token ids lie outside its 1,000-word vocabulary, which
    # transformers logs a warning about
    transformers = pytest.importorskip("transformers")
    path = tmp_path / "config.json"
    transformers.GPT2Config(n_layer=2, vocab_size=1000).to_json_file(str(path))
    # inference and training in one interpreter (what `python -m fxshape` runs is main();
    # one start-up instead of two: the suite's time)
    script = ("import sys\nfrom fxshape.cli import main\n"
              f"args = ['analyze', {str(path)!r}, '--seq-len', '32']\n"
              "sys.exit(max(main(args), main(args + ['--train'])))\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0 and proc.stdout.count("lm_head") >= 2
    assert "backward" in proc.stdout  # the training report's backward rows
    assert proc.stderr == "", proc.stderr[-2000:]
    assert "Warning" not in proc.stdout and "[transformers]" not in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "fxshape", "analyze", str(path), "--seq-len",
                           "32", "--verbose"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "[transformers]" in proc.stderr


def test_analyze_trains_in_fp8_as_transformer_engine(tmp_path, capsys):
    import pytest

    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=4,
                                   vocab_size=1000)
    cfg.save_pretrained(tmp_path)
    # TE runs eager (no --execution compiled needed); the LM head stays in bf16
    assert main(["analyze", str(tmp_path / "config.json"), "--seq-len", "32", "--train",
                 "--float8", "te-delayed", "--format", "json"]) == 0
    d = json.loads(capsys.readouterr().out)
    quant = {r.get("quant") for r in d["rows"] if r.get("quant")}
    assert quant == {"float8:te-delayed:forward", "float8:te-delayed:dgrad",
                     "float8:te-delayed:wgrad"}
    assert any("Transformer Engine, delayed scaling" in n for n in d["notes"])
    # torchao's recipes still need compiled execution: a one-line refusal (exit 2)
    assert main(["analyze", str(tmp_path / "config.json"), "--seq-len", "32", "--train",
                 "--float8", "tensorwise"]) == 2
    assert "give execution='compiled'" in capsys.readouterr().err


def test_async_tp_flag_needs_sequence_parallelism(capsys):
    # --async-tp builds Parallel(async_tp=True): without --sequence-parallel, one line
    assert main(["analyze", "gpt2", "--train", "--tp", "2", "--async-tp", "--seq-len",
                 "64"]) == 2
    assert "needs tp > 1 and sequence_parallel=True" in capsys.readouterr().err
