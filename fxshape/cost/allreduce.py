"""All-reduce inside a node as serving engines run it: one-shot, two-shot, and NCCL's
LL / LL128 / Simple protocols, chosen by size as each engine chooses.

A decode step's tensor-parallel all-reduces are small (``batch × hidden`` elements: 8 KiB
for one Llama-2-7B token), so what sets their time is latency, not bandwidth. Serving
engines run them under CUDA graphs, with kernels of their own:

- **one-shot** (vLLM's ``cross_device_reduce_1stage``, TensorRT-LLM's ``oneShotAllReduce``,
  PyTorch's symmetric-memory / intra-node ``one_shot_all_reduce``): each GPU reads the
  whole buffer of every peer over NVLink and sums it: ``(n - 1) × S`` bytes through its
  link, one kernel, one synchronised stage (its barrier, then the reads):

      one_shot(n, S) = stage_s + (n - 1) S / (peer_efficiency × link)

- **two-shot** (``cross_device_reduce_2stage``): a reduce-scatter then an all-gather by
  peer loads, ``2 (n - 1) / n × S`` through each link, two synchronised stages:

      two_shot(n, S) = 2 stage_s + 2 (n - 1) / n × S / (peer_efficiency × link)

- **multimem** (PyTorch's symmetric-memory ``multimem_all_reduce_``, NVLink SHARP on Hopper
  and Blackwell NVSwitch): each GPU reduces its ``1/n`` slice in the switch
  (``multimem.ld_reduce`` reads it from every GPU) and stores the sum to every GPU's copy
  (``multimem.st``): ``(1 + 1/n) × S`` through each GPU's link in each direction, one
  synchronised stage. vLLM's ``SymmMemCommunicator`` copies the input into the symmetric
  buffer and the result out, two memory-bound copies of ``S`` (``fxshape.cost.memops``,
  ``copy``), which ``"multimem"`` includes:

      multimem(n, S) = stage_s + (1 + 1/n) S / (peer_efficiency × link) + 2 copy(S)

  The same two constants as one-shot and two-shot, nothing fitted to multimem: vLLM's own
  benchmark of its communicators on H100 (PR #24111) is held out
  (``bench/allreduce_published.csv``, ``bench/fit_allreduce.py``).

- **NCCL** under CUDA graphs picks, per call, the protocol its own cost model
  (``src/graph/tuning.cc``) says is fastest, and takes about that long: a ring all-reduce
  of ``2 (n - 1)`` steps costs ``base_latency + 2 (n - 1) × hop_latency`` plus the bus
  bytes (``2 (n - 1) / n × S``) over the protocol's bus bandwidth. LL moves 8-byte lines of
  4 data bytes and 4 flag bytes (a quarter of the ring's bandwidth, at most 87.7 GB/s);
  LL128 reaches 92% of it; Simple all of it, after a fence per chunk. The latencies are
  NVIDIA's own figures (``tuning.cc``, NCCL 2.18–2.21: base 6.6 / 14.0 / 8.4 µs, per hop
  0.6 / 1.9 / 3.4 µs on NVLink, 1.0 / 2.5 / 5.7 µs on PCIe); the ring's bandwidth is the
  fitted NCCL ring efficiency of the link class (``fxshape.cost.comm``).

``stage_s`` (a kernel launch and a barrier across the GPUs: the two are not told apart by
the data) and ``peer_efficiency`` are fitted by ``bench/fit_allreduce.py`` to a published
kernel benchmark (sglang's port of TensorRT-LLM's custom all-reduce on 8 H100 SXM, tp 2/4/8,
2 KiB to 4 MiB: ``bench/allreduce_published.csv``), written to
``fxshape/data/allreduce_params.json``, and checked on what they were not fitted to (vLLM's
kernel in the same benchmark; tensor-parallel decode end to end,
``bench/validate_serving.py``; vLLM 0.24's kernel on a DGX H100 under CUDA graphs,
``bench/fit_allreduce_aiconfigurator.py``). NVLink 5 nodes (B200) have their own two
(``links`` in the file), fitted by ``bench/fit_allreduce_aiconfigurator.py`` on half of
aiconfigurator's DGX B200 rows, the other half held out.

Which one runs (:data:`ALGORITHMS`):

- ``"auto"`` — what vLLM does (``csrc/custom_all_reduce.cuh``; ``custom_all_reduce.py``;
  ``cuda_communicator.py``; ``all_reduce_utils.py``): its custom kernel for 2, 4, 6 or 8
  GPUs that all reach each other over NVLink (or two on one NVLink bridge), one-shot for two
  GPUs, and for more GPUs below 512 KiB (up to four) or 256 KiB (up to eight), two-shot
  above; up to 8 MiB, then NCCL. On Hopper and Blackwell NVSwitch (NVLink 4 and 5, where
  symmetric memory has multicast) the custom kernel stops earlier
  (``CUSTOM_ALL_REDUCE_MAX_SIZES``: H100 64 / 32 MiB / 512 / 256 KiB for 2 / 4 / 6 / 8
  GPUs; B200 2 / 2 / 1 / 1 MiB) and PyTorch's symmetric memory takes over up to
  ``SYMM_MEM_ALL_REDUCE_MAX_SIZES`` (H100 64 / 32 / 64 / 64 MiB; B200 8 / 32 / 128 / 128
  MiB): multimem for 4, 6, 8 GPUs on Hopper and 6, 8 on Blackwell, its two-shot (with the
  same two copies) otherwise; NCCL beyond.
- ``"one-shot"`` / ``"two-shot"`` — the custom kernel whatever the size (where the GPUs
  allow); ``"multimem"`` — symmetric memory's multimem, where the switch has multicast.
- ``"nccl"`` — NCCL's protocol choice.

Pure functions; nothing here imports torch.
"""

