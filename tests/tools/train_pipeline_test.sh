#!/usr/bin/env bash
# `strata train --model gpt --pipeline-stages P --schedule KIND`: the GPT split over
# pipeline stages on ZeRO engines ends with the plain trainer's parameters bit for bit
# (--save-params: names, shapes, order and bytes), with its gradient norms and losses at
# every step (within 1e-7 at two replicas, which the plain trainer means in fp32), as threads
# and as P x D processes under strata launch, in fp32, bf16 and fp16 (a dynamic loss scaler
# that skips the first step on every stage alike; the unit-scaled GPT without one) and with FP8 products
# (delayed scaling: each operand's amax history too), with optimizer state and
# parameters on NVMe, and zb-auto from the times of its first step; a resumed run ends with
# the bits of one that never stopped (synchronous and asynchronous saves), and background saves that fail end
# the run in an error naming the stages; --init-from starts it from the plain trainer's saved
# weights as it starts the plain trainer; its validation losses and sampled text are the
# plain trainer's; --explain and --link-gbps work per stage;
# --trace draws every stage's actions and engine rows; what it cannot take is refused by
# name.
# Exits 77 (skipped) where io_uring is unavailable.
set -euo pipefail
source "$(dirname "$0")/common.sh" "$1" train-pipeline
readme="$(dirname "$0")/../../docs/user-guide.md"
shape=(--model gpt --data "$readme" --d-model 32 --heads 4 --seq-len 16 --vocab 256 --layers 2)
gpt=("${shape[@]}" --steps 4)
config() {  # $1: file, $2: zero stage, $3: offload device[, $4: bf16, $5: fp16 (true/false)]
  cat > "$1" <<JSON
{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 8, "gradient_clipping": 1.0,
 "bf16": {"enabled": ${4:-false}}, "fp16": {"enabled": ${5:-false}, "loss_scale": 0, "initial_scale_power": 24, "hysteresis": 1},
 "optimizer": {"type": "AdamW", "params": {"lr": 0.003, "weight_decay": 0.01}},
 "zero_optimization": {"stage": $2, "stage3_param_persistence_threshold": 0,
   "offload_optimizer": {"device": "$3", "nvme_path": "$dir/nvme"},
   "offload_param": {"device": "$3", "nvme_path": "$dir/nvme", "max_in_cpu": 0}}}
JSON
}
same_losses() {  # $1: what, $2: plain log, $3: pipelined log: equal losses and gradient norms
  python3 - "$2" "$3" <<'PY' || fail "$1: losses or gradient norms differ"
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert len(a) == len(b) == 4, (len(a), len(b))
for x, y in zip(a, b):
    # The plain trainer means the loss over ranks in fp32 (rounding at 1e-7); a single rank's is exact.
    assert abs(x["loss"] - y["loss"]) <= 1e-7 * x["loss"], (x["step"], x["loss"], y["loss"])
    assert x["grad_norm"] == y["grad_norm"], (x["step"], x["grad_norm"], y["grad_norm"])
assert b[-1]["loss"] < b[0]["loss"], "the loss did not go down"
PY
  echo "ok: $1: the plain trainer's losses and gradient norms"
}

same_params() {  # $1: what, $2, $3: --save-params of the plain and the pipelined run
  tensors_equal "$2" "$3" 28 || fail "$1: parameters differ from the plain trainer's"
  echo "ok: $1: the plain trainer's parameters, bit for bit (names, shapes, order, bytes)"
}

config "$dir/z1.json" 1 none
"$strata" train "${gpt[@]}" --config "$dir/z1.json" --log-json "$dir/plain.jsonl" --save-params "$dir/plain.st" \
  >/dev/null
out=$("$strata" train "${gpt[@]}" --config "$dir/z1.json" --pipeline-stages 2 --schedule 1f1b --verbose \
  --log-json "$dir/pipe.jsonl" --save-params "$dir/pipe.st" 2>&1) || fail "1f1b: $out"
grep -Eq "step +4/4 +loss [0-9.]+ .* tok/s .*stage 1: device" <<<"$out" || fail "no progress lines: $out"
same_losses "1f1b, 2 stages as threads, ZeRO-1" "$dir/plain.jsonl" "$dir/pipe.jsonl"
same_params "1f1b, 2 stages as threads" "$dir/plain.st" "$dir/pipe.st"
# Each stage's whole device (the engine's ledger, the activations' pool) beside its ledger.
grep -q "device total peak" <<<"$out" || fail "no device total in the progress lines: $out"
python3 - "$dir/pipe.jsonl" <<'PY' || fail "a stage's whole-device peak is not above its ledger's"
import json, sys
for line in open(sys.argv[1]):
    for st in json.loads(line)["stages"]:
        assert st["device_memory_peak_bytes"] > st["device_peak_bytes"] > 0, st
