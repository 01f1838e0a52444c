"""Co-design advisor: which hyperparameter to change, to what, and how much faster it is.

``advise(model_or_config)`` searches hyperparameter values with better GEMM shapes — vocabulary
a multiple of 64 × tp, hidden size and head dimension with more factors of two, a
flash-attention-friendly head dimension, the best MLP width near the current one — and
re-analyzes the model with each candidate (``fxshape.analyze`` on a new model built from the
changed config, on the meta device). A candidate is recommended when its whole step
(``report.step``: GEMMs, memory-bound ops, optimizer, host) is predicted at least
``min_speedup`` faster *and* its GEMMs at least that much more efficient (achieved TFLOP/s), so
that a smaller model never wins just for being smaller, and its parameter count stays within
``param_tolerance`` of the original.

Re-analysis builds each candidate at full depth on the meta device (~20 ms) and analyzes it
like any model: ``fxshape.analyze`` traces one layer per group of identical layers and gives
every layer its rows (``fxshape.tracing.dedup``), exactly the full trace's rows, at a fraction
of its cost.
"""

from __future__ import annotations

import copy
import math
import re
import sys
from dataclasses import dataclass

import torch
from tabulate import tabulate

from ..config.setup import takes_setup
from ..analysis.provenance import hyperparameters
from ..hardware.dtypes import canonical_dtype
from ..hardware.gpus import get_gpu
from ..cost.quant import PackingRefused
from ..parallelism.plan import PlanRefused
from ..tracing.configs import ConfigRefused, check_config, model_class_for

__all__ = ["Advice", "Recommendation", "advise", "evaluate_config", "sweep", "SweepPoint",
           "Sweep"]

#: head dimensions flash-attention kernels run at full tile efficiency
_FLASH_HEAD_DIMS = (64, 128)
DEFAULT_TOLERANCE = 0.02
DEFAULT_MIN_SPEEDUP = 0.01


@dataclass(frozen=True)
class Recommendation:
    """One suggested change (one hyperparameter, or a few that must change together)."""

    hyperparameter: str  # "vocab_size", or "hidden_size, num_attention_heads"
    current: object  # an int, or a tuple for joint changes
    suggested: object
    predicted_speedup: float  # step time before / after - 1 (0.05 = 5% faster)
    throughput_gain: float  # achieved GEMM TFLOP/s after / before - 1
    param_delta: int  # change in parameter count
    reason: str
    changes: tuple  # ((config attribute, old, new), ...)
    #: GEMM (and attention) time before / after - 1: the shapes' own gain, without the
    #: memory-bound ops, the optimizer and the host that the step adds
    gemm_speedup: float = 0.0
    #: decode: the candidate's KV cache bytes per token (one sequence, all layers, per GPU)
    kv_bytes_per_token: int = 0


@dataclass(frozen=True)
class Evaluation:
    time_s: float  # predicted GEMM time of one step (all layers)
    flops: int
    params: int
    attention_s: float = 0.0  # of which attention kernels (forward and backward)
    kernel: str = ""  # the attention kernel(s) they were predicted as
    step_s: float = 0.0  # the whole step (report.step.time_s)
    kv_bytes_per_token: int = 0  # decode: report.capacity.kv_bytes_per_token
    tokens_per_s: float | None = None  # report.step.tokens_per_s
    #: quantized or float8 analyses: the report's "left in bf16: ..." notes
    left: tuple = ()


