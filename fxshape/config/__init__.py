"""Config: what an analysis is asked to predict, as a few frozen objects (issue 53).

``setup`` holds :class:`~fxshape.config.setup.Setup`, composed of a
:class:`~fxshape.config.setup.Workload` (the mode, the sizes, the KV cache, the MoE routing,
the inputs), a :class:`~fxshape.parallelism.plan.Parallel` (the plan, its recomputation
included), a :class:`~fxshape.config.setup.Machine` (the GPU, the machine it is in, the
constant set) and :class:`~fxshape.config.setup.Kernels` (the dtype, how the step executes,
which attention, GEMV, all-reduce, optimizer, quantization and FP8 kernels run). Each object
validates its own fields once, in one line each; the setup checks what two of them decide
together, translates ``analyze``'s keywords in one place (``Setup.from_keywords``), derives
the capture cache's key from its fields' metadata and says which fields differ from their
defaults (what ``report.options`` reports on).

May import: hardware, cost, tracing, parallelism.
"""
