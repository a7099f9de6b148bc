#!/usr/bin/python3
"""Plots the metrics CSV of any weft example as a PNG: each numeric column against the iteration.

    scripts/plot_metrics.py parameter_server_metrics.csv                 # -> parameter_server_metrics.png
    scripts/plot_metrics.py rl.csv -o rl.png --x episode --columns reward,running_reward
    scripts/plot_metrics.py a.csv --smooth 50                            # adds a moving average

The CSV has a header line and one row per iteration. The x axis is the column given by --x, else
the first column named iteration, episode, step or epoch, else the first column. Every other
column whose values are all numbers gets its own panel (or only those named by --columns); a
panel shows the raw values and, with --smooth N (N > 1), their moving average over N rows.
An empty cell is a value not measured at that row (a validation loss written every K steps): a
column is drawn through its measured points; when they are fewer than half the rows they are
marked and not smoothed, else the moving average runs over them.
Uses matplotlib (Debian's python3-matplotlib, installed by scripts/setup.sh) without a display.
"""

import argparse
import csv
import math
import os
import sys

X_CANDIDATES = ("iteration", "episode", "step", "epoch")


def fail(message):
    print(f"plot_metrics.py: {message}", file=sys.stderr)
    sys.exit(1)


def read_columns(path):
    try:
        with open(path, newline="") as f:
            rows = list(csv.reader(f))
    except OSError as e:
        fail(f"cannot read {path}: {e.strerror}")
    rows = [r for r in rows if r]
    if len(rows) < 2:
        fail(f"{path} has no data rows (expected a header line and one row per iteration)")
    header = [h.strip() for h in rows[0]]
    columns = {h: [] for h in header}
    for number, row in enumerate(rows[1:], start=2):
        if len(row) != len(header):
            fail(f"{path}:{number}: {len(row)} fields, the header has {len(header)}")
        for h, value in zip(header, row):
            columns[h].append(value.strip())
    return header, columns


def as_numbers(values, allow_empty=False):
    """The values as floats (an empty cell as nan when allow_empty), or None when one is not a
    number."""
    out = []
    for v in values:
        if allow_empty and v == "":
            out.append(math.nan)
            continue
        try:
            out.append(float(v))
        except ValueError:
            return None
    return out


def moving_average(values, n):
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= n:
            total -= values[i - n]
        out.append(total / min(i + 1, n))
    return out


def main():
    parser = argparse.ArgumentParser(description="Plot a weft example's metrics CSV as a PNG.")
    parser.add_argument("csv", help="metrics file: a header line, then one row per iteration")
    parser.add_argument("-o", "--output", help="PNG to write (default: the CSV's path with .png)")
    parser.add_argument("--x", help="the column on the x axis (default: iteration, episode, step or epoch)")
    parser.add_argument("--columns", help="comma-separated columns to plot (default: every other numeric column)")
    parser.add_argument("--smooth", type=int, default=0, help="also draw a moving average over N rows")
    parser.add_argument("--title", help="figure title (default: the CSV's file name)")
    args = parser.parse_args()
    if args.smooth < 0:
        fail("--smooth must be non-negative")

    header, columns = read_columns(args.csv)
    if args.x:
        if args.x not in columns:
            fail(f"no column '{args.x}' in {args.csv} (columns: {', '.join(header)})")
        x_name = args.x
    else:
        x_name = next((h for h in X_CANDIDATES if h in columns), header[0])
    xs = as_numbers(columns[x_name])
    if xs is None:
        fail(f"the x column '{x_name}' holds values that are not numbers")

    if args.columns:
        names = [c.strip() for c in args.columns.split(",") if c.strip()]
        for n in names:
            if n not in columns:
                fail(f"no column '{n}' in {args.csv} (columns: {', '.join(header)})")
    else:
        names = [h for h in header if h != x_name and h not in X_CANDIDATES]
    series = []
    for n in names:
        ys = as_numbers(columns[n], allow_empty=True)
        if ys is not None and all(math.isnan(v) for v in ys):
            ys = None
        if ys is None:
            if args.columns:
                fail(f"column '{n}' holds values that are not numbers")
            continue
        series.append((n, ys))
    if not series:
        fail(f"{args.csv} has no numeric column to plot besides '{x_name}'")

    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        fail("matplotlib is missing: apt-get install python3-matplotlib (scripts/setup.sh installs it)")

    output = args.output or os.path.splitext(args.csv)[0] + ".png"
    fig, axes = plt.subplots(len(series), 1, figsize=(8, 2.6 * len(series)), sharex=True, squeeze=False)
    for ax, (name, ys) in zip(axes[:, 0], series):
        finite = [v for v in ys if math.isfinite(v)]
        points = [(x, y) for x, y in zip(xs, ys) if not math.isnan(y)]
        px, py = [p[0] for p in points], [p[1] for p in points]
        sparse = len(points) < len(ys) / 2
        ax.plot(px, py, linewidth=1.2 if sparse else 0.7, marker="o" if sparse else None, markersize=3,
                alpha=0.45 if args.smooth > 1 and not sparse else 1.0, label=name)
        if args.smooth > 1 and not sparse:
            ax.plot(px, moving_average(py, args.smooth), linewidth=1.5, label=f"{name} (mean of {args.smooth})")
            ax.legend(loc="best", fontsize="small")
        ax.set_ylabel(name)
        ax.grid(True, alpha=0.3)
        if finite and min(finite) > 0 and max(finite) / min(finite) > 1e3:
            ax.set_yscale("log")
    axes[-1, 0].set_xlabel(x_name)
    fig.suptitle(args.title or os.path.basename(args.csv))
    fig.tight_layout()
    try:
        fig.savefig(output, dpi=110)
    except OSError as e:
        fail(f"cannot write {output}: {e.strerror}")
    print(f"wrote {output} ({len(series)} panel(s), {len(xs)} rows)")


if __name__ == "__main__":
    main()
