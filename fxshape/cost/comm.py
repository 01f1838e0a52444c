"""NCCL collectives: all-reduce, reduce-scatter, all-gather and send/recv over a topology.

A ring collective over ``n`` GPUs moves its *bus bytes* through each GPU's link (NCCL's
``busBw`` convention): ``2 (n - 1) / n`` of the buffer for an all-reduce, ``(n - 1) / n``
for a reduce-scatter or an all-gather, the buffer for a send/recv. Inside a node the time is
a latency plus those bytes over the link (``fxshape.hardware.topology``) at the bandwidth
NCCL reaches on that kind of link:

    flat(n, S, B) = alpha + alpha_rank * (n - 1) + bus_bytes(S, n) / (efficiency * B)

A group that spans nodes (``n`` GPUs, ``d`` to a node, ``n / d`` nodes) is priced
hierarchically, as NCCL's rings and trees over rail-optimized nodes move it: the node's
GPUs first reduce-scatter the buffer among themselves over NVLink, each GPU then runs the
collective on its ``S / d`` shard with the GPUs of the same rank in the other nodes, through
its own network adapter (``min(1, rails / d)`` of one, ``Topology.rails``), and the node
all-gathers the result:

    all_reduce(n, d, S) = max(flat_intra(all_reduce, d, S), flat_network(all_reduce, n / d, S / d))

(a reduce-scatter or an all-gather: its own intra and network halves; the maximum, since
NCCL pipelines the buffer's chunks through both levels at once). So a 16-GPU all-reduce
over two DGX nodes moves 1/8 of the buffer through each adapter, not all of it.
``efficiency``, ``alpha`` and ``alpha_rank`` are fitted per link class (NVSwitch, NVSwitch
with in-switch reduction on Hopper, NVLink pairs, PCIe, the network between nodes) and kind
(ring collectives; point-to-point copies), shared by every machine, and per measured machine
(its own NCCL version, adapters and switches), by ``bench/fit_comm.py``, through the same
:func:`collective_time` that predicts. A machine without measurements takes the shared
constants on measured NCCL all-reduces and send/recvs
(``../shared/calibration/comm/vidur_collectives.csv``; written to
``fxshape/data/comm_params.json``). A class shared by the A100 and H100 machines is checked
leave-one-GPU-out. Reduce-scatter and all-gather take the all-reduce's constants (a ring
all-reduce is one of each): unvalidated. An all-to-all (expert parallelism's dispatch and
combine) moves ``(n - 1) / n`` of each GPU's buffer through its link, as an all-gather does
(nccl-tests' busBw convention for both), and takes the ring constants of its link class
(NVSwitch without the in-switch reduction), its efficiency capped at 1 (the fitted ring
efficiencies exceed the nominal link, which only a reduction in the switch explains: an
all-to-all's bytes all cross the link); across nodes, the part for other nodes goes
through the network adapters and the rest over NVLink, at once. No all-to-all was measured
here: ``bench/validate_ep.py`` compares it with DeepEP's published dispatch bandwidth, held
out. Pure functions; nothing here imports torch.

AMD's Infinity Fabric mesh (``Topology.mesh``: the MI300X / MI325X platform, a link from each
GPU to each peer, no switch): a collective over ``n`` GPUs of a node runs over ``n - 1``
links a GPU (``Topology.link_gbs``), with RCCL's usable share of each link as AMD publishes
it (:data:`SOURCED_CLASSES`; no RCCL run was measured here).

Today's NCCL (2.29, issue 50): on ``dgx-h100`` and ``dgx-b200`` each ring collective has
constants of its own, fitted by ``bench/fit_comm_aiconfigurator.py`` on aiconfigurator's
nccl-tests tables of those machines (all-reduce, all-gather, reduce-scatter, all-to-all on
2 to 8 GPUs, one half of the rows held out), under the key ``CLASS/KIND:COLLECTIVE``
(``nvswitch_nvls/ring:all_gather``); a collective a machine has no such entry for takes its
class's constants as above. Those entries also carry NCCL's low-latency protocols (LL and
LL128: ``ll_alpha_s``, ``ll_efficiency``) beside the Simple protocol's line, and a
collective takes the faster of the two, as NCCL's tuner picks:

    flat(n, S, B) = alpha_rank (n - 1) + min(alpha + bus_bytes / (efficiency B),
                                             ll_alpha + bus_bytes / (ll_efficiency B))
"""

from __future__ import annotations

import functools
import numbers
import os
from dataclasses import asdict, dataclass

