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
