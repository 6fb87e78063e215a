#!/usr/bin/env bash
# Carry a CPU machine's build to a lent GPU machine and run the GPU check there.
#   scripts/gpu_carry.sh pack [--build DIR] [--out DIR]
#     on the CPU machine: strips bin/strata and every test suite that has [cuda] tests, adds
#     each shared library they link that a bare machine lacks, except the C runtime and the
#     CUDA libraries (cudart, cuBLAS, NCCL: the GPU machine's own CUDA install provides them),
#     into DIR/strata-gpu.tar.xz (default gpu-carry/; about 25 MB, under a 64 MiB transfer).
#   scripts/gpu_carry.sh run [--carry DIR] [--out DIR] [-- GPU_CHECK_ARGS...]
#     on the GPU machine: unpacks into /tmp/strata-gpu, finds the CUDA libraries the binaries
#     still miss under /usr/local, /opt and /usr/lib, checks that `strata info` sees CUDA, runs
#     scripts/gpu_check.sh and leaves report.json, report.md and logs.tar.gz in --out (at most
#     three files: a lease returns few). Exit: gpu_check's, or 2 when the carried build cannot
#     start there (the missing libraries are printed).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
refuse() { echo "gpu_carry: $*" >&2; exit 2; }
[ $# -ge 1 ] || refuse "usage: gpu_carry.sh pack|run [options] (see the header of $0)"
verb=$1; shift
carry=$root/gpu-carry build=$root/build out=
while [ $# -gt 0 ]; do
  case $1 in
    --build|--out|--carry)
      [ $# -ge 2 ] && [ -n "$2" ] || refuse "$1 needs a value"
      case $1 in --build) build=$2 ;; --out) out=$2 ;; *) carry=$2 ;; esac
      shift 2 ;;
    --) shift; break ;;
    *) refuse "unknown argument '$1' (see the header of $0)" ;;
  esac
done
cuda_libs='lib(cudart|cublas|cublasLt|nccl|cuda)\.so'
crt_libs='/(libc|libm|libdl|librt|libpthread|libgcc_s|libstdc\+\+)\.so'

pack() {
  out=${out:-$carry}
  [ -x "$build/bin/strata" ] || refuse "no $build/bin/strata: build first or pass --build DIR"
  stage=$(mktemp -d) || refuse "mktemp failed"
  trap 'rm -rf "$stage"' EXIT
  mkdir -p "$stage/bin" "$stage/lib" "$out" || refuse "cannot create $out"
  bins=("$build/bin/strata")
  for t in "$build"/bin/strata_*_tests; do  # [CUDA]: the runner skips a spec naming [cuda] here
    n=$("$t" --list-test-names-only '[CUDA]~[uring]~[pku]~[mount]' 2>/dev/null | grep -c .)
    [ "$n" -gt 0 ] && bins+=("$t")
  done
  for b in "${bins[@]}"; do strip -o "$stage/bin/${b##*/}" "$b" || refuse "strip $b failed"; done
  ldd "${bins[@]}" | awk '/=> \//{print $3}' | sort -u | grep -Ev "$crt_libs" | grep -Ev "/$cuda_libs" |
    while read -r l; do cp -L "$l" "$stage/lib/"; done
  XZ_OPT="-T0 -3" tar -C "$stage" -cJf "$out/strata-gpu.tar.xz" bin lib || refuse "tar failed"
  echo "gpu_carry: $out/strata-gpu.tar.xz ($(du -h "$out/strata-gpu.tar.xz" | cut -f1)):" \
    "${#bins[@]} binaries, $(ls "$stage/lib" | wc -l) libraries; on the GPU machine:" \
    "scripts/gpu_carry.sh run --carry $out --out DIR"
}

run() {
  [ -n "$out" ] || refuse "run needs --out DIR for the report"
  [ -f "$carry/strata-gpu.tar.xz" ] || refuse "no $carry/strata-gpu.tar.xz: run 'gpu_carry.sh pack' on the CPU machine and carry that folder"
  dest=/tmp/strata-gpu
  rm -rf "$dest" && mkdir -p "$dest/build" && tar -C "$dest/build" -xJf "$carry/strata-gpu.tar.xz" ||
    refuse "cannot unpack into $dest"
  export LD_LIBRARY_PATH=$dest/build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  for _ in 1 2 3; do  # each pass adds the folders of the libraries still missing
    missing=$(ldd "$dest"/build/bin/* 2>/dev/null | awk '/not found/{print $1}' | sort -u)
    [ -z "$missing" ] && break
    for m in $missing; do
      f=$(find /usr/local /opt /usr/lib -name "$m" 2>/dev/null | head -1)
      [ -n "$f" ] && LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$(dirname "$f")
    done
  done
  # cuBLAS is opened on first use (models/detail/cublas_api.h), so ldd does not list it: find it
  # as the toolkit's other libraries are found.
  major=$(ldd "$dest/build/bin/strata" | grep -o 'libcudart\.so\.[0-9]*' | head -1 | sed 's/.*\.so\.//')
  for m in ${major:+libcublas.so.$major libcublasLt.so.$major}; do
    ldconfig -p | grep -q "$m" && continue
    found=""
    IFS=: read -ra dirs <<< "$LD_LIBRARY_PATH"
    for d in "${dirs[@]}"; do [ -e "$d/$m" ] && found=1; done
    [ -n "$found" ] && continue
    f=$(find /usr/local /opt /usr/lib -name "$m" 2>/dev/null | head -1)
    [ -n "$f" ] && LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$(dirname "$f")
  done
  if ! ldconfig -p | grep -q 'libcuda\.so\.1'; then  # the driver's library, outside ldconfig
    f=$(find /usr/local/nvidia /usr/lib /usr/local -name libcuda.so.1 2>/dev/null | head -1)
    [ -n "$f" ] && LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$(dirname "$f")
  fi
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  missing=$(ldd "$dest"/build/bin/* 2>/dev/null | awk '/not found/{print $1}' | sort -u)
  [ -z "$missing" ] || refuse "libraries not found on this machine: $missing"
  "$dest/build/bin/strata" info || refuse "the carried strata does not start here"
  mkdir -p "$out" || refuse "cannot create $out"
  report=/tmp/gpu-report
  rm -rf "$report"
  "$root/scripts/gpu_check.sh" --build "$dest/build" --out "$report" "$@"
  rc=$?
  cp "$report/report.json" "$report/report.md" "$out/" 2>/dev/null
  (cd "$report" && find logs work -type f -size -4M \( -name '*.log' -o -name '*.json' -o -name '*.jsonl' \
    -o -name '*.txt' -o -name '*.md' \) -print0 | tar --null -czf "$out/logs.tar.gz" -T -)
  return $rc
}

case $verb in
  pack) pack ;;
  run) run "$@" ;;
  *) refuse "unknown verb '$verb': pack or run" ;;
esac
