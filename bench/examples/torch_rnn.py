#!/usr/bin/python3
"""PyTorch's counterpart of examples/rnn, for bench/examples/run.py: PyTorch's distributed RNN
(pytorch/examples distributed/rpc/rnn) with the weft app's sizes and call pattern. Rank 0 "ps"
holds the embedding table (Embedding ntoken x ninp, U(+-0.1), dropout) and the decoder (dropout,
Linear nhid -> ntoken, bias zero, U(+-0.1)), both built there by the trainer through rpc.remote;
rank 1 "trainer" holds the LSTM (ninp -> nhid, nlayers, dropout between layers). Per batch,
inside a dist_autograd context: detach the hidden state, embedding on ps by rpc_sync, the LSTM,
decoder on ps by rpc_sync, cross-entropy over every position, dist_autograd.backward,
DistributedOptimizer (SGD) step over every parameter's RRef (the remote ones fetched from ps).

    /usr/bin/python3 bench/examples/torch_rnn.py --iterations 300 --metrics rnn.csv
    /usr/bin/python3 bench/examples/torch_rnn.py --upstream --iterations 500 --metrics up.csv

Data: synthetic random tokens and targets of the batch's shape [bptt, batch] (the contents do not
change the time of an iteration). Writes iteration,loss,seconds per iteration (seconds: from the
embedding call to the end of the step, as the weft app measures) to --metrics.
"""

import argparse
import os
import sys
import time

import torch
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.optim import DistributedOptimizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_common import init_rpc, launch, parameter_rrefs, remote_method, write_csv  # noqa: E402


class EmbeddingTable(nn.Module):
    def __init__(self, ntoken, ninp, dropout):
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        nn.init.uniform_(self.encoder.weight, -0.1, 0.1)

    def forward(self, inp):
        return self.drop(self.encoder(inp))


class Decoder(nn.Module):
    def __init__(self, ntoken, nhid, dropout):
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.decoder = nn.Linear(nhid, ntoken)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -0.1, 0.1)

    def forward(self, output):
        return self.decoder(self.drop(output))


class RNNModel(nn.Module):
    def __init__(self, ps, a):
        super().__init__()
        self.emb_table_rref = rpc.remote(ps, EmbeddingTable, args=(a.ntoken, a.ninp, a.dropout))
        self.rnn = nn.LSTM(a.ninp, a.nhid, a.nlayers, dropout=a.dropout)
        self.decoder_rref = rpc.remote(ps, Decoder, args=(a.ntoken, a.nhid, a.dropout))

    def forward(self, inp, hidden):
        emb = remote_method(EmbeddingTable.forward, self.emb_table_rref, inp)
        output, hidden = self.rnn(emb, hidden)
        decoded = remote_method(Decoder.forward, self.decoder_rref, output)
        return decoded, hidden

    def parameter_rrefs(self):
        params = remote_method(parameter_rrefs_of, self.emb_table_rref)
        params.extend(parameter_rrefs(self.rnn))
        params.extend(remote_method(parameter_rrefs_of, self.decoder_rref))
        return params


def parameter_rrefs_of(module):
    return parameter_rrefs(module)


def train(a):
    torch.manual_seed(a.seed)
    model = RNNModel("ps", a)
    params = model.parameter_rrefs()
    opt = DistributedOptimizer(torch.optim.SGD, params, lr=a.lr)
    shape = (a.nlayers, a.batch_size, a.nhid)
    if a.upstream:
        hidden = (torch.randn(*shape), torch.randn(*shape))
    else:
        hidden = (torch.zeros(*shape), torch.zeros(*shape))
    rows = []
    for it in range(a.iterations):
        x = torch.randint(0, a.ntoken, (a.bptt, a.batch_size))
        y = torch.randint(0, a.ntoken, (a.bptt, a.batch_size))
        hidden = (hidden[0].detach(), hidden[1].detach())
        t0 = time.perf_counter()
        with dist_autograd.context() as cid:
            out, hidden = model(x, hidden)
            loss = F.cross_entropy(out.reshape(-1, a.ntoken), y.reshape(-1))
            dist_autograd.backward(cid, [loss])
            opt.step(cid)
            loss_value = loss.item()
        rows.append((it + 1, loss_value, time.perf_counter() - t0))
    write_csv(a.metrics, ("iteration", "loss", "seconds"), rows)


def worker(rank, world, a, port):
    init_rpc("ps" if rank == 0 else "trainer", rank, world, port)
    if rank == 1:
        train(a)
    rpc.shutdown()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iterations", type=int, default=300)
    p.add_argument("--upstream", action="store_true",
                   help="upstream's sizes: ntoken 7, ninp 2, nhid 3, nlayers 4, bptt 5, batch 6, lr 0.05, "
                        "random initial state")
    p.add_argument("--ntoken", type=int)
    p.add_argument("--ninp", type=int)
    p.add_argument("--nhid", type=int)
    p.add_argument("--nlayers", type=int)
    p.add_argument("--bptt", type=int)
    p.add_argument("--batch-size", type=int)
    p.add_argument("--dropout", type=float, default=0.5)
    p.add_argument("--lr", type=float)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--metrics", default="torch_rnn_metrics.csv")
    a = p.parse_args()
    preset = dict(ntoken=7, ninp=2, nhid=3, nlayers=4, bptt=5, batch_size=6, lr=0.05) if a.upstream else \
        dict(ntoken=8, ninp=32, nhid=64, nlayers=2, bptt=20, batch_size=32, lr=1.0)
    for k, v in preset.items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    launch(worker, 2, a)


if __name__ == "__main__":
    main()