PY

config "$dir/b1.json" 1 none true
"$strata" train "${gpt[@]}" --config "$dir/b1.json" --log-json "$dir/plain-bf16.jsonl" \
  --save-params "$dir/plain-bf16.st" >/dev/null
"$strata" train "${gpt[@]}" --config "$dir/b1.json" --pipeline-stages 2 --schedule zb-h2 \
  --log-json "$dir/pipe-bf16.jsonl" --save-params "$dir/pipe-bf16.st" >/dev/null
same_losses "zb-h2 in bf16, 2 stages as threads, ZeRO-1" "$dir/plain-bf16.jsonl" "$dir/pipe-bf16.jsonl"
same_params "zb-h2 in bf16, 2 stages as threads" "$dir/plain-bf16.st" "$dir/pipe-bf16.st"

# fp16 with a dynamic loss scaler from 2^24, far above what this model's gradients take:
# the first steps overflow on every stage and are skipped, the scale halves on each, and
# the rest trains to the plain trainer's bits (12 steps: room for the scale to come down).
config "$dir/h3.json" 3 cpu false true
"$strata" train "${shape[@]}" --steps 12 --config "$dir/h3.json" --log-json "$dir/plain-fp16.jsonl" \
  --save-params "$dir/plain-fp16.st" >/dev/null
"$strata" train "${shape[@]}" --steps 12 --config "$dir/h3.json" --pipeline-stages 2 --schedule zb-h1 \
  --log-json "$dir/pipe-fp16.jsonl" --save-params "$dir/pipe-fp16.st" >/dev/null
same_params "zb-h1 in fp16, 2 stages as threads" "$dir/plain-fp16.st" "$dir/pipe-fp16.st"
python3 - "$dir/plain-fp16.jsonl" "$dir/pipe-fp16.jsonl" <<'PY' || fail "fp16: the steps skipped or the loss scales differ"
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
key = lambda r: (r["skipped"], r["loss_scale"], r["loss"], r["grad_norm"])
assert len(a) == len(b) == 12 and [key(x) for x in a] == [key(y) for y in b], ([key(x) for x in a], [key(y) for y in b])
assert a[0]["skipped"] and not a[-1]["skipped"], [x["skipped"] for x in a]
PY
echo "ok: fp16: the same losses, gradient norms, steps skipped and loss scales"

# The unit-scaled GPT in fp16 with no loss scaler (a static scale of 1): every weight steps at
# its own learning-rate scale on its stage's engine, and the run, its text included, is the
# plain trainer's.
config "$dir/u3.json" 3 cpu false true
sed -i 's/"loss_scale": 0/"loss_scale": 1/' "$dir/u3.json"
a=$("$strata" train "${gpt[@]}" --unit-scaled --config "$dir/u3.json" --log-json "$dir/plain-unit.jsonl" \
  --save-params "$dir/plain-unit.st" --sample 24 2>&1 | sed -n '/sample (/,$p' | grep -av '^saved ')
b=$("$strata" train "${gpt[@]}" --unit-scaled --config "$dir/u3.json" --pipeline-stages 2 --schedule 1f1b \
  --log-json "$dir/pipe-unit.jsonl" --save-params "$dir/pipe-unit.st" --sample 24 2>&1 | sed -n '/sample (/,$p' | grep -av '^saved ')
same_losses "unit-scaled fp16 without a loss scaler, 1f1b, ZeRO-3 in host RAM" "$dir/plain-unit.jsonl" \
  "$dir/pipe-unit.jsonl"
same_params "unit-scaled fp16 without a loss scaler" "$dir/plain-unit.st" "$dir/pipe-unit.st"
grep -q "^sample (24 bytes):" <<<"$b" && [ "$a" = "$b" ] || fail "unit-scaled --sample differs: $a // $b"
# The unit-scaled GPT with FP8 products cast at scale 1 (fp8.scaling none), fp16 without a
# loss scaler: the issue's unit-FP8 recipe, pipelined to the plain trainer's bits.
python3 -c 'import json, sys
c = json.load(open(sys.argv[1])); c["fp8"] = {"enabled": True, "scaling": "none"}; print(json.dumps(c))' \
  "$dir/u3.json" > "$dir/u8.json"
"$strata" train "${gpt[@]}" --unit-scaled --config "$dir/u8.json" --log-json "$dir/plain-u8.jsonl" \
  --save-params "$dir/plain-u8.st" >/dev/null
