# Sourced by the CLI test scripts: `fail`, and the io_uring check that skips (exit 77) where
# the kernel does not offer it; then $dir, a scratch directory removed on exit.
# Usage: source common.sh STRATA NAME
strata=$1
fail() { echo "FAIL: $*" >&2; exit 1; }

if ! "$strata" info --json | python3 -c 'import json, sys; sys.exit(0 if json.load(sys.stdin)["io_uring"]["available"] else 1)'; then
  echo "SKIPPED: io_uring unavailable here (see strata info)"
  exit 77
fi
dir=$(mktemp -d "${STRATA_TEST_TMPDIR:-/var/tmp}/strata-$2-test-XXXXXX")
trap 'rm -rf "$dir"' EXIT
