"""What fxshape's models predict for one operator of a trace, from its recorded shapes.

A trace's operator carries ``Input Dims`` and ``Input type`` (and, in newer traces, strides
and scalar values), not tensors, so it is priced here, not by the graph walk's handlers
(``fxshape.analysis.opcost``), which read FX nodes; both end in the same cost models:

- GEMMs (``aten::mm``, ``addmm``, ``bmm``, ``baddbmm``): ``fxshape.cost.gemm.predict_matmul``
  with the recorded sizes; the layout from the strides, else ``nt`` under ``aten::linear``;
  fp32 inputs are TF32 when the kernel that ran says so (``tf32``, ``s1688gemm``,
  ``s16816gemm``, ``xf32`` in its name), else fp32 without TF32, PyTorch's default
  (``torch.backends.cuda.matmul.allow_tf32 = False``);
- attention (SDPA's fused kernels): ``fxshape.cost.attention.predict_attention``;
- memory-bound ops (pointwise, reductions, copies, fills, LayerNorm, softmax, ``cat``): the
  bytes they move, from the shapes, at the fitted efficiency of their kernel family
  (``fxshape.cost.memops.kernel_time``);
- collectives (``nccl:*`` annotations, ``record_param_comms`` events):
  ``fxshape.cost.comm.predict_collective`` over the group (the event's ``Group size``, else
  the trace's world size) on the GPU's usual machine.

Every other operator raises :class:`NoModel` with the reason: it is reported as an operator
without a model, its measured time counted apart, never priced as zero. Handlers are
registered by operator name (:func:`register_trace_handler`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from dataclasses import dataclass

from ..cost.attention import AttentionShape, predict_attention
from ..cost.comm import predict_collective
from ..cost.gemm import predict_matmul
from ..cost.gemm_kernels import (AUXILIARY_ROLES, gemm_kernel_role, parse_gemm_tile,
                                 vector_kernel_family)
from ..cost.memops import kernel_time, memop_bytes, memop_family
from ..hardware.gpus import GPUSpec
from ..hardware.topology import default_topology, get_topology

__all__ = ["Priced", "NoModel", "PriceContext", "price_op", "register_trace_handler",
           "trace_dtype", "TF32_MARKERS", "kernel_element_type"]

#: element types as ``Input type`` spells them -> (fxshape dtype key or None, bytes)
_TYPES = {
    "float": ("fp32", 4), "c10::Half": ("fp16", 2), "c10::BFloat16": ("bf16", 2),
    "double": (None, 8), "c10::Float8_e4m3fn": ("fp8", 1), "c10::Float8_e5m2": ("fp8", 1),
    "c10::Float8_e4m3fnuz": ("fp8", 1), "c10::Float8_e5m2fnuz": ("fp8", 1),
    "long int": (None, 8), "int64_t": (None, 8), "int": (None, 4), "short int": (None, 2),
    "signed char": (None, 1), "unsigned char": (None, 1), "bool": (None, 1),
    "c10::complex<float>": (None, 8),
}
#: substrings of kernel names that mean an fp32 GEMM ran on TF32 tensor cores
TF32_MARKERS = ("tf32", "s1688gemm", "s16816gemm", "xf32")

#: For traces that recorded no ``Input type`` (older PyTorch wrote only ``Input dims``):
#: the element types kernel names spell, as ``Input type`` spells them. C++ template
#: arguments (``c10::BFloat16``, ``__nv_bfloat16``, ``c10::Half``, ``float``), cuBLAS's and
#: CUTLASS's names (``bf16``, ``fp16``, ``h884gemm``, ``f16f16``, ``sgemm``, the TF32
#: markers), NCCL's (``..._Sum_float``) and Tensile's data-type field (``Cijk_..._HHS_``:
#: S single, H half, B bfloat16, D double).
_BF16_NAME = re.compile(r"bfloat16|bf16", re.I)
_HALF_NAME = re.compile(r"c10::half|__half|(?<![a-z0-9])(?:fp16|f16|half)(?![0-9])"
                        r"|(?:^|_)h\d{3,5}gemm|hgemm", re.I)
_FLOAT_NAME = re.compile(r"(?<![A-Za-z0-9])float(?![A-Za-z0-9])|sgemm|"
                         + "|".join(TF32_MARKERS))
#: (``c10::optional<double>`` is a scalar argument's type in a signature, not the tensors')
_DOUBLE_NAME = re.compile(r"(?<!optional<)(?<![A-Za-z0-9])double(?![A-Za-z0-9])|dgemm")
_BOOL_NAME = re.compile(r"(?<![A-Za-z0-9_])bool(?![A-Za-z0-9_])")
_TENSILE_TYPE = re.compile(r"Cijk_A[a-z]+_B[a-z]+_([SHBD])[A-Z]*_")
_TENSILE_TYPES = {"S": "float", "H": "c10::Half", "B": "c10::BFloat16", "D": "double"}
#: operators that convert: float beside a 16-bit type in their kernels' names is not an
#: accumulator there, so their element types are not inferred
_CONVERTING = ("aten::copy_", "aten::_to_copy", "aten::to", "aten::type_as")

_COLLECTIVES = {"all_reduce": "all_reduce", "allreduce": "all_reduce",
                "all_reduce_coalesced": "all_reduce", "_all_gather_base": "all_gather",
                "all_gather": "all_gather", "all_gather_into_tensor": "all_gather",
                "all_gather_into_tensor_coalesced": "all_gather",
                "_reduce_scatter_base": "reduce_scatter", "reduce_scatter": "reduce_scatter",
                "reduce_scatter_tensor": "reduce_scatter",
                "reduce_scatter_tensor_coalesced": "reduce_scatter",
                "all_to_all": "all_to_all", "alltoall_base": "all_to_all",
                "all_to_all_single": "all_to_all", "send": "send_recv", "recv": "send_recv",
                "allgather": "all_gather", "_allgather_base": "all_gather",
                "allgather_into_tensor_coalesced": "all_gather", "alltoall": "all_to_all"}
#: ``record_param_comms``' ``dtype`` argument -> bytes per element
_COMM_DTYPES = {"Float": 4, "BFloat16": 2, "Half": 2, "Double": 8, "Int": 4, "Long": 8,
                "Byte": 1, "Char": 1, "Bool": 1, "Float8_e4m3fn": 1, "Float8_e5m2": 1}


class NoModel(Exception):
    """An operator fxshape has no model for; the message says why."""


@dataclass(frozen=True)
class Priced:
    """One operator's prediction: ``cls`` (``"gemm"``, ``"conv"``, ``"attention"``,
    ``"memory"``, ``"communication"``), ``time_s`` (device time of its kernels) and ``what`` (the sizes
    and dtype it was priced at)."""

    cls: str
    time_s: float
    what: str
    #: a GEMM's ``(batch, m, n, k, dtype, layout)`` as priced; () for other classes
    gemm: tuple = ()
    #: a GEMM's bound in the model: ``"compute"``, ``"memory"`` or ``"latency"``; ""
    #: otherwise
    bound: str = ""
    #: a GEMM's time with the model's own kernel choice on the whole GPU (what ``analyze``
    #: predicts for the shape); None for other classes
    chosen_s: float | None = None
    #: a memory-bound op's kernels as priced: ``((family, bytes), ...)``; () otherwise
    memops: tuple = ()
    #: a GEMM priced as the tensor-core kernel that ran: ``(kernel name, split-K factor or
    #: 0 where the trace does not say)``; () otherwise
    ran: tuple = ()
    #: an SDPA call as priced: ``(AttentionShape, direction, dtype key)``; () otherwise
    attention: tuple = ()


@dataclass(frozen=True)
class PriceContext:
    """What pricing one operator needs besides the operator: the GPU (a ``GPUSpec``), the
    names of the kernels it launched, the operator enclosing it (its name, or ""), the
    trace's world size, the GEMM parameter file, the launch grid of each kernel (None
    where the trace has none) and the SMs its kernels had (None: all; fewer while a
    collective's kernel held some)."""

    gpu: GPUSpec
    kernels: tuple
    parent: str = ""
    world_size: int | None = None
    params_path: str | None = None
    grids: tuple = ()
    sms: int | None = None


_HANDLERS = {}


def register_trace_handler(*names):
    """Register ``fn(op, ctx) -> Priced`` for trace operators named ``names``
    (``"aten::mm"``); it raises :class:`NoModel` for calls it cannot price."""
    def deco(fn):
        for n in names:
            _HANDLERS[n] = fn
        return fn
    return deco


def trace_dtype(type_name: str):
    """``(fxshape dtype key or None, itemsize)`` of an ``Input type`` string."""
    if type_name not in _TYPES:
        raise NoModel(f"element type {type_name!r} unknown")
    return _TYPES[type_name]


def _is_shape(d) -> bool:
    return isinstance(d, tuple) and all(isinstance(x, int) and not isinstance(x, bool)
                                        for x in d)


def _tensors(op):
    """``(shape, itemsize)`` of each tensor input (scalars and tensor lists left out)."""
    out = []
    for i, d in enumerate(op.dims):
        t = op.types[i] if i < len(op.types) else ""
        if _is_shape(d) and d and t in _TYPES:
            out.append((d, _TYPES[t][1]))
    return out


def _numel(shape) -> int:
    return math.prod(shape)


def _broadcast(shapes) -> tuple:
    nd = max(len(s) for s in shapes)
    out = []
    for i in range(nd):
        sizes = {s[len(s) - nd + i] for s in shapes if len(s) - nd + i >= 0}
        sizes.discard(1)
        out.append(max(sizes) if sizes else 1)
    return tuple(out)


# ---------------------------------------------------------------------------------------
# GEMMs
# ---------------------------------------------------------------------------------------

def _gemm_dtype(op, ctx, idx) -> str:
    key, _ = trace_dtype(op.types[idx] if idx < len(op.types) else "")
    if key is None:
        raise NoModel(f"a GEMM in {op.types[idx]!r} (no tensor-core or SIMT model)")
    if key == "fp32" and any(m in k.lower() for k in ctx.kernels for m in TF32_MARKERS):
        return "tf32"
    return key


def _transposed(shape, strides) -> bool:
    # a matrix stored column-major: its last dimension is not the contiguous one
    return (strides is not None and len(strides) >= 2 and strides[-1] != 1
            and strides[-2] == 1 and shape[-1] > 1)


_KERNEL_LAYOUT = re.compile(r"_(nn|nt|tn|tt)(?:_|$)")


def _layout(op, ctx, ia, ib) -> str:
    """fxshape's layout of the GEMM: from the recorded strides; else from the kernel's
    name, whose suffix is cuBLAS's column-major view with the operands swapped (PyTorch
    calls ``C^T = B^T A^T``: ``..._tn`` is fxshape's ``nt``, F.linear's); else ``nt`` under
    ``aten::linear`` and ``nn`` otherwise."""
    if op.strides is not None and len(op.strides) > max(ia, ib):
        a = _transposed(op.dims[ia], op.strides[ia])
        b = _transposed(op.dims[ib], op.strides[ib])
        return ("t" if a else "n") + ("t" if b else "n")
    for k in ctx.kernels:
        m = _KERNEL_LAYOUT.search(k)
        if m and ("gemm" in k.lower() or "Cijk" in k):
            return m.group(1)[::-1]
    return "nt" if ctx.parent == "aten::linear" else "nn"


def _gemm(op, ctx, ia, ib, batched):
    if len(op.dims) <= ib or not (_is_shape(op.dims[ia]) and _is_shape(op.dims[ib])):
        raise NoModel("its input shapes are not recorded")
    a, b = op.dims[ia], op.dims[ib]
    if batched:
        if len(a) != 3 or len(b) != 3:
            raise NoModel(f"batched GEMM inputs {list(a)} x {list(b)} are not 3-D")
        batch, m, k, n = a[0], a[1], a[2], b[2]
    else:
        if len(a) != 2 or len(b) != 2:
            raise NoModel(f"GEMM inputs {list(a)} x {list(b)} are not 2-D")
        batch, (m, k), n = 1, a, b[1]
    if min(batch, m, n, k) <= 0:
        raise NoModel("an empty GEMM")
    roles = [gemm_kernel_role(k_) for k_ in ctx.kernels if not k_.startswith(_NOT_KERNELS)]
    if roles and "main" not in roles:
        aux = sorted(set(roles))
        raise NoModel("the trace lacks its GEMM kernel: only the library's "
                      + " and ".join(f"{r} kernel" for r in aux)
                      + " of it is recorded (a sampled or truncated trace): not compared")
    dkey = _gemm_dtype(op, ctx, ia)
    layout = _layout(op, ctx, ia, ib)
    # price the kernel that ran where the trace names it: fp32 without TF32 a SIMT sgemm;
    # tensor cores a kernel whose name has its tile, with its split-K factor (grid.z of a
    # single GEMM, 1 when unsplit; a batched one's grid.z is the batch)
    ran, split = None, None
    if dkey == "fp32":
        ran = next((k_ for k_ in ctx.kernels if "sgemm" in k_), None)
    else:
        for i, k_ in enumerate(ctx.kernels):
            if parse_gemm_tile(k_) is not None:
                ran = k_
                grid = ctx.grids[i] if i < len(ctx.grids) else None
                if batch == 1 and grid and len(grid) == 3 and grid[2] >= 1:
                    split = int(grid[2])
                break
    # cuBLAS's GEMV and K = 1 kernels: a memory-bound pass over the operands (the matrix
    # streamed once; the outer product written), priced by the memory-bound model
    vec = next((f for f in map(vector_kernel_family, ctx.kernels) if f), None)
    try:
        chosen = predict_matmul(m, n, k, batch=batch, dtype=dkey, gpu=ctx.gpu, layout=layout,
                                params_path=ctx.params_path)
        if vec is None:
            p = predict_matmul(m, n, k, batch=batch, dtype=dkey, gpu=ctx.gpu, layout=layout,
                               params_path=ctx.params_path, kernel=ran, split_k=split,
                               sms=ctx.sms)
    except ValueError as exc:
        raise NoModel(str(exc)) from None
    if vec is not None:
        kt = kernel_time(vec, chosen.bytes, gpu=ctx.gpu, params_path=ctx.params_path)
        p = dataclasses.replace(chosen, time_s=kt.time_s, bound=kt.bound, kernel="")
        ran = None
    # kernels the library launched beside the product, each a pass over the output: the
    # stand-alone bias epilogue (reads the product and the bias, writes the sum) and the
    # scaling by beta (reads and writes the output)
    out_e = 4 if dkey in ("fp32", "tf32") else 2
    extra, extra_what = 0.0, ""
    for role in roles:
        if role in ("epilogue", "scale"):
            nbytes = batch * m * n * out_e * 2 + (n * out_e if role == "epilogue" else 0)
            extra += kernel_time("elementwise", nbytes, gpu=ctx.gpu,
                                 params_path=ctx.params_path).time_s
            extra_what += f" + {'bias epilogue' if role == 'epilogue' else 'beta scaling'} kernel"
    what = f"{'B=' + str(batch) + ' ' if batch > 1 else ''}M={m} N={n} K={k} {dkey} {layout}"
    if ran is not None and p.kernel.endswith("as run"):
        sliced = f" split {split}" if split and split > 1 else ""
        what += f" ({p.tile[0]}x{p.tile[1]}{sliced} as run)"
    elif ran is not None and p.kernel and ran.startswith(p.kernel[:-3]):
        what += f" ({p.kernel[:-3]} as run)"
    elif vec is not None:
        what += (f" (cuBLAS {'GEMV' if vec == 'reduction' else 'K=1'} kernel as run: "
                 f"{vec} pass {_mb(chosen.bytes)})")
    what += extra_what
    if ctx.sms is not None:
        what += f" on {ctx.sms} SMs"
    as_run = (ran, split or 0) if ran is not None and p.kernel.endswith("as run") else ()
    return Priced("gemm", p.time_s + extra, what, (batch, m, n, k, dkey, layout), p.bound,
                  chosen.time_s + extra, ran=as_run)


#: device events of a GEMM operator that are no kernel (``gpu_memset`` / ``gpu_memcpy``)
_NOT_KERNELS = ("Memset", "Memcpy")


#: GEMM operators: (the input index of A, of B, batched); addmm and baddbmm take the
#: added tensor first, as does ``_addmm_activation`` (addmm with its GELU or ReLU fused in
#: cuBLASLt's epilogue: nn.TransformerEncoderLayer's fast path); ``_scaled_mm`` is the FP8
#: GEMM (its scales follow the two matrices)
_GEMMS = {"aten::mm": (0, 1, False), "aten::addmm": (1, 2, False),
          "aten::_addmm_activation": (1, 2, False), "aten::_scaled_mm": (0, 1, False),
          "aten::bmm": (0, 1, True), "aten::baddbmm": (1, 2, True)}
for _name, (_a, _b, _batched) in _GEMMS.items():
    register_trace_handler(_name)(
        lambda op, ctx, a=_a, b=_b, batched=_batched: _gemm(op, ctx, a, b, batched))


@register_trace_handler("aten::mv", "aten::addmv")
def _mv(op, ctx):
    """A matrix-vector product (``mv(mat, vec)``, ``addmv(self, mat, vec)``): the GEMM of
    the matrix by the vector as a one-column matrix (cuBLAS runs it on its GEMV kernels)."""
    ia = 1 if op.name == "aten::addmv" else 0
    if len(op.dims) <= ia + 1 or not all(_is_shape(d) for d in op.dims[ia:ia + 2]):
        raise NoModel("its input shapes are not recorded")
    mat, vec = op.dims[ia], op.dims[ia + 1]
    if len(mat) != 2 or len(vec) != 1:
        raise NoModel(f"matrix-vector inputs {list(mat)} x {list(vec)} are not 2-D x 1-D")
    dims = op.dims[:ia + 1] + ((vec[0], 1),) + op.dims[ia + 2:]
    strides = op.strides
    if strides is not None and len(strides) > ia + 1:
        strides = strides[:ia + 1] + ((1, 1),) + strides[ia + 2:]
    return _gemm(dataclasses.replace(op, dims=dims, strides=strides), ctx, ia, ia + 1,
                 False)


# ---------------------------------------------------------------------------------------
# convolutions (cuDNN's and MIOpen's implicit GEMMs)
# ---------------------------------------------------------------------------------------

def _ints(op, arg: str, n: int):
    """Integer list argument ``arg`` of ``op`` from its ``Concrete Inputs`` (``"[2, 2]"``;
    one value stands for every spatial dimension), or None where not recorded."""
    import re

    v = _concrete(op, arg)
    if not isinstance(v, str) or not v.strip():
        return None
    got = [int(x) for x in re.findall(r"-?\d+", v)]
    if len(got) == 1:
        got = got * n
    return tuple(got) if len(got) == n else None


def _conv_gemms(op, ctx, direction):
    """The implicit GEMMs of a convolution as cuDNN runs it (``fxshape.analysis.ops``'s
    convention): forward M = batch x output pixels, N = out channels / groups, K = in
    channels / groups x kernel elements; backward the input gradient (M = batch x input
    pixels) and the weight gradient (reducing over batch x output pixels)."""
    if direction == "forward":
        x, w = (op.dims + ((), ()))[:2]
    else:
        dy, x, w = (op.dims + ((), (), ()))[:3]
    if not (_is_shape(x) and _is_shape(w)) or len(x) < 3 or len(x) != len(w):
        raise NoModel("its input and weight shapes are not recorded as [N, C, spatial...]")
    nd = len(x) - 2
    groups = _concrete(op, "groups")
    try:
        g = int(groups) if isinstance(groups, str) and groups.strip() else 1
    except ValueError:
        g = 1
    if _concrete(op, "transposed") == "True":
        raise NoModel("a transposed convolution (not modelled)")
    kernel = _numel(w[2:])
    n, c_out, c_in = x[0], w[0], w[1]  # w: [out, in / groups, k...]
    if direction == "forward":
        stride, pad = _ints(op, "stride", nd), _ints(op, "padding", nd)
        dil = _ints(op, "dilation", nd) or (1,) * nd
        if stride is None or pad is None:
            raise NoModel("its stride and padding are not recorded (Concrete Inputs)")
        out = [(i + 2 * p - d * (k - 1) - 1) // s + 1
               for i, k, s, p, d in zip(x[2:], w[2:], stride, pad, dil)]
        if min(out) <= 0:
            raise NoModel(f"an empty output {out}")
        return [("fprop", g, n * _numel(out), c_out // g, c_in * kernel)]
    if not _is_shape(dy) or len(dy) != len(x):
        raise NoModel("its output gradient's shape is not recorded")
    mask = _concrete(op, "output_mask")
    want = [t == "True" for t in mask.strip("[]").replace(" ", "").split(",")] \
        if isinstance(mask, str) and mask.strip() else [True, True]
    gemms = []
    if want and want[0]:
        gemms.append(("dgrad", g, n * _numel(x[2:]), c_in, (c_out // g) * kernel))
    if len(want) > 1 and want[1]:
        gemms.append(("wgrad", g, c_out // g, c_in * kernel, n * _numel(dy[2:])))
    if not gemms:
        raise NoModel("a backward that computes only the bias gradient (a reduction)")
    return gemms


def _conv(op, ctx, direction):
    gemms = _conv_gemms(op, ctx, direction)
    first = 1 if direction == "backward" else 0
    dkey = _gemm_dtype(op, ctx, first)
    t, what = 0.0, []
    try:
        for name, g, m, n, k in gemms:
            t += predict_matmul(m, n, k, batch=g, dtype=dkey, gpu=ctx.gpu,
                                params_path=ctx.params_path).time_s
            what.append(f"{name} {'B=' + str(g) + ' ' if g > 1 else ''}M={m} N={n} K={k}")
    except ValueError as exc:
        raise NoModel(str(exc)) from None
    return Priced("conv", t, f"{', '.join(what)} {dkey} (implicit GEMM)")


@register_trace_handler("aten::cudnn_convolution", "aten::miopen_convolution",
                        "aten::convolution", "aten::_convolution")
def _conv_fwd(op, ctx):
    return _conv(op, ctx, "forward")


@register_trace_handler("aten::convolution_backward")
def _conv_bwd(op, ctx):
    return _conv(op, ctx, "backward")


# ---------------------------------------------------------------------------------------
# attention (SDPA's fused kernels; q, k, v as [batch, heads, seq, head_dim])
# ---------------------------------------------------------------------------------------

def _aten(name: str):
    """The ``torch.ops.aten`` overload packet of a trace operator named ``aten::NAME``, or
    None."""
    import torch

    if not name.startswith("aten::"):
        return None
    return getattr(torch.ops.aten, name[len("aten::"):], None)


@functools.lru_cache(maxsize=None)
def _arg_at(name: str, arg: str):
    """Where aten operator ``name``'s argument ``arg`` is in its schema (what its
    ``Concrete Inputs`` follow), or None."""
    packet = _aten(name)
    schema = getattr(getattr(packet, "default", None), "_schema", None)
    names = [a.name for a in schema.arguments] if schema is not None else []
    return names.index(arg) if arg in names else None


def _concrete(op, arg: str):
    """The recorded value (a string) of scalar argument ``arg`` of ``op``, or None."""
    concrete = op.arg("Concrete Inputs")
    at = _arg_at(op.name, arg)
    if isinstance(concrete, tuple) and at is not None and at < len(concrete):
        return concrete[at]
    return None


def _bhsd(op, first, layout):
    """``((b, h, s, d) of q, k, v), note``: the recorded shapes as [batch, heads, seq, dim].
    FlashAttention's and the memory-efficient kernel's own ops take [batch, seq, heads,
    dim]; a variable-length call ([tokens, heads, dim] with cumulative sequence lengths) is
    priced as its sequences at equal length."""
    dims = op.dims[first:first + 3]
    if len(dims) < 3 or not all(_is_shape(d) for d in dims):
        raise NoModel("q, k and v shapes are not recorded")
    if layout == "bshd" and all(len(d) == 3 for d in dims):
        cum = op.dims[first + 3] if len(op.dims) > first + 3 else ()
        if not (_is_shape(cum) and len(cum) == 1 and cum[0] > 1):
            raise NoModel("a variable-length call without its sequence offsets recorded")
        b = cum[0] - 1
        return (tuple((b, h, max(1, round(t / b)), d) for t, h, d in dims),
                f" (variable length: {b} sequences of equal length assumed)")
    if not all(len(d) == 4 for d in dims):
        raise NoModel("q, k and v shapes are not recorded as [batch, heads, seq, dim]")
    if layout == "bshd":
        return tuple((b, h, s, d) for b, s, h, d in dims), ""
    return tuple(tuple(d) for d in dims), ""


def _attention(op, ctx, direction, first, layout="bhsd"):
    ((b, h, sq, d), (_, hk, sk, _), (_, _, _, dv)), varlen = _bhsd(op, first, layout)
    causal = _concrete(op, "is_causal") == "True"
    mask = _concrete(op, "custom_mask_type")  # the memory-efficient kernel's: 1, 2 causal
    if isinstance(mask, str) and mask.strip() in ("1", "2"):
        causal = True
    key, _ = trace_dtype(op.types[first] if first < len(op.types) else "")
    if key not in ("fp16", "bf16"):
        raise NoModel(f"fused attention in {key or op.types[first]!r}")
    shape = AttentionShape(b, h, hk, sq, sk, d, dv, causal)
    choice = sdpa_backend(op.name, ctx.gpu)
    try:
        p = predict_attention(shape, direction=direction, dtype=key, gpu=ctx.gpu,
                              attention=choice)
    except ValueError as exc:
        raise NoModel(str(exc)) from None
    return Priced("attention", p.time_s, f"B={b} H={h} S={sq}x{sk} D={d} {key} "
                  f"{'causal ' if causal else ''}{direction} ({p.kernel}){varlen}",
                  attention=(shape, direction, key, choice))


def sdpa_backend(op_name: str, gpu) -> str:
    """The ``attention=`` choice of the kernel an SDPA operator of a trace ran: its name
    says the backend (``_scaled_dot_product_cudnn_attention``: cuDNN's kernel, modelled on
    Hopper; ``..._flash_attention`` and ``..._efficient_attention``: FlashAttention-2 on sm80+,
    as the model prices both, the memory-efficient kernel before)."""
    from ..hardware.gpus import get_gpu

    spec = get_gpu(gpu)
    if "cudnn" in op_name and spec.arch == "hopper":
        return "cudnn"
    return "flash" if spec.arch in ("volta", "turing") or "cudnn" in op_name else "fa2"


@register_trace_handler("aten::_scaled_dot_product_flash_attention",
                        "aten::_scaled_dot_product_efficient_attention",
                        "aten::_scaled_dot_product_cudnn_attention")
def _sdpa(op, ctx):
    return _attention(op, ctx, "forward", 0)


@register_trace_handler("aten::_scaled_dot_product_flash_attention_backward",
                        "aten::_scaled_dot_product_efficient_attention_backward",
                        "aten::_scaled_dot_product_cudnn_attention_backward")
def _sdpa_bwd(op, ctx):
    return _attention(op, ctx, "backward", 1)  # grad_out first, then q, k, v


# the kernels' own ops, which SDPA's ops call and which launch the kernels (so a trace's
# kernels pair with them): FlashAttention's and the memory-efficient kernel's take q, k, v
# as [batch, seq, heads, dim], cuDNN's as SDPA does
@register_trace_handler("aten::_flash_attention_forward", "aten::_efficient_attention_forward")
def _kernel_attention(op, ctx):
    return _attention(op, ctx, "forward", 0, "bshd")


@register_trace_handler("aten::_flash_attention_backward",
                        "aten::_efficient_attention_backward")
def _kernel_attention_bwd(op, ctx):
    return _attention(op, ctx, "backward", 1, "bshd")


@register_trace_handler("aten::_cudnn_attention_forward")
def _cudnn_attention(op, ctx):
    return _attention(op, ctx, "forward", 0)


@register_trace_handler("aten::_cudnn_attention_backward")
def _cudnn_attention_bwd(op, ctx):
    return _attention(op, ctx, "backward", 1)


# ---------------------------------------------------------------------------------------
# memory-bound ops
# ---------------------------------------------------------------------------------------

def _kernel(family, nbytes, ctx, what):
    return Priced("memory", kernel_time(family, int(nbytes), gpu=ctx.gpu,
                                        params_path=ctx.params_path).time_s, what,
                  memops=((family, int(nbytes)),))


def _mb(nbytes) -> str:
    return f"{nbytes / 1e6:.3g} MB"


@register_trace_handler("aten::native_layer_norm")
def _layer_norm(op, ctx):
    ts = _tensors(op)
    if not ts:
        raise NoModel("its input shape is not recorded")
    x = ts[0][0]
    w = op.dims[2] if len(op.dims) > 2 and _is_shape(op.dims[2]) and op.dims[2] else x[-1:]
    cols = _numel(w)
    rows = _numel(x) // cols
    dkey = _TYPES[op.types[0]][0] or "fp32"
    return _kernel("layer_norm", memop_bytes("layer_norm", rows, cols, dkey), ctx,
                   f"layer_norm {rows}x{cols}")


@register_trace_handler("aten::native_layer_norm_backward")
def _layer_norm_bwd(op, ctx):
    ts = _tensors(op)
    if len(ts) < 2:
        raise NoModel("its input shapes are not recorded")
    (x, e) = ts[1]
    cols = x[-1]
    rows = _numel(x) // cols
    # dx: reads dy, x (and mean, rstd), writes dx; dgamma/dbeta: a second pass over dy, x
    dx = _kernel("layer_norm", 3 * rows * cols * e + 2 * rows * 4, ctx, "")
    dw = _kernel("reduction", 2 * rows * cols * e + 2 * cols * e, ctx, "")
    return Priced("memory", dx.time_s + dw.time_s, f"layer_norm backward {rows}x{cols}",
                  memops=dx.memops + dw.memops)


def _softmax(op, ctx, reads):
    ts = _tensors(op)
    if not ts:
        raise NoModel("its input shape is not recorded")
    x, e = ts[0]
    dkey = _TYPES[op.types[0]][0] or "fp32"
    fam = memop_family("softmax", x[-1], dkey)
    nbytes = (reads + 1) * _numel(x) * e
    return _kernel(fam, nbytes, ctx, f"softmax {_numel(x) // x[-1]}x{x[-1]} ({_mb(nbytes)})")


@register_trace_handler("aten::_softmax", "aten::_log_softmax")
def _softmax_fwd(op, ctx):
    return _softmax(op, ctx, 1)


@register_trace_handler("aten::_softmax_backward_data", "aten::_log_softmax_backward_data")
def _softmax_bwd(op, ctx):
    return _softmax(op, ctx, 2)


@register_trace_handler("aten::copy_")
def _copy(op, ctx):
    ts = _tensors(op)
    if len(ts) < 2:
        raise NoModel("its input shapes are not recorded")
    (dst, ed), (src, es) = ts[:2]
    nbytes = _numel(dst) * ed + _numel(src) * es
    return _kernel("copy", nbytes, ctx, f"copy {_mb(nbytes)}")


@register_trace_handler("aten::fill_", "aten::zero_")
def _fill(op, ctx):
    ts = _tensors(op)
    if not ts:
        raise NoModel("its input shape is not recorded")
    x, e = ts[0]
    return _kernel("fill", _numel(x) * e, ctx, f"fill {_mb(_numel(x) * e)}")


@register_trace_handler("aten::cat")
def _cat(op, ctx):
    parts = op.dims[0] if op.dims else ()
    if not op.types or op.types[0] != "TensorList":
        raise NoModel(f"its inputs are recorded as {list(op.types)}, not a tensor list")
    shapes = [p for p in parts if _is_shape(p) and p] if isinstance(parts, tuple) else []
    if not shapes:
        raise NoModel("its input shapes are not recorded")
    # TensorList inputs carry no element type of their own: the trace's next typed input
    # or fp32
    e = next((_TYPES[x][1] for x in op.types if x in _TYPES), 4)
    nbytes = 2 * sum(_numel(s) for s in shapes) * e
    return _kernel("copy", nbytes, ctx, f"cat {_mb(nbytes)}")


@functools.lru_cache(maxsize=None)
def _tags(name: str) -> frozenset:
    """The ``torch.Tag`` names of any overload of aten operator ``name`` (``aten::add``)."""
    packet = _aten(name)
    if packet is None:
        return frozenset()
    tags = set()
    for ov in packet.overloads():
        tags.update(str(t).split(".")[-1] for t in getattr(getattr(packet, ov), "tags", ()))
    return frozenset(tags)


def _generic(op, ctx):
    """Pointwise and reduction ops by their tags; anything else has no model."""
    tags = _tags(op.name)
    ts = _tensors(op)
    if "pointwise" in tags:
        if not ts:
            raise NoModel("its input shapes are not recorded")
        out = _broadcast([s for s, _ in ts])
        e_out = max(e for _, e in ts)
        read = sum(_numel(s) * e for s, e in ts)
        nbytes = read + _numel(out) * e_out
        return _kernel("elementwise", nbytes, ctx, f"pointwise {_mb(nbytes)}")
    if "reduction" in tags:
        if not ts:
            raise NoModel("its input shapes are not recorded")
        x, e = ts[0]
        return _kernel("reduction", _numel(x) * e, ctx, f"reduction {_mb(_numel(x) * e)}")
    raise NoModel(f"no trace model for {op.name}")


# ---------------------------------------------------------------------------------------
# collectives
# ---------------------------------------------------------------------------------------

def _collective(op, ctx):
    """An ``nccl:*`` annotation (its buffers in ``Input Dims``) or a ``record_param_comms``
    event (``Collective name``, ``In msg nelems`` / ``Out msg nelems``, ``dtype``)."""
    comms = op.name == "record_param_comms"
    name = str(op.arg("Collective name", "")) if comms else op.name[len("nccl:"):]
    kind = _COLLECTIVES.get(name)
    if kind is None:
        raise NoModel(f"no model for the collective {name or op.name!r}")
    n = op.arg("Group size") or ctx.world_size
    if not isinstance(n, int) or n < 1:
        raise NoModel("the group size is unknown (no 'Group size' on the event and no "
                      "distributedInfo.world_size in the trace)")
    if comms:
        e = _COMM_DTYPES.get(str(op.arg("dtype", "")))
        nel = op.arg("Out msg nelems" if kind == "all_gather" else "In msg nelems")
        if e is None or not isinstance(nel, int) or nel <= 0:
            raise NoModel("its message size or dtype is not recorded")
        nbytes = nel * e  # all_gather: the gathered (output) buffer, as the model takes it
    else:
        ts = _tensors(op)
        if not ts:
            raise NoModel("its buffer sizes are not recorded")
        nbytes = sum(_numel(s) * e for s, e in ts)
        if kind == "all_gather":
            nbytes *= n  # the input is this rank's shard; the model takes the gathered buffer
    topo = default_topology(ctx.gpu.name)
    nodes = max(1, -(-n // topo.gpus_per_node))
    try:
        p = predict_collective(kind, nbytes, n if kind != "send_recv" else 2,
                               topology=get_topology(f"{topo.name}:{nodes}"))
    except ValueError as exc:
        raise NoModel(str(exc)) from None
    return Priced("communication", p.time_s,
                  f"{kind} {_mb(nbytes)} over {n} GPUs ({topo.name})")


def kernel_element_type(op_name: str, kernels) -> str:
    """The element type, as ``Input type`` spells it, that the names of operator
    ``op_name``'s kernels say its tensors have: for traces recorded without ``Input type``.

    One type spelled is the answer; a 16-bit type beside ``float`` is the 16-bit one
    (``float`` is the accumulator: ``ampere_fp16_s16816gemm_fp16``, ``ReduceOp<c10::Half,
    ... float ...>``), except for an operator that converts (``copy_``, ``_to_copy``). A
    kernel that casts its inputs (PyTorch's ``LoadWithCast``: inputs of mixed types) is not
    read at all.

    Raises:
        NoModel: the names spell no type, or several.
    """
    if any("WithCast" in k for k in kernels):
        raise NoModel("its input types are not recorded (no 'Input type': an older PyTorch) "
                      "and its kernel converts between types (LoadWithCast): which input "
                      "has which its name does not say")
    found = set()
    for k in kernels:
        if k.startswith(_NOT_KERNELS) or gemm_kernel_role(k) in AUXILIARY_ROLES:
            continue  # a memset, or a split-K reduce (in fp32 whatever the GEMM's type)
        k = _without_parameters(k)
        m = _TENSILE_TYPE.search(k)
        if m:
            found.add(_TENSILE_TYPES[m.group(1)])
            continue
        if _BF16_NAME.search(k):
            found.add("c10::BFloat16")
        if _HALF_NAME.search(_BF16_NAME.sub("", k)):
            found.add("c10::Half")
        if _FLOAT_NAME.search(k):
            found.add("float")
        if _DOUBLE_NAME.search(k):
            found.add("double")
        if _BOOL_NAME.search(k):
            found.add("bool")  # a mask beside float (where's lambda(bool, float, float))
    if (len(found) == 2 and "float" in found and found & {"c10::Half", "c10::BFloat16"}
            and op_name not in _CONVERTING):
        found.discard("float")
    if len(found) != 1:
        said = f"they spell {', '.join(sorted(found))}" if found else "they spell none"
        raise NoModel("its input types are not recorded (no 'Input type': an older PyTorch) "
                      f"and its kernels' names do not say one: {said}")
    return found.pop()


def _without_parameters(kernel: str) -> str:
    """A demangled kernel name less its parameter list (``softmax_warp_forward<float, ...>
    (float*, ..., bool const*, int, bool)``: the flags and indices there are no tensor's
    element type); template and lambda arguments stay."""
    if not kernel.endswith(")"):
        return kernel
    depth = 0
    for i in range(len(kernel) - 1, -1, -1):
        depth += {")": 1, "(": -1}.get(kernel[i], 0)
        if depth == 0:
            return kernel[:i]
    return kernel


def _typed(op, ctx):
    """``(op, type)``: ``op`` with the ``Input type`` its kernels' names imply for each
    tensor input (a scalar ``Scalar``, a tensor list ``TensorList``), when the trace
    recorded none, and that type."""
    t = kernel_element_type(op.name, ctx.kernels)
    types = tuple("Scalar" if not d else t if _is_shape(d) else "TensorList"
                  for d in op.dims)
    return dataclasses.replace(op, types=types), t


def price_op(op, ctx: PriceContext) -> Priced:
    """Price trace operator ``op`` (a ``fxshape.traces.kineto.TraceOp``). A trace that
    recorded shapes but no ``Input type`` (an older PyTorch) is priced at the element
    type its kernels' names spell (:func:`kernel_element_type`), and ``what`` says so.

    Raises:
        NoModel: fxshape has no model for it (the message says why).
    """
    if op.dims and not op.types:
        op, t = _typed(op, ctx)
        got = _price(op, ctx)
        return dataclasses.replace(got, what=f"{got.what} (element type from the kernel "
                                              f"names: {t})")
    return _price(op, ctx)


def _price(op, ctx):
    if op.name.startswith("nccl:") or op.name == "record_param_comms":
        return _collective(op, ctx)
    if op.name.startswith("triton_"):
        raise NoModel("a Triton kernel Inductor generated: the trace records no tensor "
                      "shapes for it (analyze(execution='compiled') prices its fusion group "
                      "from the graph)")
    handler = _HANDLERS.get(op.name)
    if handler is not None:
        return handler(op, ctx)
    return _generic(op, ctx)
