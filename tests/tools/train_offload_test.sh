#!/usr/bin/env bash
# `strata train` with budget-driven NVMe offload end to end: --explain prints the plan, the
# per-step log carries the io and nvme keys with peaks under their budgets, a budget nothing
# fits is refused naming the key to raise, Ctrl-C ends at the next step, and no swap file
# is left behind in any of these. Exits 77 (skipped) where io_uring is unavailable.
set -euo pipefail
source "$(dirname "$0")/common.sh" "$1" train-offload
config() {  # $1: device budget
  cat > "$dir/ds.json" <<JSON
{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "bf16": {"enabled": true},
 "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
   "offload_optimizer": {"nvme_path": "$dir/nvme"},
   "offload_param": {"nvme_path": "$dir/nvme", "buffer_count": 2, "buffer_size": 65536}},
 "memory_budget": {"device": "$1", "host": "8.25MiB", "nvme": "64MiB"},
 "optimizer": {"type": "AdamW", "params": {"lr": 0.001}}}
JSON
}
model=(--model mlp --layers 16 --hidden 256)

config 1MiB
out=$("$strata" train "${model[@]}" --config "$dir/ds.json" --steps 3 --explain --log-json "$dir/log.jsonl")
grep -q "placement (budget-driven, memory_budget)" <<<"$out" || fail "no plan printed: $out"
grep -q "moved per step:" <<<"$out" || fail "no predicted traffic: $out"
python3 - "$dir/log.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 3, rows
for r in rows:
    io = r["io"]
    assert io["nvme_read_bytes"] > 0 and io["nvme_write_bytes"] > 0 and io["h2d_bytes"] > 0, io
    for t in ("device", "host", "nvme"):
        u = r["tiers"][t]
        assert 0 < u["peak_bytes"] <= u["budget_bytes"], (t, u)
print("ok: io", {k: rows[-1]["io"][k] for k in ("h2d_bytes", "d2h_bytes", "nvme_read_bytes", "nvme_write_bytes")})
PY
[ ! -e "$dir/nvme" ] || fail "swap files left behind: $(ls -R "$dir/nvme")"

config 4KiB
if msg=$("$strata" train "${model[@]}" --config "$dir/ds.json" --steps 1 2>&1); then fail "a 4 KiB device was accepted"; fi
grep -q "raise memory_budget.device to at least" <<<"$msg" || fail "refusal does not name the budget: $msg"
grep -q "^  (--explain says why)$" <<<"$msg" || fail "the reasons are not left to --explain: $msg"
msg=$("$strata" train "${model[@]}" --config "$dir/ds.json" --steps 1 --explain 2>&1) && fail "accepted with --explain"
grep -q "^  why: .*Raise memory_budget.device to at least" <<<"$msg" || fail "--explain does not say why: $msg"
[ ! -e "$dir/nvme" ] || fail "swap files left behind after the refusal"

config 1MiB
"$strata" train "${model[@]}" --config "$dir/ds.json" --steps 100000 > "$dir/out.txt" 2>&1 &
pid=$!
for _ in $(seq 100); do grep -q "^step" "$dir/out.txt" && break; sleep 0.1; done
kill -INT "$pid"
rc=0
wait "$pid" || rc=$?
[ "$rc" -ne 0 ] || fail "an interrupted run exited 0"
grep -q "interrupted by signal" "$dir/out.txt" || fail "no interruption message: $(tail -3 "$dir/out.txt")"
[ ! -e "$dir/nvme" ] || fail "swap files left behind after Ctrl-C: $(ls -R "$dir/nvme")"
echo "all train offload checks passed"
