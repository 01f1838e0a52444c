"""Low precision in the analysis: quantized inference (``analyze(quantize=)``) and FP8
training (``analyze(float8=)``).

Each analysis makes one state (:class:`QuantState` or :class:`Float8State`, in
``fxshape.report.build``) and passes it to the annotate pass (``annotate(quant=)``):
:func:`quantized_row` and :func:`float8_row` price a linear layer's GEMM as its engine runs
it (``fxshape.cost.quant``, ``fxshape.cost.float8``) and record the layers left in bf16 with
the reason; :func:`check_quantize` and :func:`check_float8` refuse what no engine runs, in one
line; :func:`fxshape.execution.quantized.quantized_parts` and ``float8_parts`` finish the report
(packed memory, the notes).
"""

from __future__ import annotations

import dataclasses

import torch

from ..cost.gemv import gemv_choice
from ..hardware.dtypes import canonical_dtype
from ..hardware.gpus import get_gpu, gpus_of_arch
from .ops import Gemm
from .rows import GemmRow

# GEMMs of a linear layer's weight: F.linear, and GPT-2's Conv1D (addmm / mm)
WEIGHT_CLASSES = ("Linear", "Conv1D")


@dataclasses.dataclass
class QuantState:
    """One analysis's quantization: the method, the layers kept in bf16 by rule (module ->
    reason, decided from the model) and those found on the way (filled by :func:`_row`)."""

    q: object
    keep: dict
    left: dict = dataclasses.field(default_factory=dict)


def quant_keep(model, q, tied: bool) -> dict:
    """module -> why it stays in bf16: the LM head under fp8, nvfp4 and mxfp8 (vLLM,
    TensorRT-LLM and ModelOpt leave it unquantized), or a head whose weight is the input
    embedding's (``tied``)."""
    get_out = getattr(model, "get_output_embeddings", None)
    head = get_out() if callable(get_out) else None
    if head is None:
        return {}
    name = next((n for n, mod in model.named_modules() if mod is head), None)
    if name is None:
        return {}
    if q.method == "fp8":
        return {name: "the LM head stays in bf16 (vLLM's and TensorRT-LLM's FP8 "
                      "checkpoints leave lm_head unquantized)"}
    if q.method in ("nvfp4", "mxfp8"):
        return {name: f"the LM head stays in bf16 (ModelOpt's {q.method.upper()} "
                      "checkpoints exclude lm_head)"}
    if tied:
        return {name: "its weight is the input embedding's (tied), which the embedding "
                      "lookup reads in bf16"}
    return {}


def quantized_row(node, g: Gemm, fqn, cls, phase, dkey, spec, state, gemv=None):
    """The row of a quantized linear layer's GEMM, or None when the layer stays in bf16
    (recorded in ``state.left`` with the reason). ``gemv``: how matrix-vector products run
    (``fxshape.cost.gemv``; None: the ``use_gemv`` context's choice)."""
    from ..cost.quant import (BLOCK_ALIGN_RULE, BLOCK_FORMATS, block_eligible, fp8_eligible,
                              predict_quantized)

    if g.attn is not None or phase != "forward":
        return None
    if g.op.startswith("grouped"):
        state.left[fqn or node.name] = ("expert GEMMs (grouped): quantized MoE kernels are not "
                                        "modelled")
        return None
    if not (g.op == "linear" or (g.op in ("mm", "addmm") and cls in WEIGHT_CLASSES)):
        return None
    # a decode capture wraps the model: its module names start with "model."
    name = fqn[len("model."):] if fqn.startswith("model.") and fqn not in state.keep else fqn
    reason = state.keep.get(fqn) or state.keep.get(name)
    q = state.q
    if reason is None and q.method == "fp8" and not fp8_eligible(g.n, g.k):
        reason = (f"K={g.k}, N={g.n}: FP8 GEMMs need multiples of 16 (torch._scaled_mm); "
                  "runs in bf16")
    if reason is None and q.method in BLOCK_FORMATS and not block_eligible(g.n, g.k, q.method):
        reason = (f"K={g.k}, N={g.n}: {q.method} GEMMs need multiples of "
                  f"{BLOCK_FORMATS[q.method][3]} ({BLOCK_ALIGN_RULE[q.method]}); runs in bf16")
    if reason is not None:
        state.left[fqn or node.name] = reason
        return None
    if q.method == "int4" and g.k % q.group_size:
        from ..cost.quant import GROUP_SIZES, PackingRefused

        raise PackingRefused(f"group_size={q.group_size} does not divide K={g.k} of "
                             f"{name or node.name}; accepted: a group size of "
                             f"{', '.join(str(x) for x in GROUP_SIZES if g.k % x == 0) or 'none'}"
                             " (of 32, 64, 128, 256) for this layer")
    qg = predict_quantized(max(g.m, 1), max(g.n, 1), max(g.k, 1), q, gpu=spec, dtype=dkey,
                           batch=max(g.batch, 1), op=g.op,
                           gemv=gemv_choice() if gemv is None else gemv,
                           layout=g.layout)
    p = qg.prediction
    flops = int(round(2 * g.batch * g.m * g.n * g.k * g.work))
    note = "; ".join(x for x in (g.note, qg.what) if x)
    return GemmRow(node=node.name, module=fqn, module_type=cls, op=g.op, phase=phase,
                   batch=g.batch, m=g.m, n=g.n, k=g.k, dtype=p.dtype, layout=g.layout,
                   work=g.work, note=note, flops=flops, time_s=p.time_s * g.work,
                   prediction=p, quant=q.key, kernels=qg.kernels)


