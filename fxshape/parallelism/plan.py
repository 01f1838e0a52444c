"""The parallel plan: :class:`Parallel`, one frozen record of how a step is spread over GPUs.

``Parallel(tp=2, pp=4, dp=8, zero=3, microbatches=16)`` is 64 GPUs: tensor parallelism over
2 (Megatron, inside a node), a pipeline of 4 stages, 8 data-parallel ranks with parameters,
gradients and optimizer state sharded over them (FSDP). Validated once, in
``__post_init__`` (what needs the model, :func:`check_plan`). ``batch_size`` in ``analyze``
is the micro-batch of one data-parallel rank: the global batch is ``batch_size ×
microbatches × dp``.
"""

from __future__ import annotations

import numbers
from dataclasses import asdict, dataclass, field, fields

__all__ = ["Parallel", "PlanRefused", "SCHEDULES", "ZERO_STAGES", "GRAD_DTYPES", "check_mode", "check_plan",
           "parallel_of", "RECOMPUTE", "check_recompute", "check_cp_seq", "STAGE_SPLITS",
           "stage_layer_counts", "layer_chunks", "chunk_of_layer", "torchtitan_split",
           "MAX_PIPELINE_MICROBATCHES", "parse_stage_layers"]

#: ``"1f1b"`` (PipeDream-flush / Megatron's default; with ``virtual_stages`` > 1 the
#: interleaved 1F1B), ``"interleaved"`` (the same, ``virtual_stages`` > 1 required),
#: ``"gpipe"`` (all forwards, then all backwards), ``"zbv"`` (zero bubble, ZB-V: two chunks
#: a rank in a V, the backward split into its input- and weight-gradient passes;
#: ``virtual_stages=2``; torchtitan's ``ZBVZeroBubble``)
SCHEDULES = ("1f1b", "interleaved", "gpipe", "zbv")
#: 0: replicated (DDP); 1: optimizer state sharded over ``dp``; 2: and gradients; 3: and
#: parameters (FSDP / FSDP2 / ZeRO-3)
ZERO_STAGES = (0, 1, 2, 3)
#: the dtypes gradients can be held and reduced in, with their bytes per element
GRAD_DTYPES = {"fp32": 4, "bf16": 2, "fp16": 2}
#: named rules for splitting the layers into pipeline chunks (``Parallel.stage_layers``):
#: ``"torchtitan"``, torchtitan's ``generate_llm_fqn_per_model_part`` (the embedding and the
#: head each weighed as one layer, the weighted total spread evenly, the first chunks taking
#: the remainder)
STAGE_SPLITS = ("torchtitan",)


def _count(name, v, minimum=1) -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < minimum:
        raise ValueError(f"Parallel.{name} must be an integer >= {minimum}, got {v!r}")
    return int(v)


#: ``None`` (keep every activation), ``"full"`` (every layer's forward re-run in its
#: backward: ``gradient_checkpointing_enable()``), ``"selective"`` (Megatron's selective
#: recomputation: the attention core only), ``"op"`` (torchtitan's op-level selective
#: checkpointing: every second matmul and every memory-bound op of each layer re-run, the
#: attention kernel and the other matmuls saved)
RECOMPUTE = (None, "full", "selective", "op")


def _check_recompute_value(recompute) -> None:
    if recompute not in RECOMPUTE:
        raise ValueError(f"unknown recompute {recompute!r}; accepted: None, 'full', "
                         "'selective', 'op'")


def parse_stage_layers(text: str):
    """``Parallel.stage_layers`` from text: ``"torchtitan"`` or comma-separated layer counts
    per chunk (``"15,16,15"``); a one-line ``ValueError`` otherwise."""
    if text in STAGE_SPLITS:
        return text
    try:
        counts = tuple(int(x) for x in text.split(","))
    except ValueError:
        counts = ()
    if not counts or min(counts) < 1:
        raise ValueError(f"expected {' or '.join(STAGE_SPLITS)} or layer counts of at least 1 "
                         f"per chunk, comma-separated (15,16,15), got {text!r}")
    return counts


