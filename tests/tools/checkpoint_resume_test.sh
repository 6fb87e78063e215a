#!/usr/bin/env bash
# Resume is bit-exact: for the MLP and the GPT, at world 1 and at world 2 (`strata launch`),
# for ZeRO stages 0-3 x optimizer/parameter placements on the device, in host RAM and on
# NVMe, a run saved after step 2 and resumed to step 4 (a new process) logs the same losses
# for steps 3-4 and ends with the same parameter bytes as the uninterrupted 4-step run.
# Then a checkpoint saved with one stage and placement resumes under another (same world)
# with the same bits, a resume with another --seed or another model is refused by name, as
# is a unit-scaled checkpoint of another parametrization, and `strata checkpoint verify`
# passes on every checkpoint written.
set -euo pipefail
source "$(dirname "$0")/common.sh" "$1" ckpt-resume
py=/usr/bin/python3
data="$(dirname "$0")/../../docs/user-guide.md"
mlp=(--model mlp --layers 3 --hidden 48 --seed 5 --device host)
gpt=(--model gpt --layers 2 --heads 2 --d-model 32 --seq-len 16 --data "$data" --seed 5 --device host)

config() {  # stage optimizer-device param-device
  cat <<JSON
{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "bf16": {"enabled": true},
 "gradient_clipping": 1.0, "optimizer": {"type": "AdamW", "params": {"lr": 0.003}},
 "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.003, "warmup_num_steps": 3}},
 "zero_optimization": {"stage": $1, "stage3_param_persistence_threshold": 0,
   "offload_optimizer": {"device": "$2", "nvme_path": "$dir/nvme"},
   "offload_param": {"device": "$3", "nvme_path": "$dir/nvme", "buffer_count": 4, "buffer_size": 8192}}}
JSON
}

run() {  # world args...
  local world=$1
  shift
  if [ "$world" = 1 ]; then "$strata" train "$@"; else "$strata" launch -n "$world" -- "$strata" train "$@"; fi
}

losses() {  # log.jsonl first-step: the losses logged from that step on, one per line
  python3 -c 'import json, sys
for l in open(sys.argv[1]):
    j = json.loads(l)
    if j["step"] >= int(sys.argv[2]): print(repr(j["loss"]))' "$1" "$2"
}

cases=("0 none none" "1 none none" "1 cpu none" "1 nvme none" "2 none none" "2 cpu none" "2 nvme none"
       "3 none none" "3 cpu cpu" "3 nvme none" "3 nvme nvme" "3 cpu nvme")
for model in mlp gpt; do
  declare -n args=$model
  for world in 1 2; do
    ref="$dir/$model-w$world-ref"
    config 0 none none > "$ref.json"
    run "$world" "${args[@]}" --config "$ref.json" --steps 4 --log-json "$ref.jsonl" --save-params "$ref.st" > "$ref.log"
    for c in "${cases[@]}"; do
      set -- $c
      name="$dir/$model-w$world-s$1-$2-$3"
      config "$1" "$2" "$3" > "$name.json"
      run "$world" "${args[@]}" --config "$name.json" --steps 2 --save-dir "$name.ck" --save-every 2 > "$name.a.log"
      "$strata" checkpoint verify "$name.ck" > /dev/null || fail "$name: the checkpoint does not verify"
      run "$world" "${args[@]}" --config "$name.json" --steps 4 --resume "$name.ck" --log-json "$name.jsonl" \
        --save-params "$name.st" > "$name.b.log"
      grep -q "continuing at step 3" "$name.b.log" || fail "$name: did not resume at step 3"
      [ "$(losses "$name.jsonl" 1)" = "$(losses "$ref.jsonl" 3)" ] || fail "$name: resumed losses differ"
      tensors_equal "$ref.st" "$name.st" || fail "$name: resumed parameters differ from the uninterrupted run's"
    done
    echo "$model world $world: ${#cases[@]} stage x placement runs resumed at step 3 with the uninterrupted run's bits"
  done
done

# Asynchronous saves: step 2's checkpoint is written in the background while steps 3-4 run
# (with NVMe state, linked swap files the swapper then rewrites) and committed at a step's
# end; resuming from it gives the uninterrupted run's bits.
for c in "1 none none" "3 cpu cpu" "3 nvme nvme"; do
  set -- $c
  name="$dir/async-s$1-$2-$3"
  config "$1" "$2" "$3" > "$name.json"
  run 2 "${mlp[@]}" --config "$name.json" --steps 4 --save-dir "$name.ck" --save-every 2 --save-async > "$name.a.log"
  grep -q "step-00000002 staged in .* writing in the background" "$name.a.log" || fail "$name: not staged: $(cat "$name.a.log")"
  grep -q "step-00000002 committed (.*written in the background" "$name.a.log" || fail "$name: step 2 not committed"
  run 2 "${mlp[@]}" --config "$name.json" --steps 4 --resume "$name.ck/step-00000002" --log-json "$name.jsonl" \
    --save-params "$name.st" > "$name.b.log"
  [ "$(losses "$name.jsonl" 1)" = "$(losses "$dir/mlp-w2-ref.jsonl" 3)" ] || fail "$name: resumed losses differ"
  tensors_equal "$dir/mlp-w2-ref.st" "$name.st" || fail "$name: resumed parameters differ"
