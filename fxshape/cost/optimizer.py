"""The optimizer step as PyTorch's CUDA implementations run it: the kernels, their bytes and
launches.

PyTorch's optimizers update every parameter with multi-tensor kernels
(``multi_tensor_apply``): one launch covers up to a fixed number of tensors (by how many
tensor lists the op reads: 110, 64, 48, 36 or 30 for one to five lists) and of 65,536-element
chunks (320 blocks per launch), both from ``aten/src/ATen/native/cuda/MultiTensorApply.cuh``.

- ``"adamw"``: ``torch.optim.AdamW`` with its default on CUDA, the ``foreach``
  implementation (``_multi_tensor_adamw``, PyTorch 2.x): eight ``_foreach`` ops, each a pass
  over its lists — the weight decay (``mul_`` p), ``lerp_`` (m, g), ``mul_`` (v),
  ``addcmul_`` (v, g), ``sqrt`` (v -> d), ``div_`` (d), ``add_`` (d, eps), ``addcdiv_``
  (p, m, d): 80 bytes per fp32 parameter. The step count and bias corrections live on the CPU.
- ``"adamw-fused"``: ``fused=True``: one kernel reads p, g, m, v and writes p, m, v: 28 bytes.
- ``"sgd"``: ``torch.optim.SGD`` without momentum (its default), ``foreach``: ``add_`` (p, g):
  12 bytes per parameter.
- ``None``: no optimizer step.

The optimizer's state and the parameters it updates are fp32 (master weights under
bf16/fp16 autocast). Zeroing the gradients (``zero_grad()``, ``set_to_none=True`` by default
since PyTorch 2.0) launches nothing. Pure functions; no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["OPTIMIZERS", "OptimizerPass", "optimizer_passes", "state_bytes_per_param",
           "check_optimizer"]

#: the optimizers the step can include (None: no optimizer step)
OPTIMIZERS = ("adamw", "adamw-fused", "sgd", None)
_MAX_TENSORS = {1: 110, 2: 64, 3: 48, 4: 36, 5: 30}
_CHUNK = 65536
_MAX_BLOCKS = 320
# (name, tensor lists the op takes, fp32 reads per element, fp32 writes per element)
_PASSES = {
    "adamw": (("mul_", 1, 1, 1), ("lerp_", 2, 2, 1), ("mul_", 1, 1, 1), ("addcmul_", 3, 2, 1),
              ("sqrt", 2, 1, 1), ("div_", 1, 1, 1), ("add_", 1, 1, 1), ("addcdiv_", 3, 3, 1)),
    "adamw-fused": (("_fused_adamw_", 4, 4, 3),),
    "sgd": (("add_", 2, 2, 1),),
}
#: fp32 optimizer state per parameter element (AdamW: exp_avg and exp_avg_sq)
_STATE = {"adamw": 8, "adamw-fused": 8, "sgd": 0, None: 0}


@dataclass(frozen=True)
class OptimizerPass:
    """One ``_foreach`` (or fused) op over every parameter: its launches and bytes."""

    op: str
    launches: int
    bytes: int


def check_optimizer(optimizer) -> None:
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {optimizer!r}; accepted: "
                         + ", ".join(repr(o) for o in OPTIMIZERS))


def state_bytes_per_param(optimizer) -> int:
    check_optimizer(optimizer)
    return _STATE[optimizer]


def _launches(numels, lists: int) -> int:
    """Launches of one multi-tensor op over tensors of ``numels`` elements: a launch is
    full when it holds its maximum of tensors or of chunks (a tensor may span launches)."""
    max_t, launches, tensors, blocks = _MAX_TENSORS[lists], 0, 0, 0
    for n in numels:
        chunks = max(1, math.ceil(n / _CHUNK))
        tensors += 1
        while chunks:
            take = min(chunks, _MAX_BLOCKS - blocks)
            blocks += take
            chunks -= take
            if blocks == _MAX_BLOCKS or tensors == max_t:
                launches += 1
                blocks = 0
                tensors = 1 if chunks else 0
    return launches + (1 if tensors or blocks else 0)


def optimizer_passes(optimizer, numels) -> tuple:
    """The passes of one optimizer step over parameters of ``numels`` elements each (fp32):
    a tuple of :class:`OptimizerPass` (empty for ``None``)."""
    check_optimizer(optimizer)
    numels = [int(n) for n in numels]
    if any(n < 0 for n in numels):
        raise ValueError("parameter sizes must be non-negative")
    if optimizer is None or not numels:
        return ()
    total = sum(numels)
    return tuple(OptimizerPass(op=name, launches=_launches(numels, lists),
                               bytes=4 * (reads + writes) * total)
                 for name, lists, reads, writes in _PASSES[optimizer])
