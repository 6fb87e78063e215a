#!/usr/bin/env bash
# Checkpoints that `strata train` once lost, could not make or resumed into nothing:
#  - a --save-dir inside nvme_path/rank0: the next run's cleanup of a dead run's swap files
#    left the checkpoint's linked optimizer state alone, and it resumes;
#  - NVMe state on another filesystem than the checkpoints (/dev/shm here): copied, verified,
#    resumed (link() and copy_file_range() both refuse to cross filesystems);
#  - a second run on the same --save-dir is refused naming the first one, whose checkpoints
#    stay intact;
#  - a save whose linked NVMe state the filesystem could not rewrite is refused naming the
#    bytes, on a small tmpfs in a private mount namespace (skipped where none can be made).
set -euo pipefail
source "$(dirname "$0")/common.sh" "$1" ckpt-guard
mlp=(--model mlp --layers 2 --hidden 384 --seed 1 --device host)
config() {  # config FILE NVME_PATH: stage 2, optimizer state on NVMe
  cat > "$1" <<JSON
{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 0.001}},
 "zero_optimization": {"stage": 2, "sub_group_size": 100000,
   "offload_optimizer": {"device": "nvme", "nvme_path": "$2"}}}
JSON
}

# A checkpoint inside the swap directory, resumed by the next run on the same nvme_path.
config "$dir/inside.json" "$dir/nvme"
"$strata" train "${mlp[@]}" --config "$dir/inside.json" --steps 2 --save-dir "$dir/nvme/rank0/ck" > "$dir/a.log" 2>&1 ||
  fail "the first run failed: $(tail -3 "$dir/a.log")"
ls "$dir"/nvme/rank0/ck/step-*/*.swap > /dev/null || fail "the checkpoint links no swap files"
"$strata" train "${mlp[@]}" --config "$dir/inside.json" --steps 3 --resume "$dir/nvme/rank0/ck" > "$dir/b.log" 2>&1 ||
  fail "resuming a checkpoint saved inside nvme_path failed: $(tail -3 "$dir/b.log")"
"$strata" checkpoint verify "$dir/nvme/rank0/ck" > /dev/null || fail "the checkpoint inside nvme_path does not verify"
echo "ok: a checkpoint inside nvme_path/rank0 survives the next run's cleanup and resumes"
# [regression] --steps at or below the resumed step trained nothing and exited 0.
expect_refusal "--steps at the resumed checkpoint's step" "has trained 2 steps already, so the run would train nothing" \
  "$strata" train "${mlp[@]}" --config "$dir/inside.json" --steps 2 --resume "$dir/nvme/rank0/ck"

# NVMe state on /dev/shm (tmpfs), checkpoints on this filesystem.
if [ -d /dev/shm ] && [ "$(stat -f -c %T /dev/shm)" != "$(stat -f -c %T "$dir")" ]; then
  shm=$(mktemp -d /dev/shm/strata-ckpt-guard-XXXXXX)
  trap 'rm -rf "$dir" "$shm"' EXIT
  config "$dir/shm.json" "$shm"
  out=$("$strata" train "${mlp[@]}" --config "$dir/shm.json" --steps 2 --save-dir "$dir/across" 2>&1) ||
    fail "a save across filesystems failed: $out"
  "$strata" checkpoint verify "$dir/across" > /dev/null || fail "the copied checkpoint does not verify"
  "$strata" train "${mlp[@]}" --config "$dir/shm.json" --steps 3 --resume "$dir/across" > /dev/null 2>&1 ||
    fail "the copied checkpoint does not resume"
  echo "ok: NVMe state on $(stat -f -c %T "$shm") is copied into a checkpoint on $(stat -f -c %T "$dir"), verified, resumed"
else
  echo "skipped: no /dev/shm on another filesystem type"
fi

# Two runs, one --save-dir.
config "$dir/two.json" "$dir/nvme-first"
"$strata" train "${mlp[@]}" --config "$dir/two.json" --steps 1000000 --save-dir "$dir/shared" --save-every 1 \
  > "$dir/first.log" 2>&1 &
first=$!
trap 'kill "$first" 2> /dev/null || true; rm -rf "$dir" "${shm:-}"' EXIT  # never left training on a failure
for _ in $(seq 1 1200); do [ -f "$dir/shared/latest" ] && break; sleep 0.1; done
[ -f "$dir/shared/latest" ] || fail "the first run saved nothing: $(tail -3 "$dir/first.log")"
config "$dir/second.json" "$dir/nvme-second"
expect_refusal "a second run on the same --save-dir" "is in use by pid $first" \
  "$strata" train "${mlp[@]}" --config "$dir/second.json" --steps 2 --save-dir "$dir/shared" --save-every 1
kill -INT "$first"
wait "$first" || true
trap 'rm -rf "$dir" "${shm:-}"' EXIT
"$strata" checkpoint verify "$dir/shared" > /dev/null || fail "the first run's checkpoint does not verify"
echo "ok: the first run's checkpoints verify"

# No room for the rewrite of linked state: a 12 MiB tmpfs holds both generations of the
# 4.2 MB of optimizer state (8.4 MB of swap files) and less than one more.
if unshare -m --propagation private true 2> /dev/null; then
  mkdir -p "$dir/small"
  config "$dir/small.json" "$dir/small/nvme"
  out=$(unshare -m --propagation private bash -c 'mount -t tmpfs -o size=12m strata-small "$1" && shift && "$@"' _ \
    "$dir/small" "$strata" train "${mlp[@]}" --config "$dir/small.json" --steps 3 --save-dir "$dir/small/ck" \
    --save-every 1 2>&1) && fail "a save with no room to rewrite its linked state succeeded: $out"
  grep -q "would hard-link .* of NVMe optimizer state that training rewrites.* is free: free space there, keep fewer checkpoints" \
    <<<"$out" || fail "unclear: $out"
  echo "ok: refused: $(grep -o 'would hard-link [^,]*' <<<"$out" | head -1)"
  # 20 MiB: room for one rewrite. Saving every other step with --keep 1, each save but the
  # first finds less free than it links, and is accepted for what retention frees.
  out=$(unshare -m --propagation private bash -c 'mount -t tmpfs -o size=20m strata-room "$1" && shift && "$@"' _ \
    "$dir/small" "$strata" train "${mlp[@]}" --config "$dir/small.json" --steps 8 --save-dir "$dir/small/ck" \
    --save-every 2 --keep 1 2>&1) || fail "a run with room for one rewrite and --keep 1 failed: $out"
  echo "ok: with room for one rewrite and --keep 1, it saves every other step for 8 steps"
  # [regression] Saves on consecutive steps with every checkpoint kept: the second save also
  # keeps the first one's files from being reused, so both generations need a rewrite. It is
  # refused at that save; before, it passed and step 4 died of ENOSPC in the swapper.
  out=$(unshare -m --propagation private bash -c 'mount -t tmpfs -o size=20m strata-room "$1" && shift && "$@"' _ \
    "$dir/small" "$strata" train "${mlp[@]}" --config "$dir/small.json" --steps 4 --save-dir "$dir/small/ck" \
    --save-every 1 2>&1) && fail "two consecutive linked saves without room for both rewrites passed: $out"
  grep -q "the checkpoint in .* would hard-link .* then need .* more on the filesystem" <<<"$out" || fail "unclear: $out"
  echo "ok: consecutive saves refused at the second: $(grep -o 'need [0-9.]* MiB more[^,]*, and only [0-9.]* MiB is free' <<<"$out" | head -1)"
else
  echo "skipped: cannot make a private mount namespace here"
fi
