"""Every output of the commands and the API on the presets, hashed: the safety net of a
refactor (issue 53: "every output of every command and API on the existing examples is
byte-identical before and after").

    python bench/golden_outputs.py            # check against bench/golden_outputs.json
    python bench/golden_outputs.py --write    # record (after a change that means to move)
    python bench/golden_outputs.py --only gpt2 --jobs 2

Each case is one analysis (a preset in a mode, under a plan or not) rendered in every format
a report has (the table, JSON, CSV, the op list, Markdown, the Chrome trace), or one command
line (plan, serve, advise, sweep, predict, compare, gpus, presets) run in this process with
its standard output captured. The file keeps each output's SHA-256 and length, and the list
of cases, so that a check says which case and which format moved. Outputs are this
machine's: torch, transformers and the packaged constants are part of what is hashed (the
script records their versions and refuses to compare across them).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import sys
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = os.path.join(HERE, "golden_outputs.json")

#: the presets every mode is tried on (each analysed with its default provenance)
PRESETS = ("bert-base", "deepseek-v3", "gpt2", "gpt2-large", "gpt2-medium", "gpt2-xl",
           "llama-2-70b", "llama-2-7b", "llama-3-8b", "mistral-7b", "mixtral-8x7b",
           "pythia-2.8b", "qwen2-7b", "qwen3-30b-a3b", "t5-base", "vit-base")
MODES = ("inference", "train", "decode")

#: analyses under a plan: (name, preset, analyze keywords as text, evaluated with Parallel)
PLANS = (
    ("llama-3-8b tp2 sp", "llama-3-8b", "dict(mode='train', seq_len=1024, tp=2, "
                                        "sequence_parallel=True)"),
    ("llama-3-8b fsdp", "llama-3-8b", "dict(mode='train', seq_len=1024, "
                                      "parallel=Parallel(dp=8, zero=3))"),
    ("llama-3-8b pp4 interleaved", "llama-3-8b",
     "dict(mode='train', seq_len=1024, parallel=Parallel(pp=4, dp=2, virtual_stages=2, "
     "microbatches=8))"),
    ("llama-3-8b zbv", "llama-3-8b", "dict(mode='train', seq_len=1024, "
                                     "parallel=Parallel(pp=2, virtual_stages=2, "
                                     "schedule='zbv', microbatches=4))"),
    ("llama-3-8b cp2", "llama-3-8b", "dict(mode='train', seq_len=4096, "
                                     "parallel=Parallel(cp=2, dp=4, zero=3))"),
    ("mixtral ep4", "mixtral-8x7b", "dict(mode='train', seq_len=1024, "
                                    "parallel=Parallel(dp=4, ep=4, zero=1))"),
    ("llama-3-8b compiled fp8", "llama-3-8b", "dict(mode='train', seq_len=1024, "
                                              "execution='compiled', float8='tensorwise')"),
    ("llama-3-8b int4 decode", "llama-3-8b", "dict(mode='decode', context_len=4096, "
                                             "batch_size=8, quantize='int4')"),
)

#: command lines, run in this process (their standard output hashed)
COMMANDS = (
    "gpus", "presets",
    "predict --m 4096 --n 4096 --k 4096 --gpu h100",
    "analyze gpt2 --format markdown --gpu a100",
    "analyze gpt2 --pad",
    "plan gpt2 --gpus 8 --global-batch 32 --seq-len 1024 --format json",
    "serve llama-3-8b --prompt-len 512 --output-len 64 --batch-size 4",
    "serve llama-3-8b --num-requests 16 --rate 4 --prompt-len 256 --output-len 32",
    "serve llama-3-8b --prompt-len 256 --output-len 32 --draft eagle",
    "advise gpt2 --format json",
    "sweep gpt2 --param n_embd --range 768:896:64",
    "compare {traces}/tracelens_h100_bert-small_inference.json.gz --format json",
)


def _sha(text: str) -> dict:
    data = text.encode()
    return {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}


def _renders(report) -> dict:
    import tempfile

    out = {"table": report.table(), "json": report.to_json(), "csv": report.to_csv(),
           "ops_csv": report.ops_csv(), "markdown": report.to_markdown()}
    if getattr(report, "step", None) is not None:
        with tempfile.TemporaryDirectory() as d:
            path = report.to_chrome_trace(os.path.join(d, "t.json"))
            out["chrome_trace"] = open(path).read()
    return {k: _sha(v) for k, v in out.items()}


def _analysis(preset: str, kwargs: str) -> dict:
    import fxshape
    from fxshape import Parallel  # noqa: F401 - the plans' text names it
    from fxshape.presets import build_preset

    kw = eval(kwargs, {"Parallel": Parallel, "dict": dict})  # noqa: S307 - this file's text
    try:
        report = fxshape.analyze(build_preset(preset), **kw)
    except ValueError as exc:  # a refusal is an output too
        return {"refused": _sha(str(exc))}
    return _renders(report)


def _command(line: str) -> dict:
    from fxshape.cli import main

    traces = os.path.join(HERE, "..", "..", "shared", "calibration", "traces")
    argv = line.format(traces=os.path.normpath(traces)).split()
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
    return {"exit": code, "stdout": _sha(out.getvalue()), "stderr": _sha(err.getvalue())}


def cases(only=()) -> list:
    """``(name, kind, args)`` of every case, in the file's order."""
    out = []
    for preset in PRESETS:
        for mode in MODES:
            kw = f"dict(mode={mode!r})"
            out.append((f"{preset} {mode}", "analysis", (preset, kw)))
    for name, preset, kw in PLANS:
        out.append((name, "analysis", (preset, kw)))
    for line in COMMANDS:
        out.append((f"$ fxshape {line}", "command", (line,)))
    return [c for c in out if not only or any(o in c[0] for o in only)]


