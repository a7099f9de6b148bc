"""PyTorch (cuDNN) timings for the shapes of cuda_conv_bench, float32, TF32 off.

Prints the median milliseconds of conv2d, max_pool2d and one LSTM layer,
forward and backward, on cuda:0.

    python3 bench/torch_cuda_conv_step.py [--reps 20]
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F


def median_ms(reps, fn):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=20)
    reps = p.parse_args().reps
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda:0")

    x = torch.full((32, 64, 56, 56), 0.01, device=dev, requires_grad=True)
    w = torch.full((64, 64, 3, 3), 0.01, device=dev, requires_grad=True)
    b = torch.full((64,), 0.01, device=dev, requires_grad=True)
    g = torch.full((32, 64, 56, 56), 0.01, device=dev)
    with torch.no_grad():
        print("conv2d 3x3 [32,64,56,56]->64 forward   %8.3f ms" % median_ms(reps, lambda: F.conv2d(x, w, b, padding=1)))
    out = F.conv2d(x, w, b, padding=1)
    print("conv2d 3x3 [32,64,56,56]->64 backward  %8.3f ms"
          % median_ms(reps, lambda: torch.autograd.grad(out, (x, w, b), g, retain_graph=True)))

    xp = torch.full((32, 64, 112, 112), 0.01, device=dev, requires_grad=True)
    gp = torch.full((32, 64, 56, 56), 0.01, device=dev)
    with torch.no_grad():
        print("maxPool2d 3x3/2 [32,64,112,112] forward  %8.3f ms"
              % median_ms(reps, lambda: F.max_pool2d_with_indices(xp, 3, 2, 1)))
    pooled = F.max_pool2d(xp, 3, 2, 1)
    print("maxPool2d 3x3/2 [32,64,112,112] backward %8.3f ms"
          % median_ms(reps, lambda: torch.autograd.grad(pooled, xp, gp, retain_graph=True)))

    lstm = torch.nn.LSTM(256, 512).to(dev)
    xs = torch.full((32, 64, 256), 0.01, device=dev, requires_grad=True)
    with torch.no_grad():
        print("lstmLayer T=32 N=64 in=256 H=512 forward   %8.3f ms" % median_ms(reps, lambda: lstm(xs)))
    ys, _ = lstm(xs)
    gy = torch.full_like(ys, 0.01)
    print("lstmLayer T=32 N=64 in=256 H=512 backward  %8.3f ms"
          % median_ms(reps, lambda: torch.autograd.grad(ys, [xs] + list(lstm.parameters()), gy, retain_graph=True)))


if __name__ == "__main__":
    main()
