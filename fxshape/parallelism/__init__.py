"""Parallelism: how a training step is spread over many GPUs.

``plan`` is the one parallel plan (:class:`~fxshape.parallelism.plan.Parallel`: tensor,
pipeline and data parallelism, ZeRO/FSDP sharding, micro-batches and the pipeline schedule),
validated in one place; ``schedule`` plays the pipeline schedules (1F1B, interleaved 1F1B,
GPipe) over the micro-batches; ``overlap`` runs FSDP's prefetched all-gathers and
reduce-scatters beside the compute of each block; ``placement`` says which GPUs of each
group share a node; ``context`` is ring attention (context parallelism). Pure functions on
numbers: the analysis wing turns the step's records into the per-stage times these take and
the records they give back.

May import: hardware, cost.
"""
