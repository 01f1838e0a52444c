"""The plan search (``fxshape plan``): enumerate the parallel plans a model and a machine
allow (:mod:`.space`, pure), cost each with the step and memory models, rank them
(:mod:`.search`). Imports the analysis wing; nothing below it imports this one."""

from .search import PlanResult, PlanSearch, model_shape, plan
from .space import Candidate, ModelShape, candidates

__all__ = ["plan", "PlanSearch", "PlanResult", "Candidate", "ModelShape", "candidates",
           "model_shape"]
