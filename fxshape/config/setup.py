"""What an analysis is asked to predict: :class:`Setup`, composed of a :class:`Workload`, a
:class:`~fxshape.parallelism.plan.Parallel`, a :class:`Machine` and :class:`Kernels`.

Every keyword of ``fxshape.analyze`` is a field of one of them, by the same name
(:data:`KEYWORDS`), and :meth:`Setup.from_keywords` is the one place that translates them
(``tp``, ``dp``, ``sequence_parallel`` and ``recompute`` are the plan's shorthands; ``parallel``
is the whole plan). A field's metadata says what it is (``doc``: its help text, the one
``analyze``'s docstring and the command line show) and whether it changes the capture
(``capture``): :meth:`Setup.capture_key` is derived from that, never listed by hand.
:meth:`Setup.given` says which fields differ from their defaults, what ``report.options``
reports on (``fxshape.report.options``).

Each object refuses a bad value of its own fields when it is built, in one line that names
what is accepted; :class:`Setup` refuses the contradictions between them. What needs the
model (its heads for ``tp``, its decoder for ``mode="decode"``, its layers for a pipeline)
or the analysis's rules (a quantization's formats on the GPU) is checked by the analysis.

    >>> s = Setup.from_keywords(mode="train", gpu="a100", tp=2)
    >>> s
    Setup(mode='train', gpu='a100', tp=2)
    >>> s.replace(seq_len=512).workload.seq_len
    512
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from dataclasses import dataclass, field, fields

import torch

from ..cost.allreduce import ALGORITHMS, check_algorithm
from ..cost.attention import ATTENTION_CHOICES
from ..cost.decode_attention import check_page_size
from ..cost.float8 import FLOAT8_RECIPES
from ..cost.gemm import params_in_force
from ..cost.gemv import GEMV_CHOICES, check_gemv
from ..cost.optimizer import OPTIMIZERS, check_optimizer
from ..cost.quant import GROUP_SIZES, QUANT_METHODS
from ..hardware.dtypes import canonical_dtype, kv_format
from ..hardware.gpus import get_gpu
from ..hardware.topology import get_topology, topology_for
from ..parallelism.plan import Parallel, check_mode, check_recompute, parallel_of
from ..tracing.export import check_size

__all__ = ["Setup", "Workload", "Machine", "Kernels", "KEYWORDS", "MODES", "EXECUTIONS",
           "PROVENANCE_CHOICES", "check_execution", "keyword_docs", "keyword_defaults",
           "signature_with_keywords", "takes_setup", "setup_field"]

#: what ``analyze`` can describe (``"prefill"`` is ``"inference"``: a prompt's forward)
MODES = ("inference", "prefill", "train", "decode")
#: how the model runs: ``"eager"`` (one kernel per aten op, the host dispatching each),
#: ``"compiled"`` (``torch.compile``: Inductor's fused kernels, launched by its wrapper),
#: ``"cudagraphs"`` (``torch.compile(mode="reduce-overhead")``: the same kernels replayed
#: as CUDA graphs, one launch per graph; ``fxshape.execution.step``)
EXECUTIONS = ("eager", "compiled", "cudagraphs")
#: how ``analyze`` decides what sets each GEMM dimension
PROVENANCE_CHOICES = ("traced", "matched", None)


def check_execution(execution) -> None:
    if execution not in EXECUTIONS:
        raise ValueError(f"unknown execution {execution!r}; accepted: "
                         + ", ".join(repr(e) for e in EXECUTIONS))


def _opt(default, doc: str, *, capture: bool = False, compare: bool = True, choices=None,
         parse=None):
    """A field with its help text, whether it changes the capture, and what the command
    line's flag for it accepts (``choices``, or a ``parse`` function from text; else the
    field's annotation says: a size is a positive integer, anything else text)."""
    meta = {"doc": " ".join(doc.split()), "capture": capture}
    if choices is not None:
        meta["choices"] = tuple(choices)
    if parse is not None:
        meta["parse"] = parse
    return field(default=default, compare=compare, metadata=meta)


