"""Small models written for the tests (no transformers needed)."""


import torch
import torch.nn.functional as F
from torch import nn


class MLP(nn.Module):
    def __init__(self, d_in=64, d_hidden=200, d_out=10):
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.fc2 = nn.Linear(d_hidden, d_out)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.n_head = n_head

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class Block(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.c_proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x))))


class NanoGPT(nn.Module):
    """nanoGPT-style decoder with tied embeddings; vocab 50257 by default (unpadded)."""

    def __init__(self, vocab_size=50257, block_size=256, n_layer=2, n_head=4, n_embd=128):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.h = nn.ModuleList(Block(n_embd, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied

    def forward(self, idx):
        b, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


class EinsumBmm(nn.Module):
    """Matmul flavours the op registry must handle."""

    def forward(self, a, b, c):
        x = torch.einsum("bij,bjk->bik", a, b)        # batched contraction
        y = torch.matmul(x, c)                        # 3-D @ 2-D: batch folds into M
        return torch.bmm(y, y.transpose(1, 2))        # bmm


class NoMatmul(nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2


def tiny_llama(layers=2, positions=512, **sizes):
    """A Hugging Face Llama on the meta device small enough for any test of the serving
    wing: hidden 256, 8 heads over 2 KV heads, 1,000 tokens (``sizes``: other config
    fields)."""
    import transformers

    cfg = transformers.LlamaConfig(**{**dict(
        num_hidden_layers=layers, hidden_size=256, intermediate_size=512,
        num_attention_heads=8, num_key_value_heads=2, vocab_size=1000,
        max_position_embeddings=positions), **sizes})
    with torch.device("meta"):
        return transformers.LlamaForCausalLM(cfg)
