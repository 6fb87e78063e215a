#!/usr/bin/env bash
# Runs a tokenizer reference test (SCRIPT STRATA TOKENIZER_DECODE WORKDIR) with Debian's
# python3, after checking that the Python modules it compares against import; exit 77
# (skipped, with the reason) when one does not.
set -euo pipefail
script=$1
module=$2
shift 2
py=/usr/bin/python3
if ! "$py" -c "import $module" 2>/dev/null; then
  echo "SKIP: $py cannot import $module: install python3-$module (scripts/test.sh does)"
  exit 77
fi
exec "$py" "$(dirname "$0")/$script" "$@"
