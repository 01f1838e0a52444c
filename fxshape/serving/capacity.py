"""Capacity planning under latency SLOs: ``fxshape.plan_capacity``.

Users size a deployment by its service-level objectives: "time to first token under
200 ms and inter-token latency under 30 ms at the 99th percentile". For each tensor-parallel
degree, :func:`plan_capacity` prepares one engine (``fxshape.serving.simulate.Server``: one
capture) and finds, by bisection over the Poisson arrival rate, the highest rate one
replica serves within the SLOs (``num_requests`` requests per trial, the same seed each
time, so the answer is deterministic). With a target ``rate`` it counts the data-parallel
replicas each degree needs, ``ceil(rate / highest rate)``, and the GPUs they take, and
picks the fewest GPUs; without one, the most requests per second per GPU.

A degree whose lone request already misses an SLO (its prefill or its decode steps are too
slow whatever the load) meets none; if no degree meets the SLOs the plan says which came
closest (the smallest ratio of a lone request's latency to its SLO) and by how much.
The saturation rate (all requests at once) bounds the search; a degree that meets the SLOs
even there is reported at it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .batch import check_fuse
from .simulate import Server
from .traffic import poisson_requests

__all__ = ["plan_capacity", "CapacityPlan", "TpCapacity", "parse_duration"]

_PERCENTILES = (50, 90, 99)


def parse_duration(name: str, text) -> float:
    """Seconds from ``"200ms"``, ``"0.2s"``, ``"150us"`` or a bare number of milliseconds.

    Raises:
        ValueError: anything else, named.
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        v = float(text) / 1e3
    else:
        t = str(text).strip().lower()
        scale = 1e-3
        for unit, f in (("ms", 1e-3), ("us", 1e-6), ("s", 1.0)):
            if t.endswith(unit):
                t, scale = t[: -len(unit)], f
                break
        try:
            v = float(t) * scale
        except ValueError:
            v = float("nan")
    if not (v > 0 and math.isfinite(v)):
        raise ValueError(f"{name} must be a positive duration such as 200ms, 0.2s or 200 "
                         f"(milliseconds), got {text!r}")
    return v


@dataclass(frozen=True)
class TpCapacity:
    """One tensor-parallel degree under the SLOs."""

    tp: int
    possible: bool  # the model fits and splits at this degree
    meets: bool  # a lone request meets the SLOs
    max_rate: float  # requests per second one replica serves within them (0: none)
    ttft_s: float  # at max_rate (or of a lone request when none), the SLO's percentile
    itl_s: float
    lone_ttft_s: float
    lone_itl_s: float
    #: for a target rate: replicas and GPUs (None without one, or when the SLOs are missed)
    replicas: int | None = None
    gpus: int | None = None
    note: str = ""

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class CapacityPlan:
    """What :func:`plan_capacity` found."""

    model: str
    gpu: str
    slo_ttft_s: float | None
    slo_itl_s: float | None
    percentile: int
    prompt_len: object
    output_len: object
    rate: float | None
    num_requests: int
    options: tuple  # TpCapacity per degree tried
    best: TpCapacity | None
    closest: TpCapacity | None  # when none meets: the degree that came closest
    #: speculative decoding in every trial (the engine's draft; None: none)
    draft: str | None = None
    num_speculative_tokens: int = 0
    fuse: str = "all"

    def to_dict(self) -> dict:
        return {"model": self.model, "gpu": self.gpu, "slo_ttft_s": self.slo_ttft_s,
                "slo_itl_s": self.slo_itl_s, "percentile": self.percentile,
                "prompt_len": self.prompt_len, "output_len": self.output_len,
                "rate": self.rate, "num_requests": self.num_requests,
                "options": [o.to_dict() for o in self.options],
                "best_tp": self.best.tp if self.best else None,
                "closest_tp": self.closest.tp if self.closest else None,
                "draft": self.draft, "num_speculative_tokens": self.num_speculative_tokens,
                "fuse": self.fuse,
                "summary": self.summary()}

    def summary(self) -> str:
        slo = " and ".join(x for x in (
            f"p{self.percentile} TTFT <= {self.slo_ttft_s * 1e3:g} ms" if self.slo_ttft_s
            else "", f"p{self.percentile} ITL <= {self.slo_itl_s * 1e3:g} ms"
            if self.slo_itl_s else "") if x)
        b = self.best
        if b is None:
            c = self.closest
            if c is None:
                return f"no tensor-parallel degree tried fits {self.model} on {self.gpu}"
            return (f"no degree meets {slo}: the closest, tp {c.tp}, serves a lone request "
                    f"with TTFT {c.lone_ttft_s * 1e3:.1f} ms and ITL {c.lone_itl_s * 1e3:.2f} "
                    "ms")
        if self.rate is not None:
            return (f"{b.gpus} x {self.gpu}: {b.replicas} replica(s) at tp {b.tp} serve "
                    f"{self.rate:g} requests/s within {slo} (up to {b.max_rate:.2f} each)")
        return (f"tp {b.tp}: {b.max_rate:.2f} requests/s per replica within {slo} "
                f"({b.max_rate / b.tp:.2f} per GPU, the most of the degrees tried)")


def _pct(stats, q: int) -> float:
    return {50: stats.p50, 90: stats.p90, 99: stats.p99}[q]


