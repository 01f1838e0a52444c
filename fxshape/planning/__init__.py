"""The plan search (``fxshape plan``, ``fxshape.plan``): which parallel plan trains a model
fastest on N GPUs, and does it fit? ``space`` enumerates the plans a model and a machine
allow (pure); ``search`` costs each with the step and memory models of the analysis wing
(each distinct per-rank shape set captured once) and ranks them (``fxshape.torchtitan``,
at the top level beside the presets, reads a torchtitan job into the plan it runs).

May import: hardware, cost, tracing, parallelism, config, analysis, execution, report.
"""

from .search import PlanResult, PlanSearch, model_shape, plan
from .space import Candidate, ModelShape, candidates

__all__ = ["plan", "PlanSearch", "PlanResult", "Candidate", "ModelShape", "candidates",
           "model_shape"]