from __future__ import annotations

import functools
import os
from dataclasses import asdict, dataclass

from ..hardware.topology import LINKS, Topology, get_topology, link_generation
from .memops import kernel_time
from .paramfile import read_json

__all__ = ["ALGORITHMS", "AllReduceParams", "AllReduceTime", "allreduce_params",
           "predict_allreduce", "one_shot_s", "two_shot_s", "multimem_s", "symm_copies_s",
           "nccl_protocols",
           "vllm_choice", "NCCL_TUNING", "check_algorithm", "has_multicast"]

ALGORITHMS = ("auto", "nccl", "one-shot", "two-shot", "multimem")
_DEFAULT_PATH = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data",
                             "allreduce_params.json")
#: vLLM's custom all-reduce: world sizes it takes, its buffer limit (``max_size``, 8 MiB),
#: and the sizes under which it runs one stage (csrc/custom_all_reduce.cuh, REDUCE_CASE)
VLLM_WORLD_SIZES = (2, 4, 6, 8)
VLLM_MAX_BYTES = 8 * 2**20
VLLM_ONE_STAGE_BELOW = ((4, 512 * 1024), (8, 256 * 1024))
_MiB = 2**20
#: Where symmetric memory has multicast (Hopper: NVLink 4, Blackwell: NVLink 5, behind a
#: switch), vLLM's limits by GPUs (vllm/distributed/device_communicators/
#: all_reduce_utils.py, symm_mem.py): the custom kernel's buffer, then symmetric memory's,
#: and the GPU counts that run multimem (the others its two-shot)
VLLM_SYMM = {
    "nvlink4": {"custom_max": {2: 64 * _MiB, 4: 32 * _MiB, 6: _MiB // 2, 8: _MiB // 4},
                "symm_max": {2: 64 * _MiB, 4: 32 * _MiB, 6: 64 * _MiB, 8: 64 * _MiB},
                "multimem": (4, 6, 8)},
    "nvlink5": {"custom_max": {2: 2 * _MiB, 4: 2 * _MiB, 6: _MiB, 8: _MiB},
                "symm_max": {2: 8 * _MiB, 4: 32 * _MiB, 6: 128 * _MiB, 8: 128 * _MiB},
                "multimem": (6, 8)},
}
#: the GPU whose memory the symmetric-memory copies run in, by the node's NVLink (the
#: copies are priced with ``fxshape.cost.memops``; give ``gpu=`` to say another)
_LINK_GPU = {"nvlink4": "h100-sxm", "nvlink5": "b200"}

#: NCCL's own latency model (src/graph/tuning.cc, NCCL 2.18-2.21), microseconds:
#: ring ``baseLat`` and ``hwLat`` per protocol, on NVLink and PCIe; LL's bus bandwidth
#: ceiling on one node (``llMaxBws``, Ampere and Hopper, one node: 87.7 GB/s); the share of
#: the ring's bus bandwidth each protocol reaches for an all-reduce (LL 1/4, LL128 0.92)
NCCL_TUNING = {
    "base_us": {"LL": 6.6, "LL128": 14.0, "Simple": 8.4},
    "hop_us": {"nvlink": {"LL": 0.6, "LL128": 1.9, "Simple": 3.4},
               "pcie": {"LL": 1.0, "LL128": 2.5, "Simple": 5.7}},
    "ll_max_busbw_gbs": 87.7,
    "bw_share": {"LL": 0.25, "LL128": 0.92, "Simple": 1.0},
}


@dataclass(frozen=True)
class AllReduceParams:
    """The fitted constants of the one-shot and two-shot kernels."""

    stage_s: float  # one synchronised stage: the kernel's start and a barrier
    peer_efficiency: float  # share of the nominal link a GPU's peer loads reach
    source: str = ""

    FIELDS = ("stage_s", "peer_efficiency")


@dataclass(frozen=True)
class AllReduceTime:
    """One all-reduce of ``bytes`` (each GPU's buffer) over ``gpus`` GPUs of one node.
    ``algorithm``: what ran (``one-shot``, ``two-shot``, ``nccl-LL``, ``nccl-LL128``,
    ``nccl-Simple``); ``asked``: the option given; ``why``: the rule that chose it."""

    asked: str
    algorithm: str
    gpus: int
    bytes: int
    link: str
    time_s: float
    why: str

    def to_dict(self) -> dict:
        return asdict(self)


def check_algorithm(algorithm) -> str:
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown all-reduce algorithm {algorithm!r}; accepted: "
                         + ", ".join(repr(a) for a in ALGORITHMS))
    return algorithm


