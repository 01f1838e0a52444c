"""Matrix-vector products as torch.compile runs them with coordinate-descent tuning
(``fxshape.cost.gemv``, issue 31's AMD decode): Inductor's reduction streams the weight at the
GPU's streaming bandwidth; analyze, serve and the serving step price batch-1 GEMMs that way
when told, and only those; bad input."""

import pytest

import fxshape
from fxshape.cost.gemm import predict_matmul
from fxshape.cost.gemv import (GEMV_KERNEL, check_gemv, decomposes, predict_gemv, price_matmul,
                               use_gemv)

transformers = pytest.importorskip("transformers")

from models import tiny_llama  # noqa: E402


def test_an_inductor_gemv_streams_at_the_mi250x_measured_bandwidth():
    p = predict_gemv(1, 8192, 4096, dtype="bf16", gpu="mi250x", layout="nt")
    # bytes: x (1 x 4096) + W (4096 x 8192) + y (1 x 8192), 2 bytes each
    nbytes = (4096 + 4096 * 8192 + 8192) * 2
    assert p.bytes == nbytes and p.kernel == GEMV_KERNEL and p.bound == "memory"
    # past its launch it moves them at the 1.3 TB/s AMD quotes as achievable on one GCD
    # (bench/fit_memops.py: LUMI training, hip-stream)
    assert nbytes / (p.time_s - p.launch_s) == pytest.approx(1.3e12, rel=1e-4)
    # never faster than the datasheet's 1.6384 TB/s per GCD; faster than rocBLAS's GEMM
    # as the cookbook sweeps' constants price it
    assert p.time_s > nbytes / 1.6384e12
    assert p.time_s < predict_matmul(1, 8192, 4096, dtype="bf16", gpu="mi250x",
                                     layout="nt").time_s


def test_a_gemv_costs_its_bytes():
    # twice the output columns: twice the weight and output bytes, twice the transfer
    a = predict_gemv(1, 4096, 4096, gpu="h100")
    b = predict_gemv(1, 8192, 4096, gpu="h100")
    ratio = (4096 + 4096 * 8192 + 8192) / (4096 + 4096 * 4096 + 4096)
    assert (b.time_s - b.launch_s) / (a.time_s - a.launch_s) == pytest.approx(ratio, rel=1e-9)
    # a column vector (N = 1) is the same reduction: the same bytes, the same time
    c = predict_gemv(4096, 1, 4096, gpu="h100")
    assert c.time_s == pytest.approx(a.time_s, rel=1e-9)


@pytest.mark.parametrize("op,m,n,expected", [
    ("linear", 1, 4096, True), ("mm", 8, 1, True), ("bmm", 1, 64, True),
    ("matmul", 1, 16, True), ("linear", 2, 4096, False), ("addmm", 1, 4096, False),
    ("sdpa.qk", 1, 128, False)])
def test_which_gemms_inductor_decomposes(op, m, n, expected):
    # torch/_inductor/decomposition.py: mm with one row or one column, bmm likewise; a 2-D
    # addmm only for tiny operands; a fused attention kernel's GEMMs are not aten GEMMs
    assert decomposes(op, m, n) is expected


def test_price_matmul_follows_the_choice_in_force():
    lib = predict_matmul(1, 4096, 4096, gpu="h100")
    assert price_matmul("linear", 1, 4096, 4096, gpu="h100") == lib
    with use_gemv("inductor"):
        assert price_matmul("linear", 1, 4096, 4096, gpu="h100").kernel == GEMV_KERNEL
        assert price_matmul("linear", 2, 4096, 4096, gpu="h100") == \
            predict_matmul(2, 4096, 4096, gpu="h100")
        assert price_matmul("linear", 1, 4096, 4096, gpu="h100", gemv="library") == lib
    assert price_matmul("linear", 1, 4096, 4096, gpu="h100") == lib  # the context is left


@pytest.mark.parametrize("call,match", [
    (lambda: check_gemv("triton"), "unknown gemv 'triton'; accepted: library, inductor"),
    (lambda: use_gemv(None).__enter__(), "unknown gemv None"),
    (lambda: predict_gemv(2, 2, 8), "m == 1 or n == 1"),
    (lambda: predict_gemv(1, 0, 8), "n"),
    (lambda: price_matmul("mm", 1, 8, 8, gemv="cublas"), "unknown gemv")])
def test_gemv_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.fixture(scope="module")
def tiny():
    return tiny_llama(layers=1)


def test_analyze_prices_batch_one_decode_gemms_as_reductions(tiny):
    kw = dict(mode="decode", context_len=64, gpu="mi250x", provenance=None)
    lib = fxshape.analyze(tiny, batch_size=1, **kw)
    ind = fxshape.analyze(tiny, batch_size=1, gemv="inductor", **kw)
    linears = [r for r in ind.rows if r.op == "linear"]
    # q, k, v, o, gate, up, down and the logits: all M = 1, all reductions
    assert len(linears) == 8 and all(r.prediction.kernel == GEMV_KERNEL for r in linears)
    assert ind.workload.gemv == "inductor" and lib.workload.gemv == "library"
    assert ind.step.time_s < lib.step.time_s
    (opt,) = [o for o in ind.options if o.name == "gemv"]
    assert opt.applied and "8 matrix-vector products" in opt.effect
    # at batch 2 no GEMM is a matrix-vector product: the option changes nothing, and says so
    two = fxshape.analyze(tiny, batch_size=2, gemv="inductor", **kw)
    (opt,) = [o for o in two.options if o.name == "gemv"]
    assert not opt.applied
    assert two.step.time_s == fxshape.analyze(tiny, batch_size=2, **kw).step.time_s


def test_analyze_refuses_inductor_gemvs_in_eager(tiny):
    with pytest.raises(ValueError, match="gemv='inductor' is torch.compile's"):
        fxshape.analyze(tiny, seq_len=8, gemv="inductor", provenance=None)
    with pytest.raises(ValueError, match="gemv='inductor'"):
        fxshape.analyze(tiny, mode="decode", context_len=8, execution="eager",
                        gemv="inductor", provenance=None)
    with pytest.raises(ValueError, match="unknown gemv"):
        fxshape.analyze(tiny, mode="decode", context_len=8, gemv="yes", provenance=None)


def test_serve_and_the_serving_step_take_the_reports_choice(tiny):
    kw = dict(gpu="mi250x", prompt_len=8, output_len=4, fuse="qkv")
    lib, ind = fxshape.serve(tiny, **kw), fxshape.serve(tiny, gemv="inductor", **kw)
    assert ind.gemv == "inductor" and ind.to_dict()["gemv"] == "inductor"
    assert ind.inter_token_latency_s < lib.inter_token_latency_s
    assert ind.time_to_first_token_s == lib.time_to_first_token_s  # the prefill: M = 8
    # the step re-priced at one token runs reductions; at two tokens both run the library's
    # GEMMs and cost the same
    a = fxshape.serving.BatchStep(lib.decode, fuse="qkv")
    b = fxshape.serving.BatchStep(ind.decode, fuse="qkv")
    assert b.body_s(1)[0] < a.body_s(1)[0]
    assert b.body_s(2) == a.body_s(2)
    with pytest.raises(ValueError, match="unknown gemv"):
        fxshape.serve(tiny, gemv="fast", **kw)
