"""What each option of ``analyze`` did (issue 28): every option given with a value other than
its default is stated in the report (``report.options``), either with its effect or with
the reason it changed nothing; contradictions are refused before anything is captured.

An option is *given* when its value differs from the default the analysis would otherwise
use (``gpu="h100-sxm"`` is the default's own GPU; ``execution="cudagraphs"`` is decode's
default): a default changes nothing and is not listed. For a given option,
:func:`option_effects` reads the finished report and says what the option did
(``applied=True``) or why the report is the one without it (``applied=False``). The rules are
small pure functions, one per option, in :data:`RULES`; tests check both directions (an
applied option changes the report, one said to do nothing leaves its numbers unchanged).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["OptionEffect", "given_options", "option_effects", "RULES"]


@dataclass(frozen=True)
class OptionEffect:
    """One option given to ``analyze``: its name (the keyword), the value as given, what it
    did, and whether it changed the report (False: the report is what it would be without
    it, and ``effect`` says why)."""

    name: str
    value: str
    effect: str
    applied: bool

    def describe(self) -> str:
        head = f"{self.name}={self.value}"
        return f"{head}: {self.effect}" if self.applied else f"{head} has no effect: {self.effect}"

    def as_dict(self) -> dict:
        return {"name": self.name, "value": self.value, "effect": self.effect,
                "applied": self.applied}


def given_options(report, ctx: dict, setup, quant=None) -> dict:
    """The options of ``setup`` whose values differ from the defaults the analysis would
    have used (name -> value as given): a default spelt another way (``gpu="h100-sxm"``,
    decode's ``execution="cudagraphs"``, its ``context_len``, its ``allreduce="auto"``) is
    not given. ``quant``: the checked quantization (``fxshape.cost.quant.Quantization``)."""
    import os

    import torch

    from ..cost.gemm import is_default_params
    from ..hardware.dtypes import canonical_dtype
    from ..hardware.gpus import get_gpu
    from ..hardware.topology import default_topology, get_topology
    from ..tracing.export import DEFAULT_BATCH_SIZE

    kw = setup.keywords()
    spec = get_gpu(report.gpu)
    given: dict = {}
    if spec.name != get_gpu("h100").name:
        given["gpu"] = spec.name
    if report.dtype != canonical_dtype(torch.bfloat16):
        given["dtype"] = report.dtype
    if kw.get("batch_size") not in (None, DEFAULT_BATCH_SIZE):
        given["batch_size"] = kw["batch_size"]
    for name in ("seq_len", "page_size", "tp", "dp", "sequence_parallel", "parallel",
                 "recompute", "float8"):
        if name in kw:
            given[name] = kw[name]
    if kw.get("context_len", ctx.get("default_context_len")) != \
            ctx.get("default_context_len"):
        given["context_len"] = kw["context_len"]
    topology = kw.get("topology")
    if topology is not None and \
            get_topology(topology).name != default_topology(spec.name).name:
        given["topology"] = get_topology(topology).name
    if "optimizer" in kw:
        given["optimizer"] = str(kw["optimizer"])
    if kw.get("execution", ctx.get("default_execution", "eager")) != \
            ctx.get("default_execution", "eager"):
        given["execution"] = kw["execution"]
    if "attention" in kw:
        given["attention"] = kw["attention"]
    if "moe_routing" in kw:
        given["moe_routing"] = tuple(kw["moe_routing"])
    if "dedup" in kw:
        given["dedup"] = kw["dedup"]
    path = ctx.get("params_path")  # params=, $FXSHAPE_PARAMS or an enclosing use_params
    if path and not is_default_params(path):
        given["params"] = os.fspath(path)
    if "provenance" in kw:
        given["provenance"] = str(kw["provenance"])
    if report.workload.kv_dtype is not None:
        given["kv_dtype"] = report.workload.kv_dtype
    if kw.get("allreduce", ctx.get("default_allreduce")) != ctx.get("default_allreduce"):
        given["allreduce"] = kw["allreduce"]
    if kw.get("gemv", "library") != "library":
        given["gemv"] = kw["gemv"]
    if quant is not None:
        given["quantize"] = quant.key
        if "group_size" in kw:
            given["group_size"] = kw["group_size"]
    return given


def _communication(report) -> list:
    return [o for o in report.ops if o.cls == "communication"] or \
        list(getattr(report.step, "communication", ()) or ())


def _gpu(v, report, ctx):
    return True, f"predicted on {report.gpu}"


def _dtype(v, report, ctx):
    return True, f"GEMMs in {report.dtype}"


def _batch_size(v, report, ctx):
    return True, f"{report.workload.batch_size} sequences a step"


def _seq_len(v, report, ctx):
    return True, f"{report.workload.seq_len} tokens a sequence"


def _context_len(v, report, ctx):
    return True, f"a KV cache of {report.workload.context_len} tokens a sequence"


def _tp(v, report, ctx):
    from ..analysis.parallel import layer_kind

    sharded = sum(1 for r in report.rows
                  if layer_kind(r.module, r.op, r.n, r.k) != "replicated")
    comm = _communication(report)
    return True, (f"{sharded} of {len(report.rows)} GEMMs split over {v} GPUs, "
                  f"{len(comm)} collectives")


def _sequence_parallel(v, report, ctx):
    return True, "each tensor-parallel all-reduce a reduce-scatter and an all-gather; norms " \
                 "and residuals split over the GPUs"


def _dp(v, report, ctx):
    if report.workload.mode == "train":
        return True, (f"the gradient all-reduce over {v} replicas; tokens/s is one "
                      "replica's")
    return False, ("inference replicas do not communicate: the step, its tokens/s and the "
                   "memory are one replica's")


def _topology(v, report, ctx):
    comm = _communication(report)
    if comm:
        return True, f"{len(comm)} collectives placed on {v}"
    return False, "no collective to place (tp 1, and no data-parallel gradient all-reduce)"


def _optimizer(v, report, ctx):
    if report.workload.mode != "train":
        return False, f"mode {report.workload.mode!r} has no optimizer step"
    return True, "no optimizer step" if v == "None" else f"the {v} optimizer step"


def _execution(v, report, ctx):
    return True, f"the step runs {report.step.execution}"


def _attention(v, report, ctx):
    kernels = report.workload.kernels
    if not kernels:
        return False, ("the graph has no fused attention call (scaled_dot_product_attention) "
                       "to predict as a kernel")
    if ctx.get("flash_kernel") == ctx.get("attention_kernel"):
        return False, f"{v} is the kernel 'flash' (the default) runs on {report.gpu}"
    return True, f"attention predicted as {', '.join(kernels)}"


def _moe_routing(v, report, ctx):
    return True, "expert GEMMs routed by the given fractions"


def _dedup(v, report, ctx):
    if ctx.get("stacks"):
        return True, "every layer traced (the rows equal the one-layer-per-group trace's)"
    return False, "the model has no group of identical layers to trace once"


def _params(v, report, ctx):
    if ctx.get("params_cover_gpu"):
        return True, "GEMM model constants from the file"
    return False, f"the file has no GEMM constants for {report.gpu}: the packaged ones are used"


def _provenance(v, report, ctx):
    if report.workload.mode == "decode":
        return False, "a decode step's dimensions are not traced to what sets them (the " \
                      "step is captured through the static-cache wrapper, which no re-trace " \
                      "varies)"
    return True, ("dimensions matched to hyperparameters by value" if v == "matched"
                  else "no dimension traced to what sets it")


def _kv_dtype(v, report, ctx):
    return True, f"KV cache in {report.workload.kv_dtype}"


def _page_size(v, report, ctx):
    w = report.workload
    pages = -(-w.context_len // w.page_size)
    return True, (f"a paged KV cache: {pages} page(s) of {w.page_size} tokens a sequence "
                  "(memory holds whole pages)")


def _parallel(v, report, ctx):
    w, plan = report.workload, ctx["plan"]
    if not plan.is_plain:  # a pipeline, ZeRO or micro-batches: the step played out
        return True, f"the step played out under {w.parallel}" + (
            f"; the slowest {report.step.critical}" if report.step.critical else "")
    # only tensor and data parallelism: what its shorthands would say
    got = [(name, rule(str(getattr(plan, name)), report, ctx))
           for name, rule, default in (("tp", _tp, 1), ("dp", _dp, 1),
                                       ("sequence_parallel", _sequence_parallel, False))
           if getattr(plan, name) != default]
    if plan.grad_dtype != "fp32":  # training only (fxshape.parallelism.plan.check_mode)
        got.append(("grad_dtype", (True, f"gradients held and reduced in {plan.grad_dtype}")))
    if not plan.reshard_after_forward:
        got.append(("reshard_after_forward", (False, "keeps ZeRO-3's gathered parameters "
                                                     "after the forward; without zero=3 "
                                                     "nothing is gathered")))
    return any(a for _, (a, _) in got), "; ".join(f"{n}: {e}" for n, (_, e) in got)


def _recompute(v, report, ctx):
    if v == "full":
        return True, "every layer's forward re-run in its backward"
    freed = any(n.startswith("selective recomputation:") for n in report.memory.notes)
    return True, "the attention core re-run in each layer's backward" + (
        ", its scores and probabilities not kept" if freed else
        " (a fused attention kernel keeps only its output and log-sum-exp: no memory freed)")


def _allreduce(v, report, ctx):
    ars = [o for o in report.ops if o.cls == "communication" and o.op == "tp all_reduce"]
    if not ars:
        return False, "no tensor-parallel all-reduce (tp 1, or sequence parallelism's " \
                      "reduce-scatter and all-gather)"
    ran = sorted({o.family for o in ars})
    return True, f"{len(ars)} tp all-reduces run as {', '.join(ran)} under CUDA graphs"


def _gemv(v, report, ctx):
    from ..cost.gemv import GEMV_KERNEL

    n = sum(1 for r in report.rows if r.prediction.kernel == GEMV_KERNEL)
    if not n:
        return False, "no GEMM with M = 1 or N = 1 that Inductor decomposes"
    return True, f"{n} matrix-vector products as Inductor's Triton reductions"


def _quantize(v, report, ctx):
    rows = [r for r in report.rows if r.quant]
    if not rows:
        return False, "no linear layer could be quantized (each is listed in the notes)"
    left = ctx.get("quant_left") or {}
    return True, (f"{len(rows)} linear-layer GEMMs {report.workload.quantize}"
                  + (f"; {len(left)} left in bf16 (notes say why)" if left else ""))


def _group_size(v, report, ctx):
    n = sum(1 for r in report.rows if r.quant.startswith("int4"))
    if not n:
        return False, "no int4 layer"
    return True, f"{n} int4 GEMMs with a scale and zero per {v} elements of K"


def _float8(v, report, ctx):
    rows = [r for r in report.rows if r.quant.startswith("float8")]
    if not rows:
        return False, "no linear layer could be converted (the notes say why)"
    from ..cost.float8 import recipe_label

    return True, f"{len(rows)} linear-layer GEMMs in FP8 as {recipe_label(v)} runs them"


#: one rule per option of ``analyze``: (value shown, report, context) -> (applied, effect)
RULES = {"allreduce": _allreduce, "gpu": _gpu, "dtype": _dtype, "batch_size": _batch_size, "seq_len": _seq_len,
         "context_len": _context_len, "tp": _tp, "sequence_parallel": _sequence_parallel,
         "dp": _dp, "topology": _topology, "optimizer": _optimizer, "execution": _execution,
         "attention": _attention, "moe_routing": _moe_routing, "dedup": _dedup,
         "params": _params, "provenance": _provenance, "kv_dtype": _kv_dtype,
         "page_size": _page_size, "parallel": _parallel, "recompute": _recompute,
         "gemv": _gemv, "quantize": _quantize,
         "group_size": _group_size, "float8": _float8}


def option_effects(report, given: dict, ctx: dict) -> tuple:
    """An :class:`OptionEffect` for each option in ``given`` (name -> value, only those that
    differ from their defaults), in :data:`RULES` order. ``ctx``: what the analysis knew
    beyond the report (``stacks``, ``flash_kernel``, ``attention_kernel``,
    ``params_cover_gpu``)."""
    out = []
    for name, rule in RULES.items():
        if name in given:
            shown = _shown(given[name])
            applied, effect = rule(shown, report, ctx)
            out.append(OptionEffect(name, shown, effect, applied))
    return tuple(out)


def _shown(v) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(f"{x:g}" if isinstance(x, float) else str(x) for x in v) + "]"
    return str(v)
