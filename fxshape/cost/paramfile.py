"""Reading a packaged or user-given parameter file: JSON, with a one-line error that names the
file and what kind of file it should have been."""

from __future__ import annotations

import json


def read_json(path: str, what: str):
    """The JSON content of ``path``; ``ValueError`` ("cannot read ``what`` ..." or "``what``
    ... is not JSON") when it cannot be read or parsed."""
    try:
        with open(path) as f:
            return json.load(f)
    except OSError as exc:
        raise ValueError(f"cannot read {what} {path!r}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{what} {path!r} is not JSON: {exc}") from None
