#!/usr/bin/env bash
# Builds and runs weft's GPU tests and CUDA benchmark on a bare GPU machine,
# one that has the CUDA toolkit, CMake, ninja, g++ and python3 with PyTorch but
# none of weft's Debian packages and no network.
#
#   scripts/device_check.sh prepare   on a Debian 12 machine with network:
#       downloads the packages the build needs (apt-get download, no root
#       needed) into .device/debs (git-ignored, about 14 MiB).
#   scripts/device_check.sh run       on the GPU machine, from the repository
#       root, with .device/debs carried along (the prefix and the build
#       folder are made there):
#       1. unpacks each .deb into .device/prefix (dpkg -x, never into /);
#       2. configures .device/build with CUDA on (sm_90), without the
#          distributed layers (WEFT_BUILD_DISTRIBUTED=OFF), finding OpenBLAS,
#          zlib and doctest in the prefix only;
#       3. builds every GPU test binary (test_*_gpu) and bench/cuda_bench;
#       4. runs `ctest -L gpu`, then cuda_bench and bench/torch_cuda_bench.py
#          (PyTorch's side of the same table);
#       5. writes summary.md (device, test counts, failed tests, the benchmark
#          table with weft/torch ratios) and build.log, tests.log, bench.log
#          to $OUT when set, else to .device/.
#       Each stage runs under `timeout`; a failed stage still leaves the
#       summary, and the exit status is non-zero when any stage failed.
#
# Environment: OUT (where the logs and summary go), JOBS (build jobs, default
# 16), WEFT_CUDA_ARCH (default 90-real), BUILD_TIMEOUT/TEST_TIMEOUT/
# BENCH_TIMEOUT (seconds: 300, 100, 140 by default; with unpacking and
# configuring, a run stays under 9.5 minutes), EXTRA_CMAKE_ARGS (more
# configure arguments, e.g. compiler launchers).
# The GPU machine needs bash, CMake >= 3.25, ninja, g++, nvcc, python3 with
# torch, and dpkg-deb (or ar and tar) to unpack the packages.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SCRIPT=$ROOT/scripts/device_check.sh
DEVICE_DIR=$ROOT/.device
DEBS=$DEVICE_DIR/debs
PREFIX=$DEVICE_DIR/prefix
BUILD=$DEVICE_DIR/build

# Debian 12 packages: OpenBLAS's OpenMP build (headers, libopenblas.so and its
# runtime libraries libgfortran5/libquadmath0), zlib (headers and library) and
# doctest (header and CMake package). OpenMP comes from the GPU machine's own
# g++ (libgomp), so libgomp1 is not carried: an older copy of it first on the
# library path could lack the symbols that compiler's code needs.
PACKAGES=(libopenblas-openmp-dev libopenblas0-openmp libgfortran5 libquadmath0
          zlib1g-dev zlib1g doctest-dev)
MAX_DEBS_BYTES=$((40 * 1024 * 1024))

die() { echo "device_check: $*" >&2; exit 1; }

