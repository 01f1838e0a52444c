"""Which GPUs of each parallel group share a node.

Ranks are laid out as Megatron-LM and torchtitan do: tensor parallelism fastest (adjacent
ranks, one node), then context parallelism, then the data-parallel ranks (the sharding
group inside the replicas under hybrid sharding), then the pipeline stages slowest. A
group's GPUs per node follow: the tensor-parallel group fills a node first, a data-parallel
group takes what is left of it, and a pipeline boundary crosses nodes when the ranks before
it fill whole nodes.
"""

from __future__ import annotations

__all__ = ["per_node", "stage_crosses_nodes"]


def per_node(size: int, stride: int, gpus_per_node: int) -> int:
    """GPUs per node of a group of ``size`` ranks ``stride`` apart: those of it one node
    holds (a divisor of ``size``)."""
    d = max(1, min(size, gpus_per_node // stride)) if stride < gpus_per_node else 1
    while size % d:
        d -= 1
    return d


def stage_crosses_nodes(boundary: int, ranks_per_stage: int, gpus_per_node: int) -> bool:
    """Does the send from pipeline stage ``boundary`` to the next leave the node? (Stage
    ``s`` holds ranks ``s × ranks_per_stage`` onwards.)"""
    first = boundary * ranks_per_stage
    return first // gpus_per_node != (first + ranks_per_stage) // gpus_per_node