"$strata" train "${gpt[@]}" --unit-scaled --config "$dir/u8.json" --pipeline-stages 2 --schedule zb-h1 \
  --log-json "$dir/pipe-u8.jsonl" --save-params "$dir/pipe-u8.st" >/dev/null
same_losses "unit-scaled FP8 at scale 1, fp16 without a loss scaler, zb-h1" "$dir/plain-u8.jsonl" "$dir/pipe-u8.jsonl"
same_params "unit-scaled FP8 at scale 1" "$dir/plain-u8.st" "$dir/pipe-u8.st"
# Its checkpoint records the parametrization: resumed as the other one (the same tensors,
# another function), it is refused by name, both ways.
"$strata" train "${shape[@]}" --steps 2 --unit-scaled --config "$dir/u3.json" --pipeline-stages 2 --schedule 1f1b \
  --save-dir "$dir/unit-ckpt" >/dev/null
"$strata" train "${shape[@]}" --steps 2 --config "$dir/u3.json" --pipeline-stages 2 --schedule 1f1b \
  --save-dir "$dir/plain-ckpt" >/dev/null
expect_refusal "a unit-scaled checkpoint resumed without --unit-scaled" "unit-scaled and this run's is not" \
  "$strata" train "${gpt[@]}" --config "$dir/u3.json" --pipeline-stages 2 --schedule 1f1b --resume "$dir/unit-ckpt"
expect_refusal "a plain checkpoint resumed with --unit-scaled" "records no unit-scaled parametrization" \
  "$strata" train "${gpt[@]}" --unit-scaled --config "$dir/u3.json" --pipeline-stages 2 --schedule 1f1b \
  --resume "$dir/plain-ckpt"

# FP8 products with delayed scaling (bf16 compute, ZeRO-3 in host RAM): each stage records
# the amax of its own layers' operands, reduced over its replicas, and the histories move as
# the plain trainer's do: the same losses, norms, parameters and text, as threads and as 2
# stages x 2 replicas, with validation between the steps (which records no amax); a resume
# restores each stage's histories (the bits of straight steps).
fp8cfg() {  # $1: file from $2 with an fp8 block
  python3 -c 'import json, sys
c = json.load(open(sys.argv[1])); c["fp8"] = {"enabled": True, "amax_history_len": 8}; print(json.dumps(c))' "$2" > "$1"
}
same_histories() {  # $1: what, $2: a checkpoint step dir of the plain trainer, $3: a pipelined save root, $4: step dir name
  python3 - "$2" "$3" "$4" <<'PY' || fail "$1: amax histories differ"
import json, os, sys
def histories(step_dir):
    t = json.load(open(os.path.join(step_dir, "manifest.json")))["trainer"]
    return t.get("model", t)["fp8_amax_history"]
plain = histories(sys.argv[1])
stages = [histories(os.path.join(sys.argv[2], "stage%d" % s, sys.argv[3])) for s in (0, 1)]
assert all(len(h) == len(plain) for h in stages), [len(h) for h in stages]
for i, want in enumerate(plain):
    got = [h[i] for h in stages if h[i]]
    # Each operand's history lives on the stage whose layer has its site, and it is the plain one.
    assert len(got) == 1 and got[0] == want and len(want) == 4, (i, want, [h[i] for h in stages])
PY
  echo "ok: $1: each operand's amax history, on the stage that runs its site"
}
config "$dir/f2-base.json" 3 cpu true
fp8cfg "$dir/f2.json" "$dir/f2-base.json"
a=$("$strata" train "${gpt[@]}" --config "$dir/f2.json" --log-json "$dir/plain-fp8.jsonl" --eval-every 1 \
  --save-params "$dir/plain-fp8.st" --save-dir "$dir/plain-fp8-ck" --sample 24 2>&1 | sed -n '/sample (/,$p' | grep -av '^saved ')
b=$("$strata" train "${gpt[@]}" --config "$dir/f2.json" --pipeline-stages 2 --schedule zb-h1 --eval-every 1 \
  --log-json "$dir/pipe-fp8.jsonl" --save-params "$dir/pipe-fp8.st" --save-dir "$dir/pipe-fp8-ck" --sample 24 2>&1 | sed -n '/sample (/,$p' | grep -av '^saved ')
