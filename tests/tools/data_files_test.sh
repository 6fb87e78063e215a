#!/usr/bin/env bash
# `strata train --data` reads regular files only: a FIFO (which blocked the open forever) and
# a link to /dev/zero (which grew until memory ran out) are refused by name within seconds;
# a directory holding FIFOs, a device link, a broken link and a subdirectory beside its text
# trains on the text and says what it skipped in ONE warning line that counts them.
set -euo pipefail
strata=$1
fail() { echo "FAIL: $*" >&2; exit 1; }
dir=$(mktemp -d "${STRATA_TEST_TMPDIR:-/var/tmp}/strata-data-files-test-XXXXXX")
trap 'rm -rf "$dir"' EXIT
echo '{"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW", "params": {"lr": 0.001}}}' > "$dir/ds.json"
gpt=(--model gpt --layers 1 --d-model 16 --heads 2 --seq-len 16 --config "$dir/ds.json" --steps 1 --device host)

mkfifo "$dir/fifo"
ln -s /dev/zero "$dir/zero"
for c in "fifo:is a FIFO, not a regular file" "zero:is a character device, not a regular file"; do
  set +e
  out=$(timeout 60 "$strata" train "${gpt[@]}" --data "$dir/${c%%:*}" 2>&1)
  rc=$?
  set -e
  [ "$rc" != 124 ] || fail "--data ${c%%:*} hung (killed after 60 s)"
  [ "$rc" != 0 ] || fail "--data ${c%%:*} was accepted: $out"
  grep -qF -- "--data '$dir/${c%%:*}' ${c#*:}" <<<"$out" || fail "unclear refusal of ${c%%:*}: $out"
  echo "ok: --data ${c%%:*} refused (exit $rc)"
done

mkdir "$dir/in" "$dir/in/sub"
printf 'the quick brown fox jumps over the lazy dog. %.0s' $(seq 64) > "$dir/in/a.txt"
for i in 1 2 3 4 5; do mkfifo "$dir/in/f$i"; done
ln -s /dev/zero "$dir/in/zero"
ln -s "$dir/in/gone" "$dir/in/broken"
out=$(timeout 120 "$strata" train "${gpt[@]}" --data "$dir/in" 2>&1) || fail "a directory with FIFOs did not train: $out"
grep -q "from 1 file" <<<"$out" || fail "the text file was not read alone: $out"
[ "$(grep -c "skipped" <<<"$out")" = 1 ] || fail "not one warning line for the skipped entries: $out"
grep -qF -- "--data '$dir/in': skipped 8 of its 9 entries: 8 not regular files (directories" <<<"$out" ||
  fail "the warning does not count the skipped entries: $out"
echo "ok: a directory's 8 entries that are not regular files skipped with one warning"