class PlanRefused(ValueError):
    """A plan this model or machine cannot run, refused in one line (a ``ValueError``, its
    message unchanged); ``reason``: the rule it breaks, in a few fixed words: what a plan
    search counts the plans it drops under (``fxshape.planning.search``), never parsed from
    the message."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason

    def __reduce__(self):
        return type(self), (str(self), self.reason)


@dataclass(frozen=True)
class Parallel:
    """How a step is spread over ``tp × cp × pp × dp`` GPUs.

    Args:
        tp: Megatron tensor-parallel degree (inside a node).
        cp: context-parallel degree: each sequence split over ``cp`` ranks, attention run as
            ring attention (``fxshape.parallelism.context``); the ranks hold the same
            parameters, so gradients are reduced (and ZeRO shards) over ``dp × cp``.
        pp: pipeline stages; the layers split into ``pp × virtual_stages`` chunks.
        dp: data-parallel ranks.
        zero: 0 (DDP), 1, 2 or 3 (FSDP): what is sharded over the data-parallel ranks.
        virtual_stages: model chunks per pipeline rank (interleaved 1F1B when > 1).
        microbatches: micro-batches per step (gradient accumulation; the pipeline's
            micro-batches): one optimizer step and one gradient reduction per step.
        schedule: the pipeline schedule (:data:`SCHEDULES`).
        sequence_parallel: Megatron's sequence parallelism (needs ``tp`` > 1).
        async_tp: asynchronous tensor parallelism (torchtitan's
            ``enable_async_tensor_parallel``: torch.compile's micro-pipeline TP pass over
            symmetric memory): sequence parallelism's all-gather fused into the
            column-parallel GEMMs it feeds and the row-parallel GEMM into its
            reduce-scatter, each decomposed into ``tp`` chunks whose copies run beside the
            GEMM's chunks (``fxshape.execution.step.comm_records``). Needs
            ``sequence_parallel`` and compiled execution.
        dp_shard: with ``zero`` > 0, the data-parallel ranks one copy is sharded over (hybrid
            sharding, HSDP: shard inside a node, replicate across); default all of ``dp``.
        reshard_after_forward: FSDP2's default: parameters freed after each block's
            forward and all-gathered again for its backward.
        grad_dtype: the dtype the gradients are held and reduced in (:data:`GRAD_DTYPES`):
            ``"fp32"`` (the default: fp32 master weights get fp32 gradients, as DDP and
            FSDP2 under autocast keep them) or ``"bf16"``/``"fp16"`` (DeepSpeed's and
            Megatron's half-precision gradient buffers, FSDP2's ``reduce_dtype``): the
            gradients' memory and the data-parallel reductions' bytes.
        ep: expert-parallel degree: each MoE layer's experts spread over ``ep`` of the
            ``dp × cp`` ranks (Megatron's and torchtitan's rule: it adds no GPUs), the
            routed tokens sent to their experts' ranks and back by all-to-all
            (``fxshape.parallelism.experts``); expert gradients are reduced, and ZeRO
            shards expert state, over the ``dp × cp / ep`` ranks that hold the same experts.
        capacity_factor: with ``ep``, each expert's rows capped and padded to
            ``ceil(capacity_factor × routed rows / experts)`` (GShard, Megatron's
            ``--moe-expert-capacity-factor`` with padding); None (the default): dropless,
            each expert gets the rows its routing gives it.
        stage_layers: how the layer stack splits into the ``pp × virtual_stages`` chunks
            (in chunk order: chunk ``c`` on pipeline rank ``c mod pp``). None (the
            default): equal chunks (Megatron's default; the chunks must divide the
            layers); ``"torchtitan"``: torchtitan's split (:func:`torchtitan_split`: the
            embedding and the head each count as a layer, so the first and last chunks take
            one layer fewer: Llama-3.1-405B's 126 layers over 8 stages are 15, 16 × 6, 15);
            a tuple of layer counts, one per chunk, each at least 1, summing to the layers
            (Megatron's ``--decoder-first-pipeline-num-layers`` /
            ``--decoder-last-pipeline-num-layers``, torchtitan's
            ``pipeline_parallel_layers_per_stage`` or module lists).
        recompute: in training, activation recomputation (:data:`RECOMPUTE`): None (what
            the model says: Hugging Face's ``gradient_checkpointing_enable()`` is
            ``"full"``), ``"full"`` (every layer's forward again in its backward),
            ``"selective"`` (the attention core only, Megatron's selective recomputation)
            or ``"op"`` (torchtitan's op-level selective checkpointing: each layer's every
            second matmul and its memory-bound ops again).

    A field whose metadata says ``capture`` changes the graph one rank captures (its
    shapes, its collectives); the others only how the captured step is played
    (``fxshape.config.setup.Setup.capture_key``). ``choices`` and ``parse`` (a function reading
    the field from text) are what the command line's
    generated flags take (``fxshape.cli.args.plan_flags``).
    """

    tp: int = field(default=1, metadata={"capture": True})
    cp: int = field(default=1, metadata={"capture": True})
    pp: int = 1
    dp: int = 1
    zero: int = field(default=0, metadata={"choices": ZERO_STAGES})
    virtual_stages: int = 1
    microbatches: int = 1
    schedule: str = field(default="1f1b", metadata={"choices": SCHEDULES})
    sequence_parallel: bool = field(default=False, metadata={"capture": True})
    dp_shard: int | None = None
    reshard_after_forward: bool = True
    grad_dtype: str = field(default="fp32",
                            metadata={"capture": True, "choices": tuple(GRAD_DTYPES)})
    ep: int = field(default=1, metadata={"capture": True})
    capacity_factor: float | None = field(default=None, metadata={"capture": True})
    stage_layers: tuple | str | None = field(default=None,
                                             metadata={"parse": parse_stage_layers})
    async_tp: bool = field(default=False, metadata={"capture": True})
    recompute: str | None = None

    def __post_init__(self):
        for name in ("tp", "cp", "pp", "dp", "virtual_stages", "microbatches", "ep"):
            _count(name, getattr(self, name))
        if isinstance(self.zero, bool) or self.zero not in ZERO_STAGES:
            raise ValueError(f"Parallel.zero must be one of 0, 1, 2, 3 (0: DDP, 3: FSDP), got "
                             f"{self.zero!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"unknown pipeline schedule {self.schedule!r}; accepted: "
                             + ", ".join(repr(s) for s in SCHEDULES))
        for name in ("sequence_parallel", "reshard_after_forward", "async_tp"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"Parallel.{name} must be True or False, got "
                                 f"{getattr(self, name)!r}")
        if not isinstance(self.grad_dtype, str) or self.grad_dtype not in GRAD_DTYPES:
            raise ValueError(f"Parallel.grad_dtype must be one of "
                             f"{', '.join(repr(d) for d in GRAD_DTYPES)}, got "
                             f"{self.grad_dtype!r}")
        _check_recompute_value(self.recompute)
        if self.sequence_parallel and self.tp == 1:
            raise ValueError("sequence_parallel splits the norms and residuals over the "
                             "tensor-parallel GPUs: it needs tp > 1, got tp=1")
        if self.async_tp and not self.sequence_parallel:
            raise ValueError("async_tp fuses sequence parallelism's all-gather and "
                             "reduce-scatter into the GEMMs beside them: it needs tp > 1 and "
                             "sequence_parallel=True")
        if self.zero and self.data_ranks == 1:
            raise ValueError(f"zero={self.zero} shards over the data-parallel (and "
                             "context-parallel) ranks, but dp=1 and cp=1: nothing to shard "
                             "over; use zero=0, dp > 1 or cp > 1")
        if self.data_ranks % self.ep:
            ok = [d for d in range(1, self.data_ranks + 1) if self.data_ranks % d == 0]
            raise ValueError(f"ep={self.ep} spreads the experts over data-parallel ranks, so "
                             f"it must divide dp × cp = {self.data_ranks}; accepted: "
                             + ", ".join(map(str, ok)))
        if self.capacity_factor is not None:
            c = self.capacity_factor
            if isinstance(c, bool) or not isinstance(c, numbers.Real) or not c > 0 \
                    or c != c or c == float("inf"):
                raise ValueError(f"Parallel.capacity_factor must be a positive number (1.0: "
                                 f"each expert takes its balanced share) or None (dropless), "
                                 f"got {c!r}")
            if self.ep == 1:
                raise ValueError("capacity_factor caps the rows each expert's rank receives "
                                 "in the all-to-all: it needs ep > 1")
        if self.dp_shard is not None:
            _count("dp_shard", self.dp_shard)
            if not self.zero:
                raise ValueError("dp_shard (hybrid sharding) needs zero > 0")
            if self.data_ranks % self.dp_shard:
                raise ValueError(f"dp_shard={self.dp_shard} must divide dp × cp = "
                                 f"{self.data_ranks}")
            if self.dp_shard % self.ep:
                raise ValueError(f"ep={self.ep} must divide dp_shard={self.dp_shard}: expert "
                                 "state is sharded over the ranks of a shard group that hold "
                                 "the same experts")
        self._check_pipeline()

    def _check_pipeline(self) -> None:
        """The pipeline's fields: its schedule, chunks, micro-batches and stage split."""
        if self.pp == 1:
            if self.virtual_stages > 1:
                raise ValueError("virtual_stages > 1 interleaves pipeline stages: it needs "
                                 "pp > 1")
            if self.schedule != "1f1b":
                raise ValueError(f"schedule={self.schedule!r} is a pipeline schedule: it needs "
                                 "pp > 1")
        if self.schedule == "interleaved" and self.virtual_stages == 1:
            raise ValueError("schedule='interleaved' needs virtual_stages > 1 (the model "
                             "chunks each pipeline rank holds)")
        if self.schedule == "zbv" and self.virtual_stages != 2:
            raise ValueError(f"schedule='zbv' holds two model chunks a rank, in a V: give "
                             f"virtual_stages=2 (got {self.virtual_stages})")
        if self.schedule == "gpipe" and self.virtual_stages > 1:
            raise ValueError("virtual_stages > 1 is the interleaved 1F1B schedule; GPipe has "
                             "one chunk per rank: use schedule='1f1b' or virtual_stages=1")
        if self.pp > 1 and self.microbatches > MAX_PIPELINE_MICROBATCHES:
            raise ValueError(f"Parallel.microbatches={self.microbatches} under a pipeline: at "
                             f"most {MAX_PIPELINE_MICROBATCHES:,} (the schedule is simulated "
                             "pass by pass, about a second per 65,536 micro-batches); "
                             "accepted: 1 to "
                             f"{MAX_PIPELINE_MICROBATCHES:,}")
        if self.interleaved and self.microbatches % self.pp:
            raise ValueError(f"interleaved 1F1B needs the micro-batches ({self.microbatches}) "
                             f"to be a multiple of pp={self.pp} (Megatron's rule); accepted: "
                             f"{self.pp}, {2 * self.pp}, {3 * self.pp} ...")
        sl = self.stage_layers
        if sl is not None:
            if self.pp == 1:
                raise ValueError("stage_layers splits the layers into pipeline chunks: it "
                                 "needs pp > 1")
            if isinstance(sl, str):
                if sl not in STAGE_SPLITS:
                    raise ValueError(f"unknown stage_layers {sl!r}; accepted: None (equal "
                                     "chunks), " + ", ".join(repr(x) for x in STAGE_SPLITS)
                                     + ", or a tuple of layer counts per chunk")
            elif not isinstance(sl, (tuple, list)) or len(sl) != self.stages or any(
                    isinstance(c, bool) or not isinstance(c, numbers.Integral) or c < 1
                    for c in sl):
                raise ValueError("Parallel.stage_layers must be None, "
                                 + ", ".join(repr(x) for x in STAGE_SPLITS)
                                 + f" or {self.stages} layer counts of at least 1 (one per "
                                 f"chunk: pp × virtual_stages = {self.stages}), got {sl!r}")
            else:
                object.__setattr__(self, "stage_layers", tuple(int(c) for c in sl))

    @property
    def gpus(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    @property
    def data_ranks(self) -> int:
        """Ranks that hold the same parameters and reduce their gradients together: the
        data-parallel ranks times the context-parallel ones (``dp × cp``)."""
        return self.dp * self.cp

    @property
    def is_plain(self) -> bool:
        """Only tensor and data parallelism (DDP): no pipeline, context parallelism, ZeRO or
        micro-batches, the step one timeline (``fxshape.execution.step``); otherwise it is
        played out (``fxshape.execution.pipeline``)."""
        return self.pp == 1 and self.cp == 1 and self.ep == 1 and not self.zero \
            and self.microbatches == 1

    @property
    def expert_ranks(self) -> int:
        """Ranks that hold the same experts and reduce their gradients together:
        ``dp × cp / ep``."""
        return self.data_ranks // self.ep

    @property
    def grad_bytes(self) -> int:
        """Bytes of one gradient element (:data:`GRAD_DTYPES`)."""
        return GRAD_DTYPES[self.grad_dtype]

    @property
    def interleaved(self) -> bool:
        """Megatron's interleaved 1F1B: more than one chunk a rank, looped (ZB-V's two
        chunks a rank are placed in a V instead)."""
        return self.virtual_stages > 1 and self.schedule != "zbv"

    @property
    def stages(self) -> int:
        """Model chunks the layers split into: ``pp × virtual_stages``."""
        return self.pp * self.virtual_stages

    @property
    def shard(self) -> int:
        """Ranks what ZeRO shards is split over (1 without ZeRO): ``dp_shard``, else all of
        ``dp × cp``."""
        return 1 if not self.zero else (self.dp_shard or self.data_ranks)

    @property
    def replicate(self) -> int:
        """Copies of each shard across the data-parallel ranks (hybrid sharding)."""
        return self.data_ranks // self.shard

    @property
    def schedule_name(self) -> str:
        if self.pp == 1:
            return "none"
        if self.schedule == "zbv":
            return "zero bubble ZB-V (2 chunks per rank in a V)"
        if self.interleaved:
            return f"interleaved 1F1B ({self.virtual_stages} chunks per rank)"
        return "GPipe" if self.schedule == "gpipe" else "1F1B"

    def describe(self) -> str:
        """``tp 2 × pp 4 × dp 8 = 64 GPUs; ZeRO-3 (FSDP); 16 micro-batches, 1F1B``."""
        cp = f" × cp {self.cp}" if self.cp > 1 else ""
        parts = [f"tp {self.tp}{cp} × pp {self.pp} × dp {self.dp} = {self.gpus} GPUs"]
        if self.cp > 1:
            parts.append(f"context parallel over {self.cp} (ring attention)")
        if self.ep > 1:
            cap = (f", capacity factor {self.capacity_factor:g}"
                   if self.capacity_factor is not None else ", dropless")
            parts.append(f"experts over {self.ep} ranks (all-to-all{cap})")
        if self.sequence_parallel:
            parts.append("sequence parallel" + (", async TP" if self.async_tp else ""))
        if self.zero:
            z = {1: "ZeRO-1 (optimizer state sharded)", 2: "ZeRO-2 (and gradients)",
                 3: "ZeRO-3 (FSDP: and parameters)"}[self.zero]
            if self.replicate > 1:
                z += f", hybrid: sharded over {self.shard}, replicated {self.replicate}x"
            if self.zero == 3 and not self.reshard_after_forward:
                z += ", kept gathered after the forward"
            parts.append(z)
        if self.grad_dtype != "fp32":
            parts.append(f"gradients in {self.grad_dtype}")
        mb = f"{self.microbatches} micro-batch{'es' if self.microbatches > 1 else ''}"
        if self.pp > 1:
            mb += f", {self.schedule_name}"
        if isinstance(self.stage_layers, str):
            mb += f", {self.stage_layers}'s stage split"
        elif self.stage_layers is not None:
            mb += f", layers per chunk {'/'.join(map(str, self.stage_layers))}"
        parts.append(mb)
        return "; ".join(parts)

    def as_dict(self) -> dict:
        return asdict(self)

    def __repr__(self) -> str:
        """``Parallel(pp=2, microbatches=8)``: the fields that differ from the defaults."""
        default = _DEFAULT_FIELDS
        args = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields(self)
                         if getattr(self, f.name) != default[f.name])
        return f"Parallel({args})"


_DEFAULT_FIELDS = asdict(Parallel())


def parallel_of(parallel=None, *, tp=1, dp=1, sequence_parallel=False) -> Parallel:
    """The plan from ``analyze``'s arguments: ``parallel`` (a :class:`Parallel`), or the
    shorthands ``tp``, ``dp``, ``sequence_parallel``; both given: an error."""
    if parallel is None:
        for name, v in (("tp", tp), ("dp", dp)):
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        return Parallel(tp=tp, dp=dp, sequence_parallel=sequence_parallel)
    if not isinstance(parallel, Parallel):
        raise ValueError(f"parallel must be a fxshape.Parallel plan, got "
                         f"{type(parallel).__name__}")
    given = [n for n, v, d in (("tp", tp, 1), ("dp", dp, 1),
                               ("sequence_parallel", sequence_parallel, False)) if v != d]
    if given:
        raise ValueError(f"{', '.join(given)} given beside parallel=: say it in the plan "
                         f"(Parallel({given[0]}=...)), not both")
    return parallel


def check_mode(plan: Parallel, mode: str) -> None:
    """Pipelines, ZeRO, micro-batches and a gradient dtype are training's: refused for
    another mode."""
    if mode != "train":
        for what, bad in (("pp", plan.pp > 1), ("zero", plan.zero > 0),
                          ("microbatches", plan.microbatches > 1), ("cp", plan.cp > 1),
                          ("ep", plan.ep > 1)):
            if bad:
                raise ValueError(f"Parallel.{what}={getattr(plan, what)}: pipelines, context "
                                 "and expert parallelism, ZeRO and micro-batches are "
                                 "modelled for "
                                 f"mode='train', not {mode!r}")
        if plan.grad_dtype != "fp32":
            raise ValueError(f"Parallel.grad_dtype={plan.grad_dtype!r}: gradients exist in "
                             f"mode='train' only, not {mode!r}")


def torchtitan_split(layers: int, chunks: int, input_weight: int = 1,
                     output_weight: int = 1) -> tuple[int, ...]:
    """Layers per chunk as torchtitan splits them (``generate_llm_fqn_per_model_part`` in
    ``torchtitan/distributed/pipeline_parallel.py``): ``layers + input_weight +
    output_weight`` effective layers spread evenly over the chunks, the first ``remainder``
    chunks one more; the first chunk holds the embedding (``input_weight`` of its share),
    the last the norm and head (``output_weight``).

    >>> torchtitan_split(126, 8)  # Llama-3.1-405B on 8 stages
    (15, 16, 16, 16, 16, 16, 16, 15)

    Raises:
        ValueError: a chunk that would hold no layer (torchtitan's own checks, and fxshape
            prices no chunk without layers).
    """
    total = layers + input_weight + output_weight
    per, extra = divmod(total, chunks)
    counts = [per + (1 if c < extra else 0) for c in range(chunks)]
    if chunks > 1:
        counts[0] -= input_weight
        counts[-1] -= output_weight
    else:
        counts = [layers]
    if min(counts) < 1:
        raise ValueError(f"torchtitan's split of {layers} layers over {chunks} chunks leaves "
                         f"a chunk without a layer ({'/'.join(map(str, counts))}, the "
                         "embedding and the head counted as a layer each); accepted: fewer "
                         "chunks, or stage_layers as a tuple of counts of at least 1")
    return tuple(counts)


def stage_layer_counts(plan: Parallel, layers: int) -> tuple[int, ...]:
    """Layers in each of the plan's ``pp × virtual_stages`` chunks, in chunk order
    (``Parallel.stage_layers``); :func:`check_plan` has checked that they cover
    ``layers``."""
    sl = plan.stage_layers
    if sl is None:  # equal chunks (any remainder, which check_plan refuses, on the last)
        per = max(1, layers // plan.stages)
        return (per,) * (plan.stages - 1) + (layers - per * (plan.stages - 1),)
    if sl == "torchtitan":
        return torchtitan_split(layers, plan.stages)
    return tuple(sl)


def layer_chunks(counts) -> tuple[int, ...]:
    """The chunk of each layer, in order, for ``counts`` layers per chunk:
    ``layer_chunks((2, 3)) == (0, 0, 1, 1, 1)``."""
    return tuple(c for c, n in enumerate(counts) for _ in range(n))


def chunk_of_layer(chunks, i: int) -> int:
    """The chunk of layer ``i`` (``chunks``: :func:`layer_chunks`); an index past the stack
    (a layer the capture numbers beyond it) in the last chunk."""
    return chunks[min(i, len(chunks) - 1)]


def check_plan(plan: Parallel, *, layers: int | None, topology) -> None:
    """What the plan needs of the model and the machine: the layers split into whole
    stages, the GPUs the topology holds."""
    if plan.pp > 1:
        if not layers:
            raise PlanRefused("pp > 1 splits the model's layer stack into stages, but no "
                              "stack of repeated layers was found in the model",
                              "pp without a stack of layers to split")
        if plan.stage_layers is None and layers % plan.stages:
            ok = [d for d in range(1, layers + 1) if layers % d == 0]
            raise PlanRefused(f"pp × virtual_stages = {plan.stages} does not divide the "
                              f"{layers} layers into equal chunks; accepted products: "
                              + ", ".join(map(str, ok))
                              + "; or an uneven split: Parallel(stage_layers='torchtitan') "
                              "or a tuple of layers per chunk",
                              "pp x virtual stages do not divide the layers")
        if plan.stage_layers == "torchtitan":
            try:
                torchtitan_split(layers, plan.stages)
            except ValueError as exc:  # a chunk without layers
                raise PlanRefused(str(exc), "torchtitan's split leaves a stage without a "
                                            "layer") from None
        elif plan.stage_layers is not None and sum(plan.stage_layers) != layers:
            raise PlanRefused(f"Parallel.stage_layers={plan.stage_layers!r} sums to "
                              f"{sum(plan.stage_layers)}, but the model has {layers} layers; "
                              f"accepted: {plan.stages} counts of at least 1 summing to "
                              f"{layers}", "the stage split does not sum to the layers")
    if plan.tp > topology.gpus_per_node:
        raise PlanRefused(f"tp={plan.tp} exceeds the {topology.gpus_per_node} GPUs of a "
                          f"{topology.name} node (tensor parallelism stays inside a node); "
                          f"accepted: tp <= {topology.gpus_per_node}, or another topology=",
                          "tp exceeds a node")
    if topology.gpus is not None and plan.gpus > topology.gpus:
        raise PlanRefused(f"the plan needs {plan.gpus} GPUs (tp × cp × pp × dp), but "
                          f"{topology.nodes} {topology.name} nodes hold {topology.gpus}",
                          "the plan needs more GPUs than the topology holds")


def check_cp_seq(seq_len: int, cp: int) -> None:
    """Context parallelism splits each sequence into ``2 × cp`` chunks (rank ``i`` holds
    chunks ``i`` and ``2cp − 1 − i``, which balances the causal mask's work): ``seq_len``
    must be a multiple of ``2 × cp``."""
    if cp > 1 and seq_len % (2 * cp):
        ok = 2 * cp
        raise PlanRefused(f"cp={cp} splits each sequence into 2 × cp = {ok} chunks (causal "
                          f"load balancing), but seq_len={seq_len} is not a multiple of "
                          f"{ok}; accepted: {ok}, {2 * ok}, {3 * ok} ... (e.g. "
                          f"{(seq_len // ok + 1) * ok})", "seq_len not a multiple of 2 x cp")



#: the most micro-batches a pipelined step takes: its schedule is simulated pass by pass
#: (linear in them; published pipelines run tens to a few thousand)
MAX_PIPELINE_MICROBATCHES = 65536


def check_recompute(recompute, mode: str) -> None:
    _check_recompute_value(recompute)
    if recompute is not None and mode != "train":
        raise ValueError(f"recompute={recompute!r} re-runs forwards in the backward: it needs "
                         f"mode='train', not {mode!r}")
