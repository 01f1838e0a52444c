"""FP8 training as torchao's float8 runs it under torch.compile (``fxshape.cost.float8``,
``analyze(float8=)``, issue 32): the extra kernels of one linear layer counted by hand, the
casts' bytes, FSDP's FP8 all-gather, where FP8 stops paying, and bad input."""

import pytest
import torch

import fxshape
from fxshape import Parallel
from fxshape.cost.float8 import predict_float8, scaled_mm_eligible
from fxshape.cost.gemm import predict_matmul

transformers = pytest.importorskip("transformers")

from models import tiny_llama  # noqa: E402


class _OneLinear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(256, 512)

    def forward(self, x):
        return self.fc(x)


_TRAIN = dict(mode="train", gpu="h100", execution="compiled", provenance=None)


def _one_linear(recipe):
    x = torch.zeros(128, 256, device="meta")
    return fxshape.analyze(_OneLinear().to("meta"), (x,), float8=recipe, **_TRAIN)


def test_one_linear_layers_float8_kernels_counted_by_hand():
    # tensorwise: forward casts x and w (an amax, then a cast writing both layouts: 2
    # kernels each) besides its _scaled_mm: 5; dgrad casts grad_y: 3; wgrad reuses the
    # transposed copies: 1 -- 9 kernels for 3 GEMMs, 6 of them amax and cast kernels
    r = _one_linear("tensorwise")
    roles = {x.quant.rsplit(":", 1)[1]: x.kernels for x in r.rows}
    assert set(x.dtype for x in r.rows) == {"fp8"}
    assert [x.phase for x in r.rows].count("forward") == 1
    assert roles.get("forward") == 5 and roles.get("wgrad") == 1
    # the input of a lone linear needs no gradient: its dgrad is not in the graph
    assert roles.get("dgrad", 3) == 3
    # rowwise: x and w rowwise (1 kernel each, the row amax inside); wgrad casts grad_y and
    # x columnwise (a column amax, then the cast: 2 each)
    rw = {x.quant.rsplit(":", 1)[1]: x.kernels for x in _one_linear("rowwise").rows}
    assert rw["forward"] == 3 and rw["wgrad"] == 5
    # the step counts them: bf16's kernels plus the casts
    plain = fxshape.analyze(_OneLinear().to("meta"), (torch.zeros(128, 256, device="meta"),),
                            **_TRAIN)
    assert r.step.kernels - plain.step.kernels == sum(x.kernels - 1 for x in r.rows)


def test_the_casts_bytes_by_hand():
    # forward of x[4096, 4096] @ w[4096, 4096]^T, tensorwise: each tensor read for its amax
    # (2 bytes an element), read again and written in FP8 twice (2 + 2): 6 bytes an
    # element, for x and for w
    f = predict_float8("forward", 4096, 4096, 4096, "tensorwise", gpu="h100")
    assert f.cast_bytes == 6 * 4096 * 4096 * 2 and f.kernels == 5
    # its time: the FP8 GEMM's plus the casts'
    gemm = predict_matmul(4096, 4096, 4096, dtype="fp8", gpu="h100")
    assert f.prediction.time_s == pytest.approx(gemm.time_s + f.cast_s, rel=1e-12)
    # wgrad under rowwise: grad_y^T [M, K] and x [K, N] columnwise, 2 + 2 + 1 bytes each
    w = predict_float8("wgrad", 512, 1024, 8192, "rowwise", gpu="h100")
    assert w.cast_bytes == 5 * (512 * 8192 + 8192 * 1024)


def test_float8_pays_for_large_gemms_and_not_for_small_ones():
    # torchao's own reading: bf16 time - fp8 time > the casts only for large M, K, N
    for role in ("forward", "dgrad"):
        big = predict_float8(role, 16384, 8192, 8192, "tensorwise", gpu="h100")
        assert big.prediction.time_s < predict_matmul(16384, 8192, 8192, gpu="h100").time_s
        small = predict_float8(role, 256, 256, 256, "tensorwise", gpu="h100")
        assert small.prediction.time_s > predict_matmul(256, 256, 256, gpu="h100").time_s


