#!/usr/bin/env bash
# Crash safety of checkpoints. 50 times, a run that saves after every step is killed with
# SIGKILL at a random moment and resumed from `latest` by the next one; after every kill
# the checkpoint `latest` names verifies (every chunk against its XXH3) and loads (a
# one-step resume runs), and the step it names never goes back; at the end the chain of
# killed and resumed runs has the bits of one uninterrupted run. Enough kills must land
# inside a save (its staging directory is left behind) for the test to mean anything.
# Then the damage cases: a flipped byte and a truncated shard file are errors naming the
# file, chunk and tensor (verify and resume alike), a directory without its manifest is
# not a checkpoint, and a full disk during a save fails it clearly and leaves the previous
# checkpoint latest and intact.
set -euo pipefail
source "$(dirname "$0")/common.sh" "$1" ckpt-crash
mlp=(--model mlp --layers 4 --hidden 384 --seed 1 --device host)
cat > "$dir/c.json" <<JSON
{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 0.001}},
 "zero_optimization": {"stage": 1, "offload_optimizer": {"device": "cpu"}}}
JSON
ck="$dir/ck"
latest_step() { [ -f "$ck/latest" ] && sed 's/step-0*//' "$ck/latest" | sed 's/^$/0/' || echo 0; }

kills=50 mid_save=0 last=0
RANDOM=7
for i in $(seq 1 "$kills"); do
  resume=()
  [ -f "$ck/latest" ] && resume=(--resume latest)
  [ $((i % 2)) = 0 ] && resume+=(--save-async)
  "$strata" train "${mlp[@]}" --config "$dir/c.json" --steps 1000000 --save-dir "$ck" --save-every 1 --keep 2 \
    "${resume[@]}" > "$dir/run.log" 2>&1 &
  pid=$!
  sleep "0.$(printf '%03d' $((RANDOM % 1000)))"
  kill -9 "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  compgen -G "$ck/.step-*.tmp" > /dev/null && mid_save=$((mid_save + 1))
  [ -f "$ck/latest" ] || continue
  "$strata" checkpoint verify "$ck" > "$dir/verify.log" 2>&1 || fail "kill $i: latest does not verify: $(cat "$dir/verify.log")"
  step=$(latest_step)
  [ "$step" -ge "$last" ] || fail "kill $i: latest went back from step $last to $step"
  last=$step
  "$strata" train "${mlp[@]}" --config "$dir/c.json" --steps $((step + 1)) --resume "$ck" > "$dir/load.log" 2>&1 ||
    fail "kill $i: latest (step $step) does not load: $(tail -3 "$dir/load.log")"
done
[ "$last" -gt 0 ] || fail "no checkpoint was ever committed"
[ "$mid_save" -ge 10 ] || fail "only $mid_save of $kills kills landed inside a save"
echo "$kills SIGKILLs ($mid_save inside a save): latest always verified and loaded; it reached step $last"
# The chain of killed and resumed runs, taken 3 steps further, has the bits of one run.
end=$((last + 3))
"$strata" train "${mlp[@]}" --config "$dir/c.json" --steps $end --resume "$ck" --save-params "$dir/chain.st" > /dev/null
"$strata" train "${mlp[@]}" --config "$dir/c.json" --steps $end --save-params "$dir/straight.st" > /dev/null
tensors_equal "$dir/chain.st" "$dir/straight.st" || fail "after $kills kills and resumes, step $end differs from one run's"
echo "step $end after $kills kills and resumes: the same parameter bytes as one uninterrupted run"

# Damage. A fresh checkpoint to break in copies.
"$strata" train "${mlp[@]}" --config "$dir/c.json" --steps 2 --save-dir "$dir/good" > /dev/null
step_dir=$(ls -d "$dir"/good/step-*)
cp -r "$step_dir" "$dir/flip"
python3 - "$dir/flip/rank00000.bin" <<'PY'
import sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
b[3 * (1 << 20) + 12345] ^= 0x10
open(p, "wb").write(b)
PY
out=$("$strata" checkpoint verify "$dir/flip" 2>&1) && fail "a flipped byte verified"
grep -q "rank00000.bin chunk 3 (bytes 3145728-4194304) fails its XXH3 checksum.*the chunk holds 'layers\." <<<"$out" ||
  fail "unclear: $out"
out=$("$strata" train "${mlp[@]}" --config "$dir/c.json" --steps 3 --resume "$dir/flip" 2>&1) && fail "a flipped byte loaded"
grep -q "rank00000.bin chunk 3 .* fails its XXH3 checksum while reading tensor 'layers\." <<<"$out" || fail "unclear: $out"
cp -r "$step_dir" "$dir/short"
truncate -s 100000 "$dir/short/rank00000.bin"
out=$("$strata" checkpoint verify "$dir/short" 2>&1) && fail "a truncated file verified"
grep -q "rank00000.bin holds 100000 bytes but the manifest says" <<<"$out" || fail "unclear: $out"
cp -r "$step_dir" "$dir/step-00000009"
rm "$dir/step-00000009/manifest.json"
out=$("$strata" checkpoint verify "$dir/step-00000009" 2>&1) && fail "a directory without its manifest verified"
grep -q "has no manifest.json: the save that wrote it did not complete" <<<"$out" || fail "unclear: $out"
echo "damage: a flipped byte and a truncated file are named (file, chunk, tensor); no manifest, no checkpoint"

# A full disk (a file-size limit below one shard file) during the save of step 4.
bytes=$(stat -c %s "$step_dir/rank00000.bin")
out=$(trap '' XFSZ; ulimit -f $((bytes / 2048)); "$strata" train "${mlp[@]}" --config "$dir/c.json" --steps 4 \
  --save-dir "$dir/good" --resume latest 2>&1) && fail "a save onto a full disk succeeded"
grep -q "checkpoint shard '.*rank00000.bin': writing .* failed: .*(a full disk?" <<<"$out" || fail "unclear: $out"
[ "$(cat "$dir/good/latest")" = "$(basename "$step_dir")" ] || fail "latest moved after a failed save"
"$strata" checkpoint verify "$dir/good" > /dev/null || fail "the previous checkpoint is damaged after a failed save"
compgen -G "$dir/good/.step-*" > /dev/null && fail "the failed save left its staging directory"
echo "full disk: the save fails naming the file, latest stays at $(cat "$dir/good/latest") and verifies"