def _topology_name(text: str) -> str:
    """A machine's name as the command line gives it, checked (``"dgx-h100:2"``)."""
    get_topology(text)
    return text


@dataclass(frozen=True)
class Workload:
    """What runs: the mode, the sizes of synthesized inputs (or the inputs), the KV cache
    of a decode step, the MoE routing."""

    mode: str | None = _opt(None, """
        ``"inference"`` (the default; forward GEMMs; ``"prefill"`` is the same: a prompt of
        ``seq_len`` tokens), ``"train"`` (forward and backward GEMMs as autograd runs them,
        from the joint graph; rows carry ``phase``) or ``"decode"`` (one new token per
        sequence over a static KV cache of ``context_len`` tokens, captured through
        ``fxshape.tracing.decode``; GEMMs have M = batch; ``report.memory.kv_cache``).""",
        capture=True, choices=MODES)
    batch_size: int | None = _opt(None, "sizes of synthesized inputs: sequences a step "
                                  "(default 1).", capture=True)
    seq_len: int | None = _opt(None, "sizes of synthesized inputs: tokens a sequence "
                               "(default 1024, capped at the model's positions).",
                               capture=True)
    context_len: int | None = _opt(None, """
        for ``mode="decode"``, the tokens already in the KV cache (default 1024, capped at
        the model's positions).""", capture=True)
    kv_dtype: object = _opt(None, """
        for ``mode="decode"``, the KV cache's dtype when it is not ``dtype``
        (``torch.float8_e4m3fn``, ``"fp8"``: half the cache's bytes; ``"int8"``, the same
        bytes; ``"nvfp4"``, Blackwell only: 0.5625 bytes an element,
        ``fxshape.hardware.dtypes.kv_format``); the cache's memory and the attention's reads
        use it.""", capture=True)
    page_size: int | None = _opt(None, """
        for ``mode="decode"``, tokens per page of a paged KV cache (vLLM's 16, FlashInfer's
        1 to 128); default a contiguous cache. Memory holds whole pages.""", capture=True)
    moe_routing: object = _opt(None, """
        for MoE layers, the fraction of routed rows each expert gets (one per expert,
        summing to 1). Default: balanced routing, said in each row's note.""", capture=True)
    #: the forward's arguments when given (``analyze``'s positional arguments); the sizes
    #: above are then the inputs', and no capture is shared
    example_inputs: object = _opt(None, "the forward's positional arguments (default: "
                                  "synthesized for Hugging Face models).", compare=False)
    example_kwargs: object = _opt(None, "the forward's keyword arguments.", compare=False)

    def __post_init__(self):
        if self.mode not in MODES and self.mode is not None:
            raise ValueError(f"unknown mode {self.mode!r}; accepted: "
                             + ", ".join(repr(m) for m in MODES))
        check_size("batch_size", self.batch_size)
        check_size("seq_len", self.seq_len)
        check_page_size(self.page_size)
        if self.kv_dtype is not None:
            kv_format(self.kv_dtype)
        given = [n for n in ("batch_size", "seq_len") if getattr(self, n) is not None]
        if given and self.mode != "decode" and \
                (self.example_inputs is not None or self.example_kwargs is not None):
            raise ValueError(f"{' and '.join(given)} "
                             f"{'set the sizes' if len(given) > 1 else 'sets the size'} of "
                             "synthesized inputs, but example inputs were given (their sizes "
                             "are used): drop one or the other")
        if self.run_mode != "decode":
            for name, what in (("context_len", "the tokens in the KV cache"),
                               ("kv_dtype", "the KV cache's dtype"),
                               ("page_size", "the KV cache's page size")):
                if getattr(self, name) is not None:
                    raise ValueError(f"{name} is for mode='decode' ({what}); mode "
                                     f"{self.run_mode!r} has no KV cache")

    @property
    def run_mode(self) -> str:
        """The mode as run: ``"inference"`` when none was given."""
        return "inference" if self.mode is None else self.mode