def test_fsdp_gathers_the_converted_weights_in_fp8():
    m = tiny_llama()
    kw = dict(_TRAIN, seq_len=64, parallel=Parallel(dp=8, zero=3))
    plain = fxshape.analyze(m, **kw)
    t = fxshape.analyze(m, float8="tensorwise", **kw)
    r = fxshape.analyze(m, float8="rowwise", **kw)
    gather = {name: next(c.bytes for c in rep.step.communication if c.op == "all_gather")
              for name, rep in (("bf16", plain), ("tensorwise", t), ("rowwise", r))}
    # per layer the linear weights: q 256x256, k and v 256x64, o 256x256, gate, up and
    # down 256x512: 557,056 elements; 2 layers, each gathered for its forward and again
    # for its backward (resharded after the forward): one byte less an element each time
    assert gather["bf16"] - gather["tensorwise"] == 557_056 * 2 * 2
    assert gather["rowwise"] == gather["bf16"]  # rowwise gathers bf16
    assert t.step.time_s != plain.step.time_s
    notes = " ".join(t.notes)
    assert "FSDP gathers the converted weights in FP8" in notes
    assert "lm_head" in notes  # the LM head stays in bf16, said


def test_scaled_mm_needs_multiples_of_16():
    assert scaled_mm_eligible(4096, 4096, 4096) and not scaled_mm_eligible(4096, 4100, 4096)
    with pytest.raises(ValueError, match="multiples of 16"):
        predict_float8("forward", 100, 4096, 4096, "tensorwise", gpu="h100")
    # a layer torchao's filter leaves out (features not multiples of 16) is said
    m = tiny_llama(intermediate_size=520)
    rep = fxshape.analyze(m, float8="tensorwise", seq_len=64, **_TRAIN)
    assert "not multiples of 16" in " ".join(rep.notes)
    assert not any(x.quant for x in rep.rows if x.module.endswith("mlp.down_proj"))


@pytest.mark.parametrize("kwargs, match", [
    (dict(float8="blockwise"), "unknown float8 recipe 'blockwise'; accepted: tensorwise"),
    (dict(float8="tensorwise", gpu="a100"), "no FP8 tensor cores"),
    (dict(float8="tensorwise", mode="inference"), "give mode='train'"),
    (dict(float8="tensorwise", execution="eager"), "give execution='compiled'"),
    (dict(float8="tensorwise", dtype="fp16"), "accepted: bf16"),
    (dict(float8="tensorwise", quantize="int8"), "give one of them"),
])
def test_bad_input(kwargs, match):
    kw = dict(_TRAIN, seq_len=16)
    kw.update(kwargs)
    with pytest.raises(ValueError, match=match):
        fxshape.analyze(tiny_llama(), **kw)


def test_a_torchtitan_float8_job_is_priced(tmp_path):
    from fxshape.torchtitan import read_torchtitan

    text = """
[model]
name = "llama3"
flavor = "debugmodel"
converters = ["quantize.linear.float8"]
[quantize.linear.float8]
recipe_name = "rowwise"
[training]
local_batch_size = 2
seq_len = 256
[compile]
enable = true
"""
    path = tmp_path / "job.toml"
    path.write_text(text)
    job = read_torchtitan(str(path), gpus=8)
    assert job.float8 == "rowwise"
    # without torch.compile it is predicted as the bf16 run, and said
    path.write_text(text.replace("enable = true", "enable = false"))
    eager = read_torchtitan(str(path), gpus=8)
    assert eager.float8 is None and any("float8 rowwise" in n for n in eager.notes)


