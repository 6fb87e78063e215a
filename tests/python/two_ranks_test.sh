#!/usr/bin/env bash
# strata.torch at world 2 (`strata launch -n 2 -- python3 ...`): both ranks end with the same
# parameters, and ZeRO stages 0, 1, 2 and 3 give the same bits.
set -euo pipefail
strata=$1 lib=$2 pkg=$3
source "$(dirname "$0")/common.sh"
export STRATA_LIBRARY=$lib PYTHONPATH=$pkg
ref=""
for stage in 0 1 2 3; do
  out=$("$strata" launch -n 2 -- "$py" "$(dirname "$0")/two_ranks.py" "$stage")
  echo "stage $stage: $out"
  hashes=$(sed -n 's/.*of 2: //p' <<<"$out" | sort -u)
  [ "$(wc -l <<<"$hashes")" = 1 ] && [ -n "$hashes" ] || { echo "FAIL: stage $stage: ranks differ" >&2; exit 1; }
  [ -z "$ref" ] && ref=$hashes
  [ "$hashes" = "$ref" ] || { echo "FAIL: stage $stage differs from stage 0" >&2; exit 1; }
done
echo "1 passed, 0 failed"