from ..hardware.topology import LINKS, Topology, get_topology
from .paramfile import read_json

__all__ = ["COLLECTIVES", "CommPrediction", "SOURCED_CLASSES", "bus_bytes",
           "predict_collective", "comm_params", "param_key", "collective_time", "flat_time"]

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "send_recv", "all_to_all")
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
    if collective == "all_to_all":  # each GPU keeps 1/n of its buffer, sends the rest
        return (n - 1) / n * nbytes
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
    if collective == "all_to_all":
        # bus bytes as an all-gather's, through the switch without its in-switch reduction
        return f"{'nvswitch' if link_class == 'nvswitch_nvls' else link_class}/ring"
    return f"{link_class}/{'p2p' if collective == 'send_recv' else 'ring'}"


#: Link classes no NCCL measurement here covers, with published figures instead of fitted
#: ones. ``xgmi_mesh``: RCCL over AMD's Infinity Fabric mesh (MI300X, MI325X): "CRC bit
#: correction and protocol overhead ... reduce the usable bandwidth to approximately 48 GB/s
#: per link", 75% of its 64 (AMD ROCm blog, "Understanding RCCL Bandwidth and xGMI
#: Performance on AMD Instinct MI300X", 2025); no latency term (as the shared classes,
#: which were fitted without one). Unvalidated: no RCCL run was measured here.
SOURCED_CLASSES = {
    "xgmi_mesh/ring": {"efficiency": 0.75, "alpha_s": 0.0, "alpha_rank_s": 0.0},
    "xgmi_mesh/p2p": {"efficiency": 0.75, "alpha_s": 0.0, "alpha_rank_s": 0.0},
}


def comm_params(params_path: str | None = None) -> dict:
    """``{link class: {"efficiency", "alpha_s", "alpha_rank_s"}}`` (the fitted classes and
    :data:`SOURCED_CLASSES`)."""
    return {**SOURCED_CLASSES, **_load(os.fspath(params_path or _DEFAULT_PATH))["classes"]}


def flat_time(p: dict, collective: str, nbytes: float, n: int, nominal_gbs: float) -> float:
    """One ring (or point-to-point) collective inside one link class: ``p``'s latency plus
    the bus bytes over ``efficiency`` of ``nominal_gbs`` (for an all-to-all, at most the
    link's nominal bandwidth: its bytes cross the link, nothing is reduced on the way); where
    ``p`` has the low-latency protocols' ``ll_alpha_s`` and ``ll_efficiency``, the faster of
    that and their line."""
    if n <= 1:
        return 0.0
    ranks = float(p["alpha_rank_s"]) * (n - 1)
    moved = bus_bytes(collective, nbytes, n)
    t = float(p["alpha_s"]) + ranks + moved / (_efficiency(p, collective) * nominal_gbs * 1e9)
    if "ll_alpha_s" in p:
        # NCCL's low-latency protocols (LL, LL128): less latency, a fraction of the bandwidth;
        # NCCL runs whichever its tuner finds faster, so the faster of the two
        t = min(t, float(p["ll_alpha_s"]) + ranks
                + moved / (float(p["ll_efficiency"]) * nominal_gbs * 1e9))
    return t


def _efficiency(p: dict, collective: str) -> float:
    e = float(p["efficiency"])
    return min(1.0, e) if collective == "all_to_all" else e


def collective_time(constants, collective: str, nbytes: float, n: int, d: int,
                    topo: Topology) -> tuple:
    """``(time_s, link, link class)`` of ``collective`` over ``n`` GPUs, ``d`` to a node, with
    the fitted constants ``constants(key)`` (a function: ``param_key`` -> dict; the fit
    passes the ones it is trying). Flat inside a node, hierarchical across nodes (module
    docstring). A class without constants: whatever ``constants`` raises."""
    if n == 1:
        return 0.0, "none", "none"
    if collective == "all_to_all" and n > d:
        return _all_to_all_across(constants, nbytes, n, d, topo)
    if n <= d or collective == "send_recv":
        link, cls = topo.link_for(n, d), topo.link_class(n, d)
        if collective == "all_to_all" and cls == "nvswitch_nvls":
            cls = "nvswitch"  # no reduction in the switch
        return flat_time(constants(param_key(cls, collective)), collective, nbytes, n,
                         topo.link_gbs(n, d)), link, cls
    nodes = n // d
    intra = 0.0
    if d > 1:  # the node's reduce-scatter and all-gather (an all-reduce), or one of them
        p = constants(param_key(topo.link_class(d, d), collective))
        intra = flat_time(p, collective, nbytes, d, topo.link_gbs(d, d))
    net = constants(param_key("network", collective))
    inter = flat_time(net, collective, nbytes / d, nodes,
                      LINKS[topo.inter] * topo.inter_share(d))
    # NCCL pipelines the buffer's chunks through both levels at once: the slower one rules
    return max(intra, inter), topo.inter, "network"