@functools.lru_cache(maxsize=None)
def _load(path: str, link: str | None = None) -> AllReduceParams:
    data = read_json(path, "all-reduce parameter file")
    if not isinstance(data, dict) or any(f not in data for f in AllReduceParams.FIELDS):
        raise ValueError(f"{path!r} is not an all-reduce parameter file (written by "
                         "bench/fit_allreduce.py): it needs "
                         + ", ".join(AllReduceParams.FIELDS))
    own = (data.get("links") or {}).get(link) if link else None
    if own is not None:
        if any(f not in own for f in AllReduceParams.FIELDS):
            raise ValueError(f"{path!r}: the constants of {link} need "
                             + ", ".join(AllReduceParams.FIELDS))
        data = own
    return AllReduceParams(**{f: float(data[f]) for f in AllReduceParams.FIELDS},
                           source=str(data.get("source", "")))


def allreduce_params(path: str | None = None, link: str | None = None) -> AllReduceParams:
    """The one-shot and two-shot kernels' constants: those fitted on ``link``'s nodes
    (``links`` in the file: NVLink 5, the B200's, from ``bench/fit_allreduce_aiconfigurator.py``)
    where the file has them, else the ones fitted on the H100 (``bench/fit_allreduce.py``)."""
    return _load(os.fspath(path or _DEFAULT_PATH), link)


def one_shot_s(p: AllReduceParams, nbytes: float, n: int, link_gbs: float) -> float:
    """One-shot: every peer's buffer read over the link, one stage (module docstring)."""
    return p.stage_s + (n - 1) * nbytes / (p.peer_efficiency * link_gbs * 1e9)


def two_shot_s(p: AllReduceParams, nbytes: float, n: int, link_gbs: float) -> float:
    """Two-shot: reduce-scatter then all-gather by peer loads, two stages."""
    return 2 * p.stage_s + 2 * (n - 1) / n * nbytes / (p.peer_efficiency * link_gbs * 1e9)


