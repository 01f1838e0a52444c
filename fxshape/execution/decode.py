"""One decode step (``analyze(mode="decode")``): the model wrapped with a static KV cache
(``fxshape.tracing.decode``), analysed as a forward of one token per sequence, then its
workload, KV cache, bandwidth floor and serving capacity (moved out of
``fxshape.analysis.annotate``, issue 53).

The floor (``Step.floor_s``) is the bytes the step must read over the peak DRAM bandwidth:
every weight but the input embedding (gathered a row a token; all of it where the output
layer shares it), less the experts no token is routed to, plus the context's keys and
values (a sliding-window layer's last ``window`` of them; an MLA layer's latent).
"""

from __future__ import annotations

import dataclasses

from ..hardware.dtypes import canonical_dtype, kv_format
from ..tracing.decode import kv_bytes_by_layer, latent_kv
from ..tracing.export import CaptureError, check_module, resolve_seq_len
from ..tracing.facts import (attention_windows, expert_params, head_counts, input_embedding,
                             routed_experts)
from .execute import param_shards
from ..analysis.parallel import check_tp, kv_heads_per_gpu

__all__ = ["analyze_decode"]


def _check_decode(model, w) -> int | None:
    """Refuse what a decode step cannot take (a model that is no decoder, inputs, a
    sequence length, a page longer than the positions); the model's positions."""
    from ..tracing.decode import check_decoder
    from ..tracing.facts import max_positions

    check_module(model)
    check_decoder(model)
    if w.example_inputs is not None or w.example_kwargs is not None:
        raise ValueError("mode='decode' builds its own inputs (one token per sequence and "
                         "the cache position): give batch_size and context_len instead")
    if w.seq_len is not None:
        raise ValueError("mode='decode' feeds one new token per sequence: give context_len "
                         "(the tokens in the KV cache), not seq_len")
    positions = max_positions(model.config)
    page_size = w.page_size
    if page_size is not None and positions is not None and page_size > positions:
        raise ValueError(f"page_size={page_size} exceeds the model's {positions} positions: "
                         "no page could ever fill; accepted: 1 to "
                         f"{positions} (vLLM uses 16)")
    return positions


