"""The PyTorch twin of tensor_bench's MLP step: prints median samples/s.

Usage: /usr/bin/python3 torch_mlp_step.py BATCH STEPS
Same model (784-256-128-10, ReLU), loss, optimizer and thread count as weft's.
"""
import os
import statistics
import sys
import time

import torch

batch, steps = int(sys.argv[1]), int(sys.argv[2])
torch.set_num_threads(os.cpu_count() or 1)
torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(784, 256), torch.nn.ReLU(),
    torch.nn.Linear(256, 128), torch.nn.ReLU(),
    torch.nn.Linear(128, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.rand(batch, 784)
y = torch.randint(0, 10, (batch,))
loss_fn = torch.nn.CrossEntropyLoss()


def step():
    opt.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()


for _ in range(20):
    step()
times = []
for _ in range(steps):
    t0 = time.perf_counter()
    step()
    times.append(time.perf_counter() - t0)
print(batch / statistics.median(times))
