#!/usr/bin/env bash
# Which BLAS the GPT's host compute uses, by measurement: SGEMM GFLOP/s of Debian's OpenBLAS,
# BLIS and oneDNN, and oneDNN's bf16 matmul (fp32 accumulation), on the GPT's weight
# products (N = micro-batch x sequence rows; d_model -> 3, 4 d_model and back) at the
# main job's width and at GPT-2 124M's, all threads, each library in its own process (their
# thread pools spin between calls). Installs BLIS and oneDNN when missing.
# Usage: scripts/bench_blas.sh [ITERS REPEAT] (default 7 calls per process, 3 processes)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
iters=${1:-7} repeat=${2:-3}
need=()
[ -e /usr/lib/x86_64-linux-gnu/blis-pthread/libblas.so.3 ] || need+=(libblis4-pthread)
[ -e /usr/include/oneapi/dnnl/dnnl.hpp ] || need+=(libdnnl-dev)
[ -e /usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 ] || need+=(libopenblas0-pthread)
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}"
fi
bin=$(mktemp -d)/bench_blas
trap 'rm -rf "$(dirname "$bin")"' EXIT
c++ -O2 -std=c++20 -march=native -o "$bin" "$root/scripts/bench_blas.cc" -ldnnl -ldl
threads=$(nproc)
echo "$threads threads; $(grep -o -w -m1 avx512_bf16 /proc/cpuinfo || echo 'no avx512_bf16'); GFLOP/s, median of $repeat processes per library (alternated)"
shapes=(512 192 576  512 192 768  512 768 192  1024 768 2304  1024 768 3072  1024 3072 768)
libs=(openblas blis onednn)
# oneDNN makes no bf16 matmul without bf16 dot products (avx512_bf16 or AMX): it refuses the primitive.
grep -q -w avx512_bf16 /proc/cpuinfo && libs+=(onednn-bf16)
for r in $(seq "$repeat"); do
  for lib in "${libs[@]}"; do
    OPENBLAS_NUM_THREADS=$threads BLIS_NUM_THREADS=$threads OMP_NUM_THREADS=$threads "$bin" "$lib" "$iters" "${shapes[@]}"
  done
done > "$(dirname "$bin")/runs"
/usr/bin/python3 - "$(dirname "$bin")/runs" "${libs[@]}" <<'PY'
import collections, statistics, sys
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    lib, shape, rate = line.split()
    rows[(shape, lib)].append(float(rate))
libs = sys.argv[2:]
print(f"{'N x IN x OUT':<16}" + "".join(f"{l:>13}" for l in libs))
for shape in dict.fromkeys(s for s, _ in rows):
    print(f"{shape:<16}" + "".join(f"{statistics.median(rows[(shape, l)]):>13.1f}" for l in libs))
PY
