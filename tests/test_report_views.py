"""What a user sees besides the text table: the HTML views, the plot, progress lines."""

import io
import xml.etree.ElementTree as ET

import pytest
import torch

import fxshape
from fxshape.codesign.advise import _progress

from models import NanoGPT


@pytest.fixture(scope="module")
def nanogpt_report():
    # GPT-2's widths, 2 layers, vocabulary 50,257: the LM head's N is misaligned, and
    # padding it pays at 8 x 1024 tokens on an A100 (docs/padding.md)
    with torch.device("meta"):
        model = NanoGPT(vocab_size=50257, n_layer=2, n_head=12, n_embd=768)
    return fxshape.analyze(model, (torch.zeros(8, 1024, dtype=torch.long, device="meta"),),
                           gpu="a100", dtype="fp16")


def test_report_html_has_every_collapsed_row_and_highlights_misalignment(nanogpt_report):
    html = nanogpt_report._repr_html_()
    groups = nanogpt_report.groups()
    # one <tr> for the header and one per collapsed row
    assert html.count("<tr>") == len(groups) + 1
    for g in groups:
        assert g["module"] in html
    assert '<span style="color:#c00;font-weight:bold">N=50257-&gt;50264</span>' in html
    assert "FLOP-weighted efficiency" in html


def test_padding_plan_html(nanogpt_report):
    plan = fxshape.plan_padding(nanogpt_report)
    html = plan._repr_html_()
    assert html.count("<tr>") == len(plan.padded) + 1 >= 2
    assert '<span style="color:#060;font-weight:bold">N 50257-&gt;50264</span>' in html
    assert "not padded:" in html and "-&gt;" in html  # the summary, escaped


def test_report_plot_svg(nanogpt_report, tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "where.svg"
    assert nanogpt_report.plot(str(path))
    root = ET.parse(path).getroot()  # a well-formed SVG
    assert root.tag.endswith("svg")
    text = path.read_text()
    # every collapsed row is a labelled bar; the LM head's loss is put down to misalignment
    assert "lm_head" in text and "lost: misalignment" in text
    with pytest.raises(ValueError, match=".png or .svg"):
        nanogpt_report.plot(str(tmp_path / "where.pdf"))


def test_cli_plot(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    transformers = pytest.importorskip("transformers")
    from fxshape.cli import main

    cfg = tmp_path / "config.json"
    transformers.GPT2Config(n_layer=1).to_json_file(str(cfg))
    out = tmp_path / "t.png"
    assert main(["analyze", str(cfg), "--seq-len", "64", "--plot", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["analyze", str(cfg), "--plot", str(tmp_path / "t.jpg")]) == 2
    assert "--plot must end in .png or .svg" in capsys.readouterr().err


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_progress_only_on_a_terminal():
    tty, pipe = _Tty(), io.StringIO()
    assert list(_progress([5, 6, 7], "sweep x", tty)) == [5, 6, 7]
    assert "\rsweep x: 1/3" in tty.getvalue() and "\rsweep x: 3/3" in tty.getvalue()
    assert list(_progress([5, 6, 7], "sweep x", pipe)) == [5, 6, 7]
    assert pipe.getvalue() == ""


class _TwoMatmuls(torch.nn.Module):
    """Two matmuls of different shapes in one module: one op name, one module name."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Parameter(torch.randn(64, 128))
        self.b = torch.nn.Parameter(torch.randn(128, 32))

    def forward(self, x):
        return (x @ self.a) @ self.b


def test_plot_has_one_bar_per_collapsed_row_with_unique_labels(tmp_path):
    pytest.importorskip("matplotlib")
    from fxshape.report.plot import bar_labels

    with torch.device("meta"):
        model = NanoGPT(vocab_size=50257, n_layer=2, n_head=12, n_embd=768)
    rep = fxshape.analyze(model, (torch.zeros(2, 256, dtype=torch.long, device="meta"),),
                          gpu="a100", dtype="fp16", mode="train", provenance=None)
    groups = rep.groups()
    labels = bar_labels(groups)
    # training: forward, dX and dW rows of one layer are three bars, not one
    assert len(labels) == len(set(labels)) == len(groups)
    assert sum("c_fc" in lab for lab in labels) == 3
    c_fc = [lab for lab in labels if "c_fc" in lab]
    # dX and dW are both backward GEMMs of c_fc: their sizes tell them apart
    assert sum("[forward]" in lab for lab in c_fc) == 1
    assert sum("[backward]" in lab for lab in c_fc) == 2
    path = tmp_path / "train.svg"
    assert rep.plot(str(path), top=len(groups))
    text = path.read_text()
    assert all(lab in text for lab in labels)
    # one module, one op, two shapes: the shapes tell the bars apart
    two = fxshape.analyze(_TwoMatmuls(), (torch.randn(16, 64),), provenance=None)
    assert sorted(bar_labels(two.groups())) == ["(top) matmul [forward] 1x16x128x64",
                                                "(top) matmul [forward] 1x16x32x128"]


def test_every_view_states_its_workload(nanogpt_report, tmp_path):
    import csv
    import json

    w = nanogpt_report.workload
    # the inputs were given: 8 x 1024 token ids, inference, tp 1, attention flash -> fa2
    assert (w.mode, w.batch_size, w.tp, w.attention) == ("inference", None, 1, "flash")
    assert w.inputs == (("idx", (8, 1024), "int64"),) and w.kernels == ("fa2",)
    line = "workload: inference (the default mode), inputs given, tp 1, attention flash " \
           "(runs fa2); inputs: idx 8x1024 int64"
    assert line in str(nanogpt_report) and line in nanogpt_report.to_markdown()
    assert json.loads(nanogpt_report.to_json())["workload"]["inputs"] == [
        {"name": "idx", "shape": [8, 1024], "dtype": "int64"}]
    rows = list(csv.DictReader(io.StringIO(nanogpt_report.to_csv())))
    assert {(r["mode"], r["tp"], r["attention"]) for r in rows} == {("inference", "1",
                                                                     "flash")}
    assert "workload: inference" in nanogpt_report._repr_html_()
    # synthesized inputs: the default seq_len is said to be the default
    transformers = pytest.importorskip("transformers")
    with torch.device("meta"):
        gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1,
                                                                    n_positions=512))
    rep = fxshape.analyze(gpt2, provenance=None)
    assert (rep.workload.batch_size, rep.workload.seq_len) == (1, 512)
    assert "batch 1 x seq_len 512 (default: 1024, capped at the model's positions)" in str(rep)
    rep = fxshape.analyze(gpt2, seq_len=64, batch_size=2, mode="train", provenance=None)
    assert "workload: train, batch 2 x seq_len 64, tp 1" in str(rep)
    pytest.importorskip("matplotlib")
    path = tmp_path / "w.svg"
    rep.plot(str(path))
    assert "train, batch 2 x seq_len 64, tp 1, attention flash" in path.read_text()
