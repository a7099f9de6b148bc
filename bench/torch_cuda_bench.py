#!/usr/bin/env python3
"""PyTorch's side of bench/cuda_bench: the same rows, shapes, models and timing on cuda:0.

Usage: python3 torch_cuda_bench.py [--iters N] [--only SUBSTRING]

Prints the markdown table | benchmark | unit | value | that cuda_bench prints (see its header
comment for the rows); scripts/device_check.sh joins the two (bench/device_report.py). PyTorch
runs eagerly (no torch.compile); attention is F.scaled_dot_product_attention(is_causal=True);
float32 GEMMs run without TF32 except in the tf32 rows, as in weft. Each figure is the median of
--iters runs after warm-up, each timed with CUDA events on the current stream and waited for. A
row that raises prints n/a and the error on stderr.
"""
import argparse
import math
import statistics
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

DEV = torch.device("cuda", 0)
ARGS = None


def median_ms(warmup, iters, f):
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    for _ in range(warmup):
        f()
    torch.cuda.synchronize(DEV)
    times = []
    for _ in range(iters):
        start.record()
        f()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def row(name, unit, value):
    if ARGS.only and ARGS.only not in name:
        return
    try:
        v = value()
        print(f"| {name} | {unit} | {v:.3f} |", flush=True)
    except Exception as e:  # a row that cannot run is reported, the others still run
        print(f"| {name} | {unit} | n/a |", flush=True)
        print(f"torch_cuda_bench: {name}: {e}", file=sys.stderr, flush=True)


def randn(*shape, dtype=torch.float32):
    return torch.randn(*shape, device=DEV).to(dtype)


def gb_per_s(nbytes, ms):
    return nbytes / (ms * 1e-3) / 1e9


def copy_bandwidth():
    n = 64 << 20
    src = torch.ones(n, device=DEV)
    dst = torch.empty(n, device=DEV)
    ms = median_ms(3, ARGS.iters, lambda: dst.copy_(src))
    return gb_per_s(2 * src.numel() * 4, ms)


def gemm(n, dtype, tf32):
    a, b = randn(n, n, dtype=dtype), randn(n, n, dtype=dtype)
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        ms = median_ms(2, max(3, ARGS.iters // 2), lambda: torch.matmul(a, b))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
    return 2 * n**3 / (ms * 1e-3) / 1e12


def attention(dtype, backward):
    shape = (4, 16, 2048, 64)
    q, k, v = (randn(*shape, dtype=dtype).requires_grad_(backward) for _ in range(3))
    grad = randn(*shape, dtype=dtype)

    def step():
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        if backward:
            out.backward(grad)

    return median_ms(3, ARGS.iters, step)


def train_step(model, opt, loss_fn):
    def step():
        loss = loss_fn()
        opt.zero_grad()
        loss.backward()
        opt.step()

    return median_ms(5, ARGS.iters, step)


def mlp_step():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10)).to(DEV)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = randn(64, 784)
    y = torch.randint(0, 10, (64,), device=DEV)
    return train_step(model, opt, lambda: F.cross_entropy(model(x), y))


class Cnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3)
        self.conv2 = nn.Conv2d(32, 64, 3)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        h = F.relu(self.conv1(x))
        h = F.max_pool2d(self.conv2(h), 2)
        h = torch.flatten(F.dropout(h, 0.25, True), 1)
        h = F.dropout(F.relu(self.fc1(h)), 0.5, True)
        return F.log_softmax(self.fc2(h), 1)


def cnn_step():
    torch.manual_seed(0)
    model = Cnn().to(DEV)
    opt = torch.optim.SGD(model.parameters(), lr=0.03)
    x = randn(32, 1, 28, 28)
    y = torch.randint(0, 10, (32,), device=DEV)
    return train_step(model, opt, lambda: F.nll_loss(model(x), y))


class Rnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(8, 32)
        self.lstm = nn.LSTM(32, 64, 2)
        self.dec = nn.Linear(64, 8)

    def forward(self, x):
        e = F.dropout(self.emb(x), 0.5, True)
        h, _ = self.lstm(e)
        return self.dec(F.dropout(h, 0.5, True))


