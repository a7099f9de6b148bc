"""What the PyTorch counterparts of weft's example apps share: starting a group of processes on
127.0.0.1, joining torch.distributed.rpc (TensorPipe), calling methods of remote objects the way
PyTorch's examples/distributed/rpc do, and writing per-iteration timings as CSV.

    from torch_common import launch, init_rpc, write_csv
    def worker(rank, world, args, port):        # port: the RPC rendezvous (a TCPStore)
        init_rpc("ps" if rank == 0 else "trainer", rank, world, port)
        ...
        rpc.shutdown()
    launch(worker, world=2, args=args)          # raises when a process fails

Nothing here reaches beyond the loopback interface: the rendezvous, TensorPipe's sockets and
Gloo's are all bound to 127.0.0.1 / lo. TensorPipe picks its transports as by default (shm and
uv); WEFT_BENCH_TP_TRANSPORTS=uv (a comma-separated list) restricts them. Each process computes
with PyTorch's default number of threads; WEFT_BENCH_TORCH_THREADS=N sets it.
"""

import csv
import os
import socket

import torch
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp


def free_port():
    """A TCP port on 127.0.0.1 that was free a moment ago (bound to port 0, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(worker, world, args, extra_ports=0):
    """Runs worker(rank, world, args, port, *extra) in `world` processes (torch.multiprocessing,
    spawn), where `port` is the RPC rendezvous port and `extra` holds `extra_ports` more free
    ports. Returns when every process has exited; raises if one of them failed (the others are
    terminated)."""
    ports = [free_port() for _ in range(1 + extra_ports)]
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(ports[0])
    # TensorPipe's and Gloo's sockets on the loopback interface only.
    os.environ["TP_SOCKET_IFNAME"] = "lo"
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    mp.spawn(worker, args=(world, args, *ports), nprocs=world, join=True)


def init_rpc(name, rank, world, port, threads=16, timeout=300):
    """Joins the RPC group as `name` with the TensorPipe backend, rendezvous on 127.0.0.1:port."""
    if os.environ.get("WEFT_BENCH_TORCH_THREADS"):
        torch.set_num_threads(int(os.environ["WEFT_BENCH_TORCH_THREADS"]))
    extra = {}
    if os.environ.get("WEFT_BENCH_TP_TRANSPORTS"):
        extra["_transports"] = os.environ["WEFT_BENCH_TP_TRANSPORTS"].split(",")
    options = rpc.TensorPipeRpcBackendOptions(
        num_worker_threads=threads, rpc_timeout=timeout, init_method=f"tcp://127.0.0.1:{port}", **extra
    )
    rpc.init_rpc(name, rank=rank, world_size=world, backend=rpc.BackendType.TENSORPIPE,
                 rpc_backend_options=options)


def _call_method(method, rref, *args, **kwargs):
    return method(rref.local_value(), *args, **kwargs)


def remote_method(method, rref, *args, **kwargs):
    """rpc_sync of `method` on the object `rref` holds, on its owner (the examples' helper)."""
    return rpc.rpc_sync(rref.owner(), _call_method, args=[method, rref] + list(args), kwargs=kwargs)


def remote_method_async(method, rref, *args, **kwargs):
    """rpc_async of `method` on the object `rref` holds, on its owner."""
    return rpc.rpc_async(rref.owner(), _call_method, args=[method, rref] + list(args), kwargs=kwargs)


def parameter_rrefs(module):
    """One RRef per parameter of `module`, owned by this process."""
    return [rpc.RRef(p) for p in module.parameters()]


def write_csv(path, header, rows):
    """Writes `rows` (sequences matching `header`) to `path` as CSV."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)


def seed_everything(seed):
    torch.manual_seed(seed)
