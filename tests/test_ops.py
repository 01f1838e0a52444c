"""The op registry on hand-built graphs, including symbolic sizes."""

import torch
from torch.export import Dim

from fxshape.analysis.annotate import annotate
from fxshape.analysis.ops import flash_head_dim, looks_like_matmul

from models import MLP


def test_symbolic_sizes_use_hints_and_are_marked():
    batch = Dim("batch", min=2, max=4096)
    ep = torch.export.export(MLP(), (torch.randn(48, 64),), dynamic_shapes={"x": {0: batch}})
    rows, unsupported = annotate(ep.module(), gpu="h100", dtype="bf16")
    assert not unsupported
    fc1 = [r for r in rows if r.module == "fc1"][0]
    assert (fc1.m, fc1.n, fc1.k) == (48, 200, 64)  # the example's 48 rows as the hint
    assert "symbolic sizes" in fc1.note


def test_flash_head_dims():
    # flash kernels exist for 32, 64, 96, 128, 160, 192, 224, 256
    assert [flash_head_dim(d) for d in (64, 80, 96, 100, 128, 129, 256)] == \
        [64, 96, 96, 128, 128, 160, 256]


def test_looks_like_matmul_names():
    assert looks_like_matmul(torch.ops.aten.mm.default)
    assert looks_like_matmul("mylib::fused_gemm")
    assert not looks_like_matmul(torch.ops.aten.relu.default)


def test_matmul_without_handler_is_reported_not_dropped():
    from fxshape import analyze

    class UsesAddbmm(torch.nn.Module):
        def forward(self, c, a, b):
            return torch.addbmm(c, a, b)  # sums a batch of products: no handler registered

    rep = analyze(UsesAddbmm(), (torch.randn(8, 16), torch.randn(4, 8, 12),
                                 torch.randn(4, 12, 16)))
    assert rep.rows == ()
    assert [u.target for u in rep.unsupported] == ["aten.addbmm.default"]
    assert "unsupported matmul-like ops (not counted)" in str(rep)


import pytest  # noqa: E402


class _Matmul(torch.nn.Module):
    def forward(self, a, b):
        return torch.matmul(a, b)


@pytest.mark.parametrize("a,b,expected", [
    ((7,), (7,), (1, 1, 1, 7)),                     # dot: K = 7
    ((5, 7), (7,), (1, 5, 1, 7)),                   # matrix-vector: M = 5, N = 1
    ((7,), (7, 3), (1, 1, 3, 7)),                   # vector-matrix: M = 1, N = 3
    ((2, 4, 5, 7), (7, 3), (1, 40, 3, 7)),          # batch dims of A fold into M: 2*4*5
    ((2, 1, 5, 7), (4, 7, 3), (8, 5, 3, 7)),        # broadcast batch (2,1) x (4,) -> 8
    ((6, 5, 7), (6, 7, 3), (6, 5, 3, 7)),           # plain batched
])
def test_matmul_broadcasting(a, b, expected):
    from fxshape import analyze

    rep = analyze(_Matmul(), (torch.randn(*a), torch.randn(*b)))
    assert len(rep.rows) == 1
    r = rep.rows[0]
    batch, m, n, k = expected
    # export keeps aten.matmul; the handler folds or broadcasts the batch dimensions
    assert r.op == "matmul" and (r.batch, r.m, r.n, r.k) == expected
    assert r.flops == 2 * batch * m * n * k


class _Products(torch.nn.Module):
    """Every matmul-like aten op that torch's FLOP registry leaves out, once each."""

    def __init__(self):
        super().__init__()
        self.bil = torch.nn.Bilinear(16, 24, 8)

    def forward(self, a, x, y, z, w):
        return (torch.mv(a, x),                                  # a (32, 16) @ x (16)
                torch.addmv(torch.zeros(32), a, x),
                torch.dot(x, x),
                torch.outer(x, z),                               # (16) x (20)
                torch.tensordot(a, a, dims=([1], [1])),          # contract the 16s
                torch.linalg.multi_dot([a, a.T, a]),             # (32,16)(16,32)(32,16)
                self.bil(y, w))                                  # (4,16) x (4,24) -> (4,8)


