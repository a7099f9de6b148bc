"""Prints the PyTorch reference values pasted into nn_ops_test.cpp.

Usage: /usr/bin/python3 tests/tensor/nn_ops_reference.py   (PyTorch 1.13, CPU)

Inputs are deterministic waves, wave(n, phase)[i] = sin(0.37 * i + phase),
computed in float64 exactly as the C++ test computes them.
"""
import math

import torch
import torch.nn.functional as F

torch.set_default_dtype(torch.float64)


def wave(shape, phase, scale=1.0):
    n = math.prod(shape)
    return torch.tensor([scale * math.sin(0.37 * i + phase) for i in range(n)]).reshape(shape)


def emit(name, t):
    print(f"// {name}: shape {list(t.shape)}")
    print(f"const std::vector<double> {name} = {{")
    line = "   "
    for v in t.flatten().tolist():
        item = f" {v!r},"
        if len(line) + len(item) > 118:
            print(line)
            line = "   "
        line += item
    print(line)
    print("};")


# conv2d: rectangular kernel, stride (2, 1), padding (1, 0)
x = wave((1, 2, 4, 5), 0.1)
w = wave((3, 2, 3, 2), 0.5, 0.5)
b = wave((3,), 0.9)
emit("kConvStridedOut", F.conv2d(x, w, b, stride=(2, 1), padding=(1, 0)))
# conv2d: two images, square padding 1, no bias
x = wave((2, 1, 3, 3), 0.2)
w = wave((2, 1, 2, 2), 0.7)
emit("kConvPaddedOut", F.conv2d(x, w, None, stride=1, padding=1))

# maxPool2d
x = wave((1, 2, 5, 5), 0.3)
emit("kPool3s2p1Out", F.max_pool2d(x, 3, 2, 1))
emit("kPool2Out", F.max_pool2d(x, 2))

# embeddingBag: bags [1, 0, 4], [], [4, 5], [2, 3]
weight = wave((6, 3), 0.2)
idx = torch.tensor([1, 0, 4, 4, 5, 2, 3])
offsets = torch.tensor([0, 3, 3, 5])
emit("kBagSum", F.embedding_bag(idx, weight, offsets, mode="sum"))
emit("kBagMean", F.embedding_bag(idx, weight, offsets, mode="mean"))
emit("kBagMax", F.embedding_bag(idx, weight, offsets, mode="max"))
emit("kBagWeightedSum", F.embedding_bag(idx, weight, offsets, mode="sum", per_sample_weights=wave((7,), 1.1)))
emit("kBag2dMean", F.embedding_bag(torch.tensor([[1, 2], [5, 0], [3, 3]]), weight, mode="mean"))

# lstmCell: N=2, in=3, hidden=2
cell = torch.nn.LSTMCell(3, 2)
with torch.no_grad():
    cell.weight_ih.copy_(wave((8, 3), 0.4, 0.5))
    cell.weight_hh.copy_(wave((8, 2), 0.6, 0.5))
    cell.bias_ih.copy_(wave((8,), 0.7, 0.1))
    cell.bias_hh.copy_(wave((8,), 0.8, 0.1))
h1, c1 = cell(wave((2, 3), 0.1), (wave((2, 2), 0.2, 0.5), wave((2, 2), 0.3)))
emit("kLstmH", h1.detach())
emit("kLstmC", c1.detach())
