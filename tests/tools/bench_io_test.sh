#!/usr/bin/env bash
# `strata bench io` end to end: the JSON keys and the settings used, and the bench file
# removed after a run, after an error (a file size limit: EFBIG) and after Ctrl-C.
# Exits 77 (skipped) where io_uring is unavailable.
set -euo pipefail
source "$(dirname "$0")/common.sh" "$1" bench-io

echo "== a run: keys, settings, medians of --iters runs; no file left"
out=$("$strata" bench io --dir "$dir" --size 16MiB --block 1MiB --qd 4 --batch 2 --iters 3 --json)
python3 - "$out" <<'PY'
import json, sys
j = json.loads(sys.argv[1])
for k in ("write_gbps", "read_gbps", "mixed_gbps"):
    assert j[k] > 0, (k, j[k])
    assert len(j["runs"][k]) == 3, j["runs"]
    assert sorted(j["runs"][k])[1] == j[k], (k, j)  # the median of three
assert j["size_bytes"] == 16 << 20 and j["block_bytes"] == 1 << 20, j
assert j["queue_depth"] == 4 and j["submit_batch"] == 2 and j["iters"] == 3, j
assert j["fixed_buffers"] is True, j
print("ok:", {k: round(j[k], 3) for k in ("write_gbps", "read_gbps", "mixed_gbps")}, "direct:", j["direct"])
PY
[ -z "$(ls -A "$dir")" ] || fail "bench file left behind after a run: $(ls "$dir")"

echo "== an error (file size limit) ends in a clear message and no file left"
set +e
err=$( (ulimit -f 4096; "$strata" bench io --dir "$dir" --size 16MiB --block 1MiB --qd 4 --iters 1) 2>&1 >/dev/null)
rc=$?
set -e
[ "$rc" -eq 1 ] || fail "expected exit 1 under a 4 MiB file size limit, got $rc: $err"
echo "$err" | grep -q "EFBIG" || fail "error does not name EFBIG: $err"
echo "$err" | grep -q "$dir/strata-bench-io-" || fail "error does not name the file: $err"
[ -z "$(ls -A "$dir")" ] || fail "bench file left behind after an error: $(ls "$dir")"

echo "== Ctrl-C removes the file"
"$strata" bench io --dir "$dir" --size 256MiB --block 1MiB --qd 4 --iters 1000 >/dev/null 2>&1 &
pid=$!
for _ in $(seq 1 100); do
  [ -n "$(ls -A "$dir")" ] && break
  sleep 0.05
done
[ -n "$(ls -A "$dir")" ] || fail "the bench file never appeared"
kill -INT "$pid"
set +e
wait "$pid"
rc=$?
set -e
[ "$rc" -eq 130 ] || fail "expected death by SIGINT (130), got $rc"
[ -z "$(ls -A "$dir")" ] || fail "bench file left behind after Ctrl-C: $(ls "$dir")"
# A missing --dir is created (as strata train creates nvme_path), and a file in its place is refused.
"$strata" bench io --dir "$dir/new/deeper" --size 4MiB --block 1MiB --qd 2 --iters 1 > /dev/null ||
  fail "bench io did not create a missing --dir"
[ -d "$dir/new/deeper" ] || fail "no $dir/new/deeper after bench io"
touch "$dir/afile"
err=$("$strata" bench io --dir "$dir/afile" --size 4MiB --iters 1 2>&1) && fail "a file as --dir was accepted"
grep -q -- "--dir '$dir/afile' cannot be created as a directory" <<<"$err" || fail "unclear: $err"
echo "ok: a missing --dir is created, a file in its place refused"
echo "all bench io checks passed"
