#!/usr/bin/env bash
# Runs a PyTorch oracle (gpt_oracle_test.py, or --script NAME) with Debian's python3 (where python3-torch installs); exit 77 (skipped)
# when torch is not importable, with the reason.
set -euo pipefail
py=/usr/bin/python3
if ! "$py" -c "import torch" 2>/dev/null; then
  echo "SKIP: $py cannot import torch: install python3-torch (scripts/test.sh does)"
  exit 77
fi
script=gpt_oracle_test.py
if [ "${1:-}" = "--script" ]; then
  script=$2
  shift 2
fi
exec "$py" "$(dirname "$0")/$script" "$@"
