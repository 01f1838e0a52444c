"""Co-design: which hyperparameter to change, to what, and what it does to the whole model.

``advise`` re-analyzes the model with candidate vocabulary sizes, hidden sizes, head counts
and MLP widths (``fxshape.advise``) and sweeps one hyperparameter across a range
(``fxshape.sweep``); the dimensions' causes come from the analysis (``row.set_by``).

May import: hardware, cost, tracing, config, analysis, execution, report.
"""
