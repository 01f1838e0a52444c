"""``fxshape presets``: the built-in models."""

from __future__ import annotations

import argparse

from tabulate import tabulate


def run(args) -> int:
    from ..presets import list_presets

    print(tabulate(list_presets(), headers=("preset", "model")))
    return 0


def add_parser(sub) -> argparse.ArgumentParser:
    """The ``presets`` command's parser."""
    pl = sub.add_parser("presets", help="list the built-in model presets")
    pl.set_defaults(func=run)
    return pl
