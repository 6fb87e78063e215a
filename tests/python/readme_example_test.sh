#!/usr/bin/env bash
# Runs the README's Python example (the ```python block under "## Train from PyTorch") as a
# user would, with Debian's python3; exit 77 (skipped) where torch is missing.
set -euo pipefail
readme=$1 lib=$2 pkg=$3
source "$(dirname "$0")/common.sh"
dir=$(mktemp -d "${STRATA_TEST_TMPDIR:-/var/tmp}/strata-readme-XXXXXX")
trap 'rm -rf "$dir"' EXIT
awk '/^## Train from PyTorch/ {in_section = 1} in_section && /^```python/ {grab = 1; next} grab && /^```/ {exit} grab' \
  "$readme" > "$dir/example.py"
[ -s "$dir/example.py" ] || { echo "FAIL: no python block under '## Train from PyTorch' in $readme" >&2; exit 1; }
cd "$dir"
out=$(STRATA_LIBRARY=$lib PYTHONPATH=$pkg "$py" example.py)
echo "$out"
grep -q "^step 20 loss" <<<"$out" || { echo "FAIL: the example did not train 20 steps" >&2; exit 1; }
[ -f ckpt/latest ] || { echo "FAIL: the example saved no checkpoint" >&2; exit 1; }
echo "1 passed, 0 failed"