def _run(case):
    name, kind, args = case
    warnings.simplefilter("ignore")
    return name, (_analysis(*args) if kind == "analysis" else _command(*args))


def _versions() -> dict:
    import torch
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "python": sys.version.split()[0]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help="record the outputs")
    ap.add_argument("--only", nargs="*", default=(), help="cases whose name has this text")
    ap.add_argument("--jobs", type=int, default=2, help="processes (default 2)")
    args = ap.parse_args(argv)
    todo = cases(args.only)
    analyses = [c for c in todo if c[1] == "analysis"]
    if args.jobs > 1 and len(analyses) > 1:
        import multiprocessing as mp

        with mp.get_context("fork").Pool(args.jobs) as pool:
            got = dict(pool.imap(_run, analyses))
    else:
        got = dict(map(_run, analyses))
    # the command lines in this process (the plan search forks workers of its own)
    got.update(map(_run, [c for c in todo if c[1] == "command"]))
    got = {name: got[name] for name, _, _ in todo}
    versions = _versions()
    if args.write:
        old = json.load(open(GOLDEN)) if os.path.exists(GOLDEN) else {"cases": {}}
        known = {name for name, _, _ in cases()}
        merged = {k: v for k, v in {**old.get("cases", {}), **got}.items() if k in known}
        with open(GOLDEN, "w") as f:
            json.dump({"comment": "Written by bench/golden_outputs.py --write; the outputs' "
                                  "hashes on this machine.", "versions": versions,
                       "cases": {k: merged[k] for k in sorted(merged)}}, f, indent=1,
                      sort_keys=True)
            f.write("\n")
        print(f"recorded {len(got)} cases in {os.path.relpath(GOLDEN)}")
        return 0
    want = json.load(open(GOLDEN))
    if want.get("versions") != versions:
        print(f"recorded under {want.get('versions')}, this is {versions}: not comparable; "
              "record with --write on this machine first", file=sys.stderr)
        return 2
    moved = []
    for name, outputs in got.items():
        ref = want["cases"].get(name)
        if ref is None:
            moved.append(f"{name}: not recorded")
            continue
        for key in sorted(set(ref) | set(outputs)):
            if ref.get(key) != outputs.get(key):
                moved.append(f"{name}: {key} differs")
    for line in moved:
        print(line)
    print(f"{len(got) - len({m.split(':')[0] for m in moved})} of {len(got)} cases "
          "byte-identical")
    return 1 if moved else 0


if __name__ == "__main__":
    sys.exit(main())