@dataclass(frozen=True)
class Machine:
    """Where it runs: the GPU (with its power limit: ``"h100-sxm@500w"``), the machine the
    GPUs are in, and the constants the cost models use."""

    gpu: object = _opt("h100", """GPU name or alias, or a :class:`fxshape.GPUSpec` (default
        ``"h100"``; ``fxshape gpus`` lists them).""", capture=True)
    topology: object = _opt(None, """
        the machine the GPUs are in (``fxshape.hardware.topology.TOPOLOGIES``:
        ``"dgx-h100"``, ``"dgx-a100"``, ``"pairwise-a100"``, ``"pcie4"`` ...); default: the
        one ``gpu`` usually comes in. ``tp`` must fit in one of its nodes.""",
        capture=True, parse=_topology_name)
    params: object = _opt(None, """
        a parameter file (e.g. written by ``fxshape calibrate``) whose constants replace the
        packaged ones for the GPUs it has, or a library generation (``"2024"``: the
        2022-2024 fits, before the GPUs were refitted to today's libraries); default
        ``$FXSHAPE_PARAMS`` if set, else the packaged constants. A non-packaged file is
        named in ``report.notes``.""", capture=True)

    def __post_init__(self):
        topology_for(get_gpu(self.gpu), self.topology)
        if self.params is not None:
            params_in_force(self.params)  # a bad file or name: its one-line error, here

    @property
    def spec(self):
        """The :class:`fxshape.GPUSpec`, priced with the constants of ``params`` (or the
        file in force when it is None: ``use_params``, ``$FXSHAPE_PARAMS``, the packaged
        one), which every cost model reads from it (``GPUSpec.constants``)."""
        return get_gpu(self.gpu).with_constants(params_in_force(self.params))


