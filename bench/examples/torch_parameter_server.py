#!/usr/bin/python3
"""PyTorch's counterpart of examples/parameter_server, for bench/examples/run.py: the same CNN on
Fashion-MNIST held by a parameter server, one trainer, with PyTorch's call pattern (that of
pytorch/examples distributed/rpc/parameter_server): per batch, inside a dist_autograd context, a
forward on the server by rpc_sync, NLL loss on the trainer, dist_autograd.backward, and a
DistributedOptimizer (SGD, lr 0.03) step over RRefs to the model's 8 parameters.

    /usr/bin/python3 bench/examples/torch_parameter_server.py --batches 200 --metrics ps.csv

Data: the Fashion-MNIST training split read from the Debian package's IDX files with numpy
(/usr/share/datasets/fashion-mnist, or --data-dir), normalised with mean 0.1307 and std 0.3081,
shuffled with --seed, batches of --batch-size (32). Writes iteration,loss,seconds per batch
(seconds: from entering the context to the end of the step, as the weft app measures) to
--metrics; nothing is evaluated.
"""

import argparse
import gzip
import os
import sys
import time

import numpy as np
import torch
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.optim import DistributedOptimizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_common import init_rpc, launch, parameter_rrefs, remote_method, write_csv  # noqa: E402

MEAN, STD = 0.1307, 0.3081


def read_idx(data_dir, stem):
    """The IDX file `stem` (plain or .gz) as a numpy array of its declared shape."""
    for name in (stem, stem + ".gz"):
        path = os.path.join(data_dir, name)
        if os.path.exists(path):
            opener = gzip.open if name.endswith(".gz") else open
            with opener(path, "rb") as f:
                raw = f.read()
            dims = raw[3]
            shape = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
            return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)
    raise SystemExit(f"torch_parameter_server: {stem}(.gz) not found in {data_dir} "
                     "(Debian package dataset-fashion-mnist)")


class Net(nn.Module):
    """Conv 1->32 3x3, ReLU, Conv 32->64 3x3, MaxPool 2, Dropout 0.25, Flatten, Linear 9216->128,
    ReLU, Dropout 0.5, Linear 128->10, LogSoftmax (1,199,882 parameters)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(self.conv2(x), 2)
        x = torch.flatten(self.dropout1(x), 1)
        x = self.dropout2(F.relu(self.fc1(x)))
        return F.log_softmax(self.fc2(x), dim=1)


class ParameterServer:
    def __init__(self, seed):
        torch.manual_seed(seed)
        self.model = Net()

    def forward(self, inp):
        return self.model(inp)

    def get_param_rrefs(self):
        return parameter_rrefs(self.model)


def train(args):
    images = read_idx(args.data_dir, "train-images-idx3-ubyte")
    labels = read_idx(args.data_dir, "train-labels-idx1-ubyte")
    data = (torch.from_numpy(images.astype(np.float32) / 255.0).unsqueeze(1) - MEAN) / STD
    targets = torch.from_numpy(labels.astype(np.int64))
    order = torch.randperm(len(data), generator=torch.Generator().manual_seed(args.seed))

    ps = rpc.remote("parameter_server", ParameterServer, args=(args.seed,))
    params = remote_method(ParameterServer.get_param_rrefs, ps)
    assert sum(p.to_here().numel() for p in params) == 1199882
    opt = DistributedOptimizer(torch.optim.SGD, params, lr=args.lr)

    rows = []
    for it in range(args.batches):
        lo = (it * args.batch_size) % (len(data) - args.batch_size + 1)
        idx = order[lo:lo + args.batch_size]
        x, y = data[idx], targets[idx]
        t0 = time.perf_counter()
        with dist_autograd.context() as cid:
            out = remote_method(ParameterServer.forward, ps, x)
            loss = F.nll_loss(out, y)
            dist_autograd.backward(cid, [loss])
            opt.step(cid)
            loss_value = loss.item()
        rows.append((it + 1, loss_value, time.perf_counter() - t0))
    write_csv(args.metrics, ("iteration", "loss", "seconds"), rows)


def worker(rank, world, args, port):
    init_rpc("parameter_server" if rank == 0 else "trainer_1", rank, world, port)
    if rank == 1:
        train(args)
    rpc.shutdown()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.03)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--metrics", default="torch_parameter_server_metrics.csv")
    args = p.parse_args()
    launch(worker, 2, args)


if __name__ == "__main__":
    main()
