#!/usr/bin/env bash
# DeepSpeed configs copied from public repositories (tests/engine/ds_configs, sources in
# SOURCES.md) run unchanged under `strata train` (2 steps of the demo MLP; only nvme_path
# is pointed at a scratch directory), or are refused exactly as expected.txt says, with
# the reason. Each "auto" a config holds is resolved and said; each deprecated key mapped.
set -euo pipefail
source "$(dirname "$0")/common.sh" "$1" ds-configs
data="$(dirname "$0")/../engine/ds_configs"
ran=0 refused=0
while read -r name outcome rest; do
  case "$name" in "" | \#*) continue ;; esac
  /usr/bin/python3 - "$data/$name.json" "$dir/$name.json" "$dir/nvme" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
def walk(o):
    if isinstance(o, dict):
        for k in o:
            if k == "nvme_path": o[k] = sys.argv[3]
            else: walk(o[k])
walk(c)
json.dump(c, open(sys.argv[2], "w"))
PY
  set +e
  out=$("$strata" train --model mlp --layers 2 --hidden 64 --steps 2 --device host --config "$dir/$name.json" 2>&1)
  rc=$?
  set -e
  if [ "$outcome" = run ]; then
    [ $rc = 0 ] || fail "$name should run: $(tail -2 <<<"$out")"
    grep -q "^step    2/2" <<<"$out" || fail "$name: no step 2"
    autos=$({ grep -o '"auto"' "$data/$name.json" || true; } | wc -l)
    said=$(grep -c 'the Hugging Face trainer\|the optimizer.s lr\|the run.s step count\|from the hidden size' <<<"$out" || true)
    [ "$autos" = 0 ] || [ "$said" -gt 0 ] || fail "$name: its $autos \"auto\" values were not said"
    ran=$((ran + 1))
  else
    want=${rest%%|*}
    want=$(sed 's/ *$//' <<<"$want")
    [ $rc != 0 ] || fail "$name should be refused ($want)"
    grep -qF -- "$want" <<<"$out" || fail "$name: refused, but not with '$want': $(tail -2 <<<"$out")"
    refused=$((refused + 1))
  fi
done < "$data/expected.txt"
echo "$((ran + refused)) public DeepSpeed configs: $ran ran unchanged, $refused refused as expected"