@dataclass(frozen=True)
class Kernels:
    """Which kernels run: the dtype, how the step executes, and the attention, GEMV,
    all-reduce, optimizer, quantization and FP8 kernels."""

    dtype: object = _opt(torch.bfloat16, """
        the dtype the GEMMs run in, as under autocast (default ``torch.bfloat16``).""",
        capture=True)
    execution: str | None = _opt(None, """
        how the step runs: ``"eager"`` (the default, but for decode: one kernel per aten op
        as eager PyTorch launches them, each dispatched by the host;
        ``fxshape.execution.step``), ``"compiled"`` (``torch.compile``: Inductor's fusion
        groups, ``fxshape.execution.fusion``) or ``"cudagraphs"`` (``torch.compile(mode=
        "reduce-overhead")``: the same kernels replayed as CUDA graphs; the default for
        decode, as serving engines run it).""", capture=True, choices=EXECUTIONS)
    attention: str = _opt("flash", """
        the kernel ``scaled_dot_product_attention`` calls are predicted as: ``"flash"``
        (default: what PyTorch runs on ``gpu``, FlashAttention-2 on Ampere and Hopper),
        ``"fa2"``, ``"fa3"`` (FlashAttention-3, Hopper only) or ``"math"`` (unfused, as
        ``attn_implementation="eager"`` runs). Rows carry ``kernel``.""",
        capture=True, choices=ATTENTION_CHOICES)
    gemv: str | None = _opt(None, """
        how GEMMs with ``M = 1`` or ``N = 1`` run (``fxshape.cost.gemv``): ``"library"``
        (the default: the BLAS library's GEMM kernel) or ``"inductor"`` (``torch.compile``
        with ``coordinate_descent_tuning``, as gpt-fast sets it: Inductor decomposes them
        into one Triton reduction that streams the weight; needs ``execution="compiled"``
        or ``"cudagraphs"``).""", capture=True, choices=GEMV_CHOICES)
    allreduce: str | None = _opt(None, """
        how tensor parallelism's all-reduces run (``fxshape.cost.allreduce``): ``"auto"``
        (what vLLM does: its one-shot / two-shot kernel for small buffers on NVLink,
        symmetric memory's multimem for larger ones on Hopper and Blackwell NVSwitch, NCCL
        otherwise; the default of ``mode="decode"``), ``"one-shot"``, ``"two-shot"``,
        ``"multimem"`` or ``"nccl"`` (NCCL's LL / LL128 / Simple protocol by size), all
        under CUDA graphs. Default in other modes: NCCL as measured from eager PyTorch
        (``fxshape.cost.comm``).""", choices=ALGORITHMS)
    optimizer: str | None = _opt("adamw", """
        in ``mode="train"``, the optimizer step included in ``report.step``: ``"adamw"``
        (default: ``torch.optim.AdamW``'s foreach implementation), ``"adamw-fused"``,
        ``"sgd"`` or ``None`` (``fxshape.cost.optimizer``).""", choices=OPTIMIZERS)
    quantize: object = _opt(None, """
        the linear layers quantized as an inference engine runs them (``fxshape.cost.quant``):
        ``"int8"`` or ``"int4"`` (weight-only, as gpt-fast and torchao: activations stay in
        ``dtype``), ``"fp8"`` (FP8 weights and activations, ``torch._scaled_mm``; Hopper,
        Ada, Blackwell), ``"nvfp4"`` or ``"mxfp8"`` (Blackwell's block-scaled weights and
        activations) or a :class:`fxshape.cost.quant.Quantization` (fp8 with
        ``activations="static"``). Inference, prefill and decode only. Each quantized row
        carries ``quant``; the layers left in bf16 (the LM head under fp8, nvfp4 and mxfp8,
        dimensions the format cannot take) are in ``report.notes`` with the reason;
        ``report.memory`` holds the packed weights.""", capture=True, choices=QUANT_METHODS)
    group_size: int | None = _opt(None, """
        for ``quantize="int4"``, elements of K per scale and zero (32, 64, 128, 256; default
        128); must divide every quantized layer's K.""", capture=True, choices=GROUP_SIZES)
    float8: str | None = _opt(None, """
        in ``mode="train"``, FP8 training as torchao's ``convert_to_float8_training`` runs
        it under ``torch.compile`` (``fxshape.cost.float8``): ``"tensorwise"`` or
        ``"rowwise"``; ``"mxfp8"`` (Blackwell): torchao's MX training. Transformer
        Engine's ``te.Linear``: ``"te-delayed"``, ``"te-current"``, ``"te-mxfp8"``
        (Blackwell). Every linear layer but the LM head; rows carry ``quant``.""",
        capture=True, choices=FLOAT8_RECIPES)

    def __post_init__(self):
        canonical_dtype(self.dtype)
        if self.execution is not None:
            check_execution(self.execution)
        check_optimizer(self.optimizer)
        if self.allreduce is not None:
            check_algorithm(self.allreduce)
        if self.gemv is not None:
            check_gemv(self.gemv)
        if self.float8 is not None and self.quantize is not None:
            raise ValueError("float8= trains in FP8, quantize= serves quantized layers: give "
                             "one of them")


#: the plan's fields ``analyze`` takes as keywords of their own (the rest through
#: ``parallel=``)
_PLAN_SHORTHANDS = ("tp", "dp", "sequence_parallel", "recompute")

