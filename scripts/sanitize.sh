#!/usr/bin/env bash
# Runs weft's RPC, RRef, distributed autograd and distributed optimizer tests
# under AddressSanitizer and UndefinedBehaviorSanitizer (LeakSanitizer
# included): configures a WEFT_SANITIZE=ON build (CMake adds
# -fsanitize=address,undefined -fno-sanitize-recover=undefined to every target,
# see cmake/WeftHelpers.cmake), builds only what those tests need (test_rpc,
# test_rpc_mp, test_rref, test_rref_mp, test_dist_autograd,
# test_dist_autograd_mp, test_dist_optim, test_dist_optim_mp, the helper
# programs they start from tests/rpc/helpers, tests/rref/helpers,
# tests/dist_autograd/helpers and tests/dist_optim/helpers, weftrun),
# runs those tests labelled unit or multiprocess through ctest, and prints a
# summary: the tests that failed and every sanitizer report, each cut to its
# headline, its first frames and its SUMMARY line.
#
# The RPC and RRef targets are required. A distributed autograd or optimizer
# target is built and its tests run only when the configured build declares it
# (`ninja -t targets all` lists it): a layer whose tests or helper program do
# not exist yet is left out, and the build line says which targets were built.
#
#   scripts/sanitize.sh                     # build-asan/, every test of those layers
#   scripts/sanitize.sh -R 'timeout'        # only the tests whose name matches
#   scripts/sanitize.sh -R 'dist'           # ... or whose executable's name matches
#   BUILD_DIR=/tmp/asan JOBS=8 scripts/sanitize.sh
#
# Exit status: 0 when everything built, every test passed and no sanitizer said
# anything; 1 otherwise (2 for bad usage).
#
# Environment:
#   BUILD_DIR    build directory (default build-asan, relative to the repository root)
#   BUILD_TYPE   CMAKE_BUILD_TYPE (default RelWithDebInfo: optimised, with line numbers in reports)
#   JOBS         parallel compile jobs (default 2)
#   CTEST_JOBS   tests run at once (default 1: the multiprocess tests time heartbeats and
#                process deaths, and sanitized processes are several times slower)
#
# ASan and LSan reports are written to files (log_path), not to stderr, so that
# a report survives a test that captures its own stderr and one from a helper
# process is not lost in its parent's output: they land in
# $BUILD_DIR/sanitizer-logs/, which is emptied at every run. UBSan, combined
# with ASan, ignores log_path (GCC 12) and writes to stderr: its reports are
# taken from the tests' output (ctest --output-on-failure; UBSan stops the
# process, so the test fails and its output is shown).
set -euo pipefail

usage() {
  echo "usage: scripts/sanitize.sh [-R regex]   (environment: BUILD_DIR BUILD_TYPE JOBS CTEST_JOBS)" >&2
  exit 2
}

name_filter=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    -R) [[ $# -ge 2 ]] || usage; name_filter="$2"; shift 2 ;;
    -h|--help) usage ;;
    *) usage ;;
  esac
done

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${BUILD_DIR:-build-asan}"
[[ "$build_dir" = /* ]] || build_dir="$root/$build_dir"
build_type="${BUILD_TYPE:-RelWithDebInfo}"
jobs="${JOBS:-2}"
ctest_jobs="${CTEST_JOBS:-1}"
log_dir="$build_dir/sanitizer-logs"
python="$(command -v python3 || true)"
[[ -n "$python" ]] || { echo "sanitize.sh: python3 is needed to select the tests" >&2; exit 1; }

started=$(date +%s)
elapsed() { echo "$(( $(date +%s) - started )) s"; }
section() { printf '\n==== %s\n' "$*"; }

# ---- configure and build -----------------------------------------------------------------
section "configure $build_dir (WEFT_SANITIZE=ON, $build_type)"
mkdir -p "$build_dir"
configure_log="$build_dir/sanitize-configure.log"
cmake -S "$root" -B "$build_dir" -G Ninja \
  -DCMAKE_BUILD_TYPE="$build_type" \
  -DWEFT_SANITIZE=ON -DWEFT_CUDA=OFF \
  -DWEFT_BUILD_TESTS=ON -DWEFT_BUILD_BENCH=OFF -DWEFT_BUILD_EXAMPLES=OFF >"$configure_log" 2>&1 || {
  tail -n 40 "$configure_log"
  echo "sanitize.sh: FAILED: configure (full log: $configure_log)"
  exit 1
}

# The helper programs a multiprocess test directory declares (its helpers/CMakeLists.txt).
helpers_of() {
  local list="$root/tests/$1/helpers/CMakeLists.txt"
  [[ -f "$list" ]] || return 0
  sed -n 's/^[[:space:]]*add_executable(\([A-Za-z0-9_]*\).*/\1/p' "$list"
}
# The targets the configured build declares, to leave out those of a layer not written yet.
declared=$(ninja -C "$build_dir" -t targets all 2>/dev/null | sed -n 's/^\([A-Za-z0-9_]*\): .*/\1/p' | sort -u)
is_declared() { grep -qx "$1" <<<"$declared"; }

targets="test_rpc test_rpc_mp test_rref weftrun $(helpers_of rpc)"
if [[ -f "$root/tests/rref/helpers/CMakeLists.txt" ]]; then
  targets="$targets test_rref_mp $(helpers_of rref)"
fi
skipped=""
for t in test_dist_autograd test_dist_autograd_mp $(helpers_of dist_autograd) \
         test_dist_optim test_dist_optim_mp $(helpers_of dist_optim); do
  if is_declared "$t"; then targets="$targets $t"; else skipped="$skipped $t"; fi
done
# The test executables whose tests are run, among those built.
executables=""
for t in $targets; do
  case "$t" in test_*) executables="$executables $t" ;; esac
