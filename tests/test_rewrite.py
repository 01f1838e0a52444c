"""fxshape.pad: same outputs, same gradients, original state_dict, tied weights kept tied."""

import pytest
import torch

import fxshape
from fxshape import PaddedLinear

from models import MLP, NanoGPT


@pytest.fixture(scope="module")
def gpt():
    torch.manual_seed(0)
    # GPT-2 width with its real 50257 vocabulary, one layer; planned at 8 x 1024 tokens
    model = NanoGPT(vocab_size=50257, n_layer=1, n_head=12, n_embd=768, block_size=1024)
    padded = fxshape.pad(model, (torch.zeros(8, 1024, dtype=torch.long),), gpu="a100",
                         dtype="fp16")
    return model, padded


def test_lm_head_is_padded_and_tie_kept(gpt):
    model, padded = gpt
    assert isinstance(padded.lm_head, PaddedLinear)
    assert padded.lm_head.pad_n % 8 == 0 and padded.lm_head.pad_n > 50257
    assert padded.lm_head.weight is padded.wte.weight  # still tied
    assert "lm_head" in padded.padding_report and "faster" in padded.padding_report
    # the user's model is untouched
    assert type(model.lm_head) is torch.nn.Linear and model.lm_head.weight.shape == (50257, 768)
    assert model.lm_head.weight is model.wte.weight


def test_same_outputs_and_gradients(gpt):
    model, padded = gpt
    idx = torch.randint(0, 50257, (2, 32))
    ref, out = model(idx), padded(idx)
    assert out.shape == ref.shape == (2, 32, 50257)
    scale = ref.abs().max()
    assert (out - ref).abs().max() <= 1e-5 * scale  # fp32: within 1e-5 of the output scale
    model.zero_grad()
    padded.zero_grad()
    ref.square().mean().backward()
    out.square().mean().backward()
    g_ref = model.lm_head.weight.grad
    g_pad = padded.lm_head.weight.grad
    assert (g_pad[:50257] - g_ref).abs().max() <= 1e-5 * g_ref.abs().max()
    assert torch.count_nonzero(g_pad[50257:]) == 0  # padded rows get no gradient
    g1 = dict(model.named_parameters())["h.0.c_fc.weight"].grad
    g2 = dict(padded.named_parameters())["h.0.c_fc.weight"].grad
    assert (g1 - g2).abs().max() <= 1e-5 * g1.abs().max()


def test_state_dict_has_original_keys_and_shapes(gpt):
    model, padded = gpt
    sd, ref = padded.state_dict(), model.state_dict()
    assert list(sd) == list(ref)
    assert all(sd[k].shape == ref[k].shape for k in sd)
    fresh = NanoGPT(vocab_size=50257, n_layer=1, n_head=12, n_embd=768, block_size=1024)
    fresh.load_state_dict(sd)  # loads back into the original architecture
    idx = torch.randint(0, 50257, (1, 8))
    assert torch.equal(fresh(idx), model(idx))
    padded.load_state_dict(ref)  # and the padded module accepts the original state
    assert torch.count_nonzero(padded.lm_head.weight[50257:]) == 0


@pytest.mark.parametrize("opt", ["sgd", "adamw"])
def test_padding_stays_zero_under_optimizers(opt):
    torch.manual_seed(0)
    with torch.device("meta"):
        plan_model = MLP(d_in=4096, d_hidden=4095, d_out=4096)
    model = MLP(d_in=256, d_hidden=255, d_out=256)  # small real copy, odd width
    # plan on the large shapes, apply the same padded sizes to the small layer by hand
    plan = fxshape.plan_padding(plan_model, (torch.zeros(4096, 4096, device="meta"),),
                                gpu="a100", dtype="fp16")
    assert any(d.pads for d in plan.decisions)
    layer = PaddedLinear(model.fc1, pad_n=256, pad_k=256)
    layer2 = PaddedLinear(model.fc2, pad_n=256, pad_k=256)
    net = torch.nn.Sequential(layer, torch.nn.ReLU(), layer2)
    params = list(net.parameters())
    o = torch.optim.SGD(params, lr=0.1, weight_decay=0.1) if opt == "sgd" else \
        torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1)
    for _ in range(3):
        o.zero_grad()
        net(torch.randn(16, 256)).square().mean().backward()
        o.step()
    assert torch.count_nonzero(layer.weight[255:]) == 0 and torch.count_nonzero(layer.bias[255:]) == 0
    assert torch.count_nonzero(layer2.weight[:, 255:]) == 0


