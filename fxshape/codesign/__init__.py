"""Co-design: which hyperparameter to change, to what, and what it does to the whole model.

``advise`` re-analyzes the model with candidate vocabulary sizes, hidden sizes, head counts
and MLP widths (``fxshape.advise``) and sweeps one hyperparameter across a range
(``fxshape.sweep``); the dimensions' causes come from the analysis (``row.set_by``). A
candidate the family cannot build, the plan cannot split or int4 cannot pack is left out by
the refusal's type (``ConfigRefused``, ``PlanRefused``, ``PackingRefused``).

May import: hardware, cost, tracing, parallelism, config, analysis, execution, report.
"""
