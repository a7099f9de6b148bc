#!/usr/bin/python3
"""PyTorch's counterpart of examples/ddp_rpc, for bench/examples/run.py: PyTorch's hybrid DDP +
remote embedding example (pytorch/examples distributed/rpc/ddp_rpc) on CPU. Ranks 0 and 1
"trainer0", "trainer1" form a two-process Gloo group; rank 2 "master" builds a
RemoteModule EmbeddingBag(100, 16, mode sum) on "ps" (rank 3) and starts the training on both
trainers with rpc_async, passing the RemoteModule. Each trainer holds DDP(Linear(16, 8)) and a
DistributedOptimizer (SGD, lr 0.05) over the table's parameter RRefs and RRefs to its Linear's
weight and bias. Per batch, inside a dist_autograd context: the remote EmbeddingBag forward, the
DDP Linear, cross-entropy, dist_autograd.backward (DDP averages the Linear's gradients), step.

    /usr/bin/python3 bench/examples/torch_ddp_rpc.py --epochs 20 --batches 10 --metrics ddp_rpc.csv

Data: upstream's random batches (20-50 ids in [0, 100), bags starting 1-9 ids apart, random
targets in [0, 8): the weft app's --target random). Writes iteration,loss,seconds per batch of
trainer0 (seconds: from entering the context to the end of the step, as the weft app measures)
to --metrics.
"""

import argparse
import os
import random
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
import torch.nn as nn
from torch.distributed.nn import RemoteModule
from torch.distributed.optim import DistributedOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_common import init_rpc, launch, write_csv  # noqa: E402

NUM_EMBEDDINGS = 100
EMBEDDING_DIM = 16


class HybridModel(nn.Module):
    def __init__(self, remote_emb_module):
        super().__init__()
        self.remote_emb_module = remote_emb_module
        self.fc = DDP(nn.Linear(EMBEDDING_DIM, 8))

    def forward(self, indices, offsets):
        return self.fc(self.remote_emb_module.forward(indices, offsets))


def next_batch(rng):
    n = rng.randint(20, 50)
    indices = torch.tensor([rng.randrange(NUM_EMBEDDINGS) for _ in range(n)], dtype=torch.int64)
    offsets, start = [], 0
    while start < n:
        offsets.append(start)
        start += rng.randint(1, 9)
    target = torch.tensor([rng.randrange(8) for _ in offsets], dtype=torch.int64)
    return indices, torch.tensor(offsets, dtype=torch.int64), target


def run_trainer(remote_emb_module, rank, a):
    torch.manual_seed(a.seed + 100 + rank)
    model = HybridModel(remote_emb_module)
    params = model.remote_emb_module.remote_parameters()
    for p in model.fc.parameters():
        params.append(rpc.RRef(p))
    opt = DistributedOptimizer(torch.optim.SGD, params, lr=0.05)
    criterion = nn.CrossEntropyLoss()
    rng = random.Random(a.seed * 1000 + rank)
    rows, it = [], 0
    for _ in range(a.epochs):
        for _ in range(a.batches):
            indices, offsets, target = next_batch(rng)
            it += 1
            t0 = time.perf_counter()
            with dist_autograd.context() as cid:
                output = model(indices, offsets)
                loss = criterion(output, target)
                dist_autograd.backward(cid, [loss])
                opt.step(cid)
                loss_value = loss.item()
            rows.append((it, loss_value, time.perf_counter() - t0))
    if rank == 0:
        write_csv(a.metrics, ("iteration", "loss", "seconds"), rows)
    return it


def worker(rank, world, a, rpc_port, gloo_port):
    if rank == 2:
        init_rpc("master", rank, world, rpc_port)
        table = RemoteModule("ps/cpu", nn.EmbeddingBag, args=(NUM_EMBEDDINGS, EMBEDDING_DIM),
                             kwargs={"mode": "sum"})
        futs = [rpc.rpc_async(f"trainer{r}", run_trainer, args=(table, r, a), timeout=0) for r in (0, 1)]
        for f in futs:
            f.wait()
    elif rank <= 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{gloo_port}", rank=rank, world_size=2)
        init_rpc(f"trainer{rank}", rank, world, rpc_port)
    else:
        init_rpc("ps", rank, world, rpc_port)
    rpc.shutdown()
    if rank <= 1:
        dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--batches", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--metrics", default="torch_ddp_rpc_metrics.csv")
    a = p.parse_args()
    launch(worker, 4, a, extra_ports=1)


if __name__ == "__main__":
    main()
