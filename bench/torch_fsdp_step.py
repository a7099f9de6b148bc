"""PyTorch's twin of fsdp_bench's ZeRO-3 row: torch.distributed.fsdp.FullyShardedDataParallel on CPU over
the gloo backend, the GPT of torch_gpt_step.py, one process per rank on 127.0.0.1.

Usage: /usr/bin/python3 torch_fsdp_step.py [--world 2] [--layers 4] [--width 128] [--block 64]
           [--batch 8] [--steps 20] [--threads 1]

Each transformer block is an FSDP unit (transformer_auto_wrap_policy), the root holds the rest; the
step is fsdp_bench's: forward, mean cross-entropy over [batch, block] targets, backward, AdamW
(lr 3e-4, betas 0.9/0.95, weight decay 0.1, one group), float32. It prints three lines:
  versions torch T python P
  import ok | import error <ExceptionType>: <message>
  run ok world W params N step_ms M peak_rss_mb R | run error <ExceptionType>: <message> (at <file:line function>)
M: the largest over the ranks of each rank's median step time; R: the largest growth of a rank's
peak resident set from before the model was built, in MiB (PyTorch keeps no byte count of its CPU
tensors). When the package's import fails, the run is tried with the one repair that lets it
import (see hashable_tensor_properties) and says so. Exits 0 whatever happened: the lines say it.
"""
import argparse
import functools
import importlib
import os
import platform
import resource
import socket
import statistics
import sys
import time
import traceback

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_gpt_step import GPT, Block, VOCAB  # noqa: E402


def describe(e):
    """'<Type>: <message> (at <file:line function>)': the innermost frame in torch.distributed, else
    the innermost."""
    frames = traceback.extract_tb(e.__traceback__)
    ours = [f for f in frames if "torch/distributed" in f.filename] or frames
    where = f" (at {os.path.basename(ours[-1].filename)}:{ours[-1].lineno} {ours[-1].name})" if ours else ""
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}{where}"


def import_fsdp(repair):
    """Imports torch.distributed.fsdp. With `repair`, its dataclass TensorProperties is made hashable
    while the package imports: Python 3.11 refuses an unhashable dataclass instance as a field's
    default, which torch 1.13's sharded_tensor metadata uses."""
    if not repair:
        return importlib.import_module("torch.distributed.fsdp")
    import dataclasses
    original = dataclasses.dataclass

    def hashable_tensor_properties(cls=None, /, **kw):
        def wrap(c):
            if c.__name__ == "TensorProperties":
                kw.setdefault("unsafe_hash", True)
            return original(c, **kw)
        return wrap if cls is None else wrap(cls)

    dataclasses.dataclass = hashable_tensor_properties
    try:
        return importlib.import_module("torch.distributed.fsdp")
    finally:
        dataclasses.dataclass = original


def peak_rss_bytes():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def worker(rank, a, port, repair, queue):
    try:
        torch.set_num_threads(a.threads)
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
        dist.init_process_group("gloo", rank=rank, world_size=a.world)
        fsdp = import_fsdp(repair)
        from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

        before = peak_rss_bytes()
        torch.manual_seed(7)
        model = GPT(a.layers, 4, a.width, a.block)
        params = sum(p.numel() for p in model.parameters())
        policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Block})
        model = fsdp.FullyShardedDataParallel(model, auto_wrap_policy=policy)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
        times = []
        for s in range(a.steps):
            g = torch.Generator().manual_seed(100 + rank * 1000 + s)
            x = torch.randint(0, VOCAB, (a.batch, a.block), generator=g)
            y = torch.randint(0, VOCAB, (a.batch, a.block), generator=g)
            dist.barrier()
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=False)
            model(x, y).backward()
            opt.step()
            times.append((time.perf_counter() - t0) * 1e3)
        stats = torch.tensor([statistics.median(times), float(peak_rss_bytes() - before)], dtype=torch.float64)
        dist.all_reduce(stats, op=dist.ReduceOp.MAX)
        if rank == 0:
            queue.put(f"run ok world {a.world} params {params} step_ms {stats[0].item():.2f} "
                      f"peak_rss_mb {stats[1].item() / 2**20:.1f}")
        dist.barrier()
        dist.destroy_process_group()
    except Exception as e:  # every rank fails alike; the first report is printed
        queue.put(f"run error {describe(e)}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--block", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    a = parser.parse_args()
    print(f"versions torch {torch.__version__} python {platform.python_version()}", flush=True)
    try:
        import_fsdp(repair=False)
        print("import ok", flush=True)
        repair = False
    except Exception as e:
        print(f"import error {describe(e)}", flush=True)
        repair = True
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    procs = [ctx.Process(target=worker, args=(r, a, port, repair, queue)) for r in range(a.world)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + 600
    for p in procs:
        p.join(max(1.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    result = queue.get() if not queue.empty() else (
        "run error no rank reported (exit codes " + ", ".join(str(p.exitcode) for p in procs) + ")")
    if repair:
        result = result.replace("run ", "run (TensorProperties made hashable to import) ", 1)
    print(result, flush=True)


if __name__ == "__main__":
    main()
