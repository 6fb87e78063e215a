#!/usr/bin/env bash
# Muon through `strata train` on a small GPT: each block has four matrices, so at world 2 and 3
# every rank owns some (their orthogonalizations run side by side and are broadcast), and
# buckets of 500 elements cut matrices and leave padding. At ZeRO stages 1-3, with the
# optimizer state on the device, in host RAM or on NVMe (sub-groups of 400 elements cut the
# matrices there) and the parameters in host RAM or on NVMe, the final parameters are the
# stage-0 run's bits; the run is not AdamW's. Exits 77 (skipped) where io_uring is unavailable.
set -euo pipefail
source "$(dirname "$0")/common.sh" "$1" muon
data="$(dirname "$0")/../../docs/user-guide.md"
model=(--model gpt --layers 2 --heads 2 --d-model 24 --seq-len 16 --vocab 256 --steps 3 --seed 5 --device host
  --data "$data" --val-fraction 0)

config() {  # optimizer stage optimizer-device param-device
  cat <<JSON
{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "bf16": {"enabled": true},
 "gradient_clipping": 1.0,
 "optimizer": {"type": "$1", "params": {"lr": 0.02, "adam_lr": 0.003, "weight_decay": 0.01}},
 "zero_optimization": {"stage": $2, "stage3_param_persistence_threshold": 0, "reduce_bucket_size": 500,
   "sub_group_size": 400,
   "offload_optimizer": {"device": "$3", "nvme_path": "$dir/nvme"},
   "offload_param": {"device": "$4", "nvme_path": "$dir/nvme", "buffer_count": 4, "buffer_size": 8192}}}
JSON
}

run() {  # name world
  "$strata" launch -n "$2" -- "$strata" train "${model[@]}" --config "$dir/$1.json" --save-params "$dir/$1.st" \
    > "$dir/$1.log" 2>&1 || fail "$1: $(tail -5 "$dir/$1.log")"
}

for world in 2 3; do
  ref="w$world-s0"
  config Muon 0 none none > "$dir/$ref.json"
  run "$ref" "$world"
  for p in "1 none none" "1 cpu none" "2 cpu none" "3 none none" "3 cpu cpu" "3 cpu nvme" \
    "1 nvme none" "2 nvme none" "3 nvme nvme"; do
    set -- $p
    name="w$world-s$1-$2-$3"
    config Muon "$1" "$2" "$3" > "$dir/$name.json"
    run "$name" "$world"
    tensors_equal "$dir/$ref.st" "$dir/$name.st" || fail "$name: parameters differ from $ref's"
  done
  echo "ok: world $world: Muon at stages 1-3 (state on the device, in host RAM or on NVMe, parameters in host RAM or on NVMe) gives stage 0's bits"
done
# The rows are Muon's: AdamW (the same config but the optimizer; adam_lr is Muon's key) differs.
sed 's/"type": "Muon", "params": {"lr": 0.02, "adam_lr": 0.003,/"type": "AdamW", "params": {"lr": 0.003,/' \
  "$dir/w2-s0.json" > "$dir/adamw.json"
grep -q AdamW "$dir/adamw.json" || fail "the AdamW config was not made"
run adamw 2
if tensors_equal "$dir/w2-s0.st" "$dir/adamw.st"; then fail "Muon and AdamW trained the same bits"; fi
echo "ok: Muon's run is not AdamW's"