same_losses "FP8 with delayed scaling, zb-h1, ZeRO-3 in host RAM" "$dir/plain-fp8.jsonl" "$dir/pipe-fp8.jsonl"
same_params "FP8 with delayed scaling, zb-h1" "$dir/plain-fp8.st" "$dir/pipe-fp8.st"
grep -q "^sample (24 bytes):" <<<"$b" && [ "$a" = "$b" ] || fail "FP8 --sample differs: $a // $b"
same_histories "FP8, zb-h1 after 4 steps" "$dir/plain-fp8-ck/step-00000004" "$dir/pipe-fp8-ck" step-00000004
tensors_equal "$dir/plain-fp8.st" "$dir/pipe-bf16.st" 2>/dev/null && fail "FP8 trained to the bf16 run's bits"
# Block scaling (each tile scaled by its own amax) splits B and W alike.
python3 -c 'import json, sys
c = json.load(open(sys.argv[1])); c["fp8"]["block_scaling"] = True; print(json.dumps(c))' "$dir/f2.json" > "$dir/fb.json"
"$strata" train "${gpt[@]}" --config "$dir/fb.json" --log-json "$dir/plain-fp8b.jsonl" \
  --save-params "$dir/plain-fp8b.st" >/dev/null
"$strata" train "${gpt[@]}" --config "$dir/fb.json" --pipeline-stages 2 --schedule 1f1b \
  --log-json "$dir/pipe-fp8b.jsonl" --save-params "$dir/pipe-fp8b.st" >/dev/null
same_losses "FP8 with block scaling, 1f1b" "$dir/plain-fp8b.jsonl" "$dir/pipe-fp8b.jsonl"
same_params "FP8 with block scaling, 1f1b" "$dir/plain-fp8b.st" "$dir/pipe-fp8b.st"
"$strata" launch -n 2 -- "$strata" train "${gpt[@]}" --config "$dir/f2.json" --log-json "$dir/plain-fp8-2.jsonl" \
  --save-params "$dir/plain-fp8-2.st" >/dev/null
"$strata" launch -n 4 -- "$strata" train "${gpt[@]}" --config "$dir/f2.json" --pipeline-stages 2 --schedule 1f1b \
  --log-json "$dir/pipe-fp8-2.jsonl" --save-params "$dir/pipe-fp8-2.st" >/dev/null
same_losses "FP8, 1f1b, 2 stages x 2 replicas as processes" "$dir/plain-fp8-2.jsonl" "$dir/pipe-fp8-2.jsonl"
same_params "FP8, 2 stages x 2 replicas as processes" "$dir/plain-fp8-2.st" "$dir/pipe-fp8-2.st"
frun=("${shape[@]}" --config "$dir/f2.json" --pipeline-stages 2 --schedule zb-h1)
"$strata" train "${frun[@]}" --steps 2 --save-dir "$dir/fp8-ck" >/dev/null
out=$("$strata" train "${frun[@]}" --steps 4 --resume "$dir/fp8-ck" --save-dir "$dir/fp8-ck" \
  --save-params "$dir/fp8-resumed.st" 2>&1) || fail "FP8 resume: $out"
grep -q "holds no FP8 amax history" <<<"$out" && fail "FP8 resume found no histories: $out"
tensors_equal "$dir/pipe-fp8.st" "$dir/fp8-resumed.st" || fail "FP8: resumed parameters differ from 4 straight steps"
same_histories "FP8 resumed" "$dir/plain-fp8-ck/step-00000004" "$dir/fp8-ck" step-00000004
echo "ok: FP8 stopped after 2 steps and resumed with each stage's amax histories: the bits of 4 straight steps"
"$strata" train "${shape[@]}" --steps 2 --config "$dir/f2-base.json" --pipeline-stages 2 --schedule zb-h1 \
  --save-dir "$dir/no-fp8-ck" >/dev/null
out=$("$strata" train "${frun[@]}" --steps 3 --resume "$dir/no-fp8-ck" 2>&1) || fail "resuming without histories: $out"
grep -q "note: the checkpoint holds no FP8 amax history (trained without fp8): scales start afresh" <<<"$out" ||
  fail "no note resuming an fp16 checkpoint with fp8: $out"
expect_refusal "fp8 for the pipelined MLP" "FP8 matrix products are implemented for the GPT" \
  "$strata" train --model mlp --steps 1 --config "$dir/f2.json" --pipeline-stages 2
expect_refusal "--unit-scaled for the pipelined MLP" "--unit-scaled applies to --model gpt only" \
  "$strata" train --model mlp --steps 1 --unit-scaled --config "$dir/f2-base.json" --pipeline-stages 2

config "$dir/z3.json" 3 nvme
"$strata" launch -n 2 -- "$strata" train "${gpt[@]}" --config "$dir/z3.json" --log-json "$dir/plain2.jsonl" \
  --save-params "$dir/plain2.st" >/dev/null
