"""Sliding-window attention read from the model (issue 52): Gemma 3's, Gemma 2's and
Mistral's window layers priced as a fused kernel with a window runs them (the band's scores;
in decode the last ``window`` keys) and their KV cache held as the window, not the context."""

import pytest
import torch

import fxshape

transformers = pytest.importorskip("transformers")


def _gemma3(window=128, layers=6):
    # Gemma 3's default pattern: five sliding-window layers, then one full-attention layer
    cfg = transformers.Gemma3TextConfig(num_hidden_layers=layers, hidden_size=256,
                                        intermediate_size=512, num_attention_heads=4,
                                        num_key_value_heads=2, head_dim=64, vocab_size=1000,
                                        sliding_window=window, max_position_embeddings=8192)
    with torch.device("meta"):
        return transformers.Gemma3ForCausalLM(cfg)


def _mistral(window):
    cfg = transformers.MistralConfig(num_hidden_layers=2, hidden_size=128, intermediate_size=256,
                                     num_attention_heads=4, num_key_value_heads=2,
                                     vocab_size=500, sliding_window=window,
                                     max_position_embeddings=4096)
    with torch.device("meta"):
        return transformers.MistralForCausalLM(cfg)


def _attn(report, op="sdpa.qk"):
    return {r.module: r for r in report.rows if r.op == op}


def test_windows_are_read_per_layer():
    from fxshape.tracing.facts import attention_windows as windows

    w = windows(_gemma3())
    # layer_types: 5 x sliding_attention, then full_attention
    assert w == {f"model.layers.{i}.self_attn": 128 for i in range(5)}
    assert windows(_mistral(64)) == {f"model.layers.{i}.self_attn": 64 for i in range(2)}
    assert windows(_mistral(None)) == {}


def test_prefill_prices_the_band():
    rep = fxshape.analyze(_gemma3(), seq_len=512, gpu="h100")
    rows = _attn(rep)
    # row i keeps keys (i-128, i]: sum over rows of min(i+1, 128) =
    # 512*513/2 - 384*385/2 = 131328 - 73920 = 57408 of 512 x 512 scores
    assert rows["model.layers.0.self_attn"].work == pytest.approx(57408 / 512**2)
    assert rows["model.layers.5.self_attn"].work == 0.5  # full causal
    assert rows["model.layers.0.self_attn"].time_s < rows["model.layers.5.self_attn"].time_s
    assert "sliding window of 128 keys" in rows["model.layers.0.self_attn"].note
    # a window at least as long as the sequence changes nothing
    same = _attn(fxshape.analyze(_gemma3(window=512), seq_len=512, gpu="h100"))
    assert same["model.layers.0.self_attn"].work == 0.5


def test_training_backward_prices_the_band():
    rep = fxshape.analyze(_mistral(64), seq_len=256, gpu="h100", mode="train")
    bwd = [r for r in rep.rows if r.op == "sdpa.bwd.dq"]
    full = [r for r in fxshape.analyze(_mistral(None), seq_len=256, gpu="h100",
                                       mode="train").rows if r.op == "sdpa.bwd.dq"]
    # 256*257/2 - 192*193/2 = 32896 - 18528 = 14368 of 256^2 scores kept
    assert bwd and all(r.work == pytest.approx(14368 / 256**2) for r in bwd)
    # (at 256 tokens both are a launch's floor: never slower, fewer FLOPs)
    assert sum(r.time_s for r in bwd) <= sum(r.time_s for r in full)
    assert sum(r.flops for r in bwd) < sum(r.flops for r in full)


def test_decode_reads_and_holds_the_window():
    rep = fxshape.analyze(_gemma3(), mode="decode", context_len=4096, batch_size=4, gpu="h100")
    rows = _attn(rep)
    # sliding layers read their last 128 keys, the full layer all 4096
    assert rows["model.layers.0.self_attn"].n == 128
    assert rows["model.layers.5.self_attn"].n == 4096
    # K and V x 2 KV heads x 64 x batch 4 x 2 bytes, times (5 layers x 128 + 1 x 4096) tokens
    assert rep.memory.kv_cache == 2 * 2 * 64 * 4 * 2 * (5 * 128 + 4096)
    assert any("sliding window: 5 layers" in n for n in rep.step.notes)
    assert rep.step.floor_s <= rep.step.time_s


def test_gemma2_eager_decode_says_it_is_unfused():
    cfg = transformers.Gemma2Config(num_hidden_layers=2, hidden_size=128, intermediate_size=256,
                                    num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                    vocab_size=500, sliding_window=64,
                                    max_position_embeddings=2048)
    with torch.device("meta"):
        model = transformers.Gemma2ForCausalLM(cfg)
    rep = fxshape.analyze(model, mode="decode", context_len=1024, batch_size=2, gpu="h100")
    notes = " ".join(rep.step.notes)
    assert "split-KV" not in notes and "attention unfused" in notes and "softcap" in notes
    assert "masks the scores of the whole context" in notes
    # layer 0 slides (64 tokens held), layer 1 is full (1024): K and V x 2 heads x 32 x 2 x 2 B
    assert rep.memory.kv_cache == 2 * 2 * 32 * 2 * 2 * (64 + 1024)


def test_what_fits_follows_the_windows():
    """A window layer holds at most its window: the longest context that fits is not the
    average bytes a token at the captured context scaled up (it was, before issue 52)."""
    from fxshape.execution.serving import _windowed_tokens

    rep = fxshape.analyze(_gemma3(), mode="decode", context_len=4096, batch_size=4, gpu="h100")
    # a token of one sequence: 2 (K, V) x 2 KV heads x 64 x 2 bytes = 512 a layer; one full
    # layer, five of window 128
    assert rep.workload.kv_layout == ((0, 512.0), (128, 2560.0))
    # by hand: 1 MB a sequence holds 128 tokens in all six layers (6 x 512 x 128 = 393,216
    # bytes), then 512 bytes a token: 128 + (1,000,000 - 393,216) / 512 = 1,313.1
    assert _windowed_tokens(((0, 512.0), (128, 2560.0)), 1_000_000, None) == 1313
    # all layers windowed (Mistral): the cache stops growing, so the positions bound it
    assert _windowed_tokens(((64, 1024.0),), 1e9, 4096) == 4097
    assert _windowed_tokens(((64, 1024.0),), 1000.0, 4096) == 0  # not one token's 1,024
    cap = rep.capacity
    budget = (cap.usable - cap.weights - rep.memory.activations) / 4
    want = min(int(128 + (budget - 6 * 512 * 128) / 512), 8192)
    assert cap.max_context == want and cap.capped_by_positions == (want == 8192)
