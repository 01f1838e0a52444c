"""The requests a server sees: arrival times and lengths, generated or read from a file.

- :func:`poisson_requests`: ``n`` requests arriving as a Poisson process of ``rate``
  requests per second (``math.inf``: all at once, as ``vllm bench serve``'s default
  ``--request-rate inf``), prompt and output lengths fixed or drawn uniformly from a range;
  seeded, so the same arguments give the same requests.
- :func:`read_trace`: a CSV file with a header naming ``arrival_s``, ``prompt_len`` and
  ``output_len`` (a request per row, in any order; other columns are refused by name). A bad
  row is named by its line.
"""

from __future__ import annotations

import csv
import io
import math
import random
from dataclasses import dataclass

__all__ = ["Request", "poisson_requests", "read_trace", "parse_length", "TRACE_COLUMNS"]

TRACE_COLUMNS = ("arrival_s", "prompt_len", "output_len")


@dataclass(frozen=True)
class Request:
    """One request: when it arrives (seconds), its prompt and how many tokens it generates."""

    arrival_s: float
    prompt_len: int
    output_len: int

    def __post_init__(self):
        a = self.arrival_s
        if isinstance(a, bool) or not isinstance(a, (int, float)) or not math.isfinite(a) \
                or a < 0:
            raise ValueError(f"arrival_s must be a finite number of seconds >= 0, got {a!r}")
        for name in ("prompt_len", "output_len"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")


def parse_length(name: str, value):
    """A length given as a positive integer or an inclusive range ``(lo, hi)`` / ``"lo:hi"``
    (drawn uniformly); returns ``(lo, hi)``.

    Raises:
        ValueError: anything else, named.
    """
    what = (f"{name} must be a positive integer or a range lo:hi of positive integers "
            f"with lo <= hi, got {value!r}")
    if isinstance(value, str):
        parts = value.split(":")
        try:
            nums = [int(p) for p in parts]
        except ValueError:
            raise ValueError(what) from None
        value = nums[0] if len(nums) == 1 else tuple(nums)
    if isinstance(value, int) and not isinstance(value, bool):
        value = (value, value)
    if not (isinstance(value, tuple) and len(value) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
            and 0 < value[0] <= value[1]):
        raise ValueError(what)
    return value


def poisson_requests(n: int, *, rate: float, prompt_len, output_len,
                     seed: int = 0) -> tuple:
    """``n`` requests, arriving as a Poisson process of ``rate`` per second from time 0
    (``math.inf``: all at time 0), each with a prompt and an output length given as an
    integer or an inclusive range (uniform). Deterministic for a given ``seed``.

    Raises:
        ValueError: ``n`` not a positive integer, a rate that is not positive, a bad length.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
        raise ValueError(f"the number of requests must be a positive integer, got {n!r}")
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not rate > 0:
        raise ValueError(f"rate must be a positive number of requests per second (inf: all "
                         f"at once), got {rate!r}")
    p_lo, p_hi = parse_length("prompt_len", prompt_len)
    o_lo, o_hi = parse_length("output_len", output_len)
    rng = random.Random(seed)
    t = 0.0
    out = []
    for _ in range(n):
        p = p_lo if p_lo == p_hi else rng.randint(p_lo, p_hi)
        o = o_lo if o_lo == o_hi else rng.randint(o_lo, o_hi)
        out.append(Request(t, p, o))
        if math.isfinite(rate):
            t += rng.expovariate(rate)
    return tuple(out)


def read_trace(path: str) -> tuple:
    """The requests of a CSV trace (module docstring), sorted by arrival (stable).

    Raises:
        ValueError: a missing file, a header without the three columns or with others, a
            row whose values are not what the column takes (named by line), no rows.
    """
    try:
        with open(path, newline="", encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise ValueError(f"cannot read the trace {path!r}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ValueError(f"trace {path!r} is not a text CSV (it is not UTF-8: a binary or "
                         "compressed file?); accepted: a CSV with the header "
                         + ",".join(TRACE_COLUMNS)) from None
    if "\0" in text:
        raise ValueError(f"trace {path!r} is not a text CSV (it holds NUL bytes); accepted: a "
                         "CSV with the header " + ",".join(TRACE_COLUMNS))
    try:
        return _parse_trace(text, path)
    except csv.Error as exc:
        raise ValueError(f"trace {path!r} is not a CSV this reader takes ({exc}); accepted: "
                         "a CSV with the header " + ",".join(TRACE_COLUMNS)) from None


def _parse_trace(text: str, path: str) -> tuple:
    with io.StringIO(text, newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            raise ValueError(f"trace {path!r} is empty; it needs a header "
                             + ",".join(TRACE_COLUMNS) + " and a row per request")
        cols = [h.strip() for h in header]
        missing = [c for c in TRACE_COLUMNS if c not in cols]
        extra = [c for c in cols if c not in TRACE_COLUMNS]
        if missing or extra:
            raise ValueError(f"trace {path!r} header {','.join(cols)!r}: "
                             + (f"missing {', '.join(missing)}" if missing else "")
                             + ("; " if missing and extra else "")
                             + (f"unknown {', '.join(extra)}" if extra else "")
                             + "; accepted columns: " + ", ".join(TRACE_COLUMNS))
        at = {c: cols.index(c) for c in TRACE_COLUMNS}
        out = []
        for line, row in enumerate(reader, start=2):
            if not row or all(not x.strip() for x in row):
                continue
            if len(row) != len(cols):
                raise ValueError(f"{path}:{line}: {len(row)} values, the header has "
                                 f"{len(cols)}")
            try:
                arrival = float(row[at["arrival_s"]])
            except ValueError:
                raise ValueError(f"{path}:{line}: arrival_s {row[at['arrival_s']]!r} is not "
                                 "a number of seconds") from None
            vals = {}
            for c in ("prompt_len", "output_len"):
                try:
                    vals[c] = int(row[at[c]])
                except ValueError:
                    raise ValueError(f"{path}:{line}: {c} {row[at[c]]!r} is not a positive "
                                     "integer") from None
            try:
                out.append(Request(arrival, vals["prompt_len"], vals["output_len"]))
            except ValueError as exc:
                raise ValueError(f"{path}:{line}: {exc}") from None
    if not out:
        raise ValueError(f"trace {path!r} has a header but no requests")
    return tuple(sorted(out, key=lambda r: r.arrival_s))
