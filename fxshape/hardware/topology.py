"""Interconnects: how the GPUs of a machine and of a cluster are linked, with sourced link
bandwidths (per GPU, one direction, 10^9 bytes/s).

A :class:`Topology` names the link a collective's traffic crosses at each scale: inside a
node (``intra``: NVSwitch, NVLink bridges between pairs, or PCIe) and between nodes
(``inter``: each GPU's network adapter). ``link_for(n, per_node)`` is the bottleneck of a
collective over ``n`` GPUs placed ``per_node`` to a node.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

__all__ = ["LINKS", "Topology", "TOPOLOGIES", "get_topology", "default_topology",
           "link_generation", "topology_for"]

#: nominal per-GPU, one-direction bandwidth of each link kind, GB/s, with its source
LINKS = {
    # NVLink: 25 GB/s per link per direction; V100 6 links, A100 12, H100 18, B200 18 at
    # twice the rate (NVIDIA V100/A100/H100/B200 datasheets: 300/600/900/1800 GB/s total)
    "nvlink2": 150.0,
    "nvlink3": 300.0,
    "nvlink4": 450.0,
    "nvlink5": 900.0,
    # the H800's NVLink 4: 400 GB/s total (NVIDIA H800 product brief), 8 of the H100's 18
    # links at 25 GB/s a direction
    "nvlink4-8": 200.0,
    # PCIe x16: Gen4 16 GT/s x 16 lanes = 31.5 GB/s, Gen5 63 GB/s (PCI-SIG)
    "pcie4": 31.5,
    "pcie5": 63.0,
    # InfiniBand per adapter: HDR 200 Gb/s = 25 GB/s (DGX A100: one per GPU), NDR 400 Gb/s
    # = 50 GB/s (DGX H100: one per GPU); NVIDIA DGX A100 / H100 user guides
    "ib_hdr": 25.0,
    "ib_ndr": 50.0,
    # 100 Gb/s Ethernet: 12.5 GB/s (a machine without a GPU network)
    "eth100": 12.5,
    # AMD Infinity Fabric (xGMI) on the MI300X / MI325X platform, ONE link: 64 GB/s a
    # direction; each GPU has 7, one to each peer of its node (AMD Instinct MI300X data
    # sheet: 896 GB/s peak aggregate bidirectional = 7 x 2 x 64; AMD ROCm blog
    # "Understanding RCCL Bandwidth and xGMI Performance on AMD Instinct MI300X", 2025).
    # A mesh topology multiplies it by the links a group uses (Topology.link_gbs)
    "xgmi3": 64.0,
}


def link_generation(link: str) -> str:
    """The NVLink generation of a link kind (``"nvlink4-8"``, the H800's 8 links, is
    ``"nvlink4"``): what the switch's multicast and vLLM's all-reduce tables key on; other
    links are their own."""
    return link.split("-")[0]


@dataclass(frozen=True)
class Topology:
    """``intra``: the link between GPUs of a node when every GPU reaches every other through
    it (NVSwitch, or PCIe); ``pair``: an NVLink bridge joining GPUs two by two (then
    ``intra`` is what links the pairs); ``inter``: between nodes; ``gpus_per_node``."""

    name: str
    intra: str
    inter: str
    gpus_per_node: int
    pair: str | None = None
    switch: bool = False  # an NVSwitch fabric (NVLink SHARP on Hopper)
    #: ``intra`` is ONE link of a fully connected mesh (AMD's xGMI: a link from each GPU to
    #: each peer of its node, no switch): a group of ``n`` GPUs of a node reaches its peers
    #: over ``n - 1`` links, so smaller groups get less bandwidth (``link_gbs``)
    mesh: bool = False
    source: str = ""
    #: network adapters per node that NCCL spreads a node's traffic over (None: one per GPU,
    #: the rail-optimized DGX layout); a GPU of a node using ``d`` GPUs gets
    #: ``min(1, rails / d)`` of an adapter
    rails: int | None = None
    #: nodes in the cluster (None: as many as a plan needs)
    nodes: int | None = None
    #: the measured machine whose fitted NCCL constants this one takes (same switch and
    #: NCCL, its own link bandwidths), where it has none of its own
    constants_from: str | None = None

    def __post_init__(self):
        for name in ("gpus_per_node", "rails", "nodes"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"Topology.{name} must be a positive integer, got {v!r}")
        for name in ("intra", "inter", "pair"):
            v = getattr(self, name)
            if v is not None and v not in LINKS:
                raise ValueError(f"Topology.{name}: unknown link {v!r}; accepted: "
                                 + ", ".join(LINKS))

    @property
    def gpus(self) -> int | None:
        """GPUs in the cluster (None when ``nodes`` is not set)."""
        return None if self.nodes is None else self.nodes * self.gpus_per_node

    def inter_share(self, per_node: int) -> float:
        """The fraction of one network adapter each GPU's inter-node traffic gets when
        ``per_node`` GPUs of a node take part."""
        rails = self.gpus_per_node if self.rails is None else self.rails
        return min(1.0, rails / per_node)

    def link_for(self, n: int, per_node: int) -> str:
        """The link kind a collective over ``n`` GPUs, ``per_node`` to a node, is bound by."""
        if n > per_node:
            return self.inter
        if self.pair is not None and n == 2:
            return self.pair
        return self.intra

    def link_gbs(self, n: int, per_node: int) -> float:
        """Nominal per-GPU, one-direction bandwidth (GB/s) of the link a collective over
        ``n`` GPUs, ``per_node`` to a node, is bound by: the link's figure (:data:`LINKS`),
        times the ``per_node - 1`` links each GPU uses to reach its group's peers in a mesh
        (RCCL's rings over an xGMI mesh run over every link between the group's GPUs)."""
        link = self.link_for(n, per_node)
        if self.mesh and link == self.intra:
            return LINKS[link] * (min(per_node, n, self.gpus_per_node) - 1)
        return LINKS[link]

    def link_class(self, n: int, per_node: int) -> str:
        """The fitted class of that link: ``nvswitch``, ``nvswitch_nvls``, ``nvlink_pair``,
        ``xgmi_mesh``, ``pcie`` or ``network``."""
        link = self.link_for(n, per_node)
        if self.mesh and link == self.intra:
            return "xgmi_mesh"
        if link.startswith("nvlink"):
            if self.switch and n > 2 and link_generation(link) in ("nvlink4", "nvlink5"):
                # Hopper's and Blackwell's NVSwitch reduce in the switch (NVLink SHARP,
                # which NCCL uses from 3 GPUs on): less traffic per GPU than a ring
                return "nvswitch_nvls"
            return "nvswitch" if self.switch else "nvlink_pair"
        return "pcie" if link.startswith("pcie") else "network"


TOPOLOGIES = {
    "dgx-a100": Topology("dgx-a100", "nvlink3", "ib_hdr", 8, switch=True,
                         source="NVIDIA DGX A100: 8 A100 SXM4 on NVSwitch, 8 HDR adapters"),
    "dgx-h100": Topology("dgx-h100", "nvlink4", "ib_ndr", 8, switch=True,
                         source="NVIDIA DGX H100: 8 H100 SXM5 on NVSwitch, 8 NDR adapters"),
    "dgx-b200": Topology("dgx-b200", "nvlink5", "ib_ndr", 8, switch=True,
                         source="NVIDIA DGX B200: 8 B200 on NVSwitch (NVLink 5)"),
    "gb200-nvl72": Topology("gb200-nvl72", "nvlink5", "ib_ndr", 72, switch=True,
                            source="NVIDIA GB200 NVL72: 72 Blackwell GPUs in one NVLink "
                                   "domain (NVLink Switch trays); NCCL constants of the DGX "
                                   "B200 (the same NVLink 5 switch and NCCL; the 72-GPU "
                                   "domain's own are not measured)",
                            constants_from="dgx-b200"),
    "pairwise-a100": Topology("pairwise-a100", "pcie4", "eth100", 4, pair="nvlink3",
                              source="A100 pairs on NVLink bridges, pairs over PCIe Gen4"),
    "pairwise-h100": Topology("pairwise-h100", "pcie5", "eth100", 4, pair="nvlink4",
                              source="H100 PCIe pairs on NVLink bridges, pairs over PCIe Gen5"),
    "hgx-h800": Topology("hgx-h800", "nvlink4-8", "ib_ndr", 8, switch=True,
                         source="HGX H800: 8 H800 SXM5 on NVSwitch, 400 GB/s of NVLink each "
                                "(8 links); NDR adapters as DGX H100 (DeepSeek-V3's cluster "
                                "had 8 IB NICs a node)", constants_from="dgx-h100"),
    "pairwise-h800": Topology("pairwise-h800", "pcie5", "eth100", 4, pair="nvlink4-8",
                              source="H800 PCIe pairs on NVLink bridges (400 GB/s), pairs "
                                     "over PCIe Gen5", constants_from="pairwise-h100"),
    "mi300x-platform": Topology(
        "mi300x-platform", "xgmi3", "ib_ndr", 8, mesh=True,
        source="AMD Instinct MI300X / MI325X platform: 8 OAM GPUs, each linked to the 7 others "
               "by Infinity Fabric (xGMI, 64 GB/s a link a direction; AMD MI300X data sheet), "
               "one 400 Gb/s adapter per GPU (as DGX H100; AMD's reference clusters)"),
    "pcie4": Topology("pcie4", "pcie4", "eth100", 8, source="GPUs on PCIe Gen4, no NVLink"),
    "pcie5": Topology("pcie5", "pcie5", "eth100", 8, source="GPUs on PCIe Gen5, no NVLink"),
}

#: the machine a GPU usually comes in (a default; say ``topology=`` otherwise)
_DEFAULT = {"a100-sxm4-40gb": "dgx-a100", "a100-sxm4-80gb": "dgx-a100",
            "h100-sxm": "dgx-h100", "h100-sxm-hbm2e": "dgx-h100", "h200-sxm": "dgx-h100", "b200": "dgx-b200",
            "h100-pcie": "pairwise-h100", "a100-pcie-40gb": "pairwise-a100",
            "a100-pcie-80gb": "pairwise-a100", "gb200": "gb200-nvl72", "gb300": "gb200-nvl72",
            "b300": "dgx-b200", "h100-nvl": "pairwise-h100", "h200-nvl": "pairwise-h100",
            "rtx-pro-6000-server": "pcie5", "h800-sxm": "hgx-h800",
            "h800-pcie": "pairwise-h800", "mi300x": "mi300x-platform",
            "mi325x": "mi300x-platform"}


def get_topology(name) -> Topology:
    """A :class:`Topology` by name; ``"dgx-h100:4"`` is four such nodes."""
    if isinstance(name, Topology):
        return name
    base, _, count = name.partition(":") if isinstance(name, str) else (name, "", "")
    if base not in TOPOLOGIES or (count and not (count.isdigit() and int(count) > 0)):
        raise ValueError(f"unknown topology {name!r}; accepted: {', '.join(TOPOLOGIES)}, "
                         "each optionally with ':NODES' (dgx-h100:4)")
    topo = TOPOLOGIES[base]
    return dataclasses.replace(topo, nodes=int(count)) if count else topo


def default_topology(gpu_name: str) -> Topology:
    """The machine ``gpu_name`` usually comes in: DGX for SXM parts, NVLink pairs for the
    PCIe A100/H100, AMD's xGMI platform for the MI300X and MI325X, plain PCIe otherwise."""
    return TOPOLOGIES[_DEFAULT.get(gpu_name, "pcie4")]


def topology_for(spec, topology=None) -> Topology:
    """The machine ``spec`` (a GPU spec) runs in: ``topology`` (a name or a
    :class:`Topology`) or the GPU's usual one (:func:`default_topology`). Refused in one line
    where the GPU cannot be in it: NVLink is NVIDIA's, Infinity Fabric AMD's."""
    topo = default_topology(spec.name) if topology is None else get_topology(topology)
    links = [x for x in (topo.intra, topo.pair) if x is not None]
    vendor = ("nvidia" if any(x.startswith("nvlink") for x in links)
              else "amd" if any(x.startswith("xgmi") for x in links) else None)
    if vendor is not None and vendor != spec.vendor:
        fabric = "NVLink" if vendor == "nvidia" else "Infinity Fabric (xGMI)"
        ok = ", ".join(n for n, t in TOPOLOGIES.items()
                       if not any(x.startswith("nvlink" if spec.vendor == "amd" else "xgmi")
                                  for x in (t.intra, t.pair) if x is not None))
        raise ValueError(f"topology {topo.name!r} links its GPUs by {fabric}, which "
                         f"{spec.name} ({spec.vendor}) has not; accepted for it: {ok}")
    return topo
