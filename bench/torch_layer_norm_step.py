"""The PyTorch twin of tensor_bench's layer-norm step: prints the median
seconds of one forward and backward.

Usage: /usr/bin/python3 torch_layer_norm_step.py ROWS N STEPS THREADS
x [ROWS, N] float32 with an affine weight and bias of [N]; the backward of
sum(y * g) for a fixed g gives dx, dweight and dbias, as in weft's.
"""
import statistics
import sys
import time

import torch
import torch.nn.functional as F

rows, n, steps, threads = (int(a) for a in sys.argv[1:5])
torch.set_num_threads(threads)
torch.manual_seed(0)
x = torch.randn(rows, n, requires_grad=True)
w = torch.randn(n, requires_grad=True)
b = torch.randn(n, requires_grad=True)
g = torch.randn(rows, n)


def step():
    x.grad = w.grad = b.grad = None
    y = F.layer_norm(x, (n,), w, b, 1e-5)
    y.backward(g)


for _ in range(20):
    step()
times = []
for _ in range(steps):
    t0 = time.perf_counter()
    step()
    times.append(time.perf_counter() - t0)
print(statistics.median(times))
