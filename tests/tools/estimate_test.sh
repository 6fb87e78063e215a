#!/usr/bin/env bash
# `strata estimate` against `strata train`: the full sweep of scripts/estimate_sweep.py (35+
# configurations: stages 0-3, every placement, budget-driven, overlap_comm, micro-batch,
# sequence length, re-materialization, world 1 and 2, MLP and GPT) predicts every tier's
# peak within [0, +5%] of the measured one and the process RSS within 5% either way; the
# text form names the tiers, the RSS and DeepSpeed's figure; a budget nothing fits is
# refused by estimate as by train, naming the smallest one.
# Exits 77 (skipped) where io_uring is unavailable (the sweep puts state on NVMe).
set -euo pipefail
source "$(dirname "$0")/common.sh" "$1" estimate
root=$(cd "$(dirname "$0")/../.." && pwd)
/usr/bin/python3 "$root/scripts/estimate_sweep.py" "$strata" --nvme "$dir/nvme" --csv "$dir/sweep.csv" \
  || fail "estimate_sweep.py: a prediction outside its bounds (see above)"

cat > "$dir/ds.json" <<JSON
{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "bf16": {"enabled": true},
 "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "$dir/nvme"}},
 "optimizer": {"type": "AdamW", "params": {"lr": 0.001}}}
JSON
out=$("$strata" estimate --model mlp --layers 8 --hidden 512 --config "$dir/ds.json" --world 2)
for want in "tier" "device" "host" "nvme" "optimizer" "DeepSpeed's estimator" "ZeRO-3, optimizer offloaded" \
    "process RSS peak"; do
  grep -q "$want" <<<"$out" || fail "estimate output lacks '$want': $out"
done

# A device budget below the fixed part: both commands refuse it, naming the minimum.
for cmd in estimate train; do
  set +e
  err=$("$strata" "$cmd" --model mlp --layers 8 --hidden 512 --config "$dir/ds.json" --device-budget 64KiB 2>&1)
  rc=$?
  set -e
  [ "$rc" -ne 0 ] || fail "$cmd accepted a 64 KiB device budget"
  grep -q "device budget" <<<"$err" && grep -q "at least" <<<"$err" \
    || fail "$cmd: the refusal does not name the smallest budget: $err"
done
# Optimizer state on NVMe without an nvme_path, and a host budget below one swap buffer:
# both commands refuse them alike, naming the key to set or raise.
refuses() {  # $1: config file, $2: text the refusal must hold
  for cmd in estimate train; do
    set +e
    extra=()
    [ "$cmd" = train ] && extra=(--steps 1)
    err=$("$strata" "$cmd" --model mlp --layers 4 --hidden 256 --config "$1" "${extra[@]}" 2>&1)
    rc=$?
    set -e
    [ "$rc" -ne 0 ] || fail "$cmd accepted $1"
    grep -q "$2" <<<"$err" || fail "$cmd: the refusal of $1 does not name '$2': $err"
  done
}
sed 's#"nvme_path": "[^"]*"#"nvme_path": ""#' "$dir/ds.json" > "$dir/no-path.json"
refuses "$dir/no-path.json" "offload_optimizer.nvme_path"
python3 - "$dir/ds.json" "$dir/small-host.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["memory_budget"] = {"host": "64KiB"}
c["zero_optimization"]["offload_optimizer"]["buffer_count"] = 2
c["zero_optimization"]["offload_param"] = {"device": "cpu"}  # the static form: no planner in between
json.dump(c, open(sys.argv[2], "w"))
PY
refuses "$dir/small-host.json" "memory_budget.host"

# LoRA (--lora-rank): SmolLM2-135M's shape frozen, rank-8 adapters on q_proj [576, 576] and v_proj
# [192, 576] of its 30 blocks: 8 x (1152 + 768) = 15,360 trainable elements a block (a multiple of
# 16: no padding), whose fp32 master and moments (12 B) and bf16 host accumulators (2 B: one
# gradient a step) are all the optimizer state and gradients there are.
cat > "$dir/lora.json" <<JSON
{"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "bf16": {"enabled": true},
 "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}},
 "optimizer": {"type": "AdamW", "params": {"lr": 0.0001}}}
JSON
hf="$root/scripts/configs/hf/smollm2-135m"
out=$("$strata" estimate --model "$hf" --seq-len 64 --config "$dir/lora.json" --device-budget 4GiB --lora-rank 8 --json)
/usr/bin/python3 - "$out" <<'PY' || fail "estimate --lora-rank: $out"
import json, sys
j = json.loads(sys.argv[1])
adapters = 30 * 8 * (1152 + 768)
assert j["lora"]["trainable"] == adapters, j["lora"]
assert j["tiers"]["host"]["optimizer"] == 12 * adapters, j["tiers"]["host"]
assert j["tiers"]["host"]["grads"] == 2 * adapters, j["tiers"]["host"]
assert j["tiers"]["device"]["optimizer"] == 0 and j["tiers"]["nvme"]["optimizer"] == 0
assert j["lora"]["full_host_total"] > 10 * j["tiers"]["host"]["total"] / 2, j["lora"]
PY
text=$("$strata" estimate --model "$hf" --seq-len 64 --config "$dir/lora.json" --device-budget 4GiB --lora-rank 8)
grep -q "frozen layers hold none" <<<"$text" && grep -q "full fine-tuning with the same config would hold" <<<"$text" \
  || fail "estimate --lora-rank text: $text"
set +e
err=$("$strata" estimate --model "$hf" --seq-len 64 --config "$dir/lora.json" --device-budget 4GiB --lora-rank 8 \
  --lora-targets nothing 2>&1)
set -e
grep -q "no 2-D weight's name holds any of the targets" <<<"$err" || fail "--lora-targets nothing: $err"
echo "estimate: OK"
