"""A batch of requests end to end: ``fxshape.serve``.

``batch_size`` requests of ``prompt_len`` tokens each generate ``output_len`` tokens, as a
serving engine runs them on ``tp`` GPUs:

- **the prefill** (one step over the prompts, ``mode="prefill"``, ``execution="compiled"``
  as vLLM's compiled model runs it; the LM head on the last position only, as engines
  compute logits for the tokens they sample) produces the first token: its time is the
  time to the first token;
- **the decode steps**: ``output_len - 1`` more steps, step ``k`` feeding the ``k``-th
  generated token over ``prompt_len + k`` cached tokens, each priced at its own context
  from one decode capture (``fxshape.serving.steps.DecodeSteps``; CUDA graphs), with the
  GEMMs that read one activation run as one as engines run them (``fuse``:
  ``fxshape.serving.batch.BatchStep``);
- **the request**: latency = time to first token + the decode steps; output throughput =
  ``batch_size × output_len / latency``; inter-token latency = the decode steps' mean.

The tensor-parallel all-reduces run as ``allreduce`` says (``fxshape.cost.allreduce``:
vLLM's choice by default). The request must fit: the KV cache at ``prompt_len +
output_len`` tokens for the batch, with the weights, within the GPU's memory (the decode
report's capacity at the longest context).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import torch

from ..config.setup import takes_setup
from .batch import SERVING, BatchStep, check_fuse, logits_module_of
from .steps import DecodeSteps

__all__ = ["ServeResult", "serve"]


@dataclass(frozen=True)
class ServeResult:
    """One batch of requests end to end (seconds; tokens per second over the batch)."""

    model: str
    gpu: str
    tp: int
    batch_size: int
    prompt_len: int
    output_len: int
    allreduce: str
    time_to_first_token_s: float
    #: the ``output_len - 1`` decode steps, in order (step k over prompt_len + k tokens)
    decode_steps_s: tuple
    latency_s: float
    output_tokens_per_s: float
    #: the mean decode step (0 when output_len is 1)
    inter_token_latency_s: float
    fuse: str = "all"  # the GEMMs fused (``serve``'s ``fuse``)
    gemv: str = "library"  # how matrix-vector products run (``serve``'s ``gemv``)
    notes: tuple = ()
    prefill: object = field(default=None, repr=False, compare=False)
    decode: object = field(default=None, repr=False, compare=False)

    @property
    def inter_token_latency_p50_s(self) -> float:
        return statistics.median(self.decode_steps_s) if self.decode_steps_s else 0.0

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in (
            "model", "gpu", "tp", "batch_size", "prompt_len", "output_len", "allreduce",
            "fuse", "gemv",
            "time_to_first_token_s", "inter_token_latency_s", "latency_s",
            "output_tokens_per_s")}
        d["decode_steps_s"] = list(self.decode_steps_s)
        d["notes"] = list(self.notes)
        return d

    def describe(self) -> str:
        steps = self.decode_steps_s
        itl = (f"inter-token latency {self.inter_token_latency_s * 1e3:.2f} ms "
               f"({steps[0] * 1e3:.2f} ms at {self.prompt_len + 1:,} tokens to "
               f"{steps[-1] * 1e3:.2f} ms at {self.prompt_len + self.output_len - 1:,})"
               if steps else "no decode step (one output token)")
        return (f"{self.model} on {self.tp} x {self.gpu}, batch {self.batch_size}, prompt "
                f"{self.prompt_len:,}, output {self.output_len:,}: time to first token "
                f"{self.time_to_first_token_s * 1e3:.2f} ms, {itl}, latency "
                f"{self.latency_s * 1e3:.1f} ms, {self.output_tokens_per_s:,.1f} output "
                "tokens/s")


@takes_setup(SERVING + ("page_size", "gemv"), fixed={"mode": "decode"},
             defaults={"allreduce": "auto", "gemv": "library"}, as_setup=True)
def serve(model, *, prompt_len: int, output_len: int, batch_size: int = 1, fuse=None,
          setup) -> ServeResult:
    """Predict ``batch_size`` requests of ``prompt_len`` prompt tokens generating
    ``output_len`` tokens each on ``tp`` GPUs (module docstring).

    Args:
        model: a Hugging Face causal LM (meta weights are enough; never modified).
        gpu, dtype, tp, topology, attention, kv_dtype, page_size: as in
            ``fxshape.analyze``.
        allreduce: how the tensor-parallel all-reduces run (``"auto"``: vLLM's choice;
            ``"one-shot"``, ``"two-shot"``, ``"multimem"``, ``"nccl"``).
        fuse: which GEMMs of a decode step that read one activation run as one
            (``fxshape.serving.batch.BatchStep``): ``"all"`` (engines': vLLM's Q/K/V and
            gate/up), ``"qkv"`` (the attention's projections only: gpt-fast's ``wqkv``),
            ``"none"`` (as the Hugging Face model is written). Default ``"all"``, or
            ``"none"`` with ``attention="math"`` (the unfused attention is priced as
            captured). The prefill's GEMMs are priced as captured (compute-bound there,
            fusing changes little).
        gemv: how the decode step's matrix-vector products run (``fxshape.cost.gemv``):
            ``"library"`` (the BLAS GEMM; engines') or ``"inductor"`` (gpt-fast's
            ``torch.compile`` with ``coordinate_descent_tuning``: one Triton reduction
            each at batch 1).
        quantize, group_size: the linear layers quantized, as in ``fxshape.analyze``
            (``"int8"``, ``"int4"``, ``"fp8"``; ``fxshape.cost.quant``), in the prefill and
            every decode step.
        setup: a :class:`fxshape.Setup` holding those fields (its mode ``"decode"`` or
            unset; a field it sets that ``serve`` does not use is refused); the keywords
            change it.

    Returns:
        A frozen :class:`ServeResult`; its ``prefill`` and ``decode`` are the two reports
        it was priced from.

    Raises:
        ValueError: sizes that are not positive integers; a prompt plus output longer than
            the model's positions; a batch whose KV cache does not fit; what ``analyze``
            refuses.
    """
    from ..report.build import analyze
    from ..tracing.decode import check_decoder
    from ..tracing.facts import max_positions
    from ..tracing.export import check_size

    prompt_len = check_size("prompt_len", prompt_len, optional=False)
    output_len = check_size("output_len", output_len, optional=False)
    batch_size = check_size("batch_size", batch_size, optional=False)
    tp, kernels = setup.parallel.tp, setup.kernels
    attention, allreduce, gemv = kernels.attention, kernels.allreduce, kernels.gemv
    if fuse is None:
        fuse = "none" if attention == "math" else "all"
    fuse = check_fuse(fuse)
    if fuse != "none" and attention == "math":
        raise ValueError(f"fuse={fuse!r} re-prices the step with a fused attention kernel; "
                         "with attention='math' give fuse='none'")
    check_decoder(model)
    positions = max_positions(model.config)
    total = prompt_len + output_len
    if positions is not None and total > positions:
        raise ValueError(f"prompt_len {prompt_len:,} + output_len {output_len:,} = {total:,} "
                         f"tokens exceed {type(model).__name__}'s {positions:,} positions")
    setup = setup.replace(provenance=None)
    ids = torch.zeros(batch_size, prompt_len, dtype=torch.long, device="meta")
    prefill = analyze(model, None, {"input_ids": ids, "logits_to_keep": 1},
                      setup=setup.replace(mode="prefill", kv_dtype=None, page_size=None,
                                          gemv=None, execution="compiled"))
    # one decode capture at the longest context the request reaches (its memory is the
    # request's peak); the steps before it re-priced at their own contexts
    last = total - 1
    decode = analyze(model, setup=setup.replace(batch_size=batch_size,
                                                context_len=max(last, 1)))
    _check_fits(decode, batch_size, total, tp)
    if fuse == "none":
        steps = DecodeSteps(decode)
        decode_steps = tuple(steps.time_s(prompt_len + k) for k in range(1, output_len))
    else:
        step = BatchStep(decode, logits_module=logits_module_of(model), fuse=fuse)
        decode_steps = tuple(step.time_s([prompt_len + k] * batch_size)
                             for k in range(1, output_len))
    ttft = prefill.step.time_s
    latency = ttft + sum(decode_steps)
    itl = sum(decode_steps) / len(decode_steps) if decode_steps else 0.0
    notes = (f"prefill: {prefill.step.execution}, logits of the last position only",
             f"decode: {decode.step.execution}, one capture at {last:,} cached tokens, "
             "attention re-priced at each step's context; GEMMs that read one activation "
             f"fused: {fuse}" + ("; matrix-vector products as Inductor's reductions"
                                   if gemv == "inductor" else ""))
    if decode.workload.quantize:
        notes += (f"linear layers {decode.workload.quantize} (fxshape.cost.quant)",)
    return ServeResult(model=type(model).__name__, gpu=decode.gpu, tp=tp,
                       batch_size=batch_size, prompt_len=prompt_len, output_len=output_len,
                       allreduce=allreduce, time_to_first_token_s=ttft,
                       decode_steps_s=decode_steps, latency_s=latency,
                       output_tokens_per_s=batch_size * output_len / latency,
                       inter_token_latency_s=itl, fuse=fuse, gemv=gemv, notes=notes,
                       prefill=prefill, decode=decode)


def _check_fits(decode, batch_size: int, total: int, tp: int) -> None:
    """Refuse a batch whose KV cache at ``total`` tokens does not fit with the weights."""
    if not decode.memory.fits:
        cap = decode.capacity
        raise ValueError(f"{batch_size} sequences of {total:,} tokens do not fit on "
                         f"{decode.gpu} at tp {tp}: the weights and KV cache need "
                         f"{decode.memory.peak / 2**30:.1f} GiB of "
                         f"{decode.memory.capacity / 2**30:.1f} GiB (at most "
                         f"{cap.max_batch:,} sequences of this length; raise tp or lower "
                         "the batch)")
