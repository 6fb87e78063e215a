#!/usr/bin/env bash
# Crash consistency of checkpoint saves against power loss, not only SIGKILL: the file
# operations of real `strata train --save-dir` runs are recorded through an LD_PRELOAD
# library (crash_states/record_fs.c), and every state that a crash at any point of them may
# leave on ext4/xfs (the model: crash_states/fs_model.py) is rebuilt and checked with
# `strata checkpoint verify` and, for a sample, `strata train --resume latest`
# (crash_states/replay_crash_states.py): a checkpoint that verifies holds the bytes a commit
# wrote, a commit is never lost once its `latest` is durable or its save has returned, and
# otherwise the refusal is clean. About 1,400 distinct states (the NVMe scenario most), about
# a minute on two cores (each state is a `strata` run: its start-up is what the test costs).
# Scenarios: three saves with --keep 2 (first save, second, a retention removal), written
# synchronously and with --save-async; a resumed run saving step 3 again over the existing
# one (RENAME_EXCHANGE); two saves into a save directory the first one creates; and three
# saves with the optimizer state on NVMe, whose swap files are hard-linked into the
# checkpoint. A commit lost only in posix-order states is printed as a FINDING and fails too.
# Usage: checkpoint_crash_states_test.sh STRATA RECORD_FS_SO
set -euo pipefail
source "$(dirname "$0")/common.sh" "$1" ckpt-states
recorder=$2
replay=$(dirname "$0")/crash_states/replay_crash_states.py
# Under AddressSanitizer or ThreadSanitizer their runtime must be the first library loaded.
asan=$(ldd "$strata" | awk '/lib(asan|tsan)\./ { print $3 }')
dir=$(realpath "$dir")  # the recorder matches paths without following links
mlp="--model mlp --layers 2 --hidden 64 --seed 1 --device host"

# record NAME ROOT ARGS...: runs strata train recording what happens under ROOT.
record() {
  local name=$1 root=$2
  shift 2
  mkdir -p "$root"
  LD_PRELOAD="${asan:+$asan }$recorder" STRATA_FSREC_ROOT="$root" STRATA_FSREC_LOG="$dir/$name.log" \
    "$strata" train $mlp "$@" > "$dir/$name.out" 2>&1 || fail "$name: the run failed: $(tail -5 "$dir/$name.out")"
  [ -s "$dir/$name.log" ] || fail "$name: nothing was recorded under $root (is $recorder preloaded?)"
}
# replay NAME ROOT CONFIG [INITIAL [SAVE]]: every crash state of the recording, checked
# (SAVE: the save directory, under ROOT; default ROOT itself).
replay() {
  /usr/bin/python3 "$replay" --name "$1" --strata "$strata" --log "$dir/$1.log" --root "$2" \
    --initial "${4:-}" --save "${5:-}" --work "$dir/$1.states" --train "$mlp --config $3" || fail "$1: see above"
}

cat > "$dir/cpu.json" <<JSON
{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 0.001}},
 "zero_optimization": {"stage": 1, "offload_optimizer": {"device": "cpu"}}}
JSON
ck="$dir/ck"
record three "$ck" --config "$dir/cpu.json" --steps 3 --save-dir "$ck" --save-every 1 --keep 2
[ "$(ls -d "$ck"/step-* | wc -l)" = 2 ] || fail "three saves with --keep 2 left $(ls "$ck")"
replay three "$ck" "$dir/cpu.json"
# The replay has teeth: the same recording without the fsyncs of `manifest.json.tmp` (a save
# that renames an unsynced manifest into place, then moves `latest` to it) must fail it. (A
# `latest` renamed unsynced no longer does: a torn `latest` falls back to the newest
# complete checkpoint, which is the one it named.)
awk -F'\t' '$1 == "open" { tmp[$2] = ($3 ~ /\/manifest\.json\.tmp$/) } !($1 == "fsync" && tmp[$2])' "$dir/three.log" \
  > "$dir/unsynced.log"
cp "$dir/three.log.data" "$dir/unsynced.log.data"
[ "$(wc -l < "$dir/unsynced.log")" -lt "$(wc -l < "$dir/three.log")" ] || fail "no fsync of manifest.json.tmp was recorded"
out=$(replay unsynced "$ck" "$dir/cpu.json" 2>&1) && fail "a save renaming an unsynced manifest.json.tmp passed: $out"
grep -q "FAIL: step [0-9] must survive" <<<"$out" || fail "unsynced manifest.json.tmp: unclear: $out"
echo "a recording without the fsyncs of manifest.json.tmp fails the replay ($(grep -o 'FAIL: step [0-9] must survive' <<<"$out" | head -1 | cut -c7-))"

# The same with --save-async: a writer thread writes the shard file, the commit comes later.
record async "$dir/ck-async" --config "$dir/cpu.json" --steps 3 --save-dir "$dir/ck-async" --save-every 1 --keep 2 \
  --save-async
replay async "$dir/ck-async" "$dir/cpu.json"

# Step 3 saved again by a run resumed from step 2: the new step-3 is exchanged with the old.
cp -a "$ck" "$dir/before-resave"
record resave "$ck" --config "$dir/cpu.json" --steps 3 --resume "$ck/step-00000002" --save-dir "$ck" \
  --save-every 1 --keep 2
grep -q "^rename.*step-00000003	2$" "$dir/resave.log" || fail "resave: no RENAME_EXCHANGE was recorded"
replay resave "$ck" "$dir/cpu.json" "$dir/before-resave"

# The first save creates the save directory: recorded from its parent, so that losing the
# directory itself is a crash state too.
mkdir -p "$dir/fresh"
record fresh "$dir/fresh" --config "$dir/cpu.json" --steps 2 --save-dir "$dir/fresh/ck" --save-every 1 --keep 2
replay fresh "$dir/fresh" "$dir/cpu.json" "" ck

cat > "$dir/nvme.json" <<JSON
{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 0.001}},
 "zero_optimization": {"stage": 1, "offload_optimizer": {"device": "nvme", "nvme_path": "$dir/nvme"}}}
JSON
mkdir -p "$dir/nvme"
record nvme "$dir/ck-nvme" --config "$dir/nvme.json" --steps 3 --save-dir "$dir/ck-nvme" --save-every 1 --keep 2
grep -q "^link" "$dir/nvme.log" || fail "nvme: no swap file was hard-linked into the checkpoint"
replay nvme "$dir/ck-nvme" "$dir/nvme.json"
