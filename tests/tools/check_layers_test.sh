#!/usr/bin/env bash
# The layering check (scripts/check_layers.py) passes on the repository and fails, naming the
# file and line, when an upward include, a sibling include or another folder's detail/ is
# added to a copy of it.
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
    tools) | tar xf - -C "$dir/repo"
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
echo "layering: the repository passes; upward, sibling and detail/ includes are refused"