@dataclasses.dataclass
class Float8State:
    """One training analysis under torchao's float8 (``analyze(float8=)``): the recipe, the
    converted linear layers (module names), those kept in bf16 by rule (module -> reason),
    those found on the way, each module's forward M (its tokens: what tells its wgrad from
    its dgrad) and the GEMMs converted."""

    recipe: str
    linears: frozenset
    keep: dict
    fp8_gather: bool
    left: dict = dataclasses.field(default_factory=dict)
    tokens: dict = dataclasses.field(default_factory=dict)
    converted: int = 0


def float8_state(model, recipe, plan):
    """The linear layers torchao's ``convert_to_float8_training`` converts as torchtitan
    calls it (``filter_fqns=["output"]``: the LM head stays in bf16; layers whose features
    are not multiples of 16 too), or that a Transformer Engine model builds as
    ``te.Linear`` (every linear layer but the LM head, as Megatron-LM's and llm-foundry's
    ``fc_type: te`` models do; a layer whose features are not multiples of 16 would raise
    in ``te.Linear`` and is priced as the ``nn.Linear`` it must stay, with a note)."""
    from ..cost.float8 import TE_RECIPES

    te = recipe in TE_RECIPES
    linears, keep = set(), {}
    head = None
    get_out = getattr(model, "get_output_embeddings", None)
    if callable(get_out):
        head = get_out()
    for name, mod in model.named_modules():
        if not isinstance(mod, torch.nn.Linear):
            continue
        if mod is head:
            keep[name] = ("the LM head stays in bf16 (Megatron-LM's output layer is not a "
                          "te.Linear)" if te else
                          "the LM head stays in bf16 (torchtitan's float8 "
                          "filter_fqns=['output'])")
        elif mod.in_features % 16 or mod.out_features % 16:
            keep[name] = (f"in {mod.in_features}, out {mod.out_features}: not multiples of "
                          "16 (te.Linear raises in FP8: keep it an nn.Linear)" if te else
                          f"in {mod.in_features}, out {mod.out_features}: not multiples of "
                          "16 (torchao's filter)")
        else:
            linears.add(name)
    return Float8State(recipe, frozenset(linears), keep,
                        fp8_gather=recipe == "tensorwise" and plan.zero == 3)


def float8_row(node, g: Gemm, fqn, cls, phase, dkey, spec, state):
    """The row of a converted linear layer's GEMM under float8 training, or None (bf16)."""
    from ..cost.float8 import alignment_rule, predict_float8, scaled_mm_eligible

    if g.attn is not None:
        return None
    if fqn in state.keep:
        state.left[fqn] = state.keep[fqn]
        return None
    if fqn not in state.linears or g.batch > 1:
        return None
    m, n, k = max(g.m, 1), max(g.n, 1), max(g.k, 1)
    if phase == "forward":
        role = "forward"
        state.tokens.setdefault(fqn, m)
    elif k == state.tokens.get(fqn) and m != k:
        role = "wgrad"
    else:
        role = "dgrad"
    if not scaled_mm_eligible(m, n, k, state.recipe):
        state.left[fqn] = (f"{role} GEMM M={m}, N={n}, K={k}: "
                           f"{alignment_rule(state.recipe)}")
        return None
    f8 = predict_float8(role, m, n, k, state.recipe, gpu=spec, layout=g.layout)
    state.converted += 1
    p = f8.prediction
    flops = int(round(2 * g.batch * g.m * g.n * g.k * g.work))
    note = "; ".join(x for x in (g.note, f8.what) if x)
    return GemmRow(node=node.name, module=fqn, module_type=cls, op=g.op, phase=phase,
                   batch=g.batch, m=g.m, n=g.n, k=g.k, dtype="fp8", layout=g.layout,
                   work=g.work, note=note, flops=flops,
                   time_s=p.time_s * g.work, prediction=p,
                   quant=f"float8:{state.recipe}:{role}", kernels=f8.kernels)


