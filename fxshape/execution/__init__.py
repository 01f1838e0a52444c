"""Execution: the captured step as the GPUs run it under its setup (issue 53 moved it out of
``analysis``).

``step`` gives every op of the step its record (the loss, the optimizer, the collectives, the
host's launches: :class:`~fxshape.execution.step.Step`), ``fusion`` Inductor's fusion groups
for ``execution="compiled"``, ``memory`` the liveness walk and what a GPU holds, ``execute``
the step and memory under a plan (shards, stages, op records), ``pipeline`` plays the step
under a parallel plan (stages, micro-batches, FSDP) with ``fxshape.parallelism``'s schedules,
``ring`` context parallelism's transfers, ``experts`` expert parallelism's all-to-alls,
``decode`` one decode step over its KV cache, ``serving`` what fits (the batch and the
context a GPU holds), ``quantized`` the memory and notes of quantized and FP8 runs,
``parts`` what the phases produce before the report is built once (``ReportParts``).

May import: hardware, cost, tracing, parallelism, config, analysis.
"""
