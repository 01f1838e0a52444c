"""Report: how an analysis is built and shown (issue 53 moved it out of ``analysis``).

``build`` is ``analyze``: the setup (``fxshape.config``) checked against the model, the model
captured and annotated (``fxshape.analysis``), its step executed (``fxshape.execution``),
the :class:`~fxshape.report.report.Report` built once. ``report`` renders it (tables, JSON,
CSV, Markdown, networkx, HTML), ``plot`` draws it, ``chrome`` writes the predicted step as a
Chrome / Perfetto trace, ``options`` says what each option given did (``report.options``).

May import: hardware, cost, tracing, parallelism, config, analysis, execution.
"""