def lstm_step():
    torch.manual_seed(0)
    model = Rnn().to(DEV)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x = torch.randint(0, 8, (20, 32), device=DEV)
    y = torch.randint(0, 8, (20, 32), device=DEV)
    return train_step(model, opt, lambda: F.cross_entropy(model(x).reshape(-1, 8), y.reshape(-1)))


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(width)
        self.c_attn = nn.Linear(width, 3 * width)
        self.c_proj = nn.Linear(width, width)
        self.ln_2 = nn.LayerNorm(width)
        self.c_fc = nn.Linear(width, 4 * width)
        self.mlp_proj = nn.Linear(4 * width, width)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class Gpt(nn.Module):
    """nanoGPT as examples/gpt builds it: learned positions, pre-norm blocks, exact GELU, tied head."""

    def __init__(self, layers, heads, width, block):
        super().__init__()
        self.wte = nn.Embedding(256, width)
        self.wpe = nn.Embedding(block, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() == 2:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith(("c_proj.weight", "mlp_proj.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)

    def loss(self, idx, targets):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def gpt_step(layers, heads, width, block, batch):
    torch.manual_seed(0)
    model = Gpt(layers, heads, width, block).to(DEV)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95))
    data = torch.randint(0, 256, (batch, block + 1), device=DEV)
    x, y = data[:, :block].contiguous(), data[:, 1:].contiguous()

    def step():
        opt.zero_grad(set_to_none=True)
        loss = model.loss(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    return median_ms(3, ARGS.iters, step)


def main():
    global ARGS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--only", default="")
    ARGS = parser.parse_args()
    if not torch.cuda.is_available():
        print("torch_cuda_bench: no CUDA device", file=sys.stderr)
        return 1
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(DEV)}\n")
    print("| benchmark | unit | value |\n|---|---|---:|")
    row("copy", "GB/s", copy_bandwidth)
    for n in (4096, 8192):
        row(f"gemm f32 {n}", "TFLOP/s", lambda: gemm(n, torch.float32, False))
        row(f"gemm tf32 {n}", "TFLOP/s", lambda: gemm(n, torch.float32, True))
        row(f"gemm bf16 {n}", "TFLOP/s", lambda: gemm(n, torch.bfloat16, False))

    n = 64 << 20

    def elementwise(dtype, f, tensors, passes):
        xs = [randn(n, dtype=dtype) for _ in range(tensors)]
        return gb_per_s(passes * xs[0].numel() * xs[0].element_size(), median_ms(3, ARGS.iters, lambda: f(*xs)))

    row("add f32", "GB/s", lambda: elementwise(torch.float32, torch.add, 2, 3))
    row("add bf16", "GB/s", lambda: elementwise(torch.bfloat16, torch.add, 2, 3))
    row("gelu f32", "GB/s", lambda: elementwise(torch.float32, F.gelu, 1, 2))
    rows = (16384, 4096)

    def reduction(f, nbytes):
        a = randn(*rows)
        return gb_per_s(nbytes(a), median_ms(3, ARGS.iters, lambda: f(a)))

    row("sum last dim f32", "GB/s", lambda: reduction(lambda a: a.sum(-1), lambda a: a.numel() * 4 + rows[0] * 4))
    row("softmax last dim f32", "GB/s", lambda: reduction(lambda a: torch.softmax(a, -1), lambda a: 2 * a.numel() * 4))
    w, b = randn(rows[1]), randn(rows[1])
    row("layer norm f32", "GB/s",
        lambda: reduction(lambda a: F.layer_norm(a, (rows[1],), w, b), lambda a: 2 * a.numel() * 4))

    row("attention fwd bf16", "ms", lambda: attention(torch.bfloat16, False))
    row("attention fwd+bwd bf16", "ms", lambda: attention(torch.bfloat16, True))
    row("attention fwd+bwd f32", "ms", lambda: attention(torch.float32, True))

    row("mlp step", "ms", mlp_step)
    row("cnn step", "ms", cnn_step)
    row("lstm step", "ms", lstm_step)
    row("gpt step", "ms", lambda: gpt_step(4, 4, 128, 128, 16))
    row("gpt-wide step", "ms", lambda: gpt_step(8, 8, 256, 256, 8))
    return 0


if __name__ == "__main__":
    sys.exit(main())