prepare() {
  command -v apt-get >/dev/null || die "prepare needs apt-get (a Debian 12 machine)"
  rm -rf "$DEBS"
  mkdir -p "$DEBS"
  (cd "$DEBS" && apt-get download "${PACKAGES[@]}") || die "apt-get download failed"
  local bytes
  bytes=$(du -cb "$DEBS"/*.deb | tail -1 | cut -f1)
  ls -l "$DEBS"
  echo "device_check: $(ls "$DEBS"/*.deb | wc -l) packages, $((bytes / 1024)) KiB in $DEBS"
  ((bytes < MAX_DEBS_BYTES)) || die "the packages take $bytes bytes, more than $MAX_DEBS_BYTES"
}

# Unpacks one .deb into $PREFIX: dpkg-deb when the machine has it, else ar + tar.
unpack_deb() {
  local deb=$1
  if command -v dpkg-deb >/dev/null; then
    dpkg-deb -x "$deb" "$PREFIX"
    return
  fi
  local tmp
  tmp=$(mktemp -d)
  (cd "$tmp" && ar x "$deb") || { rm -rf "$tmp"; return 1; }
  tar -xf "$tmp"/data.tar.* -C "$PREFIX"
  local rc=$?
  rm -rf "$tmp"
  return $rc
}

# Unpacks every package, then makes the prefix self-contained: absolute
# symlinks (libz.so -> /lib/...) point into the prefix, and CMake packages
# that name /usr as their install prefix (doctestTargets.cmake) name the
# prefix's usr instead.
unpack() {
  ls "$DEBS"/*.deb >/dev/null 2>&1 || die "no packages in $DEBS: run 'scripts/device_check.sh prepare' first"
  rm -rf "$PREFIX"
  mkdir -p "$PREFIX"
  local deb
  for deb in "$DEBS"/*.deb; do
    unpack_deb "$deb" || die "could not unpack $deb"
    echo "unpacked $(basename "$deb")"
  done
  local link target
  while IFS= read -r link; do
    target=$(readlink "$link")
    if [[ $target == /* ]]; then
      ln -sfn "$PREFIX$target" "$link"
      echo "relinked $link -> $PREFIX$target"
    fi
  done < <(find "$PREFIX" -type l)
  local f
  while IFS= read -r f; do
    sed -i "s|set(_IMPORT_PREFIX \"/usr\")|set(_IMPORT_PREFIX \"$PREFIX/usr\")|" "$f"
    echo "relocated $f"
  done < <(grep -rl 'set(_IMPORT_PREFIX "/usr")' "$PREFIX" --include='*.cmake')
}

# Debian's library folder name (x86_64-linux-gnu), which the packages use.
multiarch() {
  local arch
  arch=$(gcc -print-multiarch 2>/dev/null)
  echo "${arch:-x86_64-linux-gnu}"
}

# The prefix's library folders, which the build links with an rpath (DT_RPATH,
# through which libopenblas's own dependencies, libgfortran and libquadmath,
# are found too).
library_dirs() {
  local arch
  arch=$(multiarch)
  echo "$PREFIX/usr/lib/$arch/openblas-openmp:$PREFIX/usr/lib/$arch:$PREFIX/lib/$arch"
}

# LD_LIBRARY_PATH for the tests and the benchmark as well: OpenBLAS and its
# dependencies, not the prefix's zlib (ctest itself may need the system's).
runtime_library_path() {
  local arch
  arch=$(multiarch)
  echo "$PREFIX/usr/lib/$arch/openblas-openmp:$PREFIX/usr/lib/$arch${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}

configure_and_build() {
  local libdirs
  libdirs=$(library_dirs)
  # A build folder configured for another checkout (carried from elsewhere) starts afresh.
  if [[ -f $BUILD/CMakeCache.txt ]] && ! grep -qxF "CMAKE_HOME_DIRECTORY:INTERNAL=$ROOT" "$BUILD/CMakeCache.txt"; then
    echo "removing $BUILD: configured for another source folder"
    rm -rf "$BUILD"
  fi
  echo "== configure"
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DWEFT_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=${WEFT_CUDA_ARCH:-90-real}" \
    -DWEFT_BUILD_DISTRIBUTED=OFF -DWEFT_BUILD_EXAMPLES=OFF \
    "-DCMAKE_PREFIX_PATH=$PREFIX/usr" \
    "-DCMAKE_INCLUDE_PATH=$PREFIX/usr/include" \
    "-DCMAKE_LIBRARY_PATH=$PREFIX/usr/lib/$(multiarch)" \
    "-DCMAKE_BUILD_RPATH=${libdirs//:/;}" \
    "-DCMAKE_EXE_LINKER_FLAGS=-Wl,--disable-new-dtags" ${EXTRA_CMAKE_ARGS:-} || return 1
  local targets
  targets=$(ninja -C "$BUILD" -t targets all | sed -nE 's/^(test_[a-z_]+_gpu|cuda_bench): .*/\1/p' | sort -u)
  [[ -n $targets ]] || { echo "no GPU test binaries or cuda_bench among the build's targets"; return 1; }
  echo $targets >"$OUT_DIR/targets.txt"
  echo "== build:" $targets
  # Binaries from an earlier run go first, so that one that fails to build now is not tested.
  find "$BUILD" -type f \( -name 'test_*_gpu' -o -name cuda_bench \) -delete
  # -k 0: one target that fails to build leaves the others to be tested.
  ninja -C "$BUILD" -j "${JOBS:-16}" -k 0 $targets
}

# One section of the summary per stage; STATUS[stage] is ok, failed (rc) or timed out.
declare -A STATUS

run_stage() {
  local name=$1 limit=$2 log=$3
  shift 3
  local start=$SECONDS
  OUT_DIR=$OUT_DIR BENCH_LIMIT=$BENCH_LIMIT \
    timeout --kill-after=10 "$limit" bash "$SCRIPT" "$@" >>"$log" 2>&1
  local rc=$?
  local took=$((SECONDS - start))
  if ((rc == 0)); then
    STATUS[$name]="ok (${took} s)"
  elif ((rc == 124 || rc == 137)); then
    STATUS[$name]="timed out after ${limit} s"
  else
    STATUS[$name]="failed, exit status $rc (${took} s)"
  fi
  echo "device_check: $name: ${STATUS[$name]}"
  return $rc
}

run_tests() {
  LD_LIBRARY_PATH=$(runtime_library_path) \
    ctest --test-dir "$BUILD" -L gpu --output-on-failure -j "${TEST_JOBS:-8}" \
      --timeout 120 --output-junit "$OUT_DIR/tests.xml"
}

# weft's side gets half the stage's time at most, PyTorch's side the rest.
run_bench() {
  local rc=0 start=$SECONDS
  if [[ -x $BUILD/bench/cuda_bench ]]; then
    echo "== weft: $BUILD/bench/cuda_bench"
    LD_LIBRARY_PATH=$(runtime_library_path) \
      timeout "$((BENCH_LIMIT / 2))" "$BUILD/bench/cuda_bench" >"$OUT_DIR/bench_weft.md" || rc=1
    cat "$OUT_DIR/bench_weft.md"
  else
    echo "cuda_bench was not built"
    rc=1
  fi
  echo "== torch: bench/torch_cuda_bench.py"
  timeout "$((BENCH_LIMIT - (SECONDS - start) - 5))" python3 "$ROOT/bench/torch_cuda_bench.py" >"$OUT_DIR/bench_torch.md" || rc=1
  cat "$OUT_DIR/bench_torch.md"
  return $rc
}

# The nvcc the build used (or would use) and its version.
nvcc_used() {
  local nvcc
  nvcc=$(sed -n 's/^CMAKE_CUDA_COMPILER:[A-Z]*=//p' "$BUILD/CMakeCache.txt" 2>/dev/null)
  [[ -n $nvcc ]] || nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  echo "$nvcc $("$nvcc" --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
}

write_summary() {
  local summary=$OUT_DIR/summary.md
  {
    echo "# weft device check"
    echo
    echo "- device: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1 || echo unknown)"
    echo "- system: $( (. /etc/os-release && echo "$PRETTY_NAME") 2>/dev/null || uname -sr)," \
      "g++ $(g++ -dumpfullversion 2>/dev/null || echo missing)," \
      "$(cmake --version 2>/dev/null | head -1 || echo 'cmake missing')," \
      "nvcc $(nvcc_used)," \
      "python3 torch $(python3 -c 'import torch; print(torch.__version__)' 2>/dev/null || echo missing)"
    if git -C "$ROOT" rev-parse --short HEAD >/dev/null 2>&1; then
      echo "- commit: $(git -C "$ROOT" rev-parse --short HEAD)$(git -C "$ROOT" diff --quiet HEAD || echo ' (with uncommitted changes)')"
    fi
    local stage
    for stage in unpack build tests bench; do
      echo "- $stage: ${STATUS[$stage]:-not run}"
    done
    echo
    echo "## GPU tests (ctest -L gpu)"
    echo
    # ctest's JUnit file, or its console log when it was stopped before writing one.
    if [[ -s $OUT_DIR/tests.xml ]]; then
      python3 "$ROOT/bench/device_report.py" tests "$OUT_DIR/tests.xml"
    else
      python3 "$ROOT/bench/device_report.py" tests "$OUT_DIR/tests.log"
    fi
    local target missing=""
    for target in $(cat "$OUT_DIR/targets.txt" 2>/dev/null); do
      [[ -n $(find "$BUILD" -name "$target" -type f -perm -u+x 2>/dev/null) ]] || missing+=" $target"
    done
    [[ -z $missing ]] || printf '\nNot built (their tests did not run):%s\n' "$missing"
    echo
    echo "## Benchmark (weft vs PyTorch, same device)"
    echo
    python3 "$ROOT/bench/device_report.py" bench "$OUT_DIR/bench_weft.md" "$OUT_DIR/bench_torch.md"
    if [[ ${STATUS[build]:-} != ok* ]]; then
      echo
      echo "## Build errors (first 40 lines of build.log matching 'error')"
      echo
      echo '```'
      grep -m 40 -E "error|FAILED" "$OUT_DIR/build.log"
      echo '```'
    fi
  } >"$summary" 2>&1
  echo "device_check: summary in $summary"
  cat "$summary"
}

run() {
  OUT_DIR=${OUT:-$DEVICE_DIR}
  mkdir -p "$OUT_DIR"
  OUT_DIR=$(cd "$OUT_DIR" && pwd)
  : >"$OUT_DIR/build.log"
  : >"$OUT_DIR/tests.log"
  : >"$OUT_DIR/bench.log"
  rm -f "$OUT_DIR/tests.xml" "$OUT_DIR/bench_weft.md" "$OUT_DIR/bench_torch.md" "$OUT_DIR/targets.txt"
  local failed=0
  BENCH_LIMIT=${BENCH_TIMEOUT:-140}
  run_stage unpack 60 "$OUT_DIR/build.log" unpack || failed=1
  if ((failed == 0)); then
    run_stage build "${BUILD_TIMEOUT:-300}" "$OUT_DIR/build.log" configure_and_build || failed=1
    # Whatever was built is tested and timed, even when another target failed.
    run_stage tests "${TEST_TIMEOUT:-100}" "$OUT_DIR/tests.log" run_tests || failed=1
    run_stage bench "$BENCH_LIMIT" "$OUT_DIR/bench.log" run_bench || failed=1
  fi
  write_summary
  return $failed
}

# `timeout` runs a program, not a shell function: the stages re-enter this
# script through these names.
case "${1:-}" in
  prepare) prepare ;;
  run) run ;;
  unpack | configure_and_build | run_tests | run_bench)
    OUT_DIR=${OUT_DIR:?}
    BENCH_LIMIT=${BENCH_LIMIT:-140}
    "$1"
    ;;
  *)
    echo "usage: scripts/device_check.sh prepare|run" >&2
    exit 2
    ;;
esac
