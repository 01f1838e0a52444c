"""Padding correctness on the model zoo: eager (fxshape.pad) and compiled (backend="fxshape"),
fp32 and bf16, outputs and gradients, against the unpadded model.

Each model is small enough for a 2-core CPU but has the misaligned sizes fxshape pads: GPT-2's
real 50,257 vocabulary (plus an odd MLP width, to exercise Conv1D), a two-layer model with
Llama-3-8B's architecture (GQA 4:1, SwiGLU, untied head) at 1/8 width with an odd MLP width and
vocabulary, BERT (odd vocabulary: its tied decoder bias is the case), T5 (32,101 vocabulary),
Mixtral (grouped experts are not paddable; its head and router are) and nanoGPT (50,257).

Tolerances. fp32: within 1e-5 of the output (gradient) scale. bf16: the padded bf16 run within
two bf16 ulps (2**-6) of the unpadded bf16 run at the output scale, and no further from an
fp32 reference than twice the unpadded bf16 run's own distance plus one rounding (2**-8).
"""

import copy

import pytest
import torch

import fxshape
import fxshape.padding.compile as fc

from models import NanoGPT

transformers = pytest.importorskip("transformers")


def _build(name):
    t = transformers
    torch.manual_seed(0)
    if name == "gpt2":
        cfg = t.GPT2Config(n_layer=1, n_embd=768, n_head=12, vocab_size=50257, n_inner=3071)
        return t.GPT2LMHeadModel(cfg)
    if name == "llama3":
        # Llama-3-8B / 8: hidden 4096 -> 512, 32 -> 4 heads of 128, 8 -> 1 KV head,
        # MLP 14336 -> 1792 (made odd: 1791), vocab 128256 -> 16032 (made odd: 16033)
        cfg = t.LlamaConfig(hidden_size=512, num_attention_heads=4, num_key_value_heads=1,
                            intermediate_size=1791, vocab_size=16033, num_hidden_layers=2,
                            tie_word_embeddings=False)
        return t.LlamaForCausalLM(cfg)
    if name == "bert":
        cfg = t.BertConfig(hidden_size=256, num_attention_heads=4, intermediate_size=1021,
                           num_hidden_layers=1, vocab_size=30521)
        return t.BertForMaskedLM(cfg)
    if name == "t5":
        cfg = t.T5Config(d_model=256, d_kv=64, num_heads=4, d_ff=1022, num_layers=1,
                         num_decoder_layers=1, vocab_size=32101)
        return t.T5ForConditionalGeneration(cfg)
    if name == "mixtral":
        # intermediate 512: torch's CPU grouped_mm needs 16-byte strides even unpadded
        cfg = t.MixtralConfig(hidden_size=256, num_attention_heads=4, num_key_value_heads=2,
                              intermediate_size=512, num_local_experts=4,
                              num_experts_per_tok=2, num_hidden_layers=1, vocab_size=32001)
        return t.MixtralForCausalLM(cfg)
    return NanoGPT(vocab_size=50257, n_layer=1, n_head=6, n_embd=384, block_size=512)


ZOO = ["gpt2", "llama3", "bert", "t5", "mixtral", "nanogpt"]


@pytest.fixture(scope="module")
def zoo():
    return {name: _build(name).eval() for name in ZOO}


def _run(model, name, idx):
    """Forward, a scalar loss, backward; returns the (float) output."""
    if name == "nanogpt":
        out = model(idx)
    elif name == "t5":
        out = model(input_ids=idx, decoder_input_ids=idx).logits
    else:
        out = model(input_ids=idx).logits
    out.float().square().mean().backward()
    return out.float()


def _vocab(model):
    return model.config.vocab_size if hasattr(model, "config") else 50257


def _check(name, ref32, ref, out, m32, m_ref, m_out, dtype):
    """Outputs and every parameter's gradient of the padded run against the unpadded one."""
    scale = ref32.abs().max()
    if dtype == torch.float32:
        assert (out - ref).abs().max() <= 1e-5 * scale, name
    else:
        assert (out - ref).abs().max() <= 2 ** -6 * scale, name
        assert (out - ref32).abs().max() <= 2 * (ref - ref32).abs().max() + 2 ** -8 * scale
    n = 0
    # A gradient that is zero in exact arithmetic (attention's key bias: softmax ignores a
    # per-query constant) is pure rounding noise (~1e-13 here): differences below fp32's
    # resolution (2^-23) of the model's largest gradient are not told apart from it.
    ulp = 2.0 ** -23 * max(p.grad.abs().max() for p in m32.parameters() if p.grad is not None)
    for (pname, p32), pr, po in zip(m32.named_parameters(), m_ref.parameters(),
                                    m_out.parameters()):
        if p32.grad is None:
            continue
        g32, gr = p32.grad, pr.grad.float()
        go = po.grad.float()[tuple(slice(0, s) for s in gr.shape)]  # eager pad: padded params
        gscale = g32.abs().max()
        if dtype == torch.float32:
            assert (go - gr).abs().max() <= 1e-5 * gscale + ulp, (name, pname)
        else:
            assert (go - g32).abs().max() <= 2 * (gr - g32).abs().max() + 2 ** -8 * gscale, \
                (name, pname)
        n += 1
    assert n > 0


