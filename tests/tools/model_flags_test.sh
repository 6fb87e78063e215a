#!/usr/bin/env bash
# A model's own flags given with the other model (--heads, --data, --sample or --unit-scaled
# with the MLP; --hidden or --layer-ms with the GPT) are refused by `strata train`, `strata
# estimate` and `strata plan`, naming the flag and the model that takes it, before anything
# runs: ignored, they would train or size another model than the one asked for. The same
# flags with their own model are accepted (one step each, so the check can fail both ways).
# The --help of the three names example configs that exist in the source tree and are read
# by `strata estimate` without an error.
set -euo pipefail
strata=$1
fail() { echo "FAIL: $*" >&2; exit 1; }
dir=$(mktemp -d "${STRATA_TEST_TMPDIR:-/var/tmp}/strata-model-flags-test-XXXXXX")
trap 'rm -rf "$dir"' EXIT
expect_refusal() {  # FLAG OWNER COMMAND...: refused, naming FLAG and --model OWNER
  local flag=$1 owner=$2
  shift 2
  local out
  if out=$("$@" 2>&1); then fail "$flag accepted for the other model: $*"; fi
  grep -q -- "$flag applies to --model $owner only" <<<"$out" || fail "the refusal does not name $flag: $out"
}
echo '{"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW", "params": {"lr": 0.001}}}' > "$dir/ds.json"
printf 'the quick brown fox jumps over the lazy dog. %.0s' $(seq 64) > "$dir/text.txt"
mlp=(--model mlp --layers 2 --hidden 8 --config "$dir/ds.json" --steps 1)
gpt=(--model gpt --layers 1 --d-model 16 --heads 2 --seq-len 16 --data "$dir/text.txt" --config "$dir/ds.json"
  --steps 1)

for flag in "--heads 2" "--d-model 16" "--seq-len 8" "--preset tiny" "--vocab 256" "--positions 8" "--remat always" \
  "--unit-scaled" "--data $dir/text.txt" "--data-format bytes" "--val-fraction 0.2" "--eval-every 1" \
  "--eval-batches 2" "--sample 4"; do
  # shellcheck disable=SC2086  # the flag and its value are two words
  expect_refusal "${flag%% *}" gpt "$strata" train "${mlp[@]}" $flag
done
for flag in "--hidden 8" "--layer-ms 1"; do
  # shellcheck disable=SC2086
  expect_refusal "${flag%% *}" mlp "$strata" train "${gpt[@]}" $flag
done
expect_refusal --hidden mlp "$strata" train "${gpt[@]}" --hidden 8 --pipeline-stages 1
expect_refusal --heads gpt "$strata" estimate --model mlp --heads 2 --config "$dir/ds.json"
expect_refusal --hidden mlp "$strata" plan --model gpt --hidden 8 --budget device=1GiB,host=1GiB
echo "ok: 19 flags of the other model refused"

# Their own model takes them.
out=$("$strata" train "${mlp[@]}" --layer-ms 0 2>&1) || fail "the MLP refused its own flags: $out"
out=$("$strata" train "${gpt[@]}" --vocab 256 --remat always --eval-every 1 --eval-batches 1 --sample 4 2>&1) ||
  fail "the GPT refused its own flags: $out"
grep -q "^sample (4 bytes):" <<<"$out" || fail "no sample: $out"

root="$(dirname "$0")/../.."
for command in train estimate plan; do
  help=$("$strata" "$command" --help 2>&1)
  grep -q "scripts/configs/" <<<"$help" || fail "strata $command --help names no example config"
  for name in $(grep -o '[a-z0-9-]*\.json:' <<<"$help" | tr -d :); do
    [ -f "$root/scripts/configs/$name" ] || fail "strata $command --help names scripts/configs/$name, which is missing"
    out=$("$strata" estimate --model mlp --layers 2 --hidden 64 --config "$root/scripts/configs/$name" 2>&1) ||
      fail "the example config $name does not estimate: $out"
  done
done
echo "ok: the help of train, estimate and plan names example configs that are read"
echo "PASS"