def analyze_decode(model, setup, *, ctx=None, run, quant=None):
    """One decode step (``mode="decode"``): the model wrapped with a static KV cache
    (``fxshape.tracing.decode``), analyzed as a forward of one token per sequence by
    ``run`` (``analyze``'s body for the other modes, passed in: this module sits below it)
    under ``setup`` made the forward's: the report's parts (``ReportParts``) of the decode
    step, its KV cache, bandwidth floor and capacity."""
    from ..tracing.decode import decode_capture, decode_target, kv_cache_bytes
    from ..tracing.facts import kv_heads_of
    from ..analysis.rows import WorkloadRecord
    from .serving import capacity_of
    from .step import run_dtype

    w, k = setup.workload, setup.kernels
    batch_size, context_len, kv_dtype, page_size = w.batch_size, w.context_len, w.kv_dtype, \
        w.page_size
    tp, dtype, moe_routing = setup.parallel.tp, k.dtype, w.moe_routing
    positions = _check_decode(model, w)
    dkey = canonical_dtype(dtype)
    kv_key, kv_item = kv_format(kv_dtype) if kv_dtype is not None else (None, None)
    if kv_key in (dkey, canonical_dtype(run_dtype(dkey))):
        kv_key = None  # the cache is in the run dtype already: the default
    spec = setup.machine.spec
    if kv_key == "nvfp4" and spec.arch != "blackwell":
        raise ValueError(f"kv_dtype='nvfp4' needs Blackwell (TensorRT-LLM's NVFP4 KV cache); "
                         f"{spec.name} is not; accepted here: 'fp8', 'int8'")
    heads, kv_heads = head_counts(model)
    kv_heads = kv_heads or kv_heads_of(model.config)
    check_tp(tp, heads, kv_heads)
    wrapper, kwargs, length = decode_target(model, batch_size, context_len)
    wrapper.config = model.config  # heads and features for tp sharding, as the model's
    if ctx is not None:
        ctx["default_execution"] = "cudagraphs"
        ctx["default_allreduce"] = "auto"
        ctx["default_context_len"] = resolve_seq_len(model.config, None)
    inner = setup.replace(mode="inference", example_kwargs=kwargs, batch_size=None,
                          context_len=None, kv_dtype=None, page_size=None, provenance=None,
                          execution=k.execution or "cudagraphs",
                          allreduce="auto" if k.allreduce is None else k.allreduce)
    with decode_capture():
        try:
            parts = run(wrapper, inner, kv=(kv_key, page_size), ctx=ctx, quant=quant)
        except CaptureError as exc:
            raise CaptureError(f"could not capture one decode step of {type(model).__name__} "
                               "through transformers' static KV cache\n"
                               + "\n".join(str(exc).splitlines()[1:])) from None
    item = kv_item if kv_key else run_dtype(dkey).itemsize
    b = kwargs["input_ids"].shape[0]
    pages = -(-length // page_size) * page_size if page_size else length
    # each GPU holds its KV heads' share (one whole head each when tp exceeds them)
    # (an MLA cache holds one latent a token, whole on every GPU of the TP group)
    all_kv = 1 if latent_kv(model.config) is not None else (kv_heads or heads or 1)
    by_name = attention_windows(wrapper)
    windows = {mod.layer_idx: by_name[name] for name, mod in wrapper.named_modules()
               if name in by_name}
    per_gpu = kv_heads_per_gpu(all_kv, tp)
    read = kv_cache_bytes(wrapper, item, windows) * per_gpu // all_kv
    kv = read * pages // length  # what is held: whole pages
    layout = _kv_layout(wrapper, item, windows, per_gpu / all_kv / b)

    def strip(r):
        return dataclasses.replace(r, module=r.module[len("model."):]
                                   if r.module.startswith("model.") else r.module)

    workload = WorkloadRecord(mode="decode", inputs=parts.workload.inputs, batch_size=b,
                              seq_len=1, tp=tp, attention=k.attention,
                              kernels=parts.workload.kernels, context_len=length,
                              kv_dtype=kv_key, page_size=page_size, kv_layout=layout)
    cache = (f"{kv_key} " if kv_key else "") + (f"paged ({page_size} tokens a page) "
                                                 if page_size else "")
    notes = (f"decode: one token per sequence over {'an' if kv_key else 'a'} {cache}KV "
             f"cache of {length} tokens; " + _decode_attention_note(model, parts),)
    mem = parts.memory
    memory = dataclasses.replace(mem, kv_cache=kv, peak=mem.peak + kv)
    # the floor reads what the step must read: the context's keys and values, not the
    # unfilled rest of its last page
    item_w = run_dtype(dkey).itemsize
    unread = _unrouted_expert_bytes(wrapper, parts.rows, tp, item_w, moe_routing)
    floor = (mem.parameters - _input_embedding_bytes(model, tp, item_w) - unread
             + read) / (spec.memory_bandwidth_gbs * 1e9)
    notes += _window_and_latent_notes(model, parts, windows, length)
    if unread:
        notes += (f"MoE: the bandwidth floor reads the routed experts only ("
                  f"{unread / 2**30:.2f} GiB of expert weights a step does not touch left "
                  "out)",)
    step = dataclasses.replace(parts.step, mode="decode", tokens=b,
                               notes=parts.step.notes + notes, floor_s=floor)
    parts = dataclasses.replace(parts, rows=tuple(strip(r) for r in parts.rows),
                                ops=tuple(strip(o) for o in parts.ops), workload=workload,
                                step=step, memory=memory, model_name=type(model).__name__)
    return dataclasses.replace(parts, capacity=capacity_of(parts, max_positions=positions))


def _kv_layout(wrapper, item, windows, per_sequence_gpu) -> tuple:
    """``WorkloadRecord.kv_layout``: ``((window, bytes), ...)``, the bytes a token of one sequence
    holds on one GPU in the layers of each window (0: the whole context); empty without
    windows."""
    layout: dict = {}
    if windows:
        for i, nbytes in kv_bytes_by_layer(wrapper, item).items():
            w = windows.get(i, 0)
            layout[w] = layout.get(w, 0.0) + nbytes * per_sequence_gpu
    return tuple(sorted(layout.items()))


def _window_and_latent_notes(model, report, windows, length) -> tuple:
    """The decode step's notes on its sliding windows and on MLA as transformers runs it."""
    notes = []
    if windows and min(windows.values()) < length:
        layers = sum(1 for w in windows.values() if w < length)
        ws = ", ".join(str(w) for w in sorted(set(windows.values())))
        fused = _runs_fused(report)
        what = "attend to and cache only their last" if fused else "cache only their last"
        total = getattr(model.config, "num_hidden_layers", layers) or layers
        notes.append(
            f"sliding window: {layers} layer{'s' if layers > 1 else ''} {what} {ws} "
            "tokens (as a serving engine's sliding-window cache holds them)"
            + ("" if fused else "; the eager attention priced here masks the scores of the "
               "whole context instead")
            + (f"; the other {total - layers} the whole {length}" if total > layers else ""))
    if latent_kv(model.config) is not None:
        r, rope = latent_kv(model.config)
        notes.append(
            f"MLA as transformers runs it: the cache holds the {r}-wide latent and the "
            f"{rope}-wide rotary key a token, and every step expands the whole context's "
            "latents through kv_b_proj (a GEMM of M = batch x context) before attention; "
            "serving engines (FlashMLA in vLLM and SGLang) absorb kv_b_proj into the query "
            "and output projections and attend over the latent, which this step does not "
            "model: it is slower than theirs")
    return tuple(notes)


def _runs_fused(report) -> bool:
    """Whether the step's attention ran as a fused kernel (its rows name one), not as the
    model's eager matmuls."""
    return any(r.kernel for r in report.rows if r.op.startswith("sdpa"))


def _decode_attention_note(model, report) -> str:
    """What the decode step's attention runs as: a fused kernel's split-KV decode path, or,
    where the model's attention ran unfused (its eager code), its matmuls as captured."""
    if _runs_fused(report):
        return ("attention on the split-KV decode path (fxshape.cost.decode_attention), each "
                "KV head read once per group")
    cap = getattr(model.config, "attn_logit_softcapping", None)
    why = (f" (transformers runs {type(model).__name__}'s softcapped attention eagerly: SDPA "
           "has no softcap; FlashAttention and FlashInfer, which serving engines run, do, and "
           "are not what this prices)" if cap else
           f" (attn_implementation={model.config._attn_implementation!r})"
           if getattr(model.config, "_attn_implementation", None) else "")
    return ("attention unfused, as the model's eager code runs it: a matrix-vector product "
            f"over the cache per head, a softmax and another{why}")


def _unrouted_expert_bytes(model, rows, tp, item, routing=None) -> int:
    """Bytes per GPU of the routed experts' weights one decode step does not read
    (``model`` as captured: ``rows`` name its modules): a grouped expert GEMM reads only the
    experts that get rows (balanced routing: ``min(E, rows)`` of the ``E``; routing given:
    those with a share), as its rows are priced. 0 for a dense model or when every expert
    gets rows."""
    experts = expert_params(model)
    e = routed_experts(model)
    if not experts or not e:
        return 0
    touched, total = {}, {}
    for r in rows:
        if r.phase != "forward" or r.op != "grouped_mm":
            continue
        # balanced: one row of E experts, each at most m rows (m = 1: E·work experts get one);
        # routing given: one row per expert that gets rows
        got = r.batch if r.m > 1 else round(r.batch * r.work)
        touched[r.node] = touched.get(r.node, 0) + got
        total[r.node] = len(routing) if routing is not None else r.batch
    if not total:
        return 0
    share = min(1.0, sum(touched.values()) / sum(total.values()))
    if share >= 1.0:
        return 0
    shards = param_shards(model, tp, rows, head_counts(model))  # as memory.parameters holds them
    held = sum(n for p, (n, _, _) in zip(model.parameters(), shards) if id(p) in experts)
    return int(held * item * (1.0 - share))




def _input_embedding_bytes(model, tp, item) -> int:
    """Bytes per GPU of the input embedding a decode step gathers a row a token of (0 when
    the output layer shares it: then all of it is read)."""
    w, tied = input_embedding(model)
    if w is None or tied:
        return 0
    return w.numel() // (tp if w.dim() >= 2 else 1) * item