def test_mxfp8_casts_each_operand_along_its_reduction_dimension():
    # every GEMM casts its two operands, each in one kernel (the 32-element block's amax
    # inside) that reads bf16 and writes e4m3 plus an e8m0 scale a block: 2 + 1 + 1/32
    # bytes an element
    for role in ("forward", "dgrad", "wgrad"):
        f = predict_float8(role, 4096, 2048, 1024, "mxfp8", gpu="b200")
        assert f.kernels == 3
        elements = 4096 * 1024 + 1024 * 2048  # [M, K] and [K, N]
        assert f.cast_bytes == pytest.approx(elements * (3 + 1 / 32), abs=2)
    # its blocks: every dimension a multiple of 32
    assert scaled_mm_eligible(4096, 4096, 4096, "mxfp8")
    assert not scaled_mm_eligible(4096, 4096, 4112, "mxfp8")
    assert scaled_mm_eligible(4096, 4096, 4112, "tensorwise")
    with pytest.raises(ValueError, match="Blackwell"):
        predict_float8("forward", 4096, 4096, 4096, "mxfp8", gpu="h100")
    with pytest.raises(ValueError, match="Blackwell"):
        fxshape.analyze(tiny_llama(), float8="mxfp8", seq_len=64, **_TRAIN)


def test_a_torchtitan_mx_job_trains_in_mxfp8(tmp_path):
    from fxshape.torchtitan import read_torchtitan

    path = tmp_path / "mx.toml"
    path.write_text("""
[model]
name = "llama3"
flavor = "debugmodel"
converters = ["quantize.linear.mx"]
[quantize.linear.mx]
recipe_name = "mxfp8_cublas"
[training]
local_batch_size = 2
seq_len = 256
[compile]
enable = true
""")
    assert read_torchtitan(str(path), gpus=8).float8 == "mxfp8"


# --- Transformer Engine's recipes (issue 51, item 4) ---------------------------------------

def _kernels_by_role(recipe, gpu="h100", m=4096, n=4096, k=4096):
    return {role: predict_float8(role, m, n, k, recipe, gpu=gpu).kernels
            for role in ("forward", "dgrad", "wgrad")}


def test_transformer_engine_kernel_list_per_recipe_by_hand():
    # te-delayed (DelayedScaling): the scale comes from earlier steps' amaxes, so each cast
    # tensor is one cast_transpose kernel (this step's amax recorded inside it): forward
    # casts x and w (GEMM + 2), dgrad grad_y (GEMM + 1), wgrad reuses the transposed
    # copies (GEMM alone)
    assert _kernels_by_role("te-delayed") == {"forward": 3, "dgrad": 2, "wgrad": 1}
    # te-current (Float8CurrentScaling): an amax kernel before each cast_transpose
    assert _kernels_by_role("te-current") == {"forward": 5, "dgrad": 3, "wgrad": 1}
    # te-mxfp8 (MXFP8BlockScaling, Blackwell): one quantize kernel per tensor writing the
    # row- and column-wise MXFP8 copies, the block amax inside
    assert _kernels_by_role("te-mxfp8", gpu="b200") == {"forward": 3, "dgrad": 2, "wgrad": 1}


def test_transformer_engine_cast_bytes_by_hand():
    m = n = k = 4096
    # te-delayed forward: x [M, K] and w [N, K], each read once in bf16 (2 bytes) and
    # written in FP8 in both layouts (1 + 1): 4 bytes an element, no amax pass
    f = predict_float8("forward", m, n, k, "te-delayed", gpu="h100")
    assert f.cast_bytes == 4 * m * k + 4 * n * k
    # te-current: the amax pass reads each tensor once more: 6 bytes an element
    c = predict_float8("forward", m, n, k, "te-current", gpu="h100")
    assert c.cast_bytes == 6 * m * k + 6 * n * k and c.cast_s > f.cast_s
    # te-mxfp8 dgrad: grad_y [M, N=K here] read once (2) and written twice in MXFP8, an
    # e8m0 byte per 32 elements each (2 x (1 + 1/32))
    x = predict_float8("dgrad", m, n, k, "te-mxfp8", gpu="b200")
    assert x.cast_bytes == round((2 + 2 * (1 + 1 / 32)) * m * k)
    # the GEMM itself is the same FP8 GEMM as torchao's
    assert f.prediction.time_s - f.cast_s == pytest.approx(
        predict_float8("forward", m, n, k, "tensorwise", gpu="h100").prediction.time_s
        - predict_float8("forward", m, n, k, "tensorwise", gpu="h100").cast_s)