done
section "build: $(echo $targets)"
[[ -z "$skipped" ]] || echo "not declared by this build, left out:$skipped"
build_started=$(date +%s)
if ! cmake --build "$build_dir" --target $targets -j "$jobs"; then
  echo "sanitize.sh: FAILED: build ($(elapsed))"
  exit 1
fi
build_seconds=$(( $(date +%s) - build_started ))

# ---- select the tests ----------------------------------------------------------------------
# Test names are the doctest case names, so the tests are picked by the
# executable that runs them; ctest -I then runs exactly those (by number). The
# -R pattern is matched against the test's name and its executable's name.
selection=$(cd "$build_dir" && ctest --show-only=json-v1 | "$python" -c '
import json, os, re, sys
pattern = re.compile(sys.argv[1]) if sys.argv[1] else None
executables = set(sys.argv[2].split())
tests = json.load(sys.stdin)["tests"]
numbers, missing = [], []
for i, t in enumerate(tests, 1):
    name = t["name"]
    if name.endswith("_NOT_BUILT") and name[:-len("_NOT_BUILT")] in executables:
        missing.append(name)
        continue
    command = t.get("command") or []
    executable = os.path.basename(command[0]) if command else ""
    if executable not in executables:
        continue
    labels = [v for p in t.get("properties", []) if p["name"] == "LABELS" for v in p["value"]]
    if not {"unit", "multiprocess"} & set(labels):
        continue
    if pattern and not (pattern.search(name) or pattern.search(executable)):
        continue
    numbers.append(str(i))
if missing:
    print("MISSING " + " ".join(missing))
else:
    print(",".join(numbers))
' "$name_filter" "$executables")
if [[ "$selection" == MISSING* ]]; then
  echo "sanitize.sh: FAILED: ctest lists no tests for ${selection#MISSING } (were they built?)"
  exit 1
fi
if [[ -z "$selection" ]]; then
  echo "sanitize.sh: FAILED: no test matches${name_filter:+ '$name_filter'}"
  exit 1
fi
count=$(tr ',' '\n' <<<"$selection" | wc -l)

# ---- run -------------------------------------------------------------------------------------
rm -rf "$log_dir"
mkdir -p "$log_dir"
export ASAN_OPTIONS="halt_on_error=1:abort_on_error=0:detect_leaks=1:check_initialization_order=1:strict_init_order=1:detect_invalid_pointer_pairs=0:log_path=$log_dir/asan:log_exe_name=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:report_error_type=1"
export LSAN_OPTIONS="report_objects=0"
section "run $count tests (unit, multiprocess) with ASan/UBSan/LSan, $ctest_jobs at a time"
ctest_log="$build_dir/sanitize-ctest.log"
test_started=$(date +%s)
set +e
(cd "$build_dir" && ctest -I "0,0,0,$selection" -j "$ctest_jobs" --output-on-failure) 2>&1 | tee "$ctest_log"
ctest_status=${PIPESTATUS[0]}
set -e
test_seconds=$(( $(date +%s) - test_started ))

# ---- summary ---------------------------------------------------------------------------------
section "summary"
echo "build:  ${build_seconds} s  (targets: $(echo $targets))"
echo "tests:  ${test_seconds} s  ($(grep -E '^[0-9]+% tests passed' "$ctest_log" || echo "ctest printed no result line"))"
failed_tests=$(sed -n '/The following tests FAILED:/,$p' "$ctest_log" | grep -E '^[[:space:]]+[0-9]+ - ' || true)
if [[ -n "$failed_tests" ]]; then
  echo "failed tests:"
  echo "$failed_tests"
fi

reports=$(find "$log_dir" -type f -size +0 | sort)
if [[ -n "$reports" ]]; then
  echo "ASan/LSan reports: $(wc -l <<<"$reports") (full text in $log_dir)"
  while IFS= read -r f; do
    echo "--- $(basename "$f")"
    # The headline, the first frames of the first stack, and the SUMMARY line.
    grep -m1 -E 'ERROR: (Address|Leak)Sanitizer|runtime error:' "$f" || head -n 1 "$f"
    grep -m8 -E '^[[:space:]]+#[0-9]+ ' "$f" || true
    grep -m1 '^SUMMARY:' "$f" || true
  done <<<"$reports"
else
  echo "ASan/LSan reports: none"
fi
# UBSan's reports, from the tests' output: each "runtime error" line and the frames under it.
ubsan=$(grep -c 'runtime error:' "$ctest_log" || true)
if [[ "$ubsan" -gt 0 ]]; then
  echo "UBSan reports: $ubsan (full text in $ctest_log)"
  awk '/runtime error:/ { print "--- " $0; window = 12; frames = 8; next }
       window > 0 { window--; if (frames > 0 && /^[[:space:]]+#[0-9]+ /) { print; frames-- } }' "$ctest_log"
else
  echo "UBSan reports: none"
fi

if [[ "$ctest_status" -ne 0 || -n "$reports" || "$ubsan" -gt 0 ]]; then
  echo "sanitize.sh: FAILED ($(elapsed) in all)"
  exit 1
fi
echo "sanitize.sh: OK: $count tests passed under ASan/UBSan/LSan ($(elapsed) in all)"
