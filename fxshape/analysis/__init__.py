"""Analysis: a captured graph in, a row per GEMM and a kernel list per op out.

``ops`` is the one registry of per-op GEMM handlers (a node -> the GEMMs it runs), ``annotate``
captures one rank's step and puts a :class:`~fxshape.analysis.rows.GemmRow` per GEMM on
``node.meta["fxshape"]`` (``capture_step`` -> :class:`~fxshape.analysis.annotate.Capture`),
``parallel`` gives tensor-parallel per-GPU shapes, ``rows`` holds the records,
``provenance`` and ``perturb`` decide what sets each dimension (by value, or by cause through
re-traces that ``fasttrace`` records cheaply), ``opcost`` is the registry of memory-bound op
handlers (a node -> its kernels and bytes), ``lowprec`` prices quantized inference and FP8
training rows while the graph is annotated. The step these add up to is
``fxshape.execution``'s; the report and ``analyze`` are ``fxshape.report``'s.

May import: hardware, cost, tracing, parallelism, config.
"""