def test_transformer_engine_alignment():
    # te.Linear's check_dim_for_fp8_exec: tokens a multiple of 8, features of 16
    assert scaled_mm_eligible(4104, 4096, 4096, "te-delayed")  # 4104 = 8 x 513
    assert not scaled_mm_eligible(4104, 4096, 4096, "tensorwise")  # _scaled_mm: 16
    assert not scaled_mm_eligible(4096, 4104, 4096, "te-delayed")
    with pytest.raises(ValueError, match="tokens \\(M\\) a multiple of 8"):
        predict_float8("forward", 4100, 4096, 4096, "te-delayed", gpu="h100")


def test_transformer_engine_trains_eager_and_keeps_the_lm_head():
    m = tiny_llama()
    kw = dict(mode="train", gpu="h100", seq_len=64, provenance=None)
    te = fxshape.analyze(m, float8="te-delayed", **kw)  # eager: TE runs its own kernels
    cur = fxshape.analyze(m, float8="te-current", **kw)
    plain = fxshape.analyze(m, **kw)
    rows = [r for r in te.rows if r.quant]
    assert rows and {r.quant.split(":")[1] for r in rows} == {"te-delayed"}
    assert not any(r.quant for r in te.rows if r.module == "lm_head")
    notes = " ".join(te.notes)
    assert "Transformer Engine, delayed scaling" in notes and "lm_head" in notes
    (opt,) = [o for o in te.options if o.name == "float8"]
    assert opt.applied and "Transformer Engine, delayed scaling" in opt.effect
    # current scaling adds an amax kernel per cast tensor: more kernels, more time
    extra = sum(r.kernels - 1 for r in cur.rows) - sum(r.kernels - 1 for r in te.rows)
    assert extra > 0 and cur.step.kernels - te.step.kernels == extra
    assert cur.step.time_s > te.step.time_s
    assert te.step.kernels - plain.step.kernels == sum(r.kernels - 1 for r in rows)
    # the model was not touched: its linear layers are still nn.Linear
    assert all(type(mod.mlp.up_proj) is torch.nn.Linear for mod in m.model.layers)


def test_transformer_engine_leaves_unaligned_layers_with_a_word():
    m = tiny_llama(intermediate_size=520)
    rep = fxshape.analyze(m, float8="te-delayed", mode="train", gpu="h100", seq_len=64,
                          provenance=None)
    assert "te.Linear raises in FP8" in " ".join(rep.notes)
    assert not any(x.quant for x in rep.rows if x.module.endswith("mlp.down_proj"))


@pytest.mark.parametrize("kwargs, match", [
    (dict(float8="te-mxfp8", gpu="h100"), "needs Blackwell's block-scaled tensor cores"),
    (dict(float8="te-delayed", gpu="mi300x"), "TE's ROCm port is not modelled"),
    (dict(float8="te-delayed", gpu="a100"), "no FP8 tensor cores"),
    (dict(float8="te-current", mode="inference"), "give mode='train'"),
    (dict(float8="te", gpu="h100"), "te-delayed, te-current, te-mxfp8"),
])
def test_transformer_engine_bad_input(kwargs, match):
    kw = dict(mode="train", seq_len=16, provenance=None)
    kw.update(kwargs)
    with pytest.raises(ValueError, match=match):
        fxshape.analyze(tiny_llama(), **kw)
