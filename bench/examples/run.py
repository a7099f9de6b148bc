#!/usr/bin/python3
"""Times weft's example apps against equivalent PyTorch programs, in the same run.

    bench/examples/run.py [--quick] [--build-dir build] [--apps parameter_server,rnn,...] [--no-torch]
                          [--repeat R] [--keep DIR]

Each app runs through weftrun with its own flags for a fixed number of iterations and writes its
per-iteration metrics CSV; the figure is the median time per iteration after a warm-up, read
from that CSV (the apps time each iteration inside their training loop: parameter_server,
ddp_rpc and rnn per batch, rl per environment step, from each episode's time over its steps).
When /usr/bin/python3 has torch with torch.distributed.rpc (Debian's python3-torch), the
PyTorch program next to this script for the same app (same model, sizes, batch and call
pattern; TensorPipe RPC on 127.0.0.1, dist_autograd, DistributedOptimizer) runs for the same
number of iterations, and the table gives weft/PyTorch with the goal for each app (with
--repeat R, each side's lowest median of R alternating runs):

    app               iters  weft s/iter   torch s/iter  weft/torch  goal   met
    parameter_server    150    ...

Needs the apps and weftrun built in --build-dir (cmake --build BUILD --target weftrun
parameter_server rnn rl ddp_rpc). An app whose program is missing is skipped with a message.
The default run takes a few minutes on a 2-core machine, --quick about a minute.
Exit status: 0 when every app that ran succeeded (goals missed do not fail the run), 1 otherwise.
"""

import argparse
import csv
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PYTHON = "/usr/bin/python3"


class App:
    """One row of the table: how to run the weft app and its PyTorch counterpart for `n`
    iterations, and which CSV column holds the time of one iteration."""

    def __init__(self, key, program, world, weft_args, torch_script, torch_args, column, scale, unit, goal,
                 iterations, quick_iterations, warmup, quick_warmup, weft_csv=None):
        self.key, self.program, self.world = key, program, world
        self.weft_args, self.torch_script, self.torch_args = weft_args, torch_script, torch_args
        self.column, self.scale, self.unit, self.goal = column, scale, unit, goal
        self.iterations, self.quick_iterations = iterations, quick_iterations
        self.warmup, self.quick_warmup = warmup, quick_warmup
        self.weft_csv = weft_csv or (lambda path: path)