def _all_to_all_across(constants, nbytes: float, n: int, d: int, topo: Topology) -> tuple:
    """An all-to-all over ``n`` GPUs, ``d`` to a node: each GPU sends ``(d - 1) / n`` of its
    buffer to the GPUs of its node over NVLink and ``(n - d) / n`` through its share of the
    network adapters, at once; the slower part rules. Each part takes its link's constants
    (``param_key``; one latency per peer)."""
    intra = 0.0
    if d > 1:
        p = constants(param_key(topo.link_class(d, d), "all_to_all"))
        link = topo.link_gbs(d, d)
        intra = (float(p["alpha_s"]) + float(p["alpha_rank_s"]) * (d - 1)
                 + (d - 1) / n * nbytes / (_efficiency(p, "all_to_all") * link * 1e9))
    net = constants(param_key("network", "all_to_all"))
    inter = (float(net["alpha_s"]) + float(net["alpha_rank_s"]) * (n - d)
             + (n - d) / n * nbytes / (_efficiency(net, "all_to_all") * LINKS[topo.inter]
                                       * topo.inter_share(d) * 1e9))
    return max(intra, inter), topo.inter, "network"


def predict_collective(collective: str, nbytes: int, gpus: int, *, topology="dgx-h100",
                       per_node: int | None = None,
                       params_path: str | None = None) -> CommPrediction:
    """Predict one NCCL collective of ``nbytes`` (the buffer each GPU holds; for send/recv,
    the message) over ``gpus`` GPUs, ``per_node`` to a node (default: as many as the
    topology's nodes hold). ``params_path``: a collective parameter file, or ``"2024"`` for
    the packaged constants without today's NCCL entries (the 2024 fit to Vidur's
    measurements, which the DGX H100 had before).

    Raises:
        ValueError: an unknown collective or topology, sizes that are not positive
            integers, a send/recv not between two GPUs, or more GPUs per node than the
            topology's nodes hold.
    """
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}; accepted: "
                         + ", ".join(COLLECTIVES))
    n = _count("gpus", gpus, 1)
    nbytes = _count("bytes", nbytes, 0)
    topo: Topology = get_topology(topology)
    if topo.gpus is not None and n > topo.gpus:
        raise ValueError(f"{n} GPUs exceed the {topo.gpus} of {topo.nodes} {topo.name} nodes")
    d = min(n, topo.gpus_per_node) if per_node is None else _count("per_node", per_node, 1)
    if d > topo.gpus_per_node:
        raise ValueError(f"{topo.name} nodes hold {topo.gpus_per_node} GPUs, asked for {d} "
                         "per node")
    if d > n or n % d:
        raise ValueError(f"per_node {d} must divide gpus {n}")
    if collective == "send_recv" and n != 2:
        raise ValueError(f"send_recv is between 2 GPUs, got {n}")
    if n == 1:
        return CommPrediction(collective, 1, 1, nbytes, "none", "none", 0.0, 0.0, 0.0)
    gen_2024 = params_path == "2024"  # the packaged file without today's per-collective ones
    data = _load(_DEFAULT_PATH if gen_2024 or not params_path else os.fspath(params_path))
    machines = data.get("topologies", {})
    own = machines.get(topo.name) or machines.get(topo.constants_from or "", {})
    if gen_2024:
        own = {k: v for k, v in own.items() if ":" not in k}

    def constants(key):
        # a machine's constants for this collective itself (``CLASS/KIND:COLLECTIVE``, where
        # its NCCL was measured per collective), else its class's, else the shared ones
        p = (own.get(f"{key}:{collective}") or own.get(key) or data["classes"].get(key)
             or SOURCED_CLASSES.get(key))
        if p is None:
            raise ValueError(f"no fitted constants for {key} ({collective} on {topo.name}, "
                             f"{n} GPUs, {d} per node)")
        return p

    t, link, cls = collective_time(constants, collective, nbytes, n, d, topo)
    moved = bus_bytes(collective, nbytes, n)
    return CommPrediction(collective=collective, gpus=n, per_node=d, bytes=nbytes, link=link,
                          link_class=cls, time_s=t, algbw_gbs=nbytes / t / 1e9,
                          busbw_gbs=moved / t / 1e9)
