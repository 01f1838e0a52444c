"""Expert parallelism: a MoE layer's experts spread over ``ep`` ranks (pure functions).

Megatron-Core and torchtitan place the ``E`` experts of every MoE layer in contiguous blocks
of ``E / ep`` on the ``ep`` ranks of an expert-parallel group (ranks that are otherwise
data-parallel: it adds no GPUs). Each rank routes its own tokens (``R`` routed rows: tokens ×
top-k), sends every row to the rank that holds its expert (the *dispatch* all-to-all), the
ranks run their experts' grouped GEMMs on what they received, and a second all-to-all (the
*combine*) brings the rows back. The backward runs the same two exchanges on the gradients,
in the other order.

With routing fractions ``f_e`` (the share of all routed rows expert ``e`` gets; balanced:
``1 / E``), rank ``r`` receives ``ep × R × Σ_{e on r} f_e`` rows: the busiest rank sets the
pace, since the combine waits for it. With a capacity factor ``C`` each expert's rows are
capped and padded to ``ceil(C × ep × R / E)`` (GShard; Megatron with padding to capacity):
every rank receives the same, whatever the routing.

Nothing here imports torch.
"""

from __future__ import annotations

import math

from .plan import PlanRefused

__all__ = ["check_ep", "expert_blocks", "rank_loads", "busiest_rank", "capacity",
           "expert_rows", "sharded_share"]


def check_ep(ep: int, experts: int) -> None:
    """``ep`` must divide the experts of every MoE layer."""
    if experts % ep:
        ok = [d for d in range(1, experts + 1) if experts % d == 0]
        raise PlanRefused(f"ep={ep} must divide the {experts} experts of each MoE layer "
                          f"(each rank holds a whole block of experts); accepted: "
                          + ", ".join(map(str, ok)), "ep does not divide the experts")


def expert_blocks(experts: int, ep: int) -> list:
    """The experts each rank holds: ``[range(0, E/ep), range(E/ep, 2E/ep), ...]``."""
    check_ep(ep, experts)
    per = experts // ep
    return [range(r * per, (r + 1) * per) for r in range(ep)]


def rank_loads(fractions, ep: int) -> list:
    """Each rank's share of all routed rows (the sum of its experts' fractions)."""
    blocks = expert_blocks(len(fractions), ep)
    return [sum(fractions[e] for e in b) for b in blocks]


def busiest_rank(fractions, ep: int) -> int:
    """The rank with the largest share of the routed rows (the lowest index on a tie);
    ``fractions`` may be whole rows per expert too."""
    loads = rank_loads(fractions, ep)
    return max(range(ep), key=lambda r: (loads[r], -r))


def capacity(factor: float, rows: int, experts: int, ep: int) -> int:
    """Rows each expert takes under a capacity factor: ``ceil(factor × ep × rows /
    experts)``, where ``rows`` are one rank's routed rows (``ep × rows`` over the group)."""
    return max(1, math.ceil(factor * ep * rows / experts - 1e-9))


def expert_rows(rows: int, experts: int, ep: int, fractions=None,
                capacity_factor=None) -> tuple:
    """``(rank, [rows of each of its experts])`` for the busiest rank of the group: ``rows``
    routed rows per rank (``ep × rows`` in the group) over ``experts`` experts by
    ``fractions`` (None: balanced; the shares are whole rows summing to the group's total,
    largest remainders first), or each expert padded to its capacity."""
    blocks = expert_blocks(experts, ep)
    if capacity_factor is not None:
        return 0, [capacity(capacity_factor, rows, experts, ep)] * len(blocks[0])
    total = ep * rows
    if fractions is None:
        fractions = [1.0 / experts] * experts
    shares = apportion(total, fractions)
    r = busiest_rank(shares, ep)
    return r, [shares[e] for e in blocks[r]]


def apportion(total: int, fractions) -> list:
    """Whole shares of ``total`` in proportion to ``fractions`` that sum to exactly ``total``
    (largest remainders; ties go to the lower index)."""
    raw = [total * f for f in fractions]
    out = [int(math.floor(x)) for x in raw]
    left = total - sum(out)
    order = sorted(range(len(raw)), key=lambda i: (-(raw[i] - out[i]), i))
    for i in order[:left]:
        out[i] += 1
    return out


def sharded_share(elements, experts, by: int, ep: int) -> float:
    """One GPU's share of ``elements`` parameters (``experts`` of them expert-parallel)
    that ZeRO shards over ``by`` ranks: the dense ones over ``by``, the experts over the
    ``by / ep`` of those ranks that hold the same experts; ``by`` = 1: all of them."""
    if by == 1:
        return elements
    return (elements - experts) / by + experts * ep / by
