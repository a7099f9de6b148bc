#!/bin/bash
# Throughput of the data-parallel Fashion-MNIST example per process count and mode, and the
# speed-up over the single-process run without a process group (--mode local).
#
#   examples/fashion_mnist/speedup.sh [-b BUILD_DIR] [-n "1 2 4"] [-m "ddp allreduce"] [-r R] [-- FLAGS...]
#
# BUILD_DIR (default build) holds tools/weftrun/weftrun and examples/fashion_mnist/fashion_mnist.
# Each configuration runs R times (default 1) and keeps its best figures, those least disturbed by
# other work on the machine.
# FLAGS go to every run (default: --epochs 1 --max-batches 300); the metrics of each run go to a
# temporary folder that is removed at the end. Prints one row per configuration: the throughput
# over the whole run and its speed-up, and the median step time, the throughput it gives (global
# batch / median step) and that one's speed-up:
#   processes  mode  samples/s  speed-up  median-ms  step-samples/s  step-speed-up
# Exits non-zero, showing the run's output, as soon as a run fails.
set -euo pipefail

build=build
counts="1 2"
modes="ddp allreduce"
repeats=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    -b) build="$2"; shift 2 ;;
    -n) counts="$2"; shift 2 ;;
    -m) modes="$2"; shift 2 ;;
    -r) repeats="$2"; shift 2 ;;
    --) shift; break ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "speedup.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
flags=("$@")
[[ ${#flags[@]} -gt 0 ]] || flags=(--epochs 1 --max-batches 300)

weftrun="$build/tools/weftrun/weftrun"
program="$build/examples/fashion_mnist/fashion_mnist"
for f in "$weftrun" "$program"; do
  [[ -x "$f" ]] || { echo "speedup.sh: $f is missing: build the targets weftrun and fashion_mnist (or pass -b)" >&2; exit 1; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

[[ "$repeats" =~ ^[1-9][0-9]*$ ]] || { echo "speedup.sh: -r takes a positive count, not '$repeats'" >&2; exit 2; }

# Prints "THROUGHPUT MEDIAN_MS STEP_THROUGHPUT", the best of `repeats` runs each.
measure() {
  local n="$1" mode="$2" out line best="0 1e9 0"
  for ((i = 0; i < repeats; ++i)); do
    if ! out=$("$weftrun" -n "$n" "$program" --mode "$mode" --metrics "$tmp/metrics.csv" "${flags[@]}" 2>&1); then
      echo "$out" >&2
      echo "speedup.sh: the run on $n process(es) in mode $mode failed" >&2
      return 1
    fi
    # throughput: T samples/s (...); median step M ms, S samples/s
    line=$(sed -n 's/^throughput: \([0-9.]*\) samples\/s.*median step \([0-9.]*\) ms, \([0-9.]*\) samples\/s$/\1 \2 \3/p' <<<"$out")
    [[ -n "$line" ]] || { echo "$out" >&2; echo "speedup.sh: no throughput line in the output" >&2; return 1; }
    best=$(awk -v a="$best" -v b="$line" 'BEGIN { split(a, x, " "); split(b, y, " ");
      printf "%s %s %s", (y[1] > x[1] ? y[1] : x[1]), (y[2] < x[2] ? y[2] : x[2]), (y[3] > x[3] ? y[3] : x[3]) }')
  done
  echo "$best"
}

row() {  # processes mode "T M S" "T0 M0 S0"
  awk -v n="$1" -v m="$2" -v r="$3" -v b="$4" 'BEGIN { split(r, x, " "); split(b, y, " ");
    printf "%-10s %-10s %10.0f %9.2f %10.3f %15.0f %14.2f\n", n, m, x[1], x[1] / y[1], x[2], x[3], x[3] / y[3] }'
}

base=$(measure 1 local)
printf '%-10s %-10s %10s %9s %10s %15s %14s\n' processes mode samples/s speed-up median-ms step-samples/s step-speed-up
row 1 local "$base" "$base"
for mode in $modes; do
  for n in $counts; do
    row "$n" "$mode" "$(measure "$n" "$mode")" "$base"
  done
done