def test_mlp_odd_width_padded_end_to_end():
    torch.manual_seed(0)
    model = MLP(d_in=1024, d_hidden=1023, d_out=1024)
    x = torch.randn(2048, 1024)
    padded = fxshape.pad(model, (x,), gpu="a100", dtype="fp16")
    assert isinstance(padded.fc1, PaddedLinear) or isinstance(padded.fc2, PaddedLinear)
    ref, out = model(x), padded(x)
    assert (out - ref).abs().max() <= 1e-5 * ref.abs().max()


def test_filter_fn_and_nothing_to_pad():
    torch.manual_seed(0)
    model = MLP(d_in=1024, d_hidden=1023, d_out=1024)
    x = torch.randn(2048, 1024)
    kept = fxshape.pad(model, (x,), gpu="a100", dtype="fp16",
                       filter_fn=lambda mod, fqn: False)
    assert not any(isinstance(m, PaddedLinear) for m in kept.modules())
    # every GEMM still has its line: planned (the filter excluded the layers) or not
    lines = kept.padding_report.splitlines()
    assert len(lines) == len(kept.padding_plan.decisions) == 2
    assert all("not padded" in ln or "not applied" in ln for ln in lines), lines
    aligned = fxshape.pad(MLP(d_in=64, d_hidden=128, d_out=64), (torch.randn(64, 64),))
    lines = aligned.padding_report.splitlines()
    assert [ln.split(":")[0] for ln in lines] == ["fc1", "fc2"]
    assert all(": not padded: " in ln for ln in lines), lines


def test_report_says_what_happened_to_every_gemm_in_training():
    # train mode: each linear has a forward GEMM and two backward ones (dX, dW). Padding the
    # layer pads all three; the report has one line per GEMM of the plan, none left out.
    torch.manual_seed(0)
    model = MLP(d_in=1024, d_hidden=1023, d_out=1024)
    x = torch.randn(2048, 1024)
    padded = fxshape.pad(model, (x,), gpu="a100", dtype="fp16", mode="train")
    lines = padded.padding_report.splitlines()
    plan = padded.padding_plan
    assert len(lines) == len(plan.decisions)
    back = [ln for ln, d in zip(lines, plan.decisions) if d.phase == "backward"]
    assert back and all("[backward]" in ln for ln in back)
    padded_layers = {d.module for d in plan.padded if d.phase == "forward"}
    assert padded_layers  # the 1023-wide hidden layer is worth padding on an A100
    for ln, d in zip(lines, plan.decisions):
        if d.phase == "backward" and d.pads and d.module in padded_layers:
            assert "runs padded through its layer" in ln, ln


def test_report_compare_before_after(gpt):
    model, padded = gpt
    x = (torch.zeros(8, 1024, dtype=torch.long),)
    before = fxshape.analyze(model, x, gpu="a100", dtype="fp16")
    after = fxshape.analyze(padded, x, gpu="a100", dtype="fp16")
    text = before.compare(after)
    lm_after = [r for r in after.rows if r.module == "lm_head"][0]
    assert lm_after.n == padded.lm_head.pad_n  # the padded model runs the aligned GEMM
    assert "lm_head" in text and f"8192x{lm_after.n}x768" in text
    assert after.total_time_s < before.total_time_s
    assert "predicted GEMM time" in text and "no GEMM changed" in before.compare(before)


def test_cli_pad_flag(capsys):
    from fxshape.cli import main

    pytest.importorskip("transformers")
    assert main(["analyze", "gpt2", "--gpu", "a100", "--dtype", "fp16", "--pad"]) == 0
    out = capsys.readouterr().out
    assert "padding plan" in out and "lm_head" in out and "N 50257->" in out


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=60, deadline=None)
@given(m=st.integers(1, 40), n=st.integers(1, 40), k=st.integers(1, 40),
       extra_n=st.integers(0, 24), extra_k=st.integers(0, 24), extra_m=st.integers(0, 24),
       bias=st.booleans(), lead=st.sampled_from([(), (2,), (2, 3)]),
       dtype=st.sampled_from([torch.float32, torch.bfloat16]))
