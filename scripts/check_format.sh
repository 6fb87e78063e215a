#!/usr/bin/env bash
# Checks the C and C++ sources against .clang-format (clang-format 14 from Debian) and the
# 120-column limit. With no argument, every tracked source; with a git revision, only the
# files changed since it (e.g. `scripts/check_format.sh origin/main` before a push).
# Prints each file that clang-format would change and each long line; exit 1 if any.
# Usage: scripts/check_format.sh [REVISION]
set -euo pipefail
command -v clang-format > /dev/null || { echo "check_format: clang-format is missing (scripts/deps.sh installs it)" >&2; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
pattern=('*.cc' '*.h' '*.cu' '*.c')
if [ $# -gt 0 ]; then
  mapfile -t files < <(git diff --name-only --diff-filter=d "$1" -- "${pattern[@]}")
else
  mapfile -t files < <(git ls-files -- "${pattern[@]}")
fi
[ ${#files[@]} -eq 0 ] && { echo "check_format: no sources to check"; exit 0; }
bad=0
for f in "${files[@]}"; do
  if ! clang-format --dry-run -Werror "$f" > /dev/null 2>&1; then
    echo "$f: not formatted: run clang-format -i $f" >&2
    bad=1
  fi
done
if awk 'length > 120 { printf "%s:%d: %d columns (limit 120)\n", FILENAME, FNR, length; found = 1 } END { exit !found }' \
    "${files[@]}" >&2; then
  bad=1
fi
[ $bad -eq 0 ] && echo "check_format: ${#files[@]} files formatted, every line within 120 columns"
exit $bad