_PLAN_DOCS = {
    "tp": "Megatron-style tensor-parallel degree: per-GPU shapes "
          "(``fxshape.analysis.parallel``); must divide the number of attention heads.",
    "dp": "data-parallel degree: in training, the gradient all-reduce (DDP's 25 MiB "
          "buckets, overlapped with the backward; only the exposed part counts).",
    "sequence_parallel": "with ``tp`` > 1, Megatron's sequence parallelism (each "
                         "all-reduce a reduce-scatter and an all-gather).",
    "recompute": "in ``mode=\"train\"``, activation recomputation: ``None`` (what the model "
                 "says: Hugging Face's ``gradient_checkpointing_enable()`` is "
                 "``\"full\"``), ``\"full\"``, ``\"selective\"`` (Megatron's attention core) "
                 "or ``\"op\"`` (torchtitan's op-level selective checkpointing).",
    "parallel": "the whole parallel plan (:class:`fxshape.Parallel`: tp, pp, dp, cp, ep, "
                "ZeRO/FSDP, micro-batches, the pipeline schedule, the recomputation); "
                "``tp``, ``dp``, ``sequence_parallel`` and ``recompute`` are its shorthands. "
                "``batch_size`` is then the micro-batch of one data-parallel rank.",
}

_SECTIONS = ("workload", "machine", "kernels")


