#!/usr/bin/env bash
# scripts/check_format.sh passes on the repository, and in a scratch repository fails naming
# a file clang-format would change and a line over 120 columns.
# Usage: check_format_test.sh REPO_ROOT
set -euo pipefail
root=$1
fail() { echo "FAIL: $*" >&2; exit 1; }
command -v clang-format > /dev/null || { echo "SKIPPED: clang-format missing (scripts/deps.sh installs it)"; exit 77; }
"$root/scripts/check_format.sh" || fail "the repository's sources are not formatted"

dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
mkdir -p "$dir/scripts"
cp "$root/.clang-format" "$dir/"
cp "$root/scripts/check_format.sh" "$dir/scripts/"
printf 'int f( int x ){return x;}\n' > "$dir/messy.cc"
printf '// %0130d\nint g() { return 0; }\n' 0 > "$dir/long.cc"
printf 'int h() { return 0; }\n' > "$dir/clean.cc"
(cd "$dir" && git init -q && git add . && git -c user.email=t@t -c user.name=t commit -qm scratch)
out=$("$dir/scripts/check_format.sh" 2>&1) && fail "a messy file passed"
grep -q "messy.cc: not formatted" <<<"$out" || fail "unnamed: $out"
grep -q "long.cc:1: 133 columns" <<<"$out" || fail "long line not named: $out"
grep -q "clean.cc" <<<"$out" && fail "a clean file was named: $out"
echo "format: the repository passes; a messy file and a long line are named"