done
echo "asynchronous saves at world 2 (stage 1, stage 3 host, stage 3 NVMe) resume with the uninterrupted run's bits"

# Saved with one stage and placement, resumed with another: the state is the same.
from="$dir/mlp-w2-s3-nvme-nvme"
for c in "1 cpu none" "2 none none" "3 cpu cpu"; do
  set -- $c
  config "$1" "$2" "$3" > "$dir/x.json"
  run 2 "${mlp[@]}" --config "$dir/x.json" --steps 4 --resume "$from.ck" --save-params "$dir/x.st" > "$dir/x.log"
  tensors_equal "$dir/mlp-w2-ref.st" "$dir/x.st" || fail "saved at stage 3 (NVMe), resumed at stage $1 ($2/$3): differs"
done
echo "a stage-3 NVMe checkpoint resumed at stages 1, 2 and 3 with other placements: the same bits"

# FP8 products (delayed scaling over a history of 4 steps): each operand's amax history is
# part of the checkpoint, so the resumed run quantizes as the uninterrupted one did, at world
# 1 and world 2 (where the ranks reduce their amax to one history); step 6's checkpoints hold
# the same histories (a resume that dropped them would hold steps 4-6 only).
fp8cfg() {
  config "$@" | python3 -c 'import json, sys; c = json.load(sys.stdin)
c["fp8"] = {"enabled": True, "amax_history_len": 4}; print(json.dumps(c))'
}
for world in 1 2; do
  name="$dir/fp8-w$world"
  fp8cfg 3 cpu cpu > "$name.json"
  run "$world" "${gpt[@]}" --config "$name.json" --steps 6 --log-json "$name.ref.jsonl" --save-params "$name.ref.st" \
    --save-dir "$name.ref.ck" --save-every 6 > "$name.ref.log"
  run "$world" "${gpt[@]}" --config "$name.json" --steps 3 --save-dir "$name.ck" --save-every 3 > "$name.a.log"
  run "$world" "${gpt[@]}" --config "$name.json" --steps 6 --resume "$name.ck" --log-json "$name.jsonl" \
    --save-params "$name.st" --save-dir "$name.ck" --save-every 3 > "$name.b.log"
  [ "$(losses "$name.jsonl" 1)" = "$(losses "$name.ref.jsonl" 4)" ] || fail "fp8 world $world: resumed losses differ"
  tensors_equal "$name.ref.st" "$name.st" || fail "fp8 world $world: resumed parameters differ"
  ref_state=$("$strata" checkpoint show "$name.ref.ck" | sed -n 's/^  trainer //p')
  grep -q '"fp8_amax_history":\[\[' <<<"$ref_state" || fail "fp8 world $world: no amax history saved: $ref_state"
  [ "$("$strata" checkpoint show "$name.ck" | sed -n 's/^  trainer //p')" = "$ref_state" ] ||
    fail "fp8 world $world: the resumed run's amax histories differ from the uninterrupted run's"
done
out=$("$strata" train "${gpt[@]}" --config "$dir/fp8-w1.json" --steps 4 --resume "$dir/gpt-w1-s3-cpu-cpu.ck" 2>&1) ||
  fail "FP8 from a bf16 checkpoint: $out"
grep -q "holds no FP8 amax history (trained without fp8): scales start afresh" <<<"$out" || fail "no note: $out"
echo "fp8: resumed at step 4 with the uninterrupted run's bits at world 1 and 2; a bf16 checkpoint starts the scales afresh"

# The unit-scaled GPT records its parametrization (the attention score temperature, which no
# tensor shows): it resumes with it, and a checkpoint without it (written before the
# temperature was fixed) or with another, or resumed without --unit-scaled, is refused by
# name, not resumed into another function.
config 1 none none | python3 -c 'import json, sys; c = json.load(sys.stdin); del c["bf16"]
c["fp16"] = {"enabled": True, "loss_scale": 1}; c["gradient_clipping"] = 1000; print(json.dumps(c))' > "$dir/unit.json"
unit=("$strata" train "${gpt[@]}" --unit-scaled --config "$dir/unit.json")
"${unit[@]}" --steps 2 --save-dir "$dir/unit.ck" --save-every 2 > /dev/null
grep -q '"unit_scaled":{"score_temperature":0.25}' <<<"$("$strata" checkpoint show "$dir/unit.ck")" ||
  fail "the unit-scaled checkpoint records no score temperature"
