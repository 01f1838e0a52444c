import json
import subprocess
import sys

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
    assert "expected a positive integer, got 0" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_python_dash_m():
    proc = subprocess.run([sys.executable, "-m", "fxshape", "predict", "--m", "4096", "--n",
                           "4096", "--k", "4096", "--json"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["k"] == 4096