@dataclass(frozen=True)
class Setup:
    """Everything an analysis is asked: what runs (:class:`Workload`), under which plan
    (:class:`~fxshape.parallelism.plan.Parallel`), where (:class:`Machine`), with which
    kernels (:class:`Kernels`), and how the analysis itself works (``dedup``,
    ``provenance``). ``analyze(model, setup=...)``; its keywords build one
    (:meth:`from_keywords`)."""

    workload: Workload = field(default_factory=Workload)
    parallel: Parallel = field(default_factory=Parallel)
    machine: Machine = field(default_factory=Machine)
    kernels: Kernels = field(default_factory=Kernels)
    dedup: bool = _opt(True, """
        trace one representative of each group of identical layers and give every layer
        its representative's rows (``fxshape.tracing.dedup``); the rows equal the full
        trace's. ``False`` traces every layer. ``report.notes`` says which was done.""",
        capture=True)
    provenance: str | None = _opt("traced", """
        how each row's ``set_by`` (what sets M, N and K) is decided: ``"traced"`` (default:
        by cause; the model is re-traced with one hyperparameter or input size changed at a
        time, at reduced depth; ``row.causes`` lists those; ``fxshape.analysis.perturb``),
        ``"matched"`` (by value against the config and input sizes, no re-capture: faster,
        but values that coincide can be confused) or ``None`` (not decided).""",
        choices=PROVENANCE_CHOICES)

    def __post_init__(self):
        for name, kind in (("workload", Workload), ("parallel", Parallel),
                           ("machine", Machine), ("kernels", Kernels)):
            if not isinstance(getattr(self, name), kind):
                raise ValueError(f"Setup.{name} must be a {kind.__name__}, got "
                                 f"{type(getattr(self, name)).__name__}")
        if self.provenance not in PROVENANCE_CHOICES:
            raise ValueError(f"unknown provenance {self.provenance!r}; accepted: "
                             + ", ".join(repr(p) for p in PROVENANCE_CHOICES))
        mode, plan, k = self.workload.run_mode, self.parallel, self.kernels
        if plan.sequence_parallel and mode == "decode":
            raise ValueError("sequence_parallel splits the sequence of a training or prefill "
                             "step; a decode step has one token per sequence: drop it, or use "
                             "mode='prefill'")
        check_mode(plan, mode)
        check_recompute(plan.recompute, mode)
        if plan.async_tp and k.execution not in ("compiled", "cudagraphs"):
            raise ValueError("Parallel(async_tp=True) is torch.compile's micro-pipeline TP "
                             "pass (torchtitan's async TP): give execution='compiled' (eager "
                             "PyTorch runs the collectives unfused: async_tp=False)")
        if k.gemv == "inductor" and (k.execution == "eager" or
                                     (k.execution is None and mode != "decode")):
            raise ValueError("gemv='inductor' is torch.compile's decomposition of "
                             "matrix-vector products; give execution='compiled' or "
                             "'cudagraphs' (eager PyTorch runs the library's GEMM)")

    # --- keywords ------------------------------------------------------------------------

    @classmethod
    def from_keywords(cls, **keywords) -> "Setup":
        """The setup ``analyze``'s keywords describe: each is the field of that name
        (:data:`KEYWORDS`); ``tp``, ``dp``, ``sequence_parallel`` and ``recompute`` are the
        plan's shorthands (not with a ``parallel`` that sets them otherwise)."""
        return cls().replace(**keywords)

    def replace(self, **keywords) -> "Setup":
        """This setup with the fields of those keywords changed (the keywords of
        ``analyze``); an unknown keyword is a ``TypeError`` naming the accepted ones."""
        unknown = sorted(set(keywords) - set(KEYWORDS))
        if unknown:
            raise TypeError(f"unexpected keyword {unknown[0]!r}; accepted: "
                            + ", ".join(sorted(KEYWORDS)))
        plan = self.parallel
        if "parallel" in keywords or any(k in keywords for k in _PLAN_SHORTHANDS):
            plan = _plan_of(self.parallel, keywords)
        parts = {"parallel": plan}
        for section in _SECTIONS:
            mine = {k: v for k, v in keywords.items() if KEYWORDS[k] == section}
            if mine:
                parts[section] = dataclasses.replace(getattr(self, section), **mine)
        top = {k: v for k, v in keywords.items() if KEYWORDS[k] == "setup"}
        return dataclasses.replace(self, **parts, **top)

    def keywords(self) -> dict:
        """The keywords that rebuild this setup, those that differ from the defaults
        (``Setup.from_keywords(**s.keywords()) == s``)."""
        out = {}
        for name, section in KEYWORDS.items():
            if section == "parallel":
                continue
            value = getattr(self._section(section), name)
            f = _FIELDS[name]
            if f.compare and not _same(value, f.default):
                out[name] = value
        plan, default = dataclasses.replace(self.parallel, recompute=None), Parallel()
        if any(getattr(plan, f.name) != getattr(default, f.name) for f in fields(Parallel)
               if f.name not in _PLAN_SHORTHANDS):
            out["parallel"] = plan  # more than its shorthands say
        else:
            for name in ("tp", "dp", "sequence_parallel"):
                if getattr(plan, name) != getattr(default, name):
                    out[name] = getattr(plan, name)
        if self.parallel.recompute is not None:
            out["recompute"] = self.parallel.recompute
        return out

    def _section(self, section: str):
        return self if section == "setup" else getattr(self, section)

    # --- what changes the capture ----------------------------------------------------------

    def capture_key(self) -> tuple:
        """What the capture depends on: every field whose metadata says ``capture``, with
        names normalised (the GPU's label, the canonical dtype, the resolved topology), or
        None where the inputs were given (a capture of them is not shared)."""
        w = self.workload
        if w.example_inputs is not None or w.example_kwargs is not None:
            return None
        key = []
        for name, section in KEYWORDS.items():
            if section == "parallel" or not _FIELDS[name].metadata.get("capture"):
                continue
            key.append((name, _normalised(name, getattr(self._section(section), name),
                                          self)))
        for f in fields(Parallel):
            if f.metadata.get("capture"):
                key.append((f.name, getattr(self.parallel, f.name)))
        return tuple(key)

    def __repr__(self) -> str:
        """``Setup(mode='train', tp=2, gpu='a100')``: the keywords that differ from the
        defaults."""
        return "Setup(" + ", ".join(f"{k}={v!r}" for k, v in self.keywords().items()) + ")"

    def describe(self) -> str:
        """One line: every keyword that differs from its default, or ``defaults``."""
        kw = self.keywords()
        return "; ".join(f"{k} {v}" for k, v in kw.items()) if kw else "defaults"