out=$("$strata" launch -n 4 -- "$strata" train "${gpt[@]}" --config "$dir/z3.json" --pipeline-stages 2 \
  --schedule zb-h1 --verbose --log-json "$dir/pipe2.jsonl" --save-params "$dir/pipe2.st" 2>&1) ||
  fail "zb-h1 as processes: $out"
grep -q "nvme" <<<"$out" || fail "no NVMe in the --verbose memory report: $out"
same_losses "zb-h1, 2 stages x 2 replicas as processes, ZeRO-3 on NVMe" "$dir/plain2.jsonl" "$dir/pipe2.jsonl"
same_params "zb-h1, 2 stages x 2 replicas as processes" "$dir/plain2.st" "$dir/pipe2.st"
out=$("$strata" train "${gpt[@]}" --config "$dir/z3.json" --pipeline-stages 2 --schedule zb-auto \
  --log-json "$dir/pipe3.jsonl" --save-params "$dir/pipe3.st" 2>&1) || fail "zb-auto: $out"
grep -q "zb-auto from step 1's measured times (stage 0 F" <<<"$out" || fail "zb-auto did not reschedule: $out"
"$strata" train "${gpt[@]}" --config "$dir/z3.json" --log-json "$dir/plain3.jsonl" --save-params "$dir/plain3.st" \
  >/dev/null
same_losses "zb-auto from measured times, ZeRO-3 on NVMe" "$dir/plain3.jsonl" "$dir/pipe3.jsonl"
same_params "zb-auto from measured times, ZeRO-3 on NVMe" "$dir/plain3.st" "$dir/pipe3.st"
[ -z "$(find "$dir/nvme" -type f 2>/dev/null)" ] || fail "swap files left behind: $(find "$dir/nvme" -type f)"

# Resume: a run stopped after step 2 and resumed to step 4 ends with the bits of 4 steps
# straight; with one stage a save behind (stopped between two stages' saves) every stage
# resumes from the step they all have; with that step gone (keep 1) the resume is refused.
base=("${shape[@]}" --config "$dir/z3.json")
run=("${base[@]}" --pipeline-stages 2 --schedule zb-h1)
"$strata" train "${run[@]}" --steps 4 --save-params "$dir/straight.st" >/dev/null
"$strata" train "${run[@]}" --steps 2 --save-dir "$dir/ck" >/dev/null
out=$("$strata" train "${run[@]}" --steps 4 --resume "$dir/ck" --save-params "$dir/resumed.st" 2>&1) ||
  fail "resume: $out"
grep -q "resumed from $dir/ck at step 3" <<<"$out" || fail "no resume notice: $out"
tensors_equal "$dir/straight.st" "$dir/resumed.st" || fail "resumed parameters differ from 4 straight steps"
echo "ok: stopped after 2 steps and resumed: the bits of 4 straight steps"
"$strata" launch -n 4 -- "$strata" train "${run[@]}" --steps 4 --save-params "$dir/straight2.st" >/dev/null
"$strata" launch -n 4 -- "$strata" train "${run[@]}" --steps 3 --save-every 1 --save-dir "$dir/ck2" >/dev/null
rm -rf "$dir/ck2/stage1/"*-00000003  # stage 1 never committed step 3
out=$("$strata" launch -n 4 -- "$strata" train "${run[@]}" --steps 4 --resume "$dir/ck2" \
  --save-params "$dir/resumed2.st" 2>&1) || fail "resume with a stage behind: $out"
grep -q "stage 0: resuming from step 2, the newest every stage saved (its own latest is 3)" <<<"$out" ||
  fail "no notice of the older step: $out"
tensors_equal "$dir/straight2.st" "$dir/resumed2.st" || fail "resumed (a stage behind) differs from 4 straight steps"
echo "ok: 2 stages x 2 replicas, one stage a save behind: resumed from the common step, the bits of 4 steps"
# Asynchronous saves (--save-async): each stage writes in the background and commits at a
# later step of its own; 2 stages x 2 replicas as processes, ZeRO-3 on NVMe, a save every
# step, stage 1's last one lost: the resume takes the newest step both committed and ends
# with the bits of 4 straight steps.
out=$("$strata" launch -n 4 -- "$strata" train "${run[@]}" --steps 3 --save-every 1 --save-async \
  --save-dir "$dir/ck5" 2>&1) || fail "--save-async: $out"
grep -q "staged checkpoint step 3 under $dir/ck5/stage<0..1>, writing in the background" <<<"$out" ||
  fail "no background save notice: $out"
grep -q "checkpoint: $dir/ck5/stage0/step-00000003 committed" <<<"$out" || fail "the last save was not committed: $out"
for st in 0 1; do
  [ "$(ls -d "$dir/ck5/stage$st"/step-* | wc -l)" = 3 ] || fail "--save-async: stage $st: $(ls "$dir/ck5/stage$st")"