def _references(model, dtype):
    """Two unpadded copies: the fp32 reference and one in ``dtype``."""
    m32 = copy.deepcopy(model)
    ref = copy.deepcopy(model).to(dtype)
    return m32, ref


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", ZOO)
def test_eager_pad_zoo(zoo, name, dtype):
    model = zoo[name]
    # plan as fp16 on an A100 for 8 x 512 tokens (synthesized, on fake tensors), run small
    ex = (torch.zeros(8, 512, dtype=torch.long),) if name == "nanogpt" else None
    kw = {} if name == "nanogpt" else {"batch_size": 8, "seq_len": 512}
    padded = fxshape.pad(model, ex, gpu="a100", dtype="fp16", **kw)
    n_padded = sum(isinstance(m, fxshape.PaddedLinear) for m in padded.modules())
    assert n_padded >= 1, padded.padding_report  # every zoo model has a GEMM worth padding
    if name == "gpt2":
        assert isinstance(padded.transformer.h[0].mlp.c_fc, fxshape.PaddedConv1D)
        assert padded.lm_head.weight is padded.transformer.wte.weight
    if name == "bert":  # the decoder bias is also cls.predictions.bias: still one tensor
        assert padded.cls.predictions.bias is padded.cls.predictions.decoder.bias
    sd, ref_sd = padded.state_dict(), model.state_dict()
    assert list(sd) == list(ref_sd) and all(sd[k].shape == v.shape for k, v in ref_sd.items())

    idx = torch.randint(0, _vocab(model), (2, 16), generator=torch.Generator().manual_seed(1))
    m32, m_ref = _references(model, dtype)
    m_out = copy.deepcopy(padded).to(dtype)
    ref32 = _run(m32, name, idx)
    ref, out = _run(m_ref, name, idx), _run(m_out, name, idx)
    _check(name, ref32, ref, out, m32, m_ref, m_out, dtype)


# bf16 under torch.compile runs the big-vocabulary models' GEMMs through CPU bf16 kernels that
# take ~40 s each for K = 50,257 (measured on the 2-core CI machine): fp32 only for those two
_COMPILED = [(n, torch.float32) for n in ZOO] + \
    [(n, torch.bfloat16) for n in ("llama3", "bert", "t5", "mixtral")]


@pytest.mark.parametrize("name,dtype", _COMPILED,
                         ids=[f"{n}-{'fp32' if d == torch.float32 else 'bf16'}"
                              for n, d in _COMPILED])
def test_compiled_zoo(zoo, name, dtype):
    model = zoo[name]
    torch._dynamo.reset()
    # 2 x 128 tokens: the backend plans at the compiled sizes (static: dynamic=False), as fp16
    # on an A100, padding whatever is predicted faster at all
    idx = torch.randint(0, _vocab(model), (2, 128), generator=torch.Generator().manual_seed(2))
    m32, m_ref = _references(model, dtype)
    m_out = copy.deepcopy(model).to(dtype)
    backend = fc.make_backend(gpu="a100", dtype="fp16", min_gain=0.0, inner="eager")
    ref32 = _run(m32, name, idx)
    ref = _run(m_ref, name, idx)
    out = _run(torch.compile(m_out, backend=backend, dynamic=False), name, idx)
    assert backend.padded, f"{name}: nothing padded at 512 tokens"
    _check(name, ref32, ref, out, m32, m_ref, m_out, dtype)


def test_compiled_inductor_llama3(zoo):
    """The default inner backend (Inductor, CPU C++ codegen) on an HF model."""
    model = zoo["llama3"]
    torch._dynamo.reset()
    idx = torch.randint(0, _vocab(model), (2, 256), generator=torch.Generator().manual_seed(3))
    m_ref, m_out = copy.deepcopy(model), copy.deepcopy(model)
    backend = fc.make_backend(gpu="a100", dtype="fp16", min_gain=0.0)
    ref = _run(m_ref, "llama3", idx)
    out = _run(torch.compile(m_out, backend=backend, dynamic=False), "llama3", idx)
    assert backend.padded
    _check("llama3", ref, ref, out, m_ref, m_ref, m_out, torch.float32)
