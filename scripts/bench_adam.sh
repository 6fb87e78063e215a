#!/usr/bin/env bash
# Runs `strata bench adam` several times and prints the median of each figure: the machines
# are shared and noisy, and one run's median of --iters is not enough to quote.
#   scripts/bench_adam.sh [RUNS] [strata bench adam options...]
#   scripts/bench_adam.sh 5 --params 256M --copy-out bf16 --threads 2 --iters 7
set -euo pipefail
runs=${1:-5}
shift || true
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${STRATA_BIN:-$root/build/bin/strata}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for _ in $(seq "$runs"); do
  "$bin" bench adam "$@" --json | tr -d '\n' >>"$out"
  echo >>"$out"
done
/usr/bin/python3 - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
keys = ["gparams_per_s", "gbps", "roofline_gbps", "fraction_of_roofline", "grad_norm_gbps", "step_ms", "roofline_ms"]
first = rows[0]
print(json.dumps({"runs": len(rows), **{k: first[k] for k in ("optimizer", "params", "grad_dtype", "state_dtype",
      "copy_out", "threads", "iters", "isa", "bytes_per_param")},
      **{k: statistics.median(r[k] for r in rows) for k in keys},
      "fraction_each_run": [round(r["fraction_of_roofline"], 3) for r in rows]}, indent=2))
PY