done
rm -rf "$dir/ck5/stage1/"*-00000003
"$strata" launch -n 4 -- "$strata" train "${run[@]}" --steps 4 --resume "$dir/ck5" --save-params "$dir/resumed5.st" \
  >/dev/null
tensors_equal "$dir/straight2.st" "$dir/resumed5.st" || fail "resumed from asynchronous saves: not 4 straight steps"
echo "ok: asynchronous saves, 2 stages x 2 replicas: resumed from the common step, the bits of 4 straight steps"
# Background saves that fail (a 64 KiB file-size limit stands in for a full disk): each
# failure is reported when found, and the run ends in an error that names the stages whose
# last save failed, on every stage alike, as the plain trainer's run does; nothing commits.
out=$( (trap '' XFSZ; ulimit -f 64; exec "$strata" train "${gpt[@]}" --config "$dir/z1.json" --pipeline-stages 2 \
  --save-every 1 --save-async --save-dir "$dir/ck-full") 2>&1) && fail "a failed last save: accepted: $out"
grep -q "stage 1: checkpoint step 2 failed in the background: .*full disk" <<<"$out" ||
  fail "no report of the failed save: $out"
grep -q "the last checkpoint save failed on stage 0, 1: .*stays latest" <<<"$out" || fail "no error at the end: $out"
[ -z "$(ls -d "$dir"/ck-full/stage*/step-* 2>/dev/null)" ] || fail "a failed save committed: $(ls -R "$dir/ck-full")"
echo "ok: background saves that fail: reported, and the run ends in an error naming the stages"
"$strata" train "${run[@]}" --steps 2 --keep 1 --save-dir "$dir/ck3" >/dev/null
cp -a "$dir/ck3/stage1" "$dir/stage1-at-2"
"$strata" train "${run[@]}" --steps 3 --keep 1 --save-dir "$dir/ck3" --resume "$dir/ck3" >/dev/null
rm -rf "$dir/ck3/stage1" && mv "$dir/stage1-at-2" "$dir/ck3/stage1"  # stage 1 never committed step 3
expect_refusal "stages with no common step" "the stages cannot resume together" "$strata" train "${run[@]}" \
  --steps 4 --resume "$dir/ck3"
expect_refusal "another stage count" "resume with 2" "$strata" train "${base[@]}" --pipeline-stages 1 --steps 4 \
  --resume "$dir/ck"

# --init-from: the plain trainer's saved weights start the pipelined run where they start
# the plain one, as 2 stages x 2 replicas with ZeRO-3 on NVMe (each stage reads its own
# layers); a file without one of the model's tensors, or beside --resume, is refused by name.
"$strata" launch -n 2 -- "$strata" train "${gpt[@]}" --config "$dir/z3.json" --init-from "$dir/plain.st" \
  --save-params "$dir/init-plain.st" --log-json "$dir/init-plain.jsonl" >/dev/null
out=$("$strata" launch -n 4 -- "$strata" train "${gpt[@]}" --config "$dir/z3.json" --init-from "$dir/plain.st" \
  --pipeline-stages 2 --schedule zb-h1 --save-params "$dir/init-pipe.st" --log-json "$dir/init-pipe.jsonl" 2>&1) ||
  fail "--init-from: $out"
grep -q "initialised 28 tensors from $dir/plain.st" <<<"$out" || fail "no --init-from notice: $out"
same_losses "--init-from, 2 stages x 2 replicas" "$dir/init-plain.jsonl" "$dir/init-pipe.jsonl"
same_params "--init-from, 2 stages x 2 replicas" "$dir/init-plain.st" "$dir/init-pipe.st"
if tensors_equal "$dir/init-pipe.st" "$dir/pipe2.st"; then fail "--init-from gave the seed's run"; fi
python3 - "$dir/plain.st" "$dir/partial.st" <<'PY'
import json, struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
h["unused.bias"] = h.pop("h.1.mlp.c_proj.bias")  # renamed, not deleted: safetensors has no holes
head = json.dumps(h).encode()
open(sys.argv[2], "wb").write(struct.pack("<Q", len(head)) + head + b[8 + n:])
PY
expect_refusal "--init-from without a tensor" "has no tensor 'h.1.mlp.c_proj.bias', which this model registers" \
  "$strata" train "${gpt[@]}" --config "$dir/z1.json" --pipeline-stages 2 --init-from "$dir/partial.st"
