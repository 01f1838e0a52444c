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
    except (UnicodeDecodeError, RecursionError) as exc:
        raise ValueError(f"{what} {path!r} is not JSON text ({type(exc).__name__}: a "
                         "binary or compressed file?)") from None


def gpu_section(path: str, key: str, check) -> dict | None:
    """The ``key`` section of the parameter file ``path`` (``{gpu name: entry}``, as
    ``fxshape calibrate --trace`` writes ``memops`` and ``attention``), or None where the
    file has none. ``check(gpu name, entry)`` raises ``ValueError`` for a bad entry; an
    entry that is no JSON object is refused here."""
    data = read_json(path, "fxshape parameter file")
    sec = data.get(key) if isinstance(data, dict) else None
    if sec is None:
        return None
    if not isinstance(sec, dict):
        raise ValueError(f"{path!r}: its {key} section is not an object of GPU entries")
    for name, entry in sec.items():
        if not isinstance(entry, dict):
            raise ValueError(f"{path!r}: {key} entry for GPU {name!r} is not an object")
        check(name, entry)
    return sec
