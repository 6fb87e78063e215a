#!/usr/bin/env bash
# The process's resident memory stays inside its budgets: a GPT trained 20 steps with ZeRO-3,
# optimizer state and parameters on NVMe and the overlapped optimizer step, its host tier
# filled close to memory_budget.host, never has a peak RSS above
#   memory_budget.host + memory_budget.device (the emulated device lives in RAM)
#   + the RSS before setup (the executable and its libraries, logged as rss.base_bytes)
#   + 40 MiB (the trainer's arrays, the allocator's slack, transient buffers outside the ledger;
#     measured +9..12 MiB since the host tier maps its memory from the kernel, +51..58 MiB
#     before, when buffers freed on other threads stayed in malloc's per-thread arenas)
# (docs/offload.md, "How the estimate and the plan are built"). Exits 77 (skipped) where io_uring is unavailable.
set -euo pipefail
source "$(dirname "$0")/common.sh" "$1" rss-bound
cat > "$dir/ds.json" <<JSON
{"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "bf16": {"enabled": true},
 "gradient_clipping": 1.0,
 "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0, "sub_group_size": 1000000,
   "offload_optimizer": {"device": "nvme", "nvme_path": "$dir/nvme", "overlap_step": true},
   "offload_param": {"device": "nvme", "nvme_path": "$dir/nvme", "buffer_size": 1000000, "max_in_cpu": 0}},
 "memory_budget": {"device": "64MiB", "host": "152MiB"},
 "optimizer": {"type": "AdamW", "params": {"lr": 0.0003}}}
JSON
"$strata" train --model gpt --layers 6 --d-model 512 --heads 8 --vocab 256 --seq-len 64 --steps 20 \
  --config "$dir/ds.json" --data "$(dirname "$0")/../../docs/user-guide.md" --log-json "$dir/log.jsonl" > "$dir/out.txt" 2>&1 ||
  fail "training failed: $(tail -5 "$dir/out.txt")"
python3 - "$dir/log.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 20, len(rows)
slack = 40 << 20
for r in rows:
    host, device = r["tiers"]["host"], r["tiers"]["device"]
    bound = host["budget_bytes"] + device["budget_bytes"] + r["rss"]["base_bytes"] + slack
    assert r["rss"]["peak_bytes"] <= bound, (r["step"], r["rss"], bound)
last = rows[-1]
host = last["tiers"]["host"]
# The bound means something only with the host tier near its budget.
assert host["peak_bytes"] >= 0.7 * host["budget_bytes"], host
over = last["rss"]["peak_bytes"] - last["rss"]["base_bytes"] - host["budget_bytes"] - last["tiers"]["device"]["budget_bytes"]
print(f"ok: peak RSS {last['rss']['peak_bytes'] / 2**20:.1f} MiB = base {last['rss']['base_bytes'] / 2**20:.1f} MiB"
      f" + budgets {(host['budget_bytes'] + last['tiers']['device']['budget_bytes']) / 2**20:.1f} MiB"
      f" {'+' if over >= 0 else '-'} {abs(over) / 2**20:.1f} MiB (allowed +40 MiB); host tier peak"
      f" {host['peak_bytes'] / 2**20:.1f} of {host['budget_bytes'] / 2**20:.1f} MiB")
PY
[ ! -e "$dir/nvme" ] || fail "swap files left behind: $(ls -R "$dir/nvme")"
