#!/usr/bin/env bash
# Provisions a Debian 12 machine for weft and builds it into ./build.
#
#   scripts/setup.sh               # install packages (when missing), configure, build
#   scripts/setup.sh --skip-apt    # or WEFT_SKIP_APT=1: the machine is already provisioned
#
# Safe to run again: packages already installed are not touched (apt is not
# even started when all are present), and an existing build/ is reconfigured
# and rebuilt incrementally.
#
# Runs as root directly, or as another user through sudo (non-interactively
# when stdin is not a terminal, e.g. in CI). Environment:
#   WEFT_SKIP_APT=1      skip the package step entirely
#   WEFT_CUDA=AUTO|ON|OFF  CUDA kernels (default AUTO: built when nvcc is found)
#   WEFT_SANITIZE=ON     AddressSanitizer + UBSan build
#   WEFT_JOBS=N          parallel compile jobs (default: all cores)
#   WEFT_CMAKE_ARGS="…"  extra arguments for the configure step
set -euo pipefail

# Every Debian package weft's build, tests, examples and tools use.
PACKAGES=(
  build-essential cmake ninja-build pkg-config  # toolchain
  libcapnp-dev capnproto                         # wire format
  libuv1-dev                                     # event loop, TCP, timers
  libopenblas-openmp-dev                         # CPU GEMM (one thread per call; weft splits large ones)
  libgloo-dev                                    # CPU collectives
  doctest-dev                                    # tests
  dataset-fashion-mnist                          # /usr/share/datasets/fashion-mnist
  fortunes fortunes-min                          # /usr/share/games/fortunes: the text corpus (data/text.h)
  zlib1g-dev                                     # gzip'd IDX files
  python3-matplotlib                             # plots of benchmark results
  clang libclang-rt-14-dev                       # fuzzing and sanitizer runtimes
  iproute2                                       # ip netns: the two-machine test's namespaces
)

usage() {
  sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'
}

skip_apt="${WEFT_SKIP_APT:-0}"
for arg in "$@"; do
  case "$arg" in
    --skip-apt) skip_apt=1 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "setup.sh: unknown argument '$arg'" >&2; usage >&2; exit 2 ;;
  esac
done

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"

log() { printf '==> %s\n' "$*"; }

# Packages from PACKAGES that dpkg does not report as installed.
missing_packages() {
  local pkg status
  for pkg in "${PACKAGES[@]}"; do
    status="$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null || true)"
    [[ "$status" == "installed" ]] || printf '%s\n' "$pkg"
  done
}

# Runs a command as root: directly when we are root, else through sudo.
as_root() {
  if [[ "$(id -u)" -eq 0 ]]; then
    "$@"
  elif command -v sudo >/dev/null 2>&1; then
    if [[ -t 0 ]]; then
      sudo "$@"
    else
      # No terminal to ask for a password on: fail fast instead of hanging.
      sudo -n "$@"
    fi
  else
    echo "setup.sh: installing packages needs root; run as root, install sudo, or pass --skip-apt" >&2
    return 1
  fi
}

install_packages() {
  if ! command -v dpkg-query >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1; then
    echo "setup.sh: apt-get/dpkg not found; weft's setup expects Debian 12 (or pass --skip-apt" \
         "after installing: ${PACKAGES[*]})" >&2
    exit 1
  fi
  local missing
  missing="$(missing_packages)"
  if [[ -z "$missing" ]]; then
    log "all ${#PACKAGES[@]} Debian packages already installed"
    return
  fi
  # shellcheck disable=SC2086 # one package name per word
  log "installing:" $missing
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update
  # shellcheck disable=SC2086
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y $missing
  missing="$(missing_packages)"
  if [[ -n "$missing" ]]; then
    # shellcheck disable=SC2086
    echo "setup.sh: still missing after apt-get install:" $missing >&2
    exit 1
  fi
}

if [[ "$skip_apt" == "1" ]]; then
  log "skipping apt (WEFT_SKIP_APT=1 / --skip-apt)"
else
  install_packages
fi

build_dir="$repo_root/build"
jobs="${WEFT_JOBS:-$(nproc)}"
configure_args=(-S "$repo_root" -B "$build_dir" -DCMAKE_BUILD_TYPE=Release)
# Only options given in the environment are passed, so a rerun keeps what an
# earlier configure chose.
if [[ -n "${WEFT_CUDA:-}" ]]; then configure_args+=("-DWEFT_CUDA=$WEFT_CUDA"); fi
if [[ -n "${WEFT_SANITIZE:-}" ]]; then configure_args+=("-DWEFT_SANITIZE=$WEFT_SANITIZE"); fi
if [[ -f "$build_dir/CMakeCache.txt" ]]; then
  generator="$(sed -n 's/^CMAKE_GENERATOR:INTERNAL=//p' "$build_dir/CMakeCache.txt")"
  if [[ "$generator" != "Ninja" ]]; then
    echo "setup.sh: $build_dir was configured with '$generator', not Ninja; remove it and run again" >&2
    exit 1
  fi
else
  configure_args+=(-G Ninja)
fi
# shellcheck disable=SC2206 # WEFT_CMAKE_ARGS is split into words on purpose
configure_args+=(${WEFT_CMAKE_ARGS:-})

log "configuring $build_dir (Release, Ninja)"
cmake "${configure_args[@]}"
log "building with $jobs jobs"
cmake --build "$build_dir" -j "$jobs"
log "done: run the parameter-server example with" \
    "./build/tools/weftrun/weftrun -n 3 ./build/examples/parameter_server/parameter_server" \
    "and the tests with: ctest --test-dir build --output-on-failure -j2"