def _highest_rate(trial, meets, lone) -> tuple:
    """``(rate, its simulation)``: the highest request rate whose simulation ``meets`` the
    SLOs, by bisection (to 1%, 12 trials at most) below the saturated throughput; ``lone``
    (a lone request's, which meets them) when no rate above zero does."""
    sat = trial(math.inf)
    if meets(sat):
        return sat.request_throughput, sat
    lo, hi, best_sim = 0.0, sat.request_throughput, lone
    for _ in range(12):
        mid = (lo + hi) / 2
        sim = trial(mid)
        if meets(sim):
            lo, best_sim = mid, sim
        else:
            hi = mid
        if hi - lo <= 0.01 * hi:
            break
    return lo, best_sim


def plan_capacity(model, *, gpu="h100", prompt_len, output_len, slo_ttft=None, slo_itl=None,
                  percentile: int = 99, rate=None, tp=(1, 2, 4, 8), num_requests: int = 300,
                  seed: int = 0, **engine) -> CapacityPlan:
    """The highest request rate, or the fewest GPUs for ``rate``, within the SLOs (module
    docstring).

    Args:
        slo_ttft, slo_itl: the SLOs on time to first token and inter-token latency (seconds,
            or a string such as ``"200ms"``); at least one.
        percentile: the percentile the SLOs hold at (50, 90 or 99).
        rate: a target rate (requests per second) to size replicas for; None: the highest
            rate per GPU.
        tp: the tensor-parallel degrees to try.
        prompt_len, output_len: lengths (an integer or a range ``"lo:hi"``).
        num_requests, seed: the requests of each trial.
        engine: ``fxshape.serving.simulate.Server``'s options (``max_num_seqs``,
            ``gpu_memory_utilization``, ``dtype``, ...).

    Raises:
        ValueError: no SLO, a bad SLO, percentile, rate, degree or length.
    """
    if slo_ttft is None and slo_itl is None:
        raise ValueError("give an SLO: slo_ttft and/or slo_itl (e.g. '200ms')")
    ttft_slo = None if slo_ttft is None else parse_duration("slo_ttft", slo_ttft)
    itl_slo = None if slo_itl is None else parse_duration("slo_itl", slo_itl)
    if percentile not in _PERCENTILES:
        raise ValueError(f"percentile must be one of 50, 90, 99, got {percentile!r}")
    if rate is not None and (isinstance(rate, bool) or not isinstance(rate, (int, float))
                             or not 0 < rate < math.inf):
        raise ValueError(f"rate must be a positive, finite number of requests per second, "
                         f"got {rate!r}")
    degrees = tuple(tp) if isinstance(tp, (tuple, list)) else (tp,)
    if not degrees or any(isinstance(d, bool) or not isinstance(d, int) or d < 1
                          for d in degrees):
        raise ValueError(f"tp must be positive integers, got {tp!r}")
    poisson_requests(1, rate=1.0, prompt_len=prompt_len, output_len=output_len)  # checks
    if engine.get("attention") == "math":
        raise ValueError("attention='math' is refused: serving engines run a fused attention "
                         "kernel (accepted: 'flash', 'fa2', 'fa3')")

    def meets(sim) -> bool:
        return ((ttft_slo is None or _pct(sim.ttft_s, percentile) <= ttft_slo)
                and (itl_slo is None or _pct(sim.itl_s, percentile) <= itl_slo))

    def trial(server, r):
        reqs = poisson_requests(num_requests, rate=r, prompt_len=prompt_len,
                                output_len=output_len, seed=seed)
        return server.run(reqs)

    options = []
    gpu_name, draft_name, spec_k = str(gpu), None, 0
    for d in sorted(set(degrees)):
        try:
            server = Server(model, gpu=gpu, tp=d, **engine)
        except ValueError as exc:
            options.append(TpCapacity(d, False, False, 0.0, 0.0, 0.0, 0.0, 0.0,
                                      note=f"not possible: {exc}"))
            continue
        gpu_name, draft_name, spec_k = server.decode.gpu, server.draft_name, server.spec_k
        lone = server.run(poisson_requests(1, rate=1.0, prompt_len=prompt_len,
                                           output_len=output_len, seed=seed))
        lt, li = _pct(lone.ttft_s, percentile), _pct(lone.itl_s, percentile)
        if not meets(lone):
            options.append(TpCapacity(d, True, False, 0.0, lt, li, lt, li,
                                      note="a lone request misses the SLOs"))
            continue
        lo, best_sim = _highest_rate(lambda r: trial(server, r), meets, lone)
        replicas = gpus = None
        if rate is not None and lo > 0:
            replicas = math.ceil(rate / lo - 1e-12)
            gpus = replicas * d
        options.append(TpCapacity(
            d, True, lo > 0, lo, _pct(best_sim.ttft_s, percentile),
            _pct(best_sim.itl_s, percentile), lt, li, replicas, gpus,
            note="" if lo > 0 else "no rate above zero meets the SLOs"))
    feasible = [o for o in options if o.max_rate > 0]
    if rate is not None:
        best = min(feasible, key=lambda o: (o.gpus, -o.max_rate / o.tp), default=None)
    else:
        best = max(feasible, key=lambda o: (o.max_rate / o.tp, -o.tp), default=None)
    closest = None
    if best is None:
        def miss(o):
            return max((o.lone_ttft_s / ttft_slo) if ttft_slo else 0.0,
                       (o.lone_itl_s / itl_slo) if itl_slo else 0.0)

        closest = min((o for o in options if o.possible), key=miss, default=None)
    return CapacityPlan(
        model=type(model).__name__, gpu=gpu_name, slo_ttft_s=ttft_slo, slo_itl_s=itl_slo,
        percentile=percentile, prompt_len=prompt_len, output_len=output_len, rate=rate,
        num_requests=num_requests, options=tuple(options), best=best, closest=closest,
        draft=draft_name, num_speculative_tokens=spec_k,
        fuse=check_fuse(engine.get("fuse", "all")))