python3 - "$dir/plain.st" "$dir/nan.st" <<'PY'
import json, struct, sys
b = bytearray(open(sys.argv[1], "rb").read())
n = struct.unpack("<Q", b[:8])[0]
lo = json.loads(b[8:8 + n])["h.0.attn.c_attn.weight"]["data_offsets"][0]
b[8 + n + lo + 12:8 + n + lo + 16] = struct.pack("<f", float("nan"))  # element 3
open(sys.argv[2], "wb").write(b)
PY
expect_refusal "--init-from with a NaN (pipelined)" "tensor 'h.0.attn.c_attn.weight' holds nan at element 3" \
  "$strata" train "${gpt[@]}" --config "$dir/z1.json" --pipeline-stages 2 --init-from "$dir/nan.st"
expect_refusal "--init-from with --resume" "pick one" "$strata" train "${run[@]}" --steps 4 --resume "$dir/ck" \
  --init-from "$dir/plain.st"

# Validation (--eval-every, and after the last step as the plain trainer does): a forward
# pass through the stages gives the plain trainer's validation loss bit for bit, as threads
# and as 2 stages x 2 replicas of an interleaved schedule with ZeRO-3 on NVMe.
same_val() {  # $1: what, $2: plain log, $3: pipelined log, $4: the steps that validate
  python3 - "$2" "$3" "$4" <<'PY' || fail "$1: validation losses differ"
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
due = [int(s) for s in sys.argv[3].split(",")]
assert [x["step"] for x in a if "val_loss" in x] == due, [x["step"] for x in a if "val_loss" in x]
assert [(x["step"], x.get("val_loss")) for x in a] == [(y["step"], y.get("val_loss")) for y in b], (a, b)
PY
  echo "ok: $1: the plain trainer's validation losses, bit for bit"
}
"$strata" train "${gpt[@]}" --config "$dir/z1.json" --eval-every 3 --log-json "$dir/val-plain.jsonl" >/dev/null
out=$("$strata" train "${gpt[@]}" --config "$dir/z1.json" --eval-every 3 --pipeline-stages 2 --schedule zb-h1 \
  --log-json "$dir/val-pipe.jsonl" 2>&1) || fail "--eval-every: $out"
grep -Eq "step +3/4 +loss [0-9.]+  val [0-9.]+ " <<<"$out" || fail "no validation loss printed: $out"
same_val "--eval-every 3, zb-h1 as threads" "$dir/val-plain.jsonl" "$dir/val-pipe.jsonl" 1,3,4
six=(--model gpt --data "$readme" --d-model 32 --heads 4 --seq-len 16 --vocab 256 --layers 6 --steps 2)
"$strata" launch -n 2 -- "$strata" train "${six[@]}" --config "$dir/z3.json" --eval-every 1 \
  --log-json "$dir/val-plain2.jsonl" >/dev/null
"$strata" launch -n 4 -- "$strata" train "${six[@]}" --config "$dir/z3.json" --eval-every 1 --pipeline-stages 2 \
  --schedule interleaved --chunks 2 --log-json "$dir/val-pipe2.jsonl" >/dev/null
same_val "--eval-every 1, interleaved 2 stages x 2 chunks x 2 replicas as processes, ZeRO-3 on NVMe" \
  "$dir/val-plain2.jsonl" "$dir/val-pipe2.jsonl" 1,2

# --sample: the pipelined GPT generates the plain trainer's text (a forward pass through the
# stages per token, the last stage's draw sent to the others), as threads and as an
# interleaved 2 x 2 job.
sample_of() { sed -n '/sample (/,$p' | sed 's/^\[rank 0\] //'; }
a=$("$strata" train "${gpt[@]}" --config "$dir/z1.json" --sample 48 2>&1 | sample_of)
b=$("$strata" train "${gpt[@]}" --config "$dir/z1.json" --sample 48 --pipeline-stages 2 --schedule zb-h1 2>&1 | sample_of)
grep -q "^sample (48 bytes):" <<<"$b" || fail "--sample: no sample printed: $b"
[ "$a" = "$b" ] || fail "--sample: the pipelined text differs from the plain trainer's: $a // $b"
a=$("$strata" launch -n 2 -- "$strata" train "${six[@]}" --config "$dir/z3.json" --sample 32 2>&1 | sample_of)
b=$("$strata" launch -n 4 -- "$strata" train "${six[@]}" --config "$dir/z3.json" --sample 32 --pipeline-stages 2 \
  --schedule interleaved --chunks 2 2>&1 | sample_of)
grep -q "^sample (32 bytes):" <<<"$b" || fail "--sample under launch: no sample printed: $b"
[ "$a" = "$b" ] || fail "--sample under launch: the pipelined text differs from the plain trainer's: $a // $b"
echo "ok: --sample: the plain trainer's generated text, as threads and as an interleaved 2 x 2 job"

