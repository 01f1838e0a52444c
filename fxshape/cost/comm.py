"""NCCL collectives: all-reduce, reduce-scatter, all-gather and send/recv over a topology.

A ring collective over ``n`` GPUs moves its *bus bytes* through each GPU's link (NCCL's
``busBw`` convention): ``2 (n - 1) / n`` of the buffer for an all-reduce, ``(n - 1) / n``
for a reduce-scatter or an all-gather, the buffer for a send/recv. The time is a latency
plus those bytes over the bottleneck link (``fxshape.hardware.topology``) at the bandwidth
NCCL reaches on that kind of link:

    time = alpha + alpha_rank * (n - 1) + bus_bytes / (efficiency * nominal link bandwidth)

``efficiency``, ``alpha`` and ``alpha_rank`` are fitted per link class (NVSwitch, NVSwitch
with in-switch reduction on Hopper, NVLink pairs, PCIe, the network between nodes) and kind
(ring collectives; point-to-point copies), shared by every machine, and per measured machine
(its own NCCL version, adapters and switches), by ``bench/fit_comm.py``. A machine without
measurements takes the shared constants on measured NCCL
all-reduces and send/recvs (``../shared/calibration/comm/vidur_collectives.csv``; written to
``fxshape/data/comm_params.json``). A class shared by the A100 and H100 machines is checked
leave-one-GPU-out. Reduce-scatter and all-gather take the all-reduce's constants (a ring
all-reduce is one of each): unvalidated. Pure functions; nothing here imports torch.
"""

from __future__ import annotations

import functools
import numbers
import os
from dataclasses import asdict, dataclass

from ..hardware.topology import LINKS, Topology, get_topology
from .paramfile import read_json

__all__ = ["COLLECTIVES", "CommPrediction", "bus_bytes", "predict_collective", "comm_params",
           "param_key"]

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "send_recv")
_DEFAULT_PATH = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data",
                             "comm_params.json")


@dataclass(frozen=True)
class CommPrediction:
    """One collective. ``algbw_gbs``: buffer bytes / time; ``busbw_gbs``: bus bytes / time
    (NCCL's convention; comparable with the link bandwidth)."""

    collective: str
    gpus: int
    per_node: int
    bytes: int
    link: str
    link_class: str
    time_s: float
    algbw_gbs: float
    busbw_gbs: float

    def to_dict(self) -> dict:
        return asdict(self)


def _count(name, v, minimum) -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {v!r}")
    return int(v)


def bus_bytes(collective: str, nbytes: int, n: int) -> float:
    """Bytes each GPU's link carries in a ring ``collective`` of ``nbytes`` over ``n``."""
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}; accepted: "
                         + ", ".join(COLLECTIVES))
    if collective == "send_recv":
        return float(nbytes)
    factor = 2.0 if collective == "all_reduce" else 1.0
    return factor * (n - 1) / n * nbytes


@functools.lru_cache(maxsize=None)
def _load(path: str) -> dict:
    data = read_json(path, "collective parameter file")
    if not isinstance(data, dict) or "classes" not in data:
        raise ValueError(f"{path!r} is not a collective parameter file (written by "
                         "bench/fit_comm.py): it has no 'classes'")
    return data


def param_key(link_class: str, collective: str) -> str:
    """The fitted constants a collective uses: its link class and whether it is a ring
    collective or a point-to-point copy (``nvswitch/ring``, ``network/p2p``)."""
    return f"{link_class}/{'p2p' if collective == 'send_recv' else 'ring'}"


def comm_params(params_path: str | None = None) -> dict:
    """``{link class: {"efficiency", "alpha_s", "alpha_rank_s"}}``."""
    return _load(os.fspath(params_path or _DEFAULT_PATH))["classes"]


def predict_collective(collective: str, nbytes: int, gpus: int, *, topology="dgx-h100",
                       per_node: int | None = None,
                       params_path: str | None = None) -> CommPrediction:
    """Predict one NCCL collective of ``nbytes`` (the buffer each GPU holds; for send/recv,
    the message) over ``gpus`` GPUs, ``per_node`` to a node (default: as many as the
    topology's nodes hold).

    Raises:
        ValueError: an unknown collective or topology, sizes that are not positive
            integers, a send/recv not between two GPUs, or more GPUs per node than the
            topology's nodes hold.
    """
    n = _count("gpus", gpus, 1)
    nbytes = _count("bytes", nbytes, 0)
    topo: Topology = get_topology(topology)
    d = min(n, topo.gpus_per_node) if per_node is None else _count("per_node", per_node, 1)
    if d > topo.gpus_per_node:
        raise ValueError(f"{topo.name} nodes hold {topo.gpus_per_node} GPUs, asked for {d} "
                         "per node")
    if d > n or n % d:
        raise ValueError(f"per_node {d} must divide gpus {n}")
    if collective == "send_recv" and n != 2:
        raise ValueError(f"send_recv is between 2 GPUs, got {n}")
    moved = bus_bytes(collective, nbytes, n)
    link, cls = topo.link_for(n, d), topo.link_class(n, d)
    if n == 1:
        return CommPrediction(collective, 1, 1, nbytes, "none", "none", 0.0, 0.0, 0.0)
    key = param_key(cls, collective)
    data = _load(os.fspath(params_path or _DEFAULT_PATH))
    p = data.get("topologies", {}).get(topo.name, {}).get(key) or data["classes"].get(key)
    if p is None:
        raise ValueError(f"no fitted constants for {collective} over {cls} "
                         f"({topo.name}, {n} GPUs, {d} per node)")
    t = (float(p["alpha_s"]) + float(p["alpha_rank_s"]) * (n - 1)
         + moved / (float(p["efficiency"]) * LINKS[link] * 1e9))
    return CommPrediction(collective=collective, gpus=n, per_node=d, bytes=nbytes, link=link,
                          link_class=cls, time_s=t, algbw_gbs=nbytes / t / 1e9,
                          busbw_gbs=moved / t / 1e9)
