#!/usr/bin/env bash
# Measures `strata bench io` against fio on the same file size, block size and queue depth
# (fio: io_uring engine, direct=1, sequential write then read of one file), alternating the
# two RUNS times (who goes first alternates too), and prints the medians and the ratio
# Strata/fio for read and write. Installs fio from Debian if missing.
#   scripts/bench-io-vs-fio.sh [DIR]        DIR defaults to /var/tmp (must be on the device to measure)
# Environment: SIZE (2GiB), BLOCK (1MiB), QD (32), RUNS (5), STRATA (build/bin/strata).
set -euo pipefail
source "$(dirname "$0")/deps.sh"
strata_install_deps fio

dir=${1:-/var/tmp}
size=${SIZE:-2GiB}
block=${BLOCK:-1MiB}
qd=${QD:-32}
runs=${RUNS:-5}
strata=${STRATA:-$STRATA_ROOT/build/bin/strata}
[ -x "$strata" ] || { echo "no strata binary at $strata: build first (scripts/test.sh) or set STRATA" >&2; exit 1; }
[ -d "$dir" ] || { echo "no directory $dir" >&2; exit 1; }

to_bytes() {  # 2GiB, 1MiB, 4096 -> bytes (binary suffixes only, as both tools agree on them)
  /usr/bin/python3 -c '
import re, sys
m = re.fullmatch(r"(\d+)\s*(KiB|MiB|GiB|TiB)?", sys.argv[1])
if not m: sys.exit("size %r: use a number with KiB, MiB, GiB or TiB" % sys.argv[1])
print(int(m.group(1)) << {None: 0, "KiB": 10, "MiB": 20, "GiB": 30, "TiB": 40}[m.group(2)])' "$1"
}
size_b=$(to_bytes "$size")
block_b=$(to_bytes "$block")

work=$(mktemp -d)
fio_file="$dir/strata-fio-$$.dat"
cleanup() { rm -f "$fio_file"; rm -rf "$work"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

run_fio() {  # $1 = run index; sequential write, then read of the same file
  rm -f "$fio_file"
  for rw in write read; do
    fio --name="$rw" --filename="$fio_file" --size="$size_b" --bs="$block_b" --iodepth="$qd" \
      --ioengine=io_uring --direct=1 --rw="$rw" --output-format=json >"$work/fio-$rw-$1.json"
  done
  rm -f "$fio_file"
}

run_strata() {
  "$strata" bench io --dir "$dir" --size "$size_b" --block "$block_b" --qd "$qd" --iters 1 --json \
    >"$work/strata-$1.json"
}

echo "dir $dir, size $size ($size_b B), block $block, queue depth $qd, $runs alternating runs"
for i in $(seq 1 "$runs"); do
  if [ $((i % 2)) -eq 1 ]; then run_fio "$i"; run_strata "$i"; else run_strata "$i"; run_fio "$i"; fi
  echo "  run $i/$runs done"
done

/usr/bin/python3 - "$work" "$runs" <<'PY'
import json, statistics, sys
work, runs = sys.argv[1], int(sys.argv[2])
fio = {"write": [], "read": []}
strata = {"write": [], "read": [], "mixed": []}
for i in range(1, runs + 1):
    for rw in ("write", "read"):
        job = json.load(open(f"{work}/fio-{rw}-{i}.json"))["jobs"][0]
        fio[rw].append(job[rw]["bw_bytes"] / 1e9)
    s = json.load(open(f"{work}/strata-{i}.json"))
    for k in strata:
        strata[k].append(s[f"{k}_gbps"])
fmt = lambda v: " ".join(f"{x:.3f}" for x in v)
print(f"{'':8}{'fio GB/s':>10}{'strata GB/s':>13}{'strata/fio':>12}   runs (fio | strata)")
for rw in ("write", "read"):
    f, s = statistics.median(fio[rw]), statistics.median(strata[rw])
    print(f"{rw:8}{f:10.3f}{s:13.3f}{s / f:12.3f}   {fmt(fio[rw])} | {fmt(strata[rw])}")
print(f"{'mixed':8}{'-':>10}{statistics.median(strata['mixed']):13.3f}{'-':>12}   (reads and writes in flight together)")
PY