def multimem_s(p: AllReduceParams, nbytes: float, n: int, link_gbs: float) -> float:
    """Multimem: each GPU's slice reduced in the switch and stored to every GPU, one stage
    (module docstring); the copies in and out are not included."""
    return p.stage_s + (1 + 1 / n) * nbytes / (p.peer_efficiency * link_gbs * 1e9)


def symm_copies_s(nbytes: float, gpu) -> float:
    """vLLM's symmetric-memory all-reduce copies its input into the registered buffer and the
    result out: two memory-bound copies of ``nbytes`` (read and written) on ``gpu``."""
    return 2 * kernel_time("copy", 2 * int(nbytes), gpu=gpu).time_s


def has_multicast(topo: Topology, n: int) -> bool:
    """Can symmetric memory use the switch's multicast (NVLink SHARP) for ``n`` GPUs of
    ``topo``: Hopper's or Blackwell's NVSwitch, every GPU in one node."""
    return bool(topo.switch) and link_generation(topo.link_for(n, n)) in VLLM_SYMM \
        and n <= topo.gpus_per_node


def nccl_protocols(nbytes: float, n: int, ring_busbw_gbs: float, hop: str) -> dict:
    """``{protocol: seconds}`` of a one-node ring all-reduce under NCCL's own cost model
    (:data:`NCCL_TUNING`); ``ring_busbw_gbs``: the ring's bus bandwidth with Simple;
    ``hop``: ``"nvlink"`` or ``"pcie"``."""
    t = NCCL_TUNING
    bus = 2 * (n - 1) / n * nbytes
    out = {}
    for proto in ("LL", "LL128", "Simple"):
        bw = ring_busbw_gbs * t["bw_share"][proto]
        if proto == "LL":
            bw = min(bw, t["ll_max_busbw_gbs"])
        lat = (t["base_us"][proto] + 2 * (n - 1) * t["hop_us"][hop][proto]) * 1e-6
        out[proto] = lat + bus / (bw * 1e9)
    return out


def vllm_choice(nbytes: int, n: int, *, nvlink_all: bool, multicast: str | None = None
                ) -> tuple:
    """``(algorithm, why)``: what vLLM runs for ``nbytes`` over ``n`` GPUs
    (``nvlink_all``: every GPU reaches every other over NVLink; ``multicast``: the node's
    NVLink, ``"nvlink4"`` or ``"nvlink5"``, where symmetric memory has multicast, else
    None): ``"one-shot"`` or ``"two-shot"`` (its custom kernel), ``"multimem"`` or
    ``"symm-two-shot"`` (symmetric memory, copies included), or ``"nccl"``."""
    if n not in VLLM_WORLD_SIZES:
        return "nccl", f"vLLM's custom all-reduce takes 2, 4, 6 or 8 GPUs, not {n}: NCCL"
    if not nvlink_all:
        return "nccl", "the GPUs do not all reach each other over NVLink: NCCL"
    limit = VLLM_MAX_BYTES
    if multicast is not None:
        t = VLLM_SYMM[multicast]
        limit = t["custom_max"][n]
        if nbytes >= limit:
            if nbytes <= t["symm_max"][n]:
                alg = "multimem" if n in t["multimem"] else "symm-two-shot"
                return alg, (f"vLLM, {n} GPUs on {multicast}: {_size(limit)} or more, up to "
                             f"{_size(t['symm_max'][n])}: symmetric memory's "
                             f"{alg.replace('symm-', '')}")
            return "nccl", (f"vLLM, {n} GPUs on {multicast}: beyond symmetric memory's "
                            f"{_size(t['symm_max'][n])}: NCCL")
    if nbytes >= limit:
        return "nccl", "buffer beyond vLLM's 8 MiB custom all-reduce: NCCL"
    if n == 2:
        return "one-shot", "vLLM, 2 GPUs: one-shot"
    below = next(b for most, b in VLLM_ONE_STAGE_BELOW if n <= most)  # n is 4, 6 or 8
    if nbytes < below:
        return "one-shot", f"vLLM, {n} GPUs, under {below // 1024} KiB: one-shot"
    return "two-shot", f"vLLM, {n} GPUs, {below // 1024} KiB or more: two-shot"


