"""What README.md and docs/*.md show runs: every ```python block and every `$ fxshape ...`
line of a ```console block (``bash`` blocks are the set-up and bench commands that CI and
the bench scripts run themselves). A block right after ``<!-- illustrative -->`` is skipped.

The ``fxshape`` commands run in this process, through ``fxshape.cli.main`` (what the
``fxshape`` entry point and ``python -m fxshape`` call), their standard output and error
captured: a subprocess would import torch and transformers again for each (~3 s apiece; the
entry point itself is tested in tests/test_cli.py). The ``python bench/...`` commands run as
subprocesses.

A shown output, a plain block right after ``<!-- output: COMMAND -->``, is compared line by
line with what COMMAND prints; after ``<!-- output excerpt: COMMAND -->`` its lines must be a
run of consecutive lines of what COMMAND prints. (Before issue 28 only the commands ran: their exit status and
a non-empty output were checked, never what they printed, so the README's output block drifted
from the program's without a test failing.)
"""

import contextlib
import glob
import io
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


_OUTPUT = re.compile(r"<!-- output( excerpt)?: (.*?) -->\s*```\w*\n(.*?)```", re.S)


def _outputs():
    out = []
    for name in FILES:
        with open(os.path.join(ROOT, name)) as f:
            text = f.read()
        for m in _OUTPUT.finditer(text):
            line = text[:m.start()].count("\n") + 1
            out.append(pytest.param(m.group(2).strip(), m.group(3), bool(m.group(1)),
                                    id=f"{name}:{line}"))
    return out


def _argv(cmd: str) -> list:
    argv = shlex.split(cmd)
    if argv[0] == "fxshape":
        argv = [sys.executable, "-m", "fxshape"] + argv[1:]
    elif argv[0] == "python":
        argv[0] = sys.executable
        if len(argv) > 1 and argv[1].startswith("bench/"):
            argv[1] = os.path.join(ROOT, argv[1])  # docs show bench scripts run from the root
    return argv


def _run(cmd: str, cwd) -> tuple:
    """``(exit status, standard output, standard error)`` of ``cmd`` run in ``cwd``."""
    argv = _argv(cmd)
    if argv[:3] == [sys.executable, "-m", "fxshape"]:
        from fxshape.cli import main

        out, err, here = io.StringIO(), io.StringIO(), os.getcwd()
        os.chdir(cwd)
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    code = main(argv[3:])
                except SystemExit as exc:  # argparse's refusals
                    code = exc.code
        finally:
            os.chdir(here)
        return code, out.getvalue(), err.getvalue()
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=600)
    return proc.returncode, proc.stdout, proc.stderr


@pytest.mark.parametrize("cmd, shown, excerpt", _outputs())
def test_shown_output_is_what_the_command_prints(cmd, shown, excerpt, tmp_path):
    code, stdout, stderr = _run(cmd, tmp_path)
    assert code == 0, stderr[-2000:]
    got = [line.rstrip() for line in stdout.rstrip("\n").splitlines()]
    want = [line.rstrip() for line in shown.rstrip("\n").splitlines()]
    if not excerpt:
        assert got == want
        return
    starts = [i for i, line in enumerate(got) if line == want[0]]
    assert any(got[i:i + len(want)] == want for i in starts), "\n".join(got)


def test_the_readme_shows_an_output_and_opens_short():
    # the README's shown output is one of those checked, and its first screen (what comes
    # before it: what fxshape is, the quick start) is short, with no inventory of bullets
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    assert any(p.id.startswith("README.md:") for p in _outputs())
    head = text[:text.index("<!-- output:")]
    assert len(head.splitlines()) <= 50
    assert sum(1 for line in head.splitlines() if line.startswith("- ")) == 0


def test_there_are_snippets_to_run():
    # README: analyze, pad, advise, predict_matmul, predict_attention; docs: analysis, attention
    assert len(_blocks("python")) >= 7 and len(_commands()) >= 6


@pytest.mark.parametrize("code", _blocks("python"))
def test_python_snippet_runs(code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # snippets that write files write them here
    exec(compile(code, "<snippet>", "exec"), {"__name__": "__snippet__"})


@pytest.mark.parametrize("cmd", _commands())
def test_console_snippet_runs(cmd, tmp_path):
    code, stdout, stderr = _run(cmd, tmp_path)
    assert code == 0, stderr[-2000:]
    assert stdout.strip(), "printed nothing"


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


_DOTTED = re.compile(r"(?<![\w.])fxshape(?:\.[A-Za-z_]\w*)+")
_PATH = re.compile(r"(?<![\w./-])fxshape/[\w/]+(?:\.py|\.json|/)")


def _resolves(dotted: str) -> bool:
    """Is ``fxshape.a.b.c`` a module or an attribute reached from one?"""
    import importlib

    parts = dotted.split(".")
    obj, i = None, len(parts)
    while i > 0:  # the longest importable module prefix
        try:
            obj = importlib.import_module(".".join(parts[:i]))
            break
        except ImportError:
            i -= 1
    for attr in parts[i:]:
        if not hasattr(obj, attr):
            return False
        obj = getattr(obj, attr)
    return True


def test_every_module_path_the_docs_and_sources_name_exists():
    # after files move, the dotted names (fxshape.cost.gemm.ModelParams) and file paths
    # (fxshape/analysis/ops.py) that README, docs/, docstrings and bench/ name must follow
    sources = FILES + sorted(os.path.relpath(p, ROOT) for pattern in
                             ("fxshape/**/*.py", "bench/*.py")
                             for p in glob.glob(os.path.join(ROOT, pattern), recursive=True))
    bad = []
    for name in sources:
        with open(os.path.join(ROOT, name)) as f:
            text = f.read()
        for dotted in sorted(set(_DOTTED.findall(text))):
            if not _resolves(dotted.rstrip(".")):
                bad.append(f"{name}: {dotted}")
        for path in sorted(set(_PATH.findall(text))):
            if not os.path.exists(os.path.join(ROOT, path)):
                bad.append(f"{name}: {path}")
    assert bad == []
