#!/usr/bin/env bash
# The layering check (scripts/check_layers.py) passes on the repository and fails, naming the
# file and line, when an upward include, a sibling include or another folder's detail/ is
# added to a copy of it, and when a source file or an include lies in a folder no line of
# scripts/layers.txt names (a new top-level folder, a new runtime/ subfolder); and
# scripts/architecture_counts.py reads the tree.
# Usage: check_layers_test.sh REPO_ROOT
set -euo pipefail
root=$1
fail() { echo "FAIL: $*" >&2; exit 1; }
python3 "$root/scripts/check_layers.py" "$root" || fail "the repository breaks its own layer order"

dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
copy() {
  rm -rf "$dir/repo" && mkdir -p "$dir/repo"
  (cd "$root" && tar cf - scripts/layers.txt scripts/check_layers.py runtime io optim offload pipeline engine models \
    train tools) | tar xf - -C "$dir/repo"
}
expect_refusal() {  # FILE INCLUDE MESSAGE
  copy
  printf '#include "%s"\n' "$2" >> "$dir/repo/$1"
  local lines
  lines=$(wc -l < "$dir/repo/$1")
  out=$(python3 "$dir/repo/scripts/check_layers.py" "$dir/repo" 2>&1) && fail "$1 including $2 passed the check"
  grep -q "^$1:$lines: includes $2: $3" <<<"$out" || fail "unclear refusal of $1 -> $2: $out"
}
expect_refusal runtime/core/dtype.h engine/engine.h "engine is above runtime/core"
expect_refusal io/file.h runtime/core/error.h "runtime/core and io are on one line"
expect_refusal optim/adam.h offload/placement.h "offload and optim are on one line"
expect_refusal models/mlp.h runtime/comm/detail/work.h "another folder's detail/"
expect_refusal models/mlp.h train/trainer.h "train is above models"
# A folder no line names: its files and the includes that reach it are refused by name.
copy
mkdir -p "$dir/repo/serve" "$dir/repo/runtime/extra"
echo '#pragma once' > "$dir/repo/serve/loop.h"
echo '#pragma once' > "$dir/repo/runtime/extra/thing.h"
printf '#include "serve/loop.h"\n' >> "$dir/repo/engine/engine.h"
out=$(python3 "$dir/repo/scripts/check_layers.py" "$dir/repo" 2>&1) && fail "a folder on no line passed the check"
for want in "serve/loop.h: its folder is on no line of scripts/layers.txt" \
  "runtime/extra/thing.h: its folder is on no line" "includes serve/loop.h: a folder on no line"; do
  grep -q "$want" <<<"$out" || fail "no refusal '$want': $out"
done
echo "layering: the repository passes; upward, sibling and detail/ includes and unlisted folders are refused"
# scripts/architecture_counts.py (the counts the architecture is measured by) reads this tree:
# every engine part with a Context, Engine::Impl's members, and the functions over 120 lines.
counts=$(/usr/bin/python3 "$root/scripts/architecture_counts.py" --json "$root") || fail "architecture_counts.py failed"
/usr/bin/python3 - "$counts" <<'PY' || fail "architecture_counts.py: $counts"
import json, sys
c = json.loads(sys.argv[1])
assert {"OptimizerStep", "GradReducer", "ParamHomes", "PlacementPlan"} <= set(c["parts"]), c["parts"].keys()
assert c["parts"]["OptimizerStep"]["lines"] > 0 and c["impl"]["members"] > 0, c
assert all(" lines: " in f for f in c["functions"]) and c["sizes"]["library files"] > 100, c
PY
echo "architecture counts: read"