def _size(nbytes: int) -> str:
    return f"{nbytes // _MiB} MiB" if nbytes >= _MiB else f"{nbytes // 1024} KiB"


def predict_allreduce(nbytes: int, gpus: int, *, algorithm: str = "auto",
                      topology="dgx-h100", params_path: str | None = None,
                      gpu=None) -> AllReduceTime:
    """One all-reduce of ``nbytes`` (each GPU's buffer) over ``gpus`` GPUs of one node, run
    under CUDA graphs with ``algorithm`` (:data:`ALGORITHMS`; module docstring). ``gpu``:
    the GPU whose memory symmetric memory's copies run in (default: the node's, H100 on
    NVLink 4, B200 on NVLink 5).

    Raises:
        ValueError: an unknown algorithm or topology; sizes that are not positive integers;
            more GPUs than a node holds; one-shot or two-shot on GPUs that do not all reach
            each other over NVLink; multimem where the switch has no multicast.
    """
    from .comm import _count, comm_params, param_key

    check_algorithm(algorithm)
    nbytes, gpus = _count("bytes", nbytes, 0), _count("gpus", gpus, 1)
    topo: Topology = get_topology(topology)
    if gpus > topo.gpus_per_node:
        raise ValueError(f"an all-reduce inside one node: {gpus} GPUs exceed the "
                         f"{topo.gpus_per_node} of a {topo.name} node")
    if gpus == 1:
        return AllReduceTime(algorithm, "none", 1, nbytes, "none", 0.0, "one GPU")
    link = topo.link_for(gpus, gpus)
    nvlink_all = link.startswith("nvlink") and (topo.switch or gpus == 2)
    multicast = link_generation(link) if has_multicast(topo, gpus) else None
    if algorithm == "auto":
        chosen, why = vllm_choice(nbytes, gpus, nvlink_all=nvlink_all, multicast=multicast)
    else:
        chosen, why = algorithm, f"{algorithm} as asked"
        if chosen != "nccl" and not nvlink_all:
            raise ValueError(f"{chosen} all-reduce reads peers' buffers over NVLink; the "
                             f"{gpus} GPUs of {topo.name} do not all reach each other over "
                             "it: use allreduce='nccl' (or 'auto')")
        if chosen == "multimem" and multicast is None:
            raise ValueError(f"multimem all-reduce needs an NVSwitch with multicast (Hopper "
                             f"or Blackwell, NVLink 4 or 5); {topo.name}'s {link} has none: "
                             "use 'one-shot', 'two-shot', 'nccl' or 'auto'")
    if chosen == "nccl":
        # the ring's Simple bus bandwidth: the fitted NCCL ring efficiency of the link class
        cls = topo.link_class(gpus, gpus)
        own = param_key("nvswitch" if cls == "nvswitch_nvls" else cls, "all_reduce")
        busbw = float(comm_params()[own]["efficiency"]) * topo.link_gbs(gpus, gpus)
        hop = "nvlink" if link.startswith("nvlink") else "pcie"
        times = nccl_protocols(nbytes, gpus, busbw, hop)
        proto = min(times, key=lambda k: (times[k], k))
        return AllReduceTime(algorithm, f"nccl-{proto}", gpus, nbytes, link, times[proto],
                             why + f" (NCCL's model picks {proto})")
    p = allreduce_params(params_path, link)
    kernel = {"one-shot": one_shot_s, "two-shot": two_shot_s, "multimem": multimem_s,
              "symm-two-shot": two_shot_s}[chosen]
    t = kernel(p, nbytes, gpus, LINKS[link])
    if chosen in ("multimem", "symm-two-shot"):  # vLLM copies into the buffer and out
        t += symm_copies_s(nbytes, gpu or _LINK_GPU[link_generation(link)])
    return AllReduceTime(algorithm, chosen, gpus, nbytes, link, t, why)