@dataclass(frozen=True)
class Advice:
    model_name: str
    gpu: str
    dtype: str
    mode: str
    tp: int
    params: int
    time_s: float
    tflops: float
    recommendations: tuple
    combined: Recommendation | None  # all non-overlapping recommendations applied together
    notes: tuple  # rule checks and wave-boundary warnings, as sentences
    attention: str = "flash"  # the attention= choice the predictions were made with
    step_s: float = 0.0  # the whole predicted step (``report.step``)
    execution: str = "eager"
    #: decode: the model's KV cache bytes per token; the batch the step decodes
    kv_bytes_per_token: int = 0
    batch_size: int | None = None
    #: the mode was not given: advise's default (a training step)
    mode_default: bool = False

    @property
    def decode(self) -> bool:
        return self.mode == "decode"

    def table(self, fmt: str = "simple") -> str:
        head = ("hyperparameter", "current", "suggested",
                "decode tokens/s" if self.decode else "step speedup", "GEMM speedup",
                "TFLOP/s gain", "params") + (("KV bytes/token",) if self.decode else ()) + \
            ("reason",)
        rows = [(r.hyperparameter, _fmt(r.current), _fmt(r.suggested),
                 f"{100 * r.predicted_speedup:+.1f}%", f"{100 * r.gemm_speedup:+.1f}%",
                 f"{100 * r.throughput_gain:+.1f}%", f"{r.param_delta:+,}")
                + ((f"{r.kv_bytes_per_token:,}",) if self.decode else ()) + (r.reason,)
                for r in self.recommendations]
        step = f"predicted step {self.step_s * 1e3:.3f} ms"
        if self.decode and self.step_s:
            step = (f"decode step {self.step_s * 1e3:.3f} ms per token, "
                    f"{(self.batch_size or 1) / self.step_s:,.0f} tokens/s at batch "
                    f"{self.batch_size}, KV cache {self.kv_bytes_per_token:,} bytes per token")
        mode = self.mode + (" (advise's default mode)" if self.mode_default else "")
        lines = [f"{self.model_name} on {self.gpu} ({self.dtype}, {mode}, tp={self.tp}, "
                 f"attention={self.attention}, {self.execution}): "
                 f"{self.params:,} parameters, {step} "
                 f"(GEMMs {self.time_s * 1e3:.3f} ms at {self.tflops:.0f} TFLOP/s)", ""]
        if rows:
            lines.append(tabulate(rows, headers=head, tablefmt=fmt, disable_numparse=True))
        else:
            lines.append("no change is predicted to pay (nothing above the significance "
                         "threshold within the parameter tolerance)")
        if self.combined is not None and len(self.recommendations) > 1:
            c = self.combined
            lines.append(f"\nall together ({c.hyperparameter} = {_fmt(c.suggested)}): "
                         f"{100 * c.predicted_speedup:+.1f}% step speed "
                         f"({100 * c.gemm_speedup:+.1f}% GEMMs), "
                         f"{c.param_delta:+,} parameters")
        if self.notes:
            lines.append("\nnotes:")
            lines.extend(f"- {n}" for n in self.notes)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def _fmt(v) -> str:
    return ", ".join(str(x) for x in v) if isinstance(v, tuple) else str(v)


# -- building and evaluating models from configs ---------------------------------------------
def _model_class(model_or_config):
    """(config, class that builds a model from it)."""
    if isinstance(model_or_config, torch.nn.Module):
        cfg = getattr(model_or_config, "config", None)
        if cfg is None or not hasattr(cfg, "to_dict"):
            raise ValueError(
                "advise needs a Hugging Face model or config to vary hyperparameters; got "
                f"{type(model_or_config).__name__} without a .config (for plain modules use "
                "fxshape.analyze, whose report names the parameter behind each dimension)")
        return cfg, type(model_or_config)
    if hasattr(model_or_config, "to_dict") and hasattr(model_or_config, "model_type"):
        return model_or_config, None
    raise TypeError(f"advise accepts an nn.Module or a Hugging Face config, got "
                    f"{type(model_or_config).__name__}")


def _build(cls, config):
    check_config(config)
    with torch.device("meta"):
        if cls is None:  # a config alone: the class it names, else the auto class that fits
            cls, _ = model_class_for(config)
        return cls(config)


class _Evaluator:
    """Analyze configs at full depth through ``fxshape.analyze`` (which traces one layer per
    group of identical layers, exactly); cached by changes."""

    def __init__(self, model_or_config, analyze_kwargs, baseline_provenance="traced"):
        self.config, self.cls = _model_class(model_or_config)
        check_config(self.config)
        self.model_name = type(model_or_config).__name__ \
            if isinstance(model_or_config, torch.nn.Module) \
            else type(_build(self.cls, self.config)).__name__
        self.kw = analyze_kwargs
        self.cache: dict = {}
        self._built: dict = {}  # models params() built, kept for their analysis
        self.report = None  # the baseline's report
        self.baseline_provenance = baseline_provenance

    def config_with(self, changes):
        cfg = copy.deepcopy(self.config)
        for attr, _, new in changes:
            setattr(cfg, attr, new)
        return cfg

    def __call__(self, changes=()) -> Evaluation:
        key = tuple(sorted(changes))
        if key not in self.cache:
            from ..report.build import analyze

            model = self._model(key)
            # what sets each dimension is read off the baseline (its notes); candidates are
            # only timed
            report = analyze(model, **self.kw,
                             provenance=self.baseline_provenance if not key else None)
            if not key:
                self.report = report
            attn = [r for r in report.rows if r.kernel]
            kernels = "/".join(sorted({r.kernel for r in attn}))
            kv = report.capacity.kv_bytes_per_token if report.capacity is not None else 0
            self.cache[key] = Evaluation(report.total_time_s, report.total_flops,
                                         _param_count(model),
                                         sum(r.time_s for r in attn), kernels,
                                         report.step.time_s, kv, report.step.tokens_per_s,
                                         tuple(n for n in report.notes
                                               if n.startswith("left in bf16")))
        return self.cache[key]

    def params(self, changes=()) -> int:
        """The parameter count of the model with ``changes``, built on meta (~20 ms) but not
        captured: candidates too far from the baseline's count are left out unpriced."""
        key = tuple(sorted(changes))
        if key in self.cache:
            return self.cache[key].params
        self._built[key] = self._model(key)
        return _param_count(self._built[key])

    def _model(self, key):
        """The model with the changes ``key``, built on meta (~20 ms) once."""
        model = self._built.pop(key, None)
        return _build(self.cls, self.config_with(key)) if model is None else model