def apps():
    return [
        # One trainer: PyTorch's version crashes with several (see examples/parameter_server).
        App("parameter_server", "parameter_server", 2,
            lambda n, m: ["--epochs", "1", "--max-batches", str(n), "--log-interval", "1000000", "--metrics", m],
            "torch_parameter_server.py", lambda n, m: ["--batches", str(n), "--metrics", m],
            "seconds", 1.0, "s/batch", 0.7, 150, 30, 10, 5),
        # Upstream's random targets (the timing mode): 10 batches per epoch and trainer.
        App("ddp_rpc", "ddp_rpc", 4,
            lambda n, m: ["--epochs", str(n // 10), "--batches", "10", "--target", "random", "--log-interval",
                          "1000000", "--metrics", m],
            "torch_ddp_rpc.py", lambda n, m: ["--epochs", str(n // 10), "--batches", "10", "--metrics", m],
            "seconds", 1.0, "s/batch", 0.3, 200, 50, 20, 10),
        App("rnn", "rnn", 2,
            lambda n, m: ["--iterations", str(n), "--log-interval", "1000000", "--metrics", m],
            "torch_rnn.py", lambda n, m: ["--iterations", str(n), "--metrics", m],
            "seconds", 1.0, "s/batch", 0.3, 300, 60, 20, 10),
        App("rnn --upstream", "rnn", 2,
            lambda n, m: ["--upstream", "--iterations", str(n), "--log-interval", "1000000", "--metrics", m],
            "torch_rnn.py", lambda n, m: ["--upstream", "--iterations", str(n), "--metrics", m],
            "seconds", 1.0, "s/batch", 0.3, 500, 100, 20, 10),
        # Per episode: its time over its environment steps; one observer.
        App("rl", "rl", 2,
            lambda n, m: ["--max-episodes", str(n), "--log-interval", "1000000", "--metrics", m],
            "torch_rl.py", lambda n, m: ["--episodes", str(n), "--metrics", m],
            "ms_per_step", 1e-3, "s/step", 0.3, 150, 30, 10, 5),
    ]


def torch_available():
    """Whether /usr/bin/python3 can import torch.distributed.rpc (and numpy, for the data)."""
    if not os.path.exists(PYTHON):
        return False, f"{PYTHON} not found"
    probe = "import numpy, torch, torch.distributed.rpc, torch.distributed.autograd; print(torch.__version__)"
    try:
        r = subprocess.run([PYTHON, "-c", probe], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return False, "importing torch timed out"
    if r.returncode != 0:
        return False, (r.stderr.strip().splitlines() or ["import failed"])[-1]
    return True, r.stdout.strip()


def run(cmd, cwd, timeout, label):
    """Runs `cmd`; returns (ok, seconds, output tail)."""
    t0 = time.perf_counter()
    try:
        r = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        return False, time.perf_counter() - t0, f"{label}: timed out after {timeout} s\n" + tail(out)
    ok = r.returncode == 0
    msg = "" if ok else f"{label}: exit status {r.returncode}\n" + tail(r.stdout)
    return ok, time.perf_counter() - t0, msg


def tail(text, lines=15):
    kept = [ln for ln in text.splitlines() if not ln.startswith(("I2", "WARNING: Logging before"))]
    return "\n".join("    " + ln for ln in kept[-lines:])


def per_iteration(path, column, scale, warmup):
    """Median, 10th and 90th percentile of `column` (times `scale`) over the rows after the first
    `warmup`, and the number of rows they cover."""
    with open(path, newline="") as f:
        values = [float(row[column]) * scale for row in csv.DictReader(f)]
    kept = values[warmup:] if len(values) > warmup else values
    if not kept:
        raise ValueError(f"{path}: no rows")
    q = statistics.quantiles(kept, n=10) if len(kept) >= 2 else [kept[0]] * 9
    return statistics.median(kept), q[0], q[-1], len(kept)


def fmt(x):
    return "-" if x is None else (f"{x:.3g}" if x >= 1e-3 else f"{x:.3e}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer iterations (a smoke run, about a minute)")
    p.add_argument("--build-dir", default=os.path.join(ROOT, "build"),
                   help="where weftrun and the apps are built (default: build)")
    p.add_argument("--apps", default="", help="comma-separated subset of: " + ", ".join(a.key for a in apps()))
    p.add_argument("--no-torch", action="store_true", help="run the weft apps only")
    p.add_argument("--keep", metavar="DIR", help="keep the metrics CSVs in DIR (default: a temporary directory)")
    p.add_argument("--repeat", type=int, default=1,
                   help="run each program R times, alternating weft and PyTorch; the table keeps each side's "
                        "lowest median (for a machine shared with other jobs)")
    p.add_argument("--timeout", type=int, default=600, help="seconds allowed for each program (default 600)")
    args = p.parse_args()
    if args.repeat < 1:
        p.error("--repeat must be at least 1")

    selected = apps()
    if args.apps:
        wanted = [s.strip() for s in args.apps.split(",") if s.strip()]
        unknown = [w for w in wanted if w not in {a.key for a in selected}]
        if unknown:
            p.error(f"unknown app(s) {', '.join(unknown)}; known: {', '.join(a.key for a in selected)}")
        selected = [a for a in selected if a.key in wanted]

    build = os.path.abspath(args.build_dir)
    weftrun = os.path.join(build, "tools", "weftrun", "weftrun")
    if not os.access(weftrun, os.X_OK):
        sys.exit(f"run.py: {weftrun} not found; build it first: cmake --build {args.build_dir} --target weftrun "
                 "parameter_server ddp_rpc rnn rl")

    use_torch, torch_info = (False, "--no-torch") if args.no_torch else torch_available()
    print(f"weft example apps, {'quick' if args.quick else 'default'} run; build {build}")
    print(f"PyTorch: {torch_info if use_torch else 'not run (' + torch_info + ')'}; "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
    print("figures: median time per iteration after the warm-up, [p10, p90] in the detail lines", flush=True)

    workdir = os.path.abspath(args.keep) if args.keep else tempfile.mkdtemp(prefix="weft_bench_examples_")
    os.makedirs(workdir, exist_ok=True)
    results, failed = [], False
    try:
        for app in selected:
            n = app.quick_iterations if args.quick else app.iterations
            warm = app.quick_warmup if args.quick else app.warmup
            exe = os.path.join(build, "examples", app.program, app.program)
            slug = app.key.replace(" --", "_")
            row = {"app": app, "n": n, "weft": None, "torch": None, "note": ""}
            if not os.access(exe, os.X_OK):
                row["note"] = f"skipped: {exe} not built"
                print(f"{app.key}: skipped, {exe} is not built (cmake --build {args.build_dir} --target "
                      f"{app.program})", flush=True)
                results.append(row)
                continue
            for attempt in range(1, args.repeat + 1):
                tag = f" (run {attempt}/{args.repeat})" if args.repeat > 1 else ""
                metrics = os.path.join(workdir, f"weft_{slug}_{attempt}.csv")
                cmd = [weftrun, "-n", str(app.world), exe] + app.weft_args(n, metrics)
                ok, wall, msg = run(cmd, workdir, args.timeout, f"weft {app.key}")
                if ok:
                    fig = per_iteration(metrics, app.column, app.scale, warm)
                    row["weft"] = fig if row["weft"] is None or fig[0] < row["weft"][0] else row["weft"]
                    m, lo, hi, k = fig
                    print(f"{app.key}: weft  {fmt(m)} {app.unit} [{fmt(lo)}, {fmt(hi)}] over {k} iterations after "
                          f"{warm} warm-up ({wall:.1f} s wall){tag}", flush=True)
                else:
                    failed = True
                    print(msg, flush=True)
                if use_torch:
                    tmetrics = os.path.join(workdir, f"torch_{slug}_{attempt}.csv")
                    tcmd = [PYTHON, os.path.join(HERE, app.torch_script)] + app.torch_args(n, tmetrics)
                    ok, wall, msg = run(tcmd, workdir, args.timeout, f"torch {app.key}")
                    if ok:
                        fig = per_iteration(tmetrics, app.column, app.scale, warm)
                        row["torch"] = fig if row["torch"] is None or fig[0] < row["torch"][0] else row["torch"]
                        m, lo, hi, k = fig
                        print(f"{app.key}: torch {fmt(m)} {app.unit} [{fmt(lo)}, {fmt(hi)}] over {k} iterations "
                              f"after {warm} warm-up ({wall:.1f} s wall){tag}", flush=True)
                    else:
                        failed = True
                        print(msg, flush=True)
            results.append(row)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)

    print()
    print(f"{'app':<16} {'iters':>6} {'unit':>7} {'weft':>10} {'PyTorch':>10} {'weft/PyTorch':>12} {'goal':>6}  met")
    for row in results:
        app = row["app"]
        w = row["weft"][0] if row["weft"] else None
        t = row["torch"][0] if row["torch"] else None
        ratio = w / t if w is not None and t else None
        met = "-" if ratio is None else ("yes" if ratio <= app.goal else "no")
        print(f"{app.key:<16} {row['n']:>6} {app.unit:>7} {fmt(w):>10} {fmt(t):>10} "
              f"{'-' if ratio is None else f'{ratio:.3f}':>12} {'<=' + str(app.goal):>6}  {met}"
              + (f"  ({row['note']})" if row["note"] else ""))
    if args.keep:
        print(f"metrics CSVs in {workdir}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