def test_padded_linear_property(m, n, k, extra_n, extra_k, extra_m, bias, lead, dtype):
    torch.manual_seed(m * 1000 + n * 10 + k)
    lin = torch.nn.Linear(k, n, bias=bias).to(dtype)
    rows = m
    for d in lead:
        rows *= d  # PaddedLinear pads the flattened token rows
    pad_m = rows + extra_m if extra_m else None
    padded = PaddedLinear(lin, pad_n=n + extra_n, pad_k=k + extra_k, pad_m=pad_m)
    x = torch.randn(*lead, m, k, dtype=dtype, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    ref, out = lin(x), padded(x2)
    assert out.shape == ref.shape
    if dtype == torch.float32:
        tol = 1e-5 * max(1.0, ref.abs().max().item())
    else:  # bf16: within bf16 rounding of the unpadded bf16 result
        tol = 2 ** -7 * max(1.0, ref.abs().max().item())
    assert (out.float() - ref.float()).abs().max().item() <= tol
    ref.float().sum().backward()
    out.float().sum().backward()
    # Gradients are sums accumulated in fp32 and rounded once to the dtype, padded or not (the
    # padded rows and columns add exact zeros). Two such results of the same sum differ by
    # at most one rounding each: 2 x 2^-8 of the largest entry in bf16; in fp32 the
    # accumulation order shows, well inside 1e-5 of the largest entry.
    rel = 1e-5 if dtype == torch.float32 else 2 * 2 ** -8
    gx = x.grad.float()
    assert (gx - x2.grad.float()).abs().max().item() <= rel * max(1.0, gx.abs().max().item())
    g, gw = padded.weight.grad, lin.weight.grad.float()
    assert (g[:n, :k].float() - gw).abs().max().item() <= rel * max(1.0, gw.abs().max().item())
    assert torch.count_nonzero(g[n:]) == 0 and torch.count_nonzero(g[:, k:]) == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_hf_gpt2_real_vocab(dtype):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1)).eval().to(dtype)
    kwargs = {"input_ids": torch.zeros(8, 1024, dtype=torch.long), "use_cache": False}
    padded = fxshape.pad(model, example_kwargs=kwargs, gpu="a100", dtype="fp16")
    assert isinstance(padded.lm_head, PaddedLinear)
    assert padded.lm_head.weight is padded.transformer.wte.weight  # tie kept
    idx = torch.randint(0, 50257, (2, 16))
    with torch.no_grad():
        ref, out = model(idx).logits, padded(idx).logits
    scale = ref.float().abs().max()
    # fp32: within 1e-5 of the output scale; bf16: within bf16 rounding of the bf16 run
    tol = 1e-5 if dtype == torch.float32 else 2 ** -7
    assert (out.float() - ref.float()).abs().max() <= tol * scale
    sd, ref_sd = padded.state_dict(), model.state_dict()
    assert list(sd) == list(ref_sd) and all(sd[k].shape == v.shape for k, v in ref_sd.items())


class _SharedWeight(torch.nn.Module):
    """``enc``'s weight is also used by a second GEMM outside ``enc`` (transposed)."""

    def __init__(self):
        super().__init__()
        self.enc = torch.nn.Linear(768, 1001)

    def forward(self, x):
        return torch.nn.functional.linear(self.enc(x), self.enc.weight.t())


def test_a_layer_whose_weight_is_used_elsewhere_is_not_padded():
    # N = 1001 is worth padding to 1008 on an A100 at 4096 rows, but enc.weight also feeds
    # the top-level GEMM: padding it to 1008 rows would make that GEMM (4096 x 1001) @
    # (1008 x 768) fail, so the layer stays whole and the report says why
    torch.manual_seed(0)
    model, x = _SharedWeight(), torch.randn(4096, 768)
    padded = fxshape.pad(model, (x,), gpu="a100", dtype="fp16")
    enc = [d for d in padded.padding_plan.decisions if d.module == "enc"]
    assert enc and enc[0].pads  # the plan alone would pad it
    assert type(padded.enc) is torch.nn.Linear
    line = padded.padding_report.splitlines()[0]
    assert line.startswith("enc: ") and "also used outside its own GEMM" in line, line
    assert torch.equal(padded(x), model(x))


def test_the_compile_backend_pads_a_shared_weight_per_gemm():
    # the backend pads each GEMM's operands (pad -> GEMM -> slice): the weight's other use
    # sees the original tensor, so results are the same
    import fxshape.padding.compile as fc

    torch.manual_seed(0)
    model, x = _SharedWeight(), torch.randn(4096, 768)
    backend = fc.make_backend(gpu="a100", dtype="fp16", inner="eager")
    out = torch.compile(model, backend=backend)(x)
    ref = model(x)
    assert backend.padded  # something was padded (N 1001 -> 1008 at least)
    assert (out - ref).abs().max() <= 1e-5 * ref.abs().max()


def test_pad_refuses_dedup():
    with pytest.raises(ValueError, match="dedup is not accepted"):
        fxshape.pad(MLP(d_in=64, d_hidden=128, d_out=64), (torch.randn(64, 64),), dedup=True)
