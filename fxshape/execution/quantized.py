"""What quantized inference and FP8 training do to the analysis's parts before the report is
built (moved out of ``fxshape.analysis.lowprec``, issue 53): the packed weights' memory and
the decode floor they lower (:func:`quantized_parts`), FP8 training's notes and its layers
left in bf16 (:func:`float8_parts`), FSDP's bytes per element under torchao's FP8 all-gather
(:func:`float8_gather`). The rows themselves are priced while the graph is annotated
(``fxshape.analysis.lowprec``).
"""

from __future__ import annotations

import dataclasses
import re

from ..analysis.lowprec import Float8State
from ..hardware.gpus import get_gpu

__all__ = ["quantized_parts", "float8_parts", "float8_gather"]


def float8_gather(model, stacks, item, state):
    """``{layer index or None: bytes per element}`` FSDP2 gathers each unit in under
    torchao's float8 all-gather (the converted weights in FP8, the rest in ``item``); None
    without it."""
    if not isinstance(state, Float8State) or not state.fp8_gather:
        return None
    from .pipeline import layer_of

    info = [(s.name, s.length) for s in stacks]
    total: dict = {}
    fp8: dict = {}
    for name, p in model.named_parameters():
        mod = name.rsplit(".", 1)[0]
        i = layer_of(mod, info)
        total[i] = total.get(i, 0) + p.numel()
        if mod in state.linears and name.endswith("weight"):
            fp8[i] = fp8.get(i, 0) + p.numel()
    return {i: (item * (t - fp8.get(i, 0)) + fp8.get(i, 0)) / t
            for i, t in total.items() if t and fp8.get(i)}


def float8_parts(parts, state):
    """A float8 training analysis's parts (``ReportParts``) with its notes (what was
    converted, what stayed in bf16) and the workload naming the recipe."""
    rows = [r for r in parts.rows if r.quant.startswith("float8")]
    by_role: dict = {}
    for r in rows:
        role = r.quant.rsplit(":", 1)[1]
        by_role[role] = by_role.get(role, 0) + 1
    from ..cost.float8 import BLOCK_RECIPES, TE_RECIPES, recipe_label

    casts = sum(r.kernels - 1 for r in rows)
    te = state.recipe in TE_RECIPES
    formats = ("e4m3 with an e8m0 scale per 32 elements" if state.recipe in BLOCK_RECIPES
               else "x, w e4m3; grad_y e5m2")
    how = (f"{recipe_label(state.recipe)}, te.Linear's kernels" if te
           else f"{recipe_label(state.recipe)}, torch.compile")
    gemm = "te.Linear's cuBLASLt FP8 GEMMs" if te else "torch._scaled_mm"
    notes = [f"float8 training ({how}): "
             + ", ".join(f"{n} {role}" for role, n in by_role.items())
             + f" GEMMs as {gemm} ({formats}), {casts} amax and cast "
               "kernels with them (fxshape.cost.float8); memory as the bf16 run"
             + ("; FSDP gathers the converted weights in FP8" if state.fp8_gather else "")
             + ("; the weights cast every forward (no is_first_microbatch cache)"
                if te else "")]
    notes.extend(_left_notes(state.left, parts.rows, decode=False))
    return dataclasses.replace(parts, notes=parts.notes + tuple(notes),
                               workload=dataclasses.replace(
                                   parts.workload, quantize=f"float8 {state.recipe}"))


def _left_notes(left: dict, rows, decode: bool) -> list:
    """``left in bf16: <modules>: <reason>`` lines. The layers of a stack priced once and
    copied (``dedup``) reach :func:`quantized_row` once: an unquantized row whose module
    is a kept module's sibling (the same name but the layer index) is kept for the same
    reason."""
    def shown_name(mod):
        # the decode wrapper's prefix, which the rows no longer carry
        return mod[len("model."):] if decode and mod.startswith("model.") else mod

    def sibling(mod):
        return re.sub(r"\.\d+\.", ".#.", mod)

    exact = {shown_name(m): why for m, why in left.items()}
    by_pattern = {sibling(m): why for m, why in exact.items()}
    by_reason: dict = {}
    seen = set()
    for mod in [r.module for r in rows if not r.quant and r.module] + list(exact):
        why = exact.get(mod) or by_pattern.get(sibling(mod))
        if why is None or mod in seen:
            continue
        seen.add(mod)
        by_reason.setdefault(why, []).append(mod)
    out = []
    for why, mods in by_reason.items():
        shown = ", ".join(mods[:4]) + (f" and {len(mods) - 4} more" if len(mods) > 4 else "")
        out.append(f"left in bf16: {shown}: {why}")
    return out


def quantized_parts(parts, state, model):
    """A quantized analysis's parts (``ReportParts``): memory with the packed weights, the
    notes saying what was quantized and what was not (and why), the workload naming it."""
    from ..cost.quant import packed_weight_bytes
    from .step import run_dtype

    q = state.q
    item = run_dtype(parts.dtype).itemsize
    rows = [r for r in parts.rows if r.quant]
    saved, seen = 0, set()
    for r in rows:
        key = (r.module or r.node, r.node)
        if key in seen:
            continue
        seen.add(key)
        b = max(r.batch, 1)
        saved += b * (r.k * r.n * item - packed_weight_bytes(r.k, r.n, q))
    notes = [f"linear layers {q.label}: {len(rows)} GEMMs quantized "
             f"(fxshape.cost.quant); weights {saved / 2**30:.2f} GiB smaller per GPU"]
    notes.extend(_left_notes(state.left, parts.rows,
                             decode=parts.workload.mode == "decode"))
    mem = parts.memory
    if mem is not None:
        memory = dataclasses.replace(mem, parameters=mem.parameters - saved,
                                     peak=mem.peak - saved)
        parts = dataclasses.replace(parts, memory=memory)
    step = parts.step
    if step is not None and parts.workload.mode == "decode" and step.floor_s:
        bw = get_gpu(parts.gpu).memory_bandwidth_gbs * 1e9
        step = dataclasses.replace(step, floor_s=step.floor_s - saved / bw)
    parts = dataclasses.replace(
        parts, step=step, notes=parts.notes + tuple(notes),
        workload=dataclasses.replace(parts.workload, quantize=q.label))
    if parts.workload.mode == "decode" and parts.capacity is not None:
        from .serving import capacity_of
        from ..tracing.facts import max_positions

        parts = dataclasses.replace(parts, capacity=capacity_of(
            parts, max_positions=max_positions(model.config)))
    return parts
