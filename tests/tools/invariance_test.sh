#!/usr/bin/env bash
# The invariance matrix (issue 58): one small GPT trained by `strata train` under every
# combination of gradient accumulation (1 and 4 micro-batches), precision (bf16 with gradient
# clipping that fires every step; fp16 with a dynamic loss scale that overflows and skips the
# first steps), the overlapped optimizer step off and on, ZeRO stages 1-3 with the optimizer
# state and parameters in host RAM or on NVMe, at world 1 and 2, and pipelined (2 stages) at
# world 1. Within each (accumulation, precision, world) the final parameters must be the bits
# of the stage-0 run with everything on the device. Each row names the DeepSpeed bug of 2026
# it would catch:
#   - accumulation 4 at stages 1-2 with CPU offload: micro-steps after the first dropped
#     (DeepSpeed PR #7967, live from Oct 2024 to Apr 2026);
#   - overlapped optimizer with clipping that fires: the step taken before the global norm was
#     known must be redone, not kept;
#   - fp16 overflow skip under offload: a skipped step must leave state, moments and the step
#     count untouched on every tier;
#   - pipelined: each stage's engine accumulates its micro-batches as the plain trainer does.
# The Python rows (several backward() calls per micro-batch, PR #7981; fp16 loss scale
# through strata.torch) are tests/python/backward_calls_test.py and loss_scale_test.py.
# Exits 77 (skipped) where io_uring is unavailable.
set -euo pipefail
source "$(dirname "$0")/common.sh" "$1" invariance
data="$(dirname "$0")/../../docs/user-guide.md"
model=(--model gpt --layers 2 --heads 2 --d-model 32 --seq-len 16 --vocab 256 --steps 4 --seed 11 --device host
  --data "$data" --val-fraction 0)

config() {  # accumulation precision stage optimizer-device param-device overlap
  local prec
  if [ "$2" = bf16 ]; then
    prec='"bf16": {"enabled": true}, "gradient_clipping": 0.05'
  else
    prec='"fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 19, "hysteresis": 1}, "gradient_clipping": 0'
  fi
  cat <<JSON
{"train_micro_batch_size_per_gpu": $((8 / $1)), "gradient_accumulation_steps": $1, $prec,
 "optimizer": {"type": "AdamW", "params": {"lr": 0.003, "weight_decay": 0.01}},
 "zero_optimization": {"stage": $3, "stage3_param_persistence_threshold": 0,
   "offload_optimizer": {"device": "$4", "nvme_path": "$dir/nvme", "overlap_step": $6},
   "offload_param": {"device": "$5", "nvme_path": "$dir/nvme", "buffer_count": 4, "buffer_size": 8192}}}
JSON
}

run() {  # name world extra-args...: trains, saving the parameters as $dir/name.st
  local name=$1 world=$2
  shift 2
  if [ "$world" = 1 ]; then
    "$strata" train "${model[@]}" --config "$dir/$name.json" --save-params "$dir/$name.st" --log-json "$dir/$name.jsonl" \
      "$@" > "$dir/$name.log" 2>&1 || fail "$name: $(tail -5 "$dir/$name.log")"
  else
    "$strata" launch -n 2 -- "$strata" train "${model[@]}" --config "$dir/$name.json" --save-params "$dir/$name.st" \
      --log-json "$dir/$name.jsonl" "$@" > "$dir/$name.log" 2>&1 || fail "$name: $(tail -5 "$dir/$name.log")"
  fi
}

placements=("1 cpu none" "2 cpu none" "2 nvme none" "3 cpu cpu" "3 nvme nvme")
rows=0
for accum in 1 4; do
  for prec in bf16 fp16; do
    for world in 1 2; do
      ref="a$accum-$prec-w$world-s0"
      config "$accum" "$prec" 0 none none false > "$dir/$ref.json"
      run "$ref" "$world"
      # What makes the row mean something: clipping fired, or the first steps overflowed and
      # were skipped (and later ones trained).
      python3 - "$dir/$ref.jsonl" "$prec" <<'PY' || fail "$ref: the row does not exercise what it guards"
import json, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if '"step"' in l]
if sys.argv[2] == "bf16":
    assert all(s["clip_coef"] < 1 for s in steps), [s["clip_coef"] for s in steps]
else:
    skipped = [s["skipped"] for s in steps]
    assert skipped[0] and not all(skipped), skipped
PY
      for p in "${placements[@]}"; do
        for overlap in false true; do
          set -- $p
          name="a$accum-$prec-w$world-s$1-$2-$3-o$overlap"
          config "$accum" "$prec" "$1" "$2" "$3" "$overlap" > "$dir/$name.json"
          run "$name" "$world"
          tensors_equal "$dir/$ref.st" "$dir/$name.st" 28 || fail "$name: parameters differ from $ref's"
          rows=$((rows + 1))
        done
      done
      if [ "$world" = 1 ] && [ "$accum" = 4 ]; then
        for s in 0 2; do
          name="a$accum-$prec-w1-s$s-pipelined"
          config "$accum" "$prec" "$s" none none false > "$dir/$name.json"
          run "$name" 1 --pipeline-stages 2 --schedule 1f1b
          tensors_equal "$dir/$ref.st" "$dir/$name.st" 28 || fail "$name: parameters differ from $ref's"
          rows=$((rows + 1))
        done
      fi
      echo "ok: accumulation $accum, $prec, world $world: every placement, overlap on and off$([ "$world$accum" = 14 ] && echo ', pipelined') give $ref's bits"
    done
  done
done
# The axes are not ignored: 4 micro-batches of 2 are not 1 of 8 in bf16 (the sums differ).
tensors_equal "$dir/a1-bf16-w1-s0.st" "$dir/a4-bf16-w1-s0.st" 28 && fail "accumulation 1 and 4 trained the same bits"
echo "ok: $rows runs in the matrix gave their reference's bits"