def test_vector_products_and_contractions_get_gemm_rows():
    from fxshape import analyze

    rep = analyze(_Products(), (torch.randn(32, 16), torch.randn(16), torch.randn(4, 16),
                                torch.randn(20), torch.randn(4, 24)), dtype="fp32")
    assert rep.unsupported == ()
    got = sorted((r.op, r.batch, r.m, r.n, r.k) for r in rep.rows)
    want = sorted([
        ("mv", 1, 32, 1, 16), ("addmv", 1, 32, 1, 16),     # GEMV: one output column
        ("dot", 1, 1, 1, 16),                               # M = N = 1, K = 16
        ("outer", 1, 16, 20, 1),                            # K = 1
        ("tensordot", 1, 32, 32, 16),                       # a's free 32, a's free 32, K 16
        # multi_dot: (A Aᵀ) A costs 32·16·32 + 32·32·16 = 32768 multiply-adds, A (Aᵀ A)
        # 16·32·16 + 32·16·16 = 16384: the second order, Aᵀ A first (16x16, K = 32)
        ("multi_dot", 1, 16, 16, 32), ("multi_dot", 1, 32, 16, 16),
        # bilinear: x1 (4, 16) against W as (16, 8·24), then 4 rows of (8, 24) @ x2 (24)
        ("bilinear", 1, 4, 192, 16), ("bilinear", 4, 8, 1, 24),
    ])
    assert got == want
    # every product's FLOPs: 2 multiply-adds counted per (m, n, k) point
    assert sum(r.flops for r in rep.rows) == sum(2 * b * m * n * k for _, b, m, n, k in want)


def test_unsupported_by_structure_not_by_name():
    aten = torch.ops.aten
    from fxshape.analysis.ops import does_flops

    # counted by torch.utils.flop_counter, or a product it leaves out: reported if unhandled
    for op in (aten.mm.default, aten.addbmm.default, aten._trilinear.default, aten.kron.default,
               aten._scaled_mm.default, aten.convolution_backward.default):
        assert does_flops(op) and looks_like_matmul(op), op
    # elementwise and reductions are not products, whatever their names
    for op in (aten.mul.Tensor, aten.sum.dim_IntList, aten.add.Tensor, aten.mean.dim):
        assert not does_flops(op) and not looks_like_matmul(op), op


def _zoo():
    """Small models whose GEMMs torch's FlopCounterMode counts (mm, addmm, bmm, baddbmm)."""
    from models import MLP

    class Mix(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(24, 40)
            self.w = torch.nn.Parameter(torch.randn(40, 12))

        def forward(self, x, y):
            h = self.fc(x)                                   # linear over (2, 7) tokens
            s = torch.bmm(h, h.transpose(1, 2))              # (2, 7, 40) @ (2, 40, 7)
            return h @ self.w, torch.baddbmm(s, s, s), torch.mm(y, y.T)

    return [("mlp", MLP(), (torch.randn(5, 64),)),
            ("mix", Mix(), (torch.randn(2, 7, 24), torch.randn(9, 13)))]


@pytest.mark.parametrize("name,model,inputs", _zoo(), ids=[z[0] for z in _zoo()])
def test_gemm_flops_equal_torch_flop_counter(name, model, inputs):
    from torch.utils.flop_counter import FlopCounterMode

    from fxshape import analyze

    rep = analyze(model, inputs, dtype="fp32")
    # torch's own count, on the same (real, small) inputs
    with FlopCounterMode(display=False) as fc:
        model(*inputs)
    torch_flops = fc.get_total_flops()
    ours = sum(r.flops for r in rep.rows)
    assert rep.unsupported == () and ours == torch_flops, (ours, torch_flops)


def _hf_zoo():
    transformers = pytest.importorskip("transformers")
    return [
        ("gpt2", transformers.GPT2LMHeadModel(transformers.GPT2Config(
            n_layer=1, n_embd=128, n_head=2, vocab_size=512, n_positions=64))),
        ("llama", transformers.LlamaForCausalLM(transformers.LlamaConfig(
            num_hidden_layers=1, hidden_size=128, intermediate_size=352, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=512))),
        ("bert", transformers.BertModel(transformers.BertConfig(
            num_hidden_layers=1, hidden_size=128, intermediate_size=512, num_attention_heads=2,
            vocab_size=512))),
    ]


@pytest.mark.parametrize("idx,name", [(0, "gpt2"), (1, "llama"), (2, "bert")])
def test_hf_gemm_flops_equal_torch_flop_counter(idx, name):
    from torch.utils.flop_counter import FlopCounterMode

    from fxshape import analyze

    model = _hf_zoo()[idx][1].eval()
    ids = torch.randint(0, 512, (2, 16))
    rep = analyze(model, (ids,), dtype="fp32")
    with FlopCounterMode(display=False) as fc, torch.no_grad():
        model(ids)
    # on the CPU, SDPA runs a kernel torch's registry does not count, so compare the GEMMs
    # outside attention: the linears (Conv1D's addmm for GPT-2) and the LM head
    counts = fc.get_flop_counts()["Global"]
    torch_gemm = sum(v for op, v in counts.items()
                     if op.__name__ in ("mm", "addmm", "bmm", "baddbmm"))
    ours = sum(r.flops for r in rep.rows if r.attention is None)
    assert torch_gemm > 0 and ours == torch_gemm, (name, ours, dict(counts))
    assert rep.unsupported == ()