def _param_count(model) -> int:
    seen, params = set(), 0
    for p in model.parameters():  # tied weights once
        if id(p) not in seen:
            seen.add(id(p))
            params += p.numel()
    return params


def evaluate_config(model_or_config, changes: dict | None = None, **analyze_kwargs):
    """(predicted GEMM time per step, GEMM FLOPs, parameter count) of the model with
    ``changes`` (config attribute -> value) applied, at full depth."""
    ev = _Evaluator(model_or_config, analyze_kwargs)
    return ev(tuple((k, getattr(ev.config, k, None), v) for k, v in (changes or {}).items()))


# -- candidates ------------------------------------------------------------------------------
def _attr(hp, canonical):
    """The settable config attribute for a canonical hyperparameter (``hp``: from
    :func:`hyperparameters`), or None if derived."""
    if canonical not in hp:
        return None
    label = hp[canonical][0]
    return label if re.fullmatch(r"[A-Za-z_]\w*", label) else None


def _round_up(x, m):
    return -(-x // m) * m


def _twos(x: int) -> int:
    return (x & -x).bit_length() - 1 if x > 0 else 0


def _head_changes(config, hp, h_new, a_new):
    """Config changes for hidden size ``h_new`` with ``a_new`` heads (KV heads and an explicit
    head_dim follow along)."""
    h_attr, a_attr = _attr(hp, "hidden_size"), _attr(hp, "num_attention_heads")
    h, a = hp["hidden_size"][1], hp["num_attention_heads"][1]
    ch = []
    if h_new != h:
        ch.append((h_attr, h, h_new))
    if a_new != a:
        ch.append((a_attr, a, a_new))
    kv = getattr(config, "num_key_value_heads", None)
    if isinstance(kv, int) and a_new != a:
        if kv == a:
            ch.append(("num_key_value_heads", kv, a_new))  # multi-head attention stays so
        elif a_new % kv:
            return None  # grouped-query attention needs KV heads to divide the heads
    hd = getattr(config, "head_dim", None)
    if isinstance(hd, int) and hd == h // a and h_new // a_new != hd:
        ch.append(("head_dim", hd, h_new // a_new))  # head_dim was the derived value
    return tuple(ch)


def _kv_candidates(config, tp: int):
    """Decode: fewer KV heads (grouped-query attention), each a divisor of the query heads
    that whole-head tensor parallelism takes; the cache's bytes per token fall with them."""
    kv = getattr(config, "num_key_value_heads", None)
    heads = hyperparameters(config).get("num_attention_heads", (None, None))[1]
    if not isinstance(kv, int) or not isinstance(heads, int):
        return []
    out = []
    for new in range(kv - 1, 0, -1):
        if heads % new == 0 and (new % tp == 0 or tp % new == 0):
            out.append(("num_key_value_heads", (("num_key_value_heads", kv, new),),
                        f"KV heads {kv} -> {new}: the KV cache (and its reads each decode "
                        f"step) x{new / kv:.2g}"))
    return out


def _candidates(config, tp: int, gated: bool, mode: str = "train"):
    """(group, changes, reason) in a fixed order."""
    hp = hyperparameters(config)
    out = _kv_candidates(config, tp) if mode == "decode" else []
    if "vocab_size" in hp and _attr(hp, "vocab_size"):
        v = hp["vocab_size"][1]
        for mul in (64 * tp, 128 * tp):
            if v % mul:
                out.append(("vocab_size", (("vocab_size", v, _round_up(v, mul)),),
                            f"vocabulary a multiple of {mul} (64 x tp): the LM head's N and "
                            "the embedding tile evenly; odd sizes also lose 16-byte alignment"))
    have_heads = "hidden_size" in hp and "num_attention_heads" in hp \
        and _attr(hp, "hidden_size") and _attr(hp, "num_attention_heads")
    if have_heads:
        h, a = hp["hidden_size"][1], hp["num_attention_heads"][1]
        hd = h // a if h % a == 0 else None
        explicit_hd = isinstance(getattr(config, "head_dim", None), int) and \
            config.head_dim != (h // a if h % a == 0 else None)
        if not explicit_hd:
            # heads only: a flash-attention-friendly head dimension at the same width
            for hd_new in _FLASH_HEAD_DIMS:
                if hd_new != hd and h % hd_new == 0 and (h // hd_new) % tp == 0:
                    ch = _head_changes(config, hp, h, h // hd_new)
                    if ch:
                        if mode == "decode":  # the gain is the cache the step reads
                            why = ("the decode step reads the KV cache, KV heads x head_dim "
                                   "per token and layer")
                        elif hd not in _FLASH_HEAD_DIMS:
                            why = "a flash-attention tile size (64 or 128): no padded columns"
                        else:
                            why = "larger attention GEMMs (K = head_dim) run closer to peak"
                        out.append(("num_attention_heads", ch,
                                    f"head_dim {hd} -> {hd_new}: {why}"))
            # hidden size (and heads with it) with more factors of two
            if _twos(h) < 6 or hd not in _FLASH_HEAD_DIMS:
                for h_new in sorted({_round_up(h, 64), _round_up(h, 64) - 64,
                                     _round_up(h, 128), _round_up(h, 128) - 128} - {h, 0}):
                    if h_new <= 0:
                        continue
                    if h_new % a == 0 and (h_new // a) % 8 == 0:
                        ch = _head_changes(config, hp, h_new, a)
                        if ch:
                            out.append(("hidden_size", ch,
                                        f"hidden size {h} -> {h_new} (2^{_twos(h_new)} | h; "
                                        f"head_dim {h_new // a})"))
                    for hd_new in _FLASH_HEAD_DIMS:
                        if h_new % hd_new == 0 and (h_new // hd_new) % tp == 0 \
                                and h_new // hd_new != a:
                            ch = _head_changes(config, hp, h_new, h_new // hd_new)
                            if ch:
                                out.append(("hidden_size, num_attention_heads", ch,
                                            f"hidden size {h} -> {h_new} (2^{_twos(h_new)} | h) "
                                            f"with head_dim {hd_new}: {h} has no such "
                                            "split into heads"))
    f_attr = _attr(hp, "intermediate_size")
    if "intermediate_size" in hp:
        f = hp["intermediate_size"][1]
        attr = f_attr or ("n_inner" if hasattr(config, "n_inner") else None)
        if attr:
            step = 64 * tp
            centre = f
            if gated and "hidden_size" in hp:
                centre = 8 * hp["hidden_size"][1] // 3  # SwiGLU: ~8h/3 at the same parameters
            lo, hi = int(min(f, centre) * 0.97), int(max(f, centre) * 1.03)
            for f_new in range(_round_up(lo, step), hi + 1, step):
                if f_new != f:
                    out.append(("intermediate_size", ((attr, f, f_new),),
                                f"MLP width {f} -> {f_new} (2^{_twos(f_new)} | d_ff): best "
                                "tile and wave fit found by search" +
                                (" near 8h/3" if gated else "")))
    return out


def _progress(items, label: str, stream=None):
    """Yield ``items``, drawing ``label: i/n`` on one line of ``stream`` (stderr) while it
    is a terminal; nothing when it is piped or redirected."""
    stream = stream or sys.stderr
    items = list(items)
    tty = hasattr(stream, "isatty") and stream.isatty()
    for i, item in enumerate(items):
        if tty:
            stream.write(f"\r{label}: {i + 1}/{len(items)}")
            stream.flush()
        yield item
    if tty and items:
        stream.write("\r" + " " * (len(label) + 24) + "\r")
        stream.flush()


def _rule_notes(config, report, tp, batch_size):
    """Rule checks (h/a, h/t, (b·a)/t) and sizes just past a wave boundary."""
    hp = hyperparameters(config)
    notes = []
    h = hp.get("hidden_size", (None, None))[1]
    a = hp.get("num_attention_heads", (None, None))[1]
    if h and a:
        if h % a:
            notes.append(f"hidden size {h} is not divisible by {a} heads")
        elif _twos(h // a) < 3:
            notes.append(f"h/a = {h // a}: head dimension with fewer than 3 factors of two")
    if h and tp > 1 and (h // tp) % 64:
        notes.append(f"h/t = {h}/{tp} = {h / tp:g}: per-GPU hidden size not a multiple of 64")
    if a and batch_size and tp > 1 and (batch_size * a) % tp:
        notes.append(f"(b·a)/t = ({batch_size}·{a})/{tp} is not an integer")
    if report is not None:
        sms = get_gpu(report.gpu).sm_count  # one tile per SM per wave, as in fxshape.cost.gemm
        seen = set()
        for g in report.groups():
            r = g["row"]
            p = r.prediction
            if p.waves < 2 or p.bound != "compute" or g["share"] < 0.02:
                continue
            tail = p.ctas - (p.waves - 1) * sms
            if 0 < tail <= 0.15 * sms:
                dims = ", ".join(f"{d} ({s})" for d, s in zip("MNK", r.set_by or ("",) * 3)
                                 if d in "MN" and s)
                key = (g["module"], r.op)
                if key not in seen:
                    seen.add(key)
                    notes.append(f"{g['module']} {r.op} {r.m}x{r.n}x{r.k}: {p.ctas} tiles = "
                                 f"{p.waves - 1} full waves + {tail} tiles: just past a wave "
                                 f"boundary (wave efficiency {100 * p.wave_efficiency:.0f}%; "
                                 f"set by {dims or 'its sizes'})")
    if report.unsupported:  # left out of the step times: say so, and which
        ops = sorted({u.target for u in report.unsupported})
        notes.append(f"{len(report.unsupported)} matmul-like op(s) have no GEMM model and are "
                     f"not in the step times: {', '.join(ops)}")
    return tuple(notes)


def _analyze_kwargs(*, mode, context_len, kv_dtype, page_size, **kw) -> dict:
    """The ``fxshape.analyze`` options of advise and sweep: the KV cache's only in decode
    (refused in other modes)."""
    if mode == "decode":
        return dict(kw, mode=mode, context_len=context_len, kv_dtype=kv_dtype,
                    page_size=page_size)
    if (context_len, kv_dtype, page_size) != (None, None, None):
        raise ValueError("context_len, kv_dtype and page_size are for mode='decode'; mode "
                         f"{mode!r} has no KV cache")
    return dict(kw, mode=mode)


def _check_fraction(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise ValueError(f"{name} must be in [0, 1), got {value!r}")


def _low_precision(kw: dict, *, quantize, group_size, float8) -> dict:
    """``kw`` with the low-precision options of ``analyze`` that were given
    (docs/quantization.md), checked once here as ``analyze`` checks them: a sweep would
    otherwise turn a refused option into a reason on every point."""
    from ..analysis.lowprec import check_float8, check_quantize

    if float8 is not None and quantize is not None:
        raise ValueError("float8= trains in FP8, quantize= serves quantized layers: give "
                         "one of them")
    check_quantize(quantize, group_size, kw["mode"], kw["dtype"], kw["gpu"])
    if float8 is not None:
        check_float8(float8, kw["mode"], kw["dtype"], kw["gpu"], kw.get("execution"))
    given = dict(quantize=quantize, group_size=group_size, float8=float8)
    return dict(kw, **{k: v for k, v in given.items() if v is not None})


#: the fields of a :class:`fxshape.Setup` ``sweep`` prices with (``setup=`` or keywords)
SWEEP_SETUP = ("gpu", "dtype", "batch_size", "seq_len", "tp", "mode", "attention", "execution",
               "optimizer", "context_len", "kv_dtype", "page_size", "quantize", "group_size",
               "float8")
#: ``advise``'s: ``sweep``'s and a training plan on its machine
ADVISE_SETUP = SWEEP_SETUP + ("parallel", "recompute", "topology")


@takes_setup(ADVISE_SETUP)
def advise(model_or_config, *, gpu="h100", dtype=torch.bfloat16, batch_size=None,
           seq_len=None, tp: int = 1, mode: str | None = None, attention: str = "flash",
           param_tolerance: float = DEFAULT_TOLERANCE,
           min_speedup: float = DEFAULT_MIN_SPEEDUP, execution: str | None = None,
           optimizer="adamw", context_len=None, kv_dtype=None, page_size=None,
           parallel=None, recompute=None, topology=None, quantize=None, group_size=None,
           float8=None) -> Advice:
    """Recommend hyperparameter changes with better GEMM shapes.

    Args:
        model_or_config: a Hugging Face model (weights are not used) or config.
        gpu, dtype, batch_size, seq_len, tp, mode, attention, execution, optimizer: as for
            :func:`fxshape.analyze`, but ``mode`` defaults to ``"train"`` (a training step,
            eager, with AdamW; said in the header: ``analyze`` and ``sweep`` default to
            inference; attention
            as PyTorch's SDPA runs it on ``gpu``). Candidates are ranked by the predicted
            step time (``report.step``); each also says its GEMM-only speedup. A change of
            head count or head dimension says in its reason how much of its gain is the
            attention kernel's.
        context_len, kv_dtype, page_size: for ``mode="decode"`` (as for ``analyze``). Decode
            advice ranks the candidates by decode tokens/s at ``batch_size`` and
            ``context_len`` (the step at a fixed batch), adds fewer KV heads to them, gives
            each candidate's KV cache bytes per token, and says in the notes what the other
            ``tp`` degrees of one node do to the step.
        parallel, recompute, topology: a training plan (a :class:`fxshape.Parallel`, as
            ``fxshape plan`` finds them), its recomputation and its machine: each candidate
            is priced on that plan's whole step (pipeline, ZeRO, collectives); ``tp`` is
            then the plan's and must not be given apart.
        quantize, group_size, float8: low precision, as for ``analyze``
            (docs/quantization.md): each candidate is priced quantized (inference, decode)
            or trained in FP8 (``float8`` with ``execution="compiled"``), so the ranking is
            the low-precision step's; the notes name the layers a shape keeps in bf16 (K or
            N not multiples of 16, the LM head).
        param_tolerance: largest relative change of the parameter count (default 2%).
        min_speedup: significance threshold: a change must be predicted at least this much
            faster per step and this much more efficient (default 1%).
        setup: a :class:`fxshape.Setup` holding the options above (:data:`ADVISE_SETUP`;
            a field it sets that ``advise`` does not use is refused); the keywords change it.

    Returns:
        An :class:`Advice`; ``advice.recommendations`` best first.
    """
    mode_default = mode is None
    mode = "train" if mode is None else mode
    _check_fraction("param_tolerance", param_tolerance)
    _check_fraction("min_speedup", min_speedup)
    kw = _analyze_kwargs(gpu=gpu, dtype=dtype, batch_size=batch_size, seq_len=seq_len, tp=tp,
                         mode=mode, attention=attention, execution=execution,
                         optimizer=optimizer, context_len=context_len, kv_dtype=kv_dtype,
                         page_size=page_size)
    if parallel is not None or recompute is not None or topology is not None:
        if mode != "train":
            raise ValueError(f"parallel, recompute and topology price a training plan; mode "
                             f"{mode!r} was given: use mode='train'")
        if parallel is not None:
            if not isinstance(getattr(parallel, "tp", None), int):
                raise ValueError(f"parallel must be a fxshape.Parallel plan, got "
                                 f"{type(parallel).__name__}")
            if tp != 1:
                raise ValueError("tp given beside parallel=: say it in the plan "
                                 "(Parallel(tp=...)), not both")
            tp = parallel.tp
            kw = dict(kw, tp=1, parallel=parallel)
        kw = dict(kw, recompute=recompute, topology=topology)
    # every candidate analyzed quantized, or trained in float8: the low-precision step's
    # ranking
    kw = _low_precision(kw, quantize=quantize, group_size=group_size, float8=float8)
    ev = _Evaluator(model_or_config, kw)
    config = ev.config
    base = ev(())
    report = ev.report
    gated = any("gate" in r.module.rsplit(".", 1)[-1] for r in report.rows)
    candidates = _candidates(config, tp, gated, mode)
    recs, too_big, too_slow = _ranked(ev, candidates, base, param_tolerance, min_speedup)
    combined = _combined(ev, recs, base)
    notes = _rule_notes(config, report, tp, _batch(report))
    if mode == "decode":
        notes += _tp_notes(model_or_config, kw, base, report)
    # what the options did: the analysis's (each candidate is analyzed with them), and the
    # filters' counts when they are not the defaults
    notes += tuple(f"option {o.describe()}" for o in report.options)
    # what the shapes keep out of low precision (not multiples of 16, the LM head)
    notes += tuple(n for n in report.notes if n.startswith("left in bf16"))
    if param_tolerance != DEFAULT_TOLERANCE:
        notes += (f"option param_tolerance={param_tolerance:g}: {too_big} of "
                  f"{len(candidates)} candidates left out for changing the parameter count "
                  f"by more than {100 * param_tolerance:g}%",)
    if min_speedup != DEFAULT_MIN_SPEEDUP:
        notes += (f"option min_speedup={min_speedup:g}: {too_slow} of {len(candidates)} "
                  f"candidates left out for gaining less than {100 * min_speedup:g}%",)
    return Advice(model_name=ev.model_name, gpu=report.gpu, dtype=report.dtype,
                  mode=mode, tp=tp, params=base.params, time_s=base.time_s,
                  tflops=base.flops / base.time_s / 1e12 if base.time_s else 0.0,
                  recommendations=tuple(recs), combined=combined,
                  notes=notes, attention=attention,
                  step_s=base.step_s, execution=report.step.execution,
                  kv_bytes_per_token=base.kv_bytes_per_token,
                  batch_size=report.workload.batch_size, mode_default=mode_default)


def _ranked(ev, candidates, base: Evaluation, param_tolerance: float,
            min_speedup: float) -> tuple:
    """``(recommendations best first, left out for the parameter count, left out for
    gaining too little)``: the best candidate of each group that keeps the parameter count
    within ``param_tolerance`` and gains at least ``min_speedup``."""
    best: dict = {}
    too_big = too_slow = 0
    for group, changes, reason in _progress(candidates, "advise"):
        try:
            if abs(ev.params(changes) - base.params) > param_tolerance * base.params:
                too_big += 1  # left out before it is captured and priced
                continue
            e = ev(changes)
        except (ConfigRefused, PlanRefused, PackingRefused):
            # a shape the family cannot build, the plan cannot split (tp over the heads) or
            # int4 cannot pack (its group size over K): not a candidate
            continue
        rec = _recommendation(group, changes, reason, base, e)
        score = min(rec.predicted_speedup, rec.throughput_gain)
        if score < min_speedup:
            too_slow += 1
            continue
        if group not in best or score > min(best[group].predicted_speedup,
                                            best[group].throughput_gain) + 1e-12:
            best[group] = rec
    recs = sorted(best.values(), key=lambda r: (-min(r.predicted_speedup, r.throughput_gain),
                                                r.hyperparameter))
    return tuple(recs), too_big, too_slow


def _combined(ev, recs, base: Evaluation):
    """All recommendations that do not overlap, applied together (None without any)."""
    if not recs:
        return None
    taken, attrs = [], set()
    for r in recs:
        if attrs.isdisjoint(a for a, _, _ in r.changes):
            taken.extend(r.changes)
            attrs.update(a for a, _, _ in r.changes)
    e = ev(tuple(taken))
    return _recommendation(", ".join(a for a, _, _ in taken), tuple(taken),
                           "all recommendations that do not overlap", base, e)


def _tp_notes(model_or_config, kw, base: Evaluation, report) -> tuple:
    """Decode: the step at the other tensor-parallel degrees of one node (per-GPU tokens/s
    and the largest batch that fits), one sentence each."""
    from ..hardware.topology import default_topology

    tp = kw["tp"]
    node = default_topology(report.gpu).gpus_per_node
    b = report.workload.batch_size
    out = []
    for t in (1, 2, 4, 8):
        if t == tp or t > node:
            continue
        ev = _Evaluator(model_or_config, dict(kw, tp=t),  # timed only: no "set by"
                        baseline_provenance=None)
        try:
            e = ev(())
        except ValueError:  # the heads do not split t ways
            continue
        fits = ev.report.capacity.max_batch if ev.report.capacity is not None else None
        out.append(f"tp {t}: {e.step_s * 1e3:.3f} ms per token "
                   f"({base.step_s / e.step_s:.2f}x tp {tp}'s speed), "
                   f"{b / e.step_s / t:,.0f} tokens/s per GPU at batch {b}"
                   + (f", up to {fits:,} sequences fit" if fits is not None else ""))
    return tuple(out)


def _batch(report):
    from ..analysis.provenance import input_sizes

    return input_sizes(report.graph_module.graph)[0] if report.graph_module is not None \
        else None


def _recommendation(group, changes, reason, base: Evaluation, e: Evaluation) -> Recommendation:
    cur = tuple(old for _, old, _ in changes)
    new = tuple(n for _, _, n in changes)
    gemm = base.time_s / e.time_s - 1 if e.time_s > 0 else 0.0
    speedup = base.step_s / e.step_s - 1 if e.step_s > 0 else gemm
    gain = (e.flops / e.time_s) / (base.flops / base.time_s) - 1 \
        if e.time_s > 0 and base.time_s > 0 and base.flops else 0.0
    attrs = {a for a, _, _ in changes}
    if attrs & {"num_attention_heads", "n_head", "num_heads", "head_dim"} and base.kernel:
        if base.kernel == "math":
            reason += ("; unfused attention moves the batch × heads × seq² score matrix "
                       "through memory, so fewer heads move less")
        reason += (f"; attention predicted as {base.kernel}: "
                   f"{base.attention_s * 1e3:.3f} -> {e.attention_s * 1e3:.3f} ms, "
                   f"other GEMMs {(base.time_s - base.attention_s) * 1e3:.3f} -> "
                   f"{(e.time_s - e.attention_s) * 1e3:.3f} ms per step")
    if base.kv_bytes_per_token and e.kv_bytes_per_token != base.kv_bytes_per_token and \
            "KV cache" not in reason:
        reason += (f"; KV cache {base.kv_bytes_per_token:,} -> {e.kv_bytes_per_token:,} "
                   "bytes per token")
    return Recommendation(kv_bytes_per_token=e.kv_bytes_per_token,
                          hyperparameter=", ".join(a for a, _, _ in changes) or group,
                          current=cur[0] if len(cur) == 1 else cur,
                          suggested=new[0] if len(new) == 1 else new,
                          predicted_speedup=speedup, throughput_gain=gain,
                          param_delta=e.params - base.params, reason=reason, changes=changes,
                          gemm_speedup=gemm)


# -- sweeps --------------------------------------------------------------------------------
@dataclass(frozen=True)
class SweepPoint:
    value: int
    time_s: float | None  # GEMM time; None: the value is invalid for this model (see note)
    tflops: float | None
    params: int | None
    note: str
    step_s: float | None = None  # the whole predicted step
    #: tokens the step makes per second (decode: one per sequence; else the batch's tokens)
    tokens_per_s: float | None = None


class Sweep(tuple):
    """The points of a sweep (a tuple of :class:`SweepPoint`), with what they were predicted
    for: ``model_name``, ``param``, ``gpu``, ``dtype``, ``mode`` (``mode_default``: not
    given, the sweep's default, inference), ``execution``, and ``notes`` (what each option
    did, as the analysis of the unchanged model states it)."""

    def __new__(cls, points, **info):
        self = super().__new__(cls, points)
        self.model_name = info.get("model_name", "")
        self.param = info.get("param", "")
        self.gpu = info.get("gpu", "")
        self.dtype = info.get("dtype", "")
        self.mode = info.get("mode", "inference")
        self.mode_default = info.get("mode_default", False)
        self.execution = info.get("execution", "")
        self.notes = tuple(info.get("notes", ()))
        return self

    @property
    def failed(self) -> bool:
        """Every point failed (no value gave a model to predict)."""
        return all(p.time_s is None for p in self)

    def header(self) -> str:
        mode = self.mode + (" (sweep's default mode)" if self.mode_default else "")
        return (f"sweep of {self.param} for {self.model_name} on {self.gpu} ({self.dtype}, "
                f"{mode}, {self.execution})")

@takes_setup(SWEEP_SETUP)
def sweep(model_or_config, param: str, values, *, gpu="h100", dtype=torch.bfloat16,
          batch_size=None, seq_len=None, tp: int = 1, mode: str | None = None,
          attention: str = "flash", execution: str | None = None, optimizer="adamw",
          context_len=None, kv_dtype=None, page_size=None, quantize=None, group_size=None,
          float8=None) -> list:
    """Predicted GEMM throughput across values of one config attribute (the sawtooth plots).

    Changing the hidden size or head count keeps a head_dim that was derived from them
    derived; values the model rejects (not divisible by the heads, ...) give a point with
    ``time_s=None`` and the reason. ``mode`` defaults to ``"inference"``; the other options
    are :func:`fxshape.analyze`'s (``quantize``, ``group_size``, ``float8``: the sawtooth of
    the quantized or FP8-trained model, docs/quantization.md; a value whose layers the
    method cannot take, such as an int4 group size not dividing K, is a point with the
    reason). ``setup``: a :class:`fxshape.Setup` holding those options
    (:data:`SWEEP_SETUP`), the keywords changing it. Returns a :class:`Sweep` (a tuple of
    points).
    """
    mode_default = mode is None
    mode = "inference" if mode is None else mode
    config, _ = _model_class(model_or_config)
    if not hasattr(config, param) and param not in getattr(config, "attribute_map", {}):
        known = sorted(k for k, v in config.to_dict().items() if isinstance(v, int)
                       and not isinstance(v, bool))
        raise ValueError(f"{type(config).__name__} has no attribute {param!r}; integer "
                         f"attributes: {', '.join(known)}")
    values = list(values)
    if not values:
        raise ValueError("empty sweep range")
    bad = [v for v in values if isinstance(v, bool) or not isinstance(v, int) or v <= 0]
    if bad:
        raise ValueError(f"sweep values of {param} must be positive integers, got {bad[0]!r}")
    kw = _analyze_kwargs(gpu=gpu, dtype=dtype, batch_size=batch_size, seq_len=seq_len, tp=tp,
                         mode=mode, attention=attention, execution=execution,
                         optimizer=optimizer, context_len=context_len, kv_dtype=kv_dtype,
                         page_size=page_size)
    kw = _low_precision(kw, quantize=quantize, group_size=group_size, float8=float8)
    ev = _Evaluator(model_or_config, kw, baseline_provenance=None)
    hp = hyperparameters(config)
    out = []
    info = dict(model_name=ev.model_name, param=param, mode=mode, mode_default=mode_default,
                gpu=get_gpu(gpu).name, dtype=canonical_dtype(dtype),
                execution=execution or ("cudagraphs" if mode == "decode" else "eager"))
    try:  # the unchanged model states what each option did
        ev(())
        # (provenance is the sweep's own choice, not an option of sweep)
        info["notes"] = tuple(f"option {o.describe()}" for o in ev.report.options
                              if o.name != "provenance") + tuple(
            n for n in ev.report.notes if n.startswith("left in bf16"))
    except (ValueError, RuntimeError):
        pass  # an option the model refuses: every point below says why
    # what the unchanged model keeps out of a quantized format (its LM head, say) is in the
    # sweep's notes; a point says only what its own value adds
    base_left = ev.cache[()].left if () in ev.cache else ()
    for v in _progress(values, f"sweep {param}"):
        old = getattr(config, param)
        changes = [(param, old, v)]
        hd = getattr(config, "head_dim", None)
        if isinstance(hd, int) and "hidden_size" in hp and "num_attention_heads" in hp:
            h, a = hp["hidden_size"][1], hp["num_attention_heads"][1]
            if h % a == 0 and hd == h // a:
                h2 = v if param == _attr(hp, "hidden_size") else h
                a2 = v if param == _attr(hp, "num_attention_heads") else a
                if (h2, a2) != (h, a):
                    if h2 % a2:
                        out.append(SweepPoint(v, None, None, None,
                                              f"{h2} not divisible by {a2} heads"))
                        continue
                    changes.append(("head_dim", hd, h2 // a2))
        try:
            e = ev(tuple(changes))
        except (ValueError, RuntimeError) as exc:
            out.append(SweepPoint(v, None, None, None, str(exc).splitlines()[0][:120]))
            continue
        note = "; ".join(n for n in e.left if n not in base_left)
        out.append(SweepPoint(v, e.time_s, e.flops / e.time_s / 1e12 if e.time_s else 0.0,
                              e.params, note, e.step_s, e.tokens_per_s))
    return Sweep(out, **info)


def parse_range(text: str) -> range:
    """``start:stop:step`` (stop included) -> a range of positive integers."""
    parts = text.split(":")
    try:
        nums = [int(p) for p in parts]
    except ValueError:
        nums = []
    if len(nums) not in (2, 3) or any(n <= 0 for n in nums) or nums[1] < nums[0]:
        raise ValueError(f"range must be START:STOP[:STEP] with positive integers and "
                         f"START <= STOP, got {text!r}")
    step = nums[2] if len(nums) == 3 else 1
    if math.ceil((nums[1] - nums[0] + 1) / step) > 2000:
        raise ValueError(f"range {text!r} has more than 2000 points")
    return range(nums[0], nums[1] + 1, step)
