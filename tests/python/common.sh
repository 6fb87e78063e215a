# Sourced by the Python test scripts: $py, Debian's python3 (python3-torch installs there),
# and exit 77 (skipped, with the reason) when it cannot import torch.
py=/usr/bin/python3
if ! "$py" -c "import torch" 2>/dev/null; then
  echo "SKIPPED: $py cannot import torch: install python3-torch (scripts/test.sh does)"
  exit 77
fi
