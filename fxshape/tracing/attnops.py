"""Attention kept whole: fused custom ops for scaled-dot-product attention and its backward.

A GPU runs ``F.scaled_dot_product_attention`` as one fused kernel forward (FlashAttention-2
in PyTorch's flash backend) and one fused kernel backward. Traced on meta or CPU tensors it
would decompose into the math path (unfused ``bmm``, softmax through memory), which is not
what the GPU runs. During capture, :func:`keep_attention_fused` routes every call of
``F.scaled_dot_product_attention`` through two custom ops:

- ``fxshape::attention(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)
  -> (out, logsumexp)``: the fused forward;
- ``fxshape::attention_backward(grad_out, q, k, v, out, logsumexp, attn_mask, dropout_p,
  is_causal, scale, enable_gqa, mask_grad) -> (dq, dk, dv, dmask)``: the fused backward,
  registered as the forward's autograd formula, so aot_autograd's joint graph holds it as
  one node.

Both have fake (shape) implementations, so capture allocates nothing, and real CPU
implementations (the math path, with the same results as ``F.scaled_dot_product_attention``
and its autograd gradients), so a captured graph still runs. Dropout never changes the GEMMs.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

__all__ = ["attention", "attention_backward", "keep_attention_fused", "ATTENTION_OPS"]

_SDPA = F.scaled_dot_product_attention


def _expand_kv(q, k, v, enable_gqa):
    """K/V with their heads repeated to q's (grouped-query attention), as the math path runs."""
    if enable_gqa and k.dim() >= 3 and k.shape[-3] != q.shape[-3]:
        rep = q.shape[-3] // k.shape[-3]
        k = k.repeat_interleave(rep, dim=-3)
        v = v.repeat_interleave(rep, dim=-3)
    return k, v


def _logits(q, k, attn_mask, is_causal, scale):
    s = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    logits = (q.float() @ k.float().transpose(-2, -1)) * s
    if is_causal:
        sq, sk = q.shape[-2], k.shape[-2]
        keep = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril()
        logits = logits.masked_fill(~keep, float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            logits = logits.masked_fill(~attn_mask, float("-inf"))
        else:
            logits = logits + attn_mask.float()
    return logits


@torch.library.custom_op("fxshape::attention", mutates_args=())
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              attn_mask: torch.Tensor | None, dropout_p: float, is_causal: bool,
              scale: float | None, enable_gqa: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused attention forward: ``(out, logsumexp)``; ``out`` equals
    ``F.scaled_dot_product_attention`` (``logsumexp``: float32, one per query row)."""
    out = _SDPA(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                scale=scale, enable_gqa=enable_gqa)
    ke, _ = _expand_kv(q, k, v, enable_gqa)
    lse = torch.logsumexp(_logits(q, ke, attn_mask, is_causal, scale), dim=-1)
    return _flash_layout(out), lse.to(torch.float32)


def _flash_layout(out: torch.Tensor) -> torch.Tensor:
    """``out`` (batch, heads, seq, dim) laid out as FlashAttention writes it, (batch, seq,
    heads, dim) in memory, so that the usual ``transpose(1, 2).contiguous()`` after
    attention is the free view it is on the GPU."""
    if out.dim() != 4:
        return out
    return out.transpose(1, 2).contiguous().transpose(1, 2)


@attention.register_fake
def _attention_fake(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    shape = q.shape[:-1] + (v.shape[-1],)
    if len(shape) == 4:  # FlashAttention's layout (see _flash_layout)
        out = q.new_empty((shape[0], shape[2], shape[1], shape[3])).transpose(1, 2)
    else:
        out = q.new_empty(shape)
    return out, q.new_empty(q.shape[:-1], dtype=torch.float32)


@torch.library.custom_op("fxshape::attention_backward", mutates_args=())
def attention_backward(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                       v: torch.Tensor, out: torch.Tensor, logsumexp: torch.Tensor,
                       attn_mask: torch.Tensor | None, dropout_p: float, is_causal: bool,
                       scale: float | None, enable_gqa: bool, mask_grad: bool
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fused attention backward: ``(dq, dk, dv, dmask)``, the math path's gradients on real
    tensors. ``dmask`` is the gradient of a float mask that requires one (T5's learned
    position bias) when ``mask_grad``, else an empty tensor. Real tensors with dropout are
    refused: the forward's dropout mask is not kept."""
    if dropout_p > 0:
        raise NotImplementedError("fxshape::attention_backward on real tensors with dropout: "
                                  "the forward's dropout mask is not kept (capture on "
                                  "meta/fake tensors, or use dropout_p=0)")
    ke, ve = _expand_kv(q, k, v, enable_gqa)
    s = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    p = torch.softmax(_logits(q, ke, attn_mask, is_causal, scale), dim=-1)
    go = grad_out.float()
    dv = p.transpose(-2, -1) @ go
    dp = go @ ve.float().transpose(-2, -1)
    ds = p * (dp - (go * out.float()).sum(-1, keepdim=True))  # d(logits)
    dq = (ds @ ke.float()) * s
    dk = (ds.transpose(-2, -1) @ q.float()) * s
    if ke.shape != k.shape:  # grouped-query: sum the gradients of each group's heads
        g = q.shape[-3] // k.shape[-3]
        dk = dk.unflatten(-3, (k.shape[-3], g)).sum(-3)
        dv = dv.unflatten(-3, (k.shape[-3], g)).sum(-3)
    dmask = q.new_empty(0)
    if mask_grad:
        dmask = ds.sum_to_size(attn_mask.shape).to(attn_mask.dtype)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dmask


@attention_backward.register_fake
def _attention_backward_fake(grad_out, q, k, v, out, logsumexp, attn_mask, dropout_p,
                             is_causal, scale, enable_gqa, mask_grad):
    dmask = torch.empty_like(attn_mask) if mask_grad else q.new_empty(0)
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), dmask


