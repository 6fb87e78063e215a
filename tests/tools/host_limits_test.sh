#!/usr/bin/env bash
# Runs that cannot fit, and outputs that cannot be written, are refused before training
# starts, in well under a second and without allocating what they would need: a 2.1e9-
# parameter model with its state in host RAM, a teacher matrix larger than the machine, a
# schedule of 4e9 cells; --save-params into a missing directory, --log-json to an
# unwritable place; and a log that fails mid-run (/dev/full) is an error, not exit 0.
set -euo pipefail
strata=$1
fail() { echo "FAIL: $*" >&2; exit 1; }
dir=$(mktemp -d "${STRATA_TEST_TMPDIR:-/var/tmp}/strata-host-limits-test-XXXXXX")
trap 'rm -rf "$dir"' EXIT
cat > "$dir/cpu.json" <<'JSON'
{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "bf16": {"enabled": true},
 "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}},
 "optimizer": {"type": "AdamW", "params": {"lr": 0.001}}}
JSON
cat > "$dir/small.json" <<'JSON'
{"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW", "params": {"lr": 0.001}}}
JSON

# refused CMD... : must fail, within 2 s and 400 MB of peak RSS; prints its one error line.
refused() {
  python3 - "$@" <<'PY'
import resource, subprocess, sys, time
t0 = time.time()
p = subprocess.run(sys.argv[1:], capture_output=True, text=True)
took = time.time() - t0
rss_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
err = [l for l in p.stderr.splitlines() if l.startswith("strata: error:")]
assert p.returncode == 1, (p.returncode, p.stdout[-500:], p.stderr[-500:])
assert len(err) == 1, p.stderr
assert took < 2.0 and rss_mb < 400, (took, rss_mb, err)
assert not any(l.startswith("step") for l in p.stdout.splitlines()), p.stdout
print(f"{took:.2f} s, {rss_mb:.0f} MB peak: {err[0]}")
PY
}

# 8 x 16384 MLP: 2.1e9 parameters, optimizer state and parameters in host RAM.
out=$(refused "$strata" train --model mlp --layers 8 --hidden 16384 --config "$dir/cpu.json" --steps 2 \
  --device-budget 64GiB) || fail "2.1e9-parameter cpu-offload run: $out"
grep -q "host memory: this placement needs .* of host RAM .* but only .* is available" <<<"$out" || fail "$out"
grep -q 'offload_optimizer.device = "nvme"' <<<"$out" || fail "no key to change named: $out"
echo "ok: 2.1e9 parameters on the host refused: $out"

# Two ranks on one host share its RAM: a model whose state fits the machine once (about 70%
# of MemAvailable per rank) is refused for two, by both ranks, before they allocate.
avail=$(awk '/MemAvailable/ {print $2 * 1024}' /proc/meminfo)
h=$(python3 -c "import math; print(int(math.sqrt(0.7 * $avail / 11 / 8)))")
t0=$(date +%s)
if out=$("$strata" launch -n 2 -- "$strata" train --model mlp --layers 8 --hidden "$h" --config "$dir/cpu.json" \
  --steps 1 --device-budget 64GiB 2>&1); then fail "two ranks of 70% of the host's RAM each were accepted"; fi
[ $(($(date +%s) - t0)) -le 3 ] || fail "two ranks on one host: the refusal took over 3 s"
python3 - "$out" <<'PY' || fail "two ranks on one host: $out"
import re, sys
out = sys.argv[1]
rows = re.findall(r"rank (\d): host memory: this placement needs ([\d.]+) GiB of host RAM per rank .*"
                  r"for the 2 ranks on this host, but only ([\d.]+) GiB is available", out)
assert sorted(r[0] for r in rows) == ["0", "1"], out
assert all(float(need) < float(have) < 2 * float(need) for _, need, have in rows), rows
print(f"ok: two local ranks of {rows[0][1]} GiB each refused against {rows[0][2]} GiB available")
PY

out=$(refused "$strata" train --model mlp --layers 1 --hidden 1048576 --config "$dir/small.json" --steps 1 \
  --device-budget 64TiB) || fail "--hidden 1048576: $out"
echo "ok: --hidden 1048576: $out"

out=$(refused "$strata" schedule -p 4096 -m 1048576) || fail "schedule -p 4096 -m 1048576: $out"
grep -q "cells is above" <<<"$out" || fail "$out"
echo "ok: a 4e9-cell schedule refused: $out"

model=(--model mlp --layers 2 --hidden 32 --config "$dir/small.json" --steps 3)
out=$(refused "$strata" train "${model[@]}" --save-params "$dir/missing/p.safetensors") || fail "$out"
grep -q -- "--save-params '$dir/missing/p.safetensors': the directory '$dir/missing' does not exist" <<<"$out" ||
  fail "$out"
out=$(refused "$strata" train "${model[@]}" --log-json "$dir") || fail "$out"
grep -q -- "--log-json '$dir' is a directory" <<<"$out" || fail "$out"
out=$(refused "$strata" train "${model[@]}" --trace "$dir/small.json/trace.json") || fail "$out"  # a file as the directory
echo "ok: outputs checked before training"

if [ -w /dev/full ]; then
  rc=0
  msg=$("$strata" train "${model[@]}" --log-json /dev/full 2>&1) || rc=$?
  [ "$rc" = 1 ] || fail "a log on a full device exited $rc: $msg"
  grep -q -- "--log-json '/dev/full': writing step 1 failed" <<<"$msg" || fail "$msg"
  echo "ok: a full disk under --log-json is an error at the step it happens"
fi
