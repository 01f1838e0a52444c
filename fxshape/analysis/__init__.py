"""Analysis: an annotated graph in, a :class:`~fxshape.analysis.report.Report` out.

``ops`` is the one registry of per-op handlers (a node -> the GEMMs it runs), ``annotate``
puts a :class:`~fxshape.analysis.rows.GemmRow` per GEMM on ``node.meta["fxshape"]`` and is
``analyze`` (capture, annotate, provenance, report), ``parallel`` gives tensor-parallel
per-GPU shapes, ``rows`` holds the records, ``provenance`` and ``perturb`` decide what sets
each dimension (by value, or by cause through re-traces that ``fasttrace`` records cheaply),
``report`` renders tables and exports and ``plot`` draws them. The step (every op, the loss,
the optimizer, communication, memory) grows here; ``pipeline`` plays a step under a
parallel plan (stages, micro-batches, FSDP) with ``fxshape.parallelism``'s schedules;
``lowprec`` prices quantized inference and FP8 training rows (``quantize=``, ``float8=``).

May import: hardware, cost, tracing, parallelism, config.
"""
