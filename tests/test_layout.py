"""The package's layout stays true (docs/architecture.md): wings by concern, each importing
only the wings its ``__init__`` paragraph names, and no import circle anywhere.

Imports are read from the source (AST, nothing executed), function-level ones included.
"""

import ast
import os
import re

import networkx as nx
import pytest

import fxshape

PKG_DIR = os.path.dirname(fxshape.__file__)
ROOT = os.path.dirname(PKG_DIR)
#: ``May import: hardware, cost.`` or ``May import: nothing of fxshape.``
_MAY = re.compile(r"^May import: (.*?)\.?$", re.M)


def _modules(pkg_dir: str, pkg: str) -> dict:
    """{dotted module name: path} for every .py file under ``pkg_dir``."""
    out = {}
    for dirpath, dirs, files in os.walk(pkg_dir):
        dirs[:] = sorted(d for d in dirs if not d.startswith(("_", ".")))
        rel = os.path.relpath(dirpath, pkg_dir)
        parts = [pkg] + ([] if rel == "." else rel.split(os.sep))
        for f in sorted(files):
            if f.endswith(".py"):
                name = parts + ([] if f == "__init__.py" else [f[:-3]])
                out[".".join(name)] = os.path.join(dirpath, f)
    return out


def _imports(name: str, path: str, modules: dict) -> set:
    """The package modules ``name`` imports (absolute names), anywhere in the file."""
    is_pkg = path.endswith("__init__.py")
    base = name.split(".") if is_pkg else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(open(path).read(), filename=path)):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = base[:len(base) - node.level + 1]
                mod = ".".join(anchor + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            # ``from .cost import gemm`` imports the submodule, ``from .gemm import x`` the
            # module itself
            targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in modules else mod
                       for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in modules:  # ``import fxshape.cost.gemm.x`` -> the module
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


#: in a wing's "May import:" line, the top level's modules (only the command line, which
#: sits above everything, says it)
TOP = "the top level"


def _wing(module: str, wings) -> str:
    """``fxshape.cost.gemm`` -> ``cost``; top-level modules and the package -> ``""``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in wings else ""


def layout_problems(pkg_dir: str, pkg: str) -> list:
    """Every import circle and every import a wing's paragraph forbids, as sentences."""
    modules = _modules(pkg_dir, pkg)
    wings = {m.split(".")[1]: p for m, p in modules.items()
             if m.count(".") == 1 and p.endswith("__init__.py")}
    problems = []
    allowed = {}
    for w, path in sorted(wings.items()):
        doc = ast.get_docstring(ast.parse(open(path).read())) or ""
        m = _MAY.search(doc)
        if m is None:
            problems.append(f"wing {w}: its __init__ paragraph has no 'May import:' line")
            allowed[w] = set()
            continue
        said = m.group(1).strip()
        allowed[w] = set() if said.startswith("nothing") else \
            {x.strip() for x in said.split(",")}
        unknown = allowed[w] - set(wings) - {TOP}
        if unknown:
            problems.append(f"wing {w} may import {sorted(unknown)}, which are not wings")
    graph = nx.DiGraph()
    for name, path in modules.items():
        graph.add_node(name)
        src = _wing(name, wings)
        for target in sorted(_imports(name, path, modules)):
            graph.add_edge(name, target)
            dst = _wing(target, wings)
            if src and dst and dst != src and dst not in allowed.get(src, set()):
                problems.append(f"{name} imports {target}: wing {src} may not import {dst}")
            if src and not dst and target != pkg and TOP not in allowed.get(src, set()):
                problems.append(f"{name} imports {target}: a wing may not import the top "
                                "level")
            if src and target == pkg:
                problems.append(f"{name} imports {pkg} itself (the public API)")
    for cycle in sorted(sorted(c) for c in nx.simple_cycles(graph)):
        problems.append("import circle: " + " -> ".join(cycle))
    return problems


def test_the_package_keeps_its_layout():
    assert layout_problems(PKG_DIR, "fxshape") == []


def private_imports(pkg_dir: str, pkg: str) -> list:
    """Every import of a private name (``_x``, not a dunder) from another wing, as
    sentences: what one wing takes from another is its public surface (issue 53)."""
    modules = _modules(pkg_dir, pkg)
    wings = {m.split(".")[1] for m, p in modules.items()
             if m.count(".") == 1 and p.endswith("__init__.py")}
    out = []
    for name, path in modules.items():
        src = _wing(name, wings)
        is_pkg = path.endswith("__init__.py")
        base = name.split(".") if is_pkg else name.split(".")[:-1]
        for node in ast.walk(ast.parse(open(path).read(), filename=path)):
            if not isinstance(node, ast.ImportFrom) or not node.level:
                continue
            anchor = base[:len(base) - node.level + 1]
            mod = ".".join(anchor + ([node.module] if node.module else []))
            dst = _wing(mod, wings)
            for a in node.names:
                private = a.name.startswith("_") and not a.name.startswith("__")
                if private and dst != src:
                    out.append(f"{name} imports {a.name} from {mod}: private to wing "
                               f"{dst or 'the top level'}")
    return sorted(out)


def test_no_wing_takes_another_wings_private_names():
    assert private_imports(PKG_DIR, "fxshape") == []


def test_the_private_import_checker(tmp_path):
    root = tmp_path / "pkg"
    _write(str(root), {"__init__.py": "", "a/__init__.py": '"""A.\n\nMay import: b.\n"""\n',
                       "b/__init__.py": '"""B.\n\nMay import: nothing of pkg.\n"""\n',
                       "b/m.py": "_x = 1\ny = 2\n",
                       "a/n.py": "from ..b.m import _x, y\nfrom ..b import m as _m\n",
                       "b/k.py": "from .m import _x\n"})
    # a's private import from b is named; b's own, a public name, a private alias are not
    assert private_imports(str(root), "pkg") == [
        "pkg.a.n imports _x from pkg.b.m: private to wing b"]


def test_no_function_grows_past_100_lines():
    # none is longer, without exception (issue 53 split the last fourteen)
    too_long = []
    for name, path in _modules(PKG_DIR, "fxshape").items():
        rel = os.path.relpath(path, PKG_DIR).replace(os.sep, "/")
        for node in ast.walk(ast.parse(open(path).read(), filename=path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > 100:
                    too_long.append(f"{rel}:{node.name} is {lines} lines")
    assert too_long == []


def test_no_wing_holds_more_than_a_quarter_of_the_package():
    lines = {}
    for name, path in _modules(PKG_DIR, "fxshape").items():
        wing = name.split(".")[1] if name.count(".") >= 2 or path.endswith("__init__.py") \
            and name.count(".") == 1 else ""
        lines[wing] = lines.get(wing, 0) + sum(1 for _ in open(path))
    total = sum(lines.values())
    over = {w: round(n / total, 3) for w, n in lines.items() if w and n / total > 0.25}
    assert over == {}


def test_at_most_six_plain_modules_at_the_top():
    plain = sorted(f for f in os.listdir(PKG_DIR) if f.endswith(".py"))
    assert len(plain) <= 6, plain


def test_every_wing_is_in_the_architecture_page():
    wings = sorted(d for d in os.listdir(PKG_DIR)
                   if os.path.isfile(os.path.join(PKG_DIR, d, "__init__.py")))
    # hardware, cost, fit, tracing, parallelism, config, analysis, execution, report,
    # planning, serving, codesign, padding, traces, cli
    assert len(wings) == 15, wings
    page = open(os.path.join(ROOT, "docs", "architecture.md")).read()
    missing = [w for w in wings if f"`fxshape/{w}/`" not in page]
    assert missing == []


def _write(root, files: dict) -> None:
    for rel, text in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)


@pytest.mark.parametrize("files, expected", [
    # a lower wing importing a higher one, inside a function
    ({"low/__init__.py": '"""Low.\n\nMay import: nothing of pkg.\n"""\n',
      "low/a.py": "def f():\n    from ..high.b import g\n",
      "high/__init__.py": '"""High.\n\nMay import: low.\n"""\n',
      "high/b.py": "from ..low.a import f\n"},
     ["pkg.low.a imports pkg.high.b: wing low may not import high",
      "import circle: pkg.high.b -> pkg.low.a"]),
    # a circle inside one wing, through ``from . import``
    ({"w/__init__.py": '"""W.\n\nMay import: nothing of pkg.\n"""\n',
      "w/a.py": "from . import b\n", "w/b.py": "from .a import x\n"},
     ["import circle: pkg.w.a -> pkg.w.b"]),
    # a wing without its paragraph's line, and one reaching the top level
    ({"w/__init__.py": '"""W."""\n', "w/a.py": "from ..cli import main\n",
      "cli.py": "from .w.a import x\n"},
     ["wing w: its __init__ paragraph has no 'May import:' line",
      "pkg.w.a imports pkg.cli: a wing may not import the top level",
      "import circle: pkg.cli -> pkg.w.a"]),
])
def test_the_checker_finds_what_it_should(tmp_path, files, expected):
    root = tmp_path / "pkg"
    _write(str(root), dict(files, **{"__init__.py": ""}))
    assert layout_problems(str(root), "pkg") == expected


def test_the_op_registry_tells_tracing_which_nodes_are_gemms():
    # tracing imports nothing above it: the registry installs its lookup when imported, so a
    # training capture labels the phase of exactly the nodes that have a GEMM handler
    import torch

    from fxshape.analysis.ops import gemm_handler

    class MLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.up = torch.nn.Linear(16, 32)

        def forward(self, x):
            return torch.relu(self.up(x)) + 1

    gm = fxshape.capture(MLP(), (torch.randn(4, 16),), train=True)
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    labelled = {n.name for n in calls if "fxshape_phase" in n.meta}
    gemms = {n.name for n in calls if gemm_handler(n.target) is not None}
    # the forward addmm/mm and the backward's input and weight gradients are GEMMs; relu and
    # add are not
    assert len(gemms) >= 2 and labelled == gemms
    assert {n.meta["fxshape_phase"] for n in calls if n.name in gemms} == {"forward",
                                                                          "backward"}
