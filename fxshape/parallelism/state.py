"""The training state a GPU holds, in one place (issue 53: these bytes were written in three
places, and the plan search's copy assumed AdamW whatever the optimizer).

Mixed-precision training keeps fp32 master weights (4 bytes a parameter), a gradient of the
plan's ``grad_dtype`` (``Parallel.grad_bytes``), the optimizer's state
(``fxshape.cost.optimizer.state_bytes_per_param``: AdamW's two fp32 moments, 8 bytes; SGD
none) and, for PyTorch's foreach AdamW, one fp32 temporary the size of the parameters during
its step. ZeRO shards them over ``shard`` ranks: stage 1 the state (and the temporary),
stage 2 the gradients too, stage 3 the master weights too.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..cost.optimizer import state_bytes_per_param

__all__ = ["MASTER_BYTES", "TrainingState", "training_state"]

#: bytes of a master weight (fp32)
MASTER_BYTES = 4
#: bytes a parameter of the foreach AdamW step's fp32 temporary
ADAMW_TEMP_BYTES = 4


@dataclass(frozen=True)
class TrainingState:
    """Bytes on one GPU: ``master`` weights, ``grads``, optimizer ``state``, and ``temp``, the
    optimizer step's temporary (while it runs)."""

    master: float
    grads: float
    state: float
    temp: float

    @property
    def resident(self) -> float:
        """What stays between steps: master weights, gradients and optimizer state."""
        return self.master + self.grads + self.state


def training_state(elements, *, optimizer, grad_bytes: int, zero: int = 0,
                   shard: int = 1) -> TrainingState:
    """The training state of the parameters ``elements(by)`` gives: their elements on one
    GPU when sharded over ``by`` ranks (``by`` is 1 where the stage does not shard), under
    ZeRO stage ``zero`` over ``shard`` ranks.

    Raises:
        ValueError: an optimizer ``fxshape.cost.optimizer`` does not know.
    """
    per_param = state_bytes_per_param(optimizer)

    def on(stage):
        return elements(shard if zero >= stage else 1)

    return TrainingState(master=MASTER_BYTES * on(3), grads=grad_bytes * on(2),
                         state=per_param * on(1),
                         temp=ADAMW_TEMP_BYTES * on(1) if optimizer == "adamw" else 0)