"${unit[@]}" --steps 3 --resume "$dir/unit.ck" > /dev/null || fail "a unit-scaled checkpoint does not resume"
edited() {  # $1: name, $2: python editing m (the manifest's trainer model state)
  cp -r "$dir/unit.ck" "$dir/$1.ck"
  python3 - "$dir/$1.ck/step-00000002/manifest.json" "$2" <<'PY'
import json, sys
path = sys.argv[1]
j = json.load(open(path))
m = j["trainer"]["model"]
exec(sys.argv[2])
del j["xxh3"]  # an edited manifest fails its checksum: write it as an unchecked version 1
j["version"] = 1
json.dump(j, open(path, "w"))
PY
}
edited old 'del m["unit_scaled"]'
expect_refusal "a unit-scaled checkpoint without its parametrization" "records no unit-scaled parametrization" \
  "${unit[@]}" --steps 3 --resume "$dir/old.ck"
edited other 'm["unit_scaled"]["score_temperature"] = 1.0'
expect_refusal "a unit-scaled checkpoint of another temperature" "has attention score temperature 1 and this build's has 0.25" \
  "${unit[@]}" --steps 3 --resume "$dir/other.ck"
expect_refusal "a unit-scaled checkpoint into the plain GPT" "is unit-scaled and this run's is not" \
  "$strata" train "${gpt[@]}" --config "$dir/unit.json" --steps 3 --resume "$dir/unit.ck"

out=$("$strata" train --model mlp --layers 3 --hidden 48 --seed 6 --device host --config "$dir/mlp-w1-ref.json" --steps 4 --resume "$dir/mlp-w1-s0-none-none.ck" 2>&1) &&
  fail "a resume with another seed was accepted"
grep -q "trained with --seed 5 but this run has --seed 6" <<<"$out" || fail "unclear: $out"
out=$("$strata" train --model mlp --layers 3 --hidden 40 --seed 5 --device host --config "$dir/mlp-w1-ref.json" --steps 4 --resume "$dir/mlp-w1-s0-none-none.ck" 2>&1) &&
  fail "a resume into another model was accepted"
grep -q "tensor 'layers.0.weight' has shape \[48, 48\] there but \[40, 40\] in this model" <<<"$out" || fail "unclear: $out"
out=$("$strata" train "${mlp[@]}" --config "$dir/mlp-w1-ref.json" --steps 4 --resume latest 2>&1) && fail "--resume latest without --save-dir"
grep -q "resume latest needs --save-dir" <<<"$out" || fail "unclear: $out"
out=$("$strata" train "${mlp[@]}" --config "$dir/mlp-w1-ref.json" --steps 4 --resume "$dir/nothing" 2>&1) && fail "a missing checkpoint was accepted"
grep -q "is not a directory" <<<"$out" || fail "unclear: $out"
echo "refusals: another seed, another model, --resume latest without --save-dir, a missing directory"

# strata bench checkpoint: linked and copied saves of the same NVMe state; the copy moves
# exactly the state's bytes (master, exp_avg, exp_avg_sq of every parameter).
j=$("$strata" bench checkpoint --dir "$dir/bench" --layers 2 --hidden 256 --iters 1 --json)
"$py" -c 'import json, sys
j = json.loads(sys.argv[1])
assert j["state_bytes"] == 2 * (256 * 256 + 256) * 12 == j["copied_bytes"], j
assert j["link_seconds"] > 0 and j["copy_seconds"] > 0, j' "$j" || fail "bench checkpoint: $j"
[ ! -e "$dir/bench" ] || [ -z "$(ls -A "$dir/bench")" ] || fail "bench checkpoint left files in its directory"
echo "bench checkpoint: the copy moved the state's $((2 * (256 * 256 + 256) * 12)) bytes"

# Ctrl-C (SIGINT through `strata launch`) during a 2-rank run that saves every 1000 steps:
# every rank stops at the same step boundary after one final checkpoint, which verifies
# and resumes.
"$strata" launch -n 2 -- "$strata" train "${mlp[@]}" --config "$dir/mlp-w2-ref.json" --steps 1000000 \
  --save-dir "$dir/int.ck" --save-every 1000 > "$dir/int.log" 2>&1 &
pid=$!
for _ in $(seq 1 100); do grep -q "^\[rank 0\] step    5/" "$dir/int.log" 2>/dev/null && break; sleep 0.1; done
kill -INT "$pid"
wait "$pid" && fail "an interrupted run exited 0"
grep -q "interrupted before step [0-9]*; the state after step [0-9]* is in $dir/int.ck" "$dir/int.log" ||
  fail "no final checkpoint named: $(tail -5 "$dir/int.log")"
saved=$(sed -n 's/.*the state after step \([0-9]*\) is in.*/\1/p' "$dir/int.log" | head -1)
[ "$(cat "$dir/int.ck/latest")" = "$(printf 'step-%08d' "$saved")" ] || fail "latest is not step $saved"
"$strata" checkpoint verify "$dir/int.ck" > /dev/null || fail "the final checkpoint does not verify"
run 2 "${mlp[@]}" --config "$dir/mlp-w2-ref.json" --steps $((saved + 1)) --resume "$dir/int.ck" > "$dir/int2.log" ||
  fail "the final checkpoint does not resume"
echo "Ctrl-C at world 2: both ranks saved step $saved and stopped; it verifies and resumes"
