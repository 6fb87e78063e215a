#!/usr/bin/env bash
# Strata's GPT training on the host device against PyTorch's CPU training of the same model
# (same shape, micro-batch, sequence, fp32, AdamW, threads), alternated in one run, REPEAT
# times each; prints each run's median tokens/s over its steps, the medians, and the ratio.
# DEVICE=cuda: both on the GPU instead (Strata --device cuda, ZeRO-0; PyTorch eager, no TF32).
# PRECISION=bf16: bf16 products with fp32 sums on both sides (Strata's bf16 config, PyTorch's
# bf16 autocast).
# Usage: [DEVICE=cuda] [PRECISION=bf16] [PYTHON=python3] scripts/bench_gpt_vs_torch.sh [LAYERS D_MODEL HEADS SEQ MICRO STEPS
# REPEAT] (default 6 192 6 64 8 20 3). Needs a build (scripts/test.sh or quickstart.sh) and
# python3-torch (PYTHON: an interpreter with torch; Debian's /usr/bin/python3 by default).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
L=${1:-6} C=${2:-192} NH=${3:-6} T=${4:-64} B=${5:-8} STEPS=${6:-20} REPEAT=${7:-3}
threads=$(nproc)
device=${DEVICE:-host} torch_device=cpu python=${PYTHON:-/usr/bin/python3}
[ "$device" = cuda ] && torch_device=cuda
precision=${PRECISION:-fp32} bf16=false
[ "$precision" = bf16 ] && bf16=true
strata=${STRATA:-$root/build/bin/strata}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cat > "$dir/cfg.json" <<JSON
{"train_micro_batch_size_per_gpu": $B, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0, "bf16": {"enabled": $bf16},
 "optimizer": {"type": "AdamW", "params": {"lr": 0.0003}}, "zero_optimization": {"stage": 0}}
JSON
median() { /usr/bin/python3 -c 'import statistics, sys; print(f"{statistics.median(float(x) for x in sys.argv[1:]):.1f}")' "$@"; }
s_runs=() t_runs=()
for r in $(seq "$REPEAT"); do
  "$strata" train --model gpt --data "$root/docs/user-guide.md" --layers "$L" --d-model "$C" --heads "$NH" --seq-len "$T" \
    --config "$dir/cfg.json" --steps $((STEPS + 2)) --device "$device" --device-budget 16GiB --val-fraction 0 --log-json "$dir/s.jsonl" > /dev/null
  s=$(/usr/bin/python3 -c 'import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])][2:]
print("%.1f" % statistics.median(r["tokens_per_s"] for r in rows))' "$dir/s.jsonl")
  t=$("$python" "$root/scripts/bench_gpt_torch.py" "$L" "$NH" "$C" "$T" 256 "$B" "$STEPS" "$threads" "$torch_device" "$precision" |
    awk '{print $2}')
  echo "run $r: strata $s tokens/s, torch $t tokens/s"
  s_runs+=("$s") t_runs+=("$t")
done
sm=$(median "${s_runs[@]}") tm=$(median "${t_runs[@]}")
echo "GPT $L x $C ($NH heads), micro-batch $B x seq $T, $precision, on $device ($threads threads): strata $sm tokens/s, torch $tm tokens/s," \
     "ratio $(/usr/bin/python3 -c "print(f'{$sm / $tm:.2f}')") (median of $REPEAT)"
