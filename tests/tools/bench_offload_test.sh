#!/usr/bin/env bash
# `strata bench offload` end to end: the JSON keys (swapper_gbps, mixed_gbps, ratio as the
# median of per-pair ratios), the sub-group layout it reports, and no swap or bench file
# left in the directory afterwards, also when Ctrl-C ends it. Exits 77 (skipped) where io_uring is unavailable.
set -euo pipefail
source "$(dirname "$0")/common.sh" "$1" bench-offload

out=$("$strata" bench offload --dir "$dir" --params 1M --sub-group 300K --buffers 3 --qd 8 --iters 3 --json)
python3 - "$out" <<'PY'
import json, sys
j = json.loads(sys.argv[1])
for k in ("swapper_gbps", "mixed_gbps", "ratio"):
    assert j[k] > 0, (k, j[k])
    assert len(j["runs"][k]) == 3, j["runs"]
    assert sorted(j["runs"][k])[1] == j[k], (k, j)  # the median of three
assert j["sub_groups"] == 4 and j["sub_group_elems"] == 300000, j  # 1M = 3 x 300K + 100K
assert j["buffers"] == 3 and j["state_bytes"] == 12 * 1000000, j
print("ok:", {k: round(j[k], 3) for k in ("swapper_gbps", "mixed_gbps", "ratio")})
PY
[ -z "$(ls -A "$dir")" ] || fail "files left behind: $(ls -R "$dir")"

# Ctrl-C ends the run at the next step with its swap files removed.
"$strata" bench offload --dir "$dir" --params 4M --sub-group 1M --iters 100 --json > "$dir.out" 2>&1 &
pid=$!
for _ in $(seq 100); do [ -n "$(ls -A "$dir")" ] && break; sleep 0.05; done
sleep 0.5
kill -INT "$pid"
rc=0
wait "$pid" || rc=$?
[ "$rc" -ne 0 ] || fail "an interrupted run exited 0"
grep -q "interrupted by signal" "$dir.out" || fail "no interruption message: $(tail -3 "$dir.out")"
rm -f "$dir.out"
[ -z "$(ls -A "$dir")" ] || fail "files left behind after Ctrl-C: $(ls -R "$dir")"
echo "all bench offload checks passed"
