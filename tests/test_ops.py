"""The op registry on hand-built graphs, including symbolic sizes."""

import torch
from torch.export import Dim

from fxshape.analysis import annotate
from fxshape.ops import flash_head_dim, looks_like_matmul

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
