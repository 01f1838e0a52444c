"""What README.md and docs/*.md show runs: every ```python block and every `$ fxshape ...`
line of a ```console block (``bash`` blocks are the set-up and bench commands that CI and
the bench scripts run themselves). A block right after ``<!-- illustrative -->`` is skipped.
"""

import glob
import os
import re
import shlex
import subprocess
import sys

import pytest

pytest.importorskip("transformers")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FILES = ["README.md"] + sorted(os.path.relpath(p, ROOT)
                               for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))
_BLOCK = re.compile(r"(<!-- illustrative[^>]*-->\s*)?```(\w*)\n(.*?)```", re.S)


def _blocks(lang):
    out = []
    for name in FILES:
        with open(os.path.join(ROOT, name)) as f:
            text = f.read()
        for m in _BLOCK.finditer(text):
            if m.group(2) == lang and not m.group(1):
                line = text[:m.start(2)].count("\n") + 1
                out.append(pytest.param(m.group(3), id=f"{name}:{line}"))
    return out


def _commands():
    out = []
    for block in _blocks("console"):
        for cmd in block.values[0].splitlines():
            if cmd.startswith("$ "):
                out.append(pytest.param(cmd[2:].split("#")[0].strip(),
                                        id=f"{block.id}:{cmd[2:40].strip()}"))
    return out


def test_there_are_snippets_to_run():
    # README: analyze, pad, advise, predict_matmul, predict_attention; docs: analysis, attention
    assert len(_blocks("python")) >= 7 and len(_commands()) >= 6


@pytest.mark.parametrize("code", _blocks("python"))
def test_python_snippet_runs(code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # snippets that write files write them here
    exec(compile(code, "<snippet>", "exec"), {"__name__": "__snippet__"})


@pytest.mark.parametrize("cmd", _commands())
def test_console_snippet_runs(cmd, tmp_path):
    argv = shlex.split(cmd)
    if argv[0] == "fxshape":
        argv = [sys.executable, "-m", "fxshape"] + argv[1:]
    elif argv[0] == "python":
        argv[0] = sys.executable
    proc = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip(), "printed nothing"


def test_every_name_the_docs_use_is_importable():
    # `fxshape.NAME(...)` must be a callable of the package itself (not a submodule of that
    # name); any other `fxshape.NAME` must be an attribute or an importable submodule
    import importlib

    import fxshape

    for name in FILES:
        with open(os.path.join(ROOT, name)) as f:
            text = f.read()
        for attr in sorted(set(re.findall(r"\bfxshape\.([A-Za-z_]\w*)\s*\(", text))):
            assert callable(getattr(fxshape, attr, None)), f"fxshape.{attr}( in {name}"
            assert not isinstance(getattr(fxshape, attr), type(fxshape)), attr
        for attr in sorted(set(re.findall(r"\bfxshape\.([A-Za-z_]\w*)", text))):
            assert hasattr(fxshape, attr) or importlib.util.find_spec(f"fxshape.{attr}"), \
                f"fxshape.{attr} in {name}"
    assert set(fxshape.__all__) <= set(dir(fxshape))
