# Sourced by the CLI test scripts: `fail`, and the io_uring check that skips (exit 77) where
# the kernel does not offer it; then $dir, a scratch directory removed on exit.
# Usage: source common.sh STRATA NAME
strata=$1
fail() { echo "FAIL: $*" >&2; exit 1; }
# expect_refusal WHAT MESSAGE COMMAND...: COMMAND fails and its output says MESSAGE.
expect_refusal() {
  local what=$1 want=$2
  shift 2
  local out
  if out=$("$@" 2>&1); then fail "$what: accepted"; fi
  grep -q -- "$want" <<<"$out" || fail "$what: the error does not say '$want': $out"
  echo "ok: refused $what"
}
# tensors_equal A.safetensors B.safetensors [COUNT]: the same tensor names, shapes and bytes
# (the metadata, which names the run, is not compared), COUNT tensors if given.
tensors_equal() {
  python3 - "$@" <<'PY'
import json, struct, sys
def load(p):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n]); h.pop("__metadata__", None)
    return {k: (v["shape"], b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]) for k, v in h.items()}
a, b = load(sys.argv[1]), load(sys.argv[2])
sys.exit(0 if a == b and len(a) > 0 and (len(sys.argv) < 4 or len(a) == int(sys.argv[3])) else 1)
PY
}

if ! "$strata" info --json | python3 -c 'import json, sys; sys.exit(0 if json.load(sys.stdin)["io_uring"]["available"] else 1)'; then
  echo "SKIPPED: io_uring unavailable here (see strata info)"
  exit 77
fi
dir=$(mktemp -d "${STRATA_TEST_TMPDIR:-/var/tmp}/strata-$2-test-XXXXXX")
trap 'rm -rf "$dir"' EXIT
