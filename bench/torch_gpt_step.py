"""The PyTorch twin of gpt_bench's training step: prints the parameter count and median tokens/s.

Usage: /usr/bin/python3 torch_gpt_step.py [--layers 4] [--heads 4] [--width 128] [--block 128]
           [--batch 16] [--steps 20] [--warmup 3] [--threads N] [--seed 0]

The model is nanoGPT's (a byte vocabulary of 256, learned positions, pre-norm blocks with
LayerNorm, causal self-attention with a [T, T] mask as PyTorch 1.13 computes it, an MLP of 4x
width with exact GELU, a final LayerNorm and a head tied to the token embedding), initialised as
GPT-2 (N(0, 0.02), the residual projections N(0, 0.02 / sqrt(2 * layers)), zero biases), as
examples/gpt builds it in weft. The step is the example's: logits, mean cross-entropy over the
batch's [batch, block] targets, backward, gradient clipping at norm 1, AdamW (lr 1e-3, betas
0.9/0.95, weight decay 0.1 on the matrices only). One fixed batch of random bytes is used for
every step, on both sides. The figure is batch * block / the median step time after --warmup
steps, with torch.set_num_threads(--threads) (default: every core).
"""
import argparse
import math
import os
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB = 256


class CausalSelfAttention(nn.Module):
    def __init__(self, width, heads, block):
        super().__init__()
        self.heads = heads
        self.c_attn = nn.Linear(width, 3 * width)
        self.c_proj = nn.Linear(width, width)
        self.register_buffer("mask", torch.tril(torch.ones(block, block, dtype=torch.bool)).view(1, 1, block, block))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q = q.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        k = k.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(~self.mask[:, :, :t, :t], float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.c_fc = nn.Linear(width, 4 * width)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * width, width)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, width, heads, block):
        super().__init__()
        self.ln_1 = nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads, block)
        self.ln_2 = nn.LayerNorm(width)
        self.mlp = MLP(width)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, layers, heads, width, block):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, width)
        self.wpe = nn.Embedding(block, width)
        self.h = nn.ModuleList([Block(width, heads, block) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, VOCAB, bias=False)
        self.lm_head.weight = self.wte.weight
        self.apply(self._init)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * layers))

    @staticmethod
    def _init(m):
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, 0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, 0.0, 0.02)

    def forward(self, idx, targets):
        t = idx.size(1)
        x = self.wte(idx) + self.wpe(torch.arange(t))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, VOCAB), targets.reshape(-1))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--block", type=int, default=128)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--seed", type=int, default=0)
    a = parser.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    model = GPT(a.layers, a.heads, a.width, a.block)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95))
    data = torch.randint(0, VOCAB, (a.batch, a.block + 1))
    x, y = data[:, :-1].contiguous(), data[:, 1:].contiguous()

    def step():
        opt.zero_grad(set_to_none=True)
        loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss.item()

    first = step()
    for _ in range(a.warmup):
        step()
    times = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    params = sum(p.numel() for p in model.parameters())
    print(f"params {params} tokens_per_s {a.batch * a.block / statistics.median(times):.1f} first_loss {first:.4f}")


if __name__ == "__main__":
    main()