def _plan_of(plan: Parallel, keywords: dict) -> Parallel:
    """The plan from ``parallel=`` and its shorthands (``parallel_of`` refuses a plan and
    shorthands that set it otherwise); without ``parallel=``, the shorthands change
    ``plan``."""
    if "parallel" in keywords:
        out = parallel_of(keywords["parallel"], tp=keywords.get("tp", 1),
                          dp=keywords.get("dp", 1),
                          sequence_parallel=keywords.get("sequence_parallel", False))
    else:
        sh = {k: keywords.get(k, getattr(plan, k)) for k in ("tp", "dp", "sequence_parallel")}
        parallel_of(None, **sh)  # the shorthands' own one-line refusals
        out = dataclasses.replace(plan, **sh)
    if "recompute" in keywords:
        recompute = keywords["recompute"]
        if "parallel" not in keywords:
            out = dataclasses.replace(out, recompute=recompute)
        elif recompute is not None:
            if out.recompute not in (None, recompute):
                raise ValueError(f"recompute={recompute!r} and Parallel(recompute="
                                 f"{out.recompute!r}) disagree: give one of them")
            out = dataclasses.replace(out, recompute=recompute)
    return out


def _same(value, default) -> bool:
    if default is None or value is None:
        return value is default
    try:
        return bool(value == default)
    except (RuntimeError, ValueError):  # a tensor
        return False


def _normalised(name: str, value, setup: Setup):
    """A capture field's value as the key holds it."""
    if name == "gpu":
        return get_gpu(value).label
    if name == "dtype":
        return canonical_dtype(value)
    if name == "topology":
        return topology_for(setup.machine.spec, value)
    if name == "moe_routing" and isinstance(value, list):
        return tuple(value)
    if name == "quantize" and value is not None and not isinstance(value, str):
        return repr(value)
    return value


#: every keyword of ``analyze``: the section whose field it is ("setup": the setup's own;
#: "parallel": the plan's shorthands and the plan)
KEYWORDS: dict = {}
_FIELDS: dict = {}
for _section, _cls in (("workload", Workload), ("machine", Machine), ("kernels", Kernels)):
    for _f in fields(_cls):  # the inputs too: analyze's positional arguments, or replace()
        KEYWORDS[_f.name] = _section
        _FIELDS[_f.name] = _f
for _f in fields(Setup):
    if _f.name in ("dedup", "provenance"):
        KEYWORDS[_f.name] = "setup"
        _FIELDS[_f.name] = _f
for _name in _PLAN_SHORTHANDS + ("parallel",):
    KEYWORDS[_name] = "parallel"


def setup_field(name: str):
    """The ``dataclasses.Field`` of the keyword ``name`` (a field of the workload, machine,
    kernels or the setup's own; the plan's are :class:`Parallel`'s): its default, its help
    text and what its command-line flag accepts are in it."""
    if name not in _FIELDS:
        raise KeyError(f"{name!r} is not a field of the setup's workload, machine or kernels")
    return _FIELDS[name]


def keyword_defaults() -> dict:
    """Each keyword's default (a plan's shorthand: the default plan's; ``parallel``: None)."""
    plan = Parallel()
    return {name: (None if name == "parallel" else getattr(plan, name))
            if section == "parallel" else _FIELDS[name].default
            for name, section in KEYWORDS.items()
            if name not in ("example_inputs", "example_kwargs")}


def signature_with_keywords(function):
    """``function``'s signature with its ``**keywords`` spelt out as every keyword of
    :data:`KEYWORDS` with its default (what ``help()`` and ``inspect.signature`` show)."""
    sig = inspect.signature(function)
    params = [p for p in sig.parameters.values() if p.kind != p.VAR_KEYWORD]
    params += [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default)
               for name, default in keyword_defaults().items()]
    return sig.replace(parameters=params)


def keyword_docs() -> dict:
    """Each keyword's help text, from its field (the plan's from :data:`_PLAN_DOCS`)."""
    out = {}
    for name, section in KEYWORDS.items():
        out[name] = _PLAN_DOCS[name] if section == "parallel" else \
            _FIELDS[name].metadata["doc"]
    return out