# --explain prints each stage's placement in stage order; --link-gbps throttles each stage's
# host-device link (ZeRO-3 parameters in host RAM cross it at every gather) and leaves the
# bits alone.
config "$dir/c3.json" 3 cpu
out=$("$strata" train "${shape[@]}" --steps 4 --config "$dir/c3.json" --pipeline-stages 2 --explain \
  --log-json "$dir/free.jsonl" --save-params "$dir/free.st" 2>&1) || fail "--explain: $out"
python3 - "$out" <<'PY' || fail "--explain: the stages' placements are missing or out of order: $out"
import sys
out = sys.argv[1]
a, b = out.find("stage 0 placement:"), out.find("stage 1 placement:")
assert 0 <= a < b, (a, b)
assert "host" in out[a:b] and "host" in out[b:], "no tier named"
PY
"$strata" train "${shape[@]}" --steps 4 --config "$dir/c3.json" --pipeline-stages 2 --link-gbps 0.01 \
  --log-json "$dir/slow.jsonl" --save-params "$dir/slow.st" >/dev/null
tensors_equal "$dir/free.st" "$dir/slow.st" 28 || fail "--link-gbps changed the parameters"
python3 - "$dir/free.jsonl" "$dir/slow.jsonl" <<'PY' || fail "--link-gbps 0.01 did not slow the steps down"
import json, sys
free, slow = ([json.loads(l)["step_ms"] for l in open(p)] for p in sys.argv[1:])
# Every gather moves a layer of this model (about 50 KB) across a 10 MB/s link: about 95 ms
# a step where the free link takes about 10 (idle 2-core machine). The fastest step after
# the first of each run, and a margin for a machine busy with other tests.
assert min(slow[1:]) > 3 * min(free[1:]), (free, slow)
PY
echo "ok: --explain names each stage's placement in stage order; --link-gbps slows the steps and keeps the bits"

# --trace: every step's F, B and W per stage beside its engine's rows (gathers, NVMe,
# optimizer), one process per stage in one file; under strata launch one file per rank.
out=$("$strata" train "${shape[@]}" --steps 3 --config "$dir/z3.json" --pipeline-stages 2 --schedule zb-h1 \
  --trace "$dir/t.json" 2>&1) || fail "--trace: $out"
grep -q "trace: $dir/t.json" <<<"$out" || fail "no trace notice: $out"
python3 - "$dir/t.json" <<'PY' || fail "--trace: the trace lacks a stage's actions or engine rows"
import collections, json, sys
ev = json.load(open(sys.argv[1]))["traceEvents"]
lanes = {(e["pid"], e["tid"]): e["args"]["name"] for e in ev if e.get("ph") == "M" and e["name"] == "thread_name"}
procs = {e["pid"]: e["args"]["name"] for e in ev if e.get("ph") == "M" and e["name"] == "process_name"}
assert procs == {0: "stage 0", 1: "stage 1"}, procs
count = collections.Counter()
for e in ev:
    if e.get("ph") != "X": continue
    lane = lanes[(e["pid"], e["tid"])]
    kind = e["name"][0] if lane == "compute" and e["name"][0] in "FBW" and e["name"][1:].isdigit() else lane
    count[(e["pid"], kind)] += 1
for st in (0, 1):
    for k in "FBW":
        assert count[(st, k)] == 3 * 8, (st, k, count[(st, k)])  # 3 steps of 8 micro-batches
    for lane in ("send/recv", "gather", "optimizer"):
        assert count[(st, lane)] > 0, (st, lane, count)
    assert any(p == st and "nvme" in k for p, k in count), (st, count)
PY
"$strata" launch -n 4 -- "$strata" train "${shape[@]}" --steps 2 --config "$dir/z3.json" --pipeline-stages 2 \
  --trace "$dir/t4.json" >/dev/null
for r in 0 1 2 3; do
  python3 -c 'import json, sys; assert any(e.get("ph") == "X" for e in json.load(open(sys.argv[1]))["traceEvents"])' \
    "$dir/t4.json.rank$r" || fail "--trace under launch: rank $r's trace is missing or empty"
done
echo "ok: --trace: each stage's F, B, W, send/recv, gathers, NVMe and optimizer rows; one file per rank under launch"

expect_refusal "blocks that do not split" "blocks + 2 is a multiple of 3" "$strata" train "${base[@]}" \
  --pipeline-stages 3 --steps 1
expect_refusal "ranks that do not divide" "does not divide the 3 ranks" "$strata" launch -n 3 -- "$strata" train "${gpt[@]}" \
  --config "$dir/z1.json" --pipeline-stages 2