def _setup_context(ctx, inputs, output):
    q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, attn_mask)
    ctx.flags = (dropout_p, is_causal, scale, enable_gqa)


def _backward(ctx, grad_out, grad_lse):
    q, k, v, out, lse, attn_mask = ctx.saved_tensors
    mask_grad = bool(ctx.needs_input_grad[3])
    dq, dk, dv, dmask = attention_backward(grad_out, q, k, v, out, lse, attn_mask,
                                           *ctx.flags, mask_grad)
    return dq, dk, dv, dmask if mask_grad else None, None, None, None, None


attention.register_autograd(_backward, setup_context=_setup_context)

#: the op packets of the fused forward and backward (for handlers and tests)
ATTENTION_OPS = (torch.ops.fxshape.attention, torch.ops.fxshape.attention_backward)


def _fused_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                scale=None, enable_gqa=False):
    return attention(query, key, value, attn_mask, float(dropout_p), bool(is_causal),
                     None if scale is None else float(scale), bool(enable_gqa))[0]


class _KeepFused(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is _SDPA:
            return _fused_sdpa(*args, **(kwargs or {}))
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def keep_attention_fused():
    """Within this context, ``F.scaled_dot_product_attention`` (however it is called) runs
    as ``fxshape::attention``, whose backward is ``fxshape::attention_backward``.

    The mode catches calls that dispatch ``__torch_function__``; a function that hands itself
    to the mode first (``F.multi_head_attention_forward``, which ``nn.MultiheadAttention`` and
    ``nn.TransformerEncoderLayer`` run) is run by the mode with the mode off, so its own
    ``scaled_dot_product_attention(...)`` (a lookup in ``torch.nn.functional`` at call time)
    is swapped too."""
    import torch.nn.functional as F

    saved = F.scaled_dot_product_attention
    F.scaled_dot_product_attention = _fused_sdpa
    try:
        with _KeepFused():
            yield
    finally:
        F.scaled_dot_product_attention = saved