def takes_setup(accepted: tuple, *, defaults: dict | None = None, fixed: dict | None = None,
                as_setup: bool = False):
    """Decorate an API that runs analyses (``serve``, ``advise``, ``plan`` ...) so that it
    takes ``setup=`` (a :class:`Setup`) beside the keywords of it that it ``accepted``.

    The keywords change the setup's fields, as for ``analyze``; the function's ``defaults``
    (``serve``'s ``allreduce="auto"``) fill what the setup leaves at its default; ``fixed``
    are the fields the function sets itself (``mode="decode"`` for serving), which a setup
    may only hold at that value. A setup field that differs from its default but the
    function does not use is refused in one line (never silently dropped).

    ``as_setup``: the function takes the resolved :class:`Setup` as its ``setup`` argument
    (its signature then shows the ``accepted`` keywords with their defaults); otherwise it
    takes those keywords themselves (their values from the setup: the keywords that
    rebuild it), and without a setup it is called as written.
    """
    accepted = tuple(accepted)
    unknown = [k for k in accepted if k not in KEYWORDS]
    if unknown:
        raise TypeError(f"takes_setup: {unknown[0]!r} is not a keyword of fxshape.analyze")
    defaults, fixed = dict(defaults or {}), dict(fixed or {})

    def wrap(function):
        name = function.__qualname__.replace(".__init__", "")

        @functools.wraps(function)
        def wrapper(*args, setup=None, **kwargs):
            given = {k: kwargs.pop(k) for k in list(kwargs) if k in accepted}
            if as_setup:
                return function(*args, setup=_resolved(name, setup, given, accepted,
                                                       defaults, fixed), **kwargs)
            if setup is not None:
                s = _resolved(name, setup, given, accepted, defaults, fixed)
                given = {k: v for k, v in s.keywords().items() if k in accepted}
            return function(*args, **kwargs, **given)

        sig = inspect.signature(function)
        params = [p for p in sig.parameters.values() if p.name != "setup"]
        if as_setup:
            plan, kw = Parallel(), params[-1].kind == inspect.Parameter.VAR_KEYWORD
            own = params[:-1] if kw else params
            params = own + [inspect.Parameter(
                n, inspect.Parameter.KEYWORD_ONLY,
                default=defaults[n] if n in defaults else
                getattr(plan, n) if KEYWORDS[n] == "parallel" else _FIELDS[n].default)
                for n in accepted] + params[len(own):]
        at = len(params) - (params and params[-1].kind == inspect.Parameter.VAR_KEYWORD)
        params.insert(at, inspect.Parameter("setup", inspect.Parameter.KEYWORD_ONLY,
                                            default=None))
        wrapper.__signature__ = sig.replace(parameters=params)
        wrapper.setup_keywords = accepted
        return wrapper

    return wrap


def _resolved(name: str, setup, given: dict, accepted: tuple, defaults: dict,
              fixed: dict) -> Setup:
    """The setup ``name`` runs under: ``setup`` (or the defaults) with ``given`` and the
    function's ``fixed`` fields, refusing what the function would not use."""
    if setup is None:
        return Setup().replace(**{**fixed, **defaults, **given})
    if not isinstance(setup, Setup):
        raise TypeError(f"setup must be a fxshape.Setup (Setup.from_keywords(...) builds one), "
                        f"got {type(setup).__name__}")
    differs = setup.keywords()
    unused = [k for k in differs
              if k not in accepted and not (k in fixed and _same(differs[k], fixed[k]))]
    if unused:
        raise ValueError(f"{name}() does not use the setup's {', '.join(unused)}; the fields "
                         f"it takes from a setup: {', '.join(accepted)}")
    if setup.workload.example_inputs is not None or setup.workload.example_kwargs is not None:
        raise ValueError(f"{name}() builds its own inputs; give a setup without example "
                         "inputs")
    fill = {k: v for k, v in defaults.items() if k not in differs}
    return setup.replace(**{**fixed, **fill, **given})
