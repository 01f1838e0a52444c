"""The ``fxshape`` command line, one module per command (issue 53): each has
``add_parser(sub)`` (its flags) and ``run(args) -> int``; ``args`` holds the argument types
and the option groups commands share (the plan's flags generated from ``fxshape.Parallel``'s
fields), ``shared`` what several commands do. A command parses, calls the public API and
prints; the logic is the wings'. Errors are one line on stderr.

May import: the top level, hardware, cost, fit, tracing, parallelism, config, analysis, execution, report, planning, serving, traces, codesign, padding.
"""

from __future__ import annotations

import argparse
import sys

from ..cost.gemm import use_params
from . import (advise, analyze, calibrate, compare, gpus, plan, predict, presets, serve,
               sweep)
from .predict import format_prediction
from .shared import _quiet

__all__ = ["main", "build_parser", "format_prediction", "COMMANDS"]

#: the commands, in the order ``fxshape --help`` lists them
COMMANDS = (predict, analyze, advise, sweep, plan, serve, presets, gpus, compare, calibrate)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="fxshape", description="GEMM shape efficiency on GPUs.")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for command in COMMANDS:
        command.add_parser(sub)
    return ap


def main(argv=None) -> int:
    """Entry point; returns the exit status. Errors are one line on stderr (exit 2); an
    unexpected exception is one line too, its traceback shown with ``--verbose``."""
    parser = build_parser()
    args = parser.parse_args(argv)
    verbose = getattr(args, "verbose", False)
    try:
        with _quiet(verbose), use_params(getattr(args, "params", None)):
            code = args.func(args)
        sys.stdout.flush()  # a closed pipe shows here, inside the handler below
        return code
    except ValueError as exc:
        print(f"fxshape: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # the reader went away (`fxshape gpus | head`): stop quietly, as cat does
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print("fxshape: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - no traceback reaches the user without --verbose
        if verbose:
            raise
        first = (str(exc).strip().splitlines() or [""])[0][:500]
        print(f"fxshape: error: {type(exc).__name__}: {first} (--verbose shows the "
              "traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
