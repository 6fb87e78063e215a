#!/usr/bin/env bash
# Installs the Debian packages Strata builds with, only those missing (apt-get update runs
# only when something must be installed). Idempotent; sourced by quickstart.sh and test.sh.
# The CUDA toolkit (with NCCL) is expected under /usr/local/cuda; without it Strata builds
# with the CUDA backend off (its stub reports "built without CUDA").
set -euo pipefail

STRATA_DEBS=(cmake ninja-build g++ pkg-config ccache libtbb-dev libxsimd-dev liburing-dev catch2
             libgloo-dev nlohmann-json3-dev libcli11-dev libxxhash-dev libdnnl-dev clang-format python3
             libonig-dev libsentencepiece-dev libicu-dev xz-utils)

strata_missing_debs() {
  local missing=()
  for p in "${STRATA_DEBS[@]}" "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  echo "${missing[@]:-}"
}

strata_install_deps() {
  local missing
  missing=$(strata_missing_debs "$@")
  [ -z "$missing" ] && return 0
  echo "strata: installing Debian packages: $missing" >&2
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  # shellcheck disable=SC2086
  $sudo apt-get install -y -qq --no-install-recommends $missing >/dev/null
}

# strata_configure BUILD_DIR [cmake args...]: configures once, then builds incrementally.
strata_configure() {
  local dir=$1
  shift
  if [ ! -f "$dir/build.ninja" ]; then
    cmake -S "$STRATA_ROOT" -B "$dir" -G Ninja "$@"
  else
    cmake -B "$dir" "$@" >/dev/null
  fi
}

# Puts python/ (the strata package) on Debian's /usr/bin/python3 path with a .pth file, so
# `import strata` works after the build (it loads build/lib/libstrata_c.so beside it).
strata_python_path() {
  [ -x /usr/bin/python3 ] || return 0
  local site sudo=""
  site=$(/usr/bin/python3 -c 'import site; print(site.getsitepackages()[0])') || return 0
  [ "$(cat "$site/strata.pth" 2>/dev/null)" = "$STRATA_ROOT/python" ] && return 0
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo mkdir -p "$site" && echo "$STRATA_ROOT/python" | $sudo tee "$site/strata.pth" >/dev/null
}

STRATA_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export STRATA_ROOT
# ccache keyed on paths relative to the checkout, so a fresh clone (CI) reuses the cache.
export CCACHE_BASEDIR="$STRATA_ROOT" CCACHE_NOHASHDIR=1