def check_quantize(quantize, group_size, mode, dtype, gpu):
    """The :class:`fxshape.cost.quant.Quantization` asked for (None for none), refused in
    one line where no engine runs it."""
    from ..cost.quant import quantization_of

    quant = quantization_of(quantize, group_size)
    if quant is None:
        return None
    if mode == "train":
        raise ValueError(f"quantize={quant.method!r} prices inference; mode 'train' "
                         "trains in dtype (weight-only int8/int4 cannot be trained; FP8 "
                         "training is float8='tensorwise' or 'rowwise'); accepted modes: "
                         "inference, prefill, decode")
    dkey = canonical_dtype(dtype)
    if dkey not in ("bf16", "fp16"):
        raise ValueError(f"quantize= keeps activations in bf16 or fp16; got dtype={dkey!r} "
                         "(accepted: bf16, fp16; quantize='fp8' sets the GEMMs' FP8 itself)")
    spec = get_gpu(gpu)
    if quant.method == "fp8" and spec.peaks.fp8 is None:
        raise ValueError(f"{spec.name} has no FP8 tensor cores: quantize='fp8' needs one "
                         "that has (Hopper, Ada, Blackwell, MI300X); accepted here: 'int8', "
                         "'int4'")
    if quant.method in ("nvfp4", "mxfp8"):
        from ..cost.quant import block_peak

        if block_peak(spec, quant.method) is None:
            ok = "'fp8', 'int8', 'int4'" if spec.peaks.fp8 is not None else "'int8', 'int4'"
            raise ValueError(f"{spec.name} has no block-scaled tensor cores: quantize="
                             f"{quant.method!r} needs Blackwell ({gpus_of_arch('blackwell')}); "
                             f"accepted here: {ok}")
    return quant


def check_float8(float8, mode, dtype, gpu, execution):
    """Refuse, in one line, a float8 training no run matches."""
    from ..cost.float8 import BLOCK_RECIPES, TE_RECIPES, recipe_label
    from ..cost.float8 import check_float8 as check_recipe

    check_recipe(float8)
    te = float8 in TE_RECIPES
    if mode != "train":
        raise ValueError(f"float8={float8!r} is {recipe_label(float8)}'s FP8 training; mode "
                         f"{mode!r} serves: give mode='train', or quantize='fp8' for "
                         "inference")
    if canonical_dtype(dtype) != "bf16":
        raise ValueError(f"float8 training keeps bf16 activations and master weights in "
                         f"mixed precision; got dtype={canonical_dtype(dtype)!r} (accepted: "
                         "bf16)")
    if execution != "compiled" and not te:
        raise ValueError(f"float8={float8!r} prices torchao under torch.compile (its casts "
                         "fused as Inductor runs them); give execution='compiled' (eager "
                         "torchao float8 runs its scaling as separate ops and is not "
                         "modelled), or a Transformer Engine recipe (te-delayed, "
                         "te-current), whose own kernels run eager")
    spec = get_gpu(gpu)
    if float8 in BLOCK_RECIPES and spec.arch != "blackwell":
        raise ValueError(f"float8={float8!r} needs Blackwell's block-scaled tensor cores; "
                         f"{spec.name} has none (accepted: {gpus_of_arch('blackwell')}; "
                         "elsewhere 'tensorwise', 'rowwise', 'te-delayed' or 'te-current')")
    if te and spec.vendor != "nvidia" and spec.peaks.fp8 is not None:
        raise ValueError(f"float8={float8!r} is NVIDIA Transformer Engine's; {spec.name} "
                         "is AMD's (TE's ROCm port is not modelled): accepted here "
                         "'tensorwise' or 'rowwise' (torchao)")
    if spec.peaks.fp8 is None:
        raise ValueError(f"{spec.name} has no FP8 tensor cores: float8 training needs "
                         "Hopper, Ada, Blackwell or MI300X (accepted: h100, h200, b200, "
                         "mi300x, l4, rtx-4090)")


