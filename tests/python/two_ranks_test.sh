#!/usr/bin/env bash
# strata.torch at world 2 (`strata launch -n 2 -- python3 ...`), a frozen layer among trainable
# ones: both ranks end with the same parameters, ZeRO stages 0, 1, 2 and 3 give the same bits,
# rank 0's edit inside gathered_parameters(modifier_rank=0) reaches both ranks, and
# save_pretrained writes one directory from rank 0.
set -euo pipefail
strata=$1 lib=$2 pkg=$3
source "$(dirname "$0")/common.sh"
export STRATA_LIBRARY=$lib PYTHONPATH=$pkg
out_dir=$(mktemp -d "${STRATA_TEST_TMPDIR:-/var/tmp}/strata-two-ranks-XXXXXX")
trap 'rm -rf "$out_dir"' EXIT
ref=""
for stage in 0 1 2 3; do
  out=$("$strata" launch -n 2 -- "$py" "$(dirname "$0")/two_ranks.py" "$stage" "$out_dir")
  echo "stage $stage: $out"
  [ "$(grep -c "edit reached" <<<"$out")" = 2 ] || { echo "FAIL: stage $stage: rank 0's edit did not reach both ranks" >&2; exit 1; }
  [ -f "$out_dir/stage$stage/model.safetensors" ] && [ -f "$out_dir/stage$stage/config.json" ] \
    || { echo "FAIL: stage $stage: save_pretrained wrote no directory" >&2; exit 1; }
  hashes=$(sed -n 's/.*of 2: //p' <<<"$out" | sort -u)
  [ "$(wc -l <<<"$hashes")" = 1 ] && [ -n "$hashes" ] || { echo "FAIL: stage $stage: ranks differ" >&2; exit 1; }
  [ -z "$ref" ] && ref=$hashes
  [ "$hashes" = "$ref" ] || { echo "FAIL: stage $stage differs from stage 0" >&2; exit 1; }
done
echo "1 passed, 0 failed"
