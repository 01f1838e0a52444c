"""The plans a model and a machine allow: every combination of tensor, context, pipeline,
expert and data parallelism, virtual stages, ZeRO stage, micro-batch size and recomputation
that divides the model and the GPUs (pure; nothing here imports torch).

A combination that does not divide is not a plan; :func:`candidates` counts each by the
first rule it breaks, so that the search can say how many it left out and why. Pipeline
chunks (``pp × virtual stages``) that do not divide the layers are split as torchtitan
splits them (``Parallel(stage_layers="torchtitan")``: the first and last chunks one layer
short for the embedding and the head), where that leaves every chunk a layer. Two chunks a
rank are tried both as Megatron's interleaved 1F1B and as the zero-bubble ZB-V schedule
(``Parallel(schedule="zbv")``, which has no micro-batch rule).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from ..parallelism.plan import MAX_PIPELINE_MICROBATCHES, Parallel, torchtitan_split

__all__ = ["Candidate", "ModelShape", "candidates", "divisors"]


@dataclass(frozen=True)
class ModelShape:
    """What the plan rules need of a model: its repeated layers, attention heads, KV heads
    and routed experts per MoE layer (0: dense)."""

    layers: int
    heads: int
    kv_heads: int
    experts: int = 0


@dataclass(frozen=True)
class Candidate:
    """One plan to cost: the parallel plan (its recomputation included) and the
    micro-batch size (sequences per GPU per micro-batch)."""

    parallel: Parallel
    micro_batch: int

    @property
    def recompute(self) -> str | None:
        return self.parallel.recompute

    def label(self) -> str:
        p = self.parallel
        parts = [f"tp{p.tp}"]
        if p.sequence_parallel:
            parts[0] += "+sp"
        if p.cp > 1:
            parts.append(f"cp{p.cp}")
        parts.append(f"pp{p.pp}" + (f"x{p.virtual_stages}" if p.virtual_stages > 1 else "")
                     + ("v" if p.schedule == "zbv" else "")
                     + ("(tt)" if p.stage_layers == "torchtitan" else ""))
        parts.append(f"dp{p.dp}")
        if p.ep > 1:
            parts.append(f"ep{p.ep}")
        parts.append(f"zero{p.zero}")
        parts.append(f"mb{self.micro_batch}x{p.microbatches}")
        parts.append(f"rc-{self.recompute or 'none'}")
        return " ".join(parts)


def divisors(n: int) -> list:
    return [d for d in range(1, n + 1) if n % d == 0]


def _powers_of_two(limit: int) -> list:
    out, v = [], 1
    while v <= limit:
        out.append(v)
        v *= 2
    return out


def candidates(shape: ModelShape, *, gpus: int, global_batch: int, seq_len: int,
               gpus_per_node: int, micro_batches=(1, 2, 4), recompute=(None, "selective",
                                                                        "full"),
               zero=(0, 1, 3), virtual_stages=(1, 2, 4), max_cp: int = 8,
               context_parallel: bool = True) -> tuple:
    """``(plans, dropped)``: every :class:`Candidate` for ``gpus`` GPUs training
    ``global_batch`` sequences of ``seq_len`` tokens per step, and a Counter of the
    combinations left out by the first rule each breaks. Tensor parallelism stays in a
    node (a divisor of ``gpus_per_node``) with sequence parallelism on; context
    parallelism takes powers of two up to ``max_cp`` (none when ``context_parallel`` is
    False: the model has no fused attention to ring); expert parallelism the divisors of
    the experts that divide ``dp × cp``."""
    if gpus < 1 or global_batch < 1 or seq_len < 1:
        raise ValueError(f"gpus, global_batch and seq_len must be positive, got {gpus}, "
                         f"{global_batch}, {seq_len}")
    dropped: Counter = Counter()
    plans = []
    tps = [t for t in divisors(gpus_per_node) if gpus % t == 0]
    cps = _powers_of_two(max_cp) if context_parallel else [1]
    # pipelines of any depth that divides the GPUs, up to one layer a stage
    pps = sorted({d for d in divisors(gpus) if d <= shape.layers} | {1}) \
        if shape.layers else [1]
    eps = divisors(shape.experts) if shape.experts else [1]
    for tp in tps:
        if shape.heads % tp or (shape.kv_heads % tp and tp % shape.kv_heads):
            dropped["tp does not split the attention heads evenly"] += 1
            continue
        for cp in cps:
            if cp > 1 and seq_len % (2 * cp):
                dropped["seq_len not a multiple of 2 x cp"] += 1
                continue
            for pp in pps:
                if gpus % (tp * cp * pp):
                    dropped["tp x cp x pp does not divide the GPUs"] += 1
                    continue
                dp = gpus // (tp * cp * pp)
                for vp in virtual_stages:
                    if vp > 1 and pp == 1:
                        continue  # not a distinct plan
                    split = None
                    if shape.layers % (pp * vp):
                        try:
                            torchtitan_split(shape.layers, pp * vp)
                        except ValueError:
                            dropped["pp x virtual stages leave a stage without a layer"] += 1
                            continue
                        split = "torchtitan"
                    for ep in eps:
                        if (dp * cp) % ep:
                            dropped["ep does not divide dp x cp"] += 1
                            continue
                        for mb in micro_batches:
                            if global_batch % (dp * mb):
                                dropped["global batch not a multiple of dp x micro-batch"] += 1
                                continue
                            m = global_batch // (dp * mb)
                            if pp > 1 and m > MAX_PIPELINE_MICROBATCHES:
                                dropped["pipeline micro-batches above "
                                        f"{MAX_PIPELINE_MICROBATCHES:,}"] += 1
                                continue
                            # two chunks a rank: Megatron's interleaving, or ZB-V's V
                            for sched in (("1f1b", "zbv") if vp == 2 else ("1f1b",)):
                                if sched == "1f1b" and vp > 1 and m % pp:
                                    dropped["interleaved: micro-batches not a multiple of "
                                            "pp"] += 1
                                    continue
                                for z in zero:
                                    if z and dp * cp == 1:
                                        continue  # nothing to shard over: as zero 0
                                    for rc in recompute:
                                        par = Parallel(tp=tp, cp=cp, pp=pp, dp=dp, ep=ep,
                                                       zero=z, virtual_stages=vp,
                                                       microbatches=m,
                                                       sequence_parallel=tp > 1,
                                                       stage_layers=split, schedule=sched,
                                                       recompute=rc)
                                        plans.append(Candidate(par, mb))
    return plans, dropped
