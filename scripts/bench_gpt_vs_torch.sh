#!/usr/bin/env bash
# Strata's GPT training on the host device against PyTorch's CPU training of the same model
# (same shape, micro-batch, sequence, AdamW, gradient clipping 1.0, threads, byte vocabulary),
# and against the machine's GEMM rate as PyTorch reaches it (scripts/bench_matmul_torch.py:
# torch.matmul at full threads on the block's twelve weight products at the same row count,
# operands already in the products' precision), the three alternated in one run REPEAT times.
# Prints each run's median tokens/s over its steps, then per shape the medians, both sides'
# model FLOP/s (6 per matrix weight plus 12 x layers x sequence x width per token) as a
# fraction of that GEMM rate, and Strata's ratio to PyTorch.
# DEVICE=cuda: both on the GPU instead (Strata --device cuda, ZeRO-0; PyTorch eager, no TF32).
# PRECISION=bf16: bf16 products with fp32 sums on both sides (Strata's bf16 config, PyTorch's
# bf16 autocast; the GEMM yardstick multiplies bf16 tensors).
# Usage: [DEVICE=cuda] [PRECISION=bf16] [PYTHON=python3] scripts/bench_gpt_vs_torch.sh
#          [LAYERS D_MODEL HEADS SEQ MICRO STEPS REPEAT]
# With no shape, three: 4 x 256 at micro-batch 8 x 128, 8 x 512 at 4 x 256 and 12 x 768 at
# 4 x 256 (10 steps, 3 runs each; about 10 minutes on 2 cores). Needs a build (scripts/test.sh
# or quickstart.sh) and python3-torch (PYTHON: an interpreter with torch; Debian's
# /usr/bin/python3 by default); fp32 on the host also a real BLAS for PyTorch (OpenBLAS).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
threads=$(nproc)
device=${DEVICE:-host} torch_device=cpu python=${PYTHON:-/usr/bin/python3}
[ "$device" = cuda ] && torch_device=cuda
precision=${PRECISION:-fp32} bf16=false
[ "$precision" = bf16 ] && bf16=true
strata=${STRATA:-$root/build/bin/strata}
# PyTorch's fp32 CPU products go through the system BLAS: the reference BLAS (libblas3) runs
# them at a few GFLOP/s, which would compare Strata with a crippled PyTorch.
if [ "$precision" = fp32 ] && [ "$device" = host ] &&
  [[ "$(readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3 2>/dev/null)" == */blas/libblas.so.3* ]]; then
  echo "bench_gpt_vs_torch: PyTorch's fp32 products would run on the reference BLAS (libblas3):" \
    "apt-get install libopenblas0-pthread first (on a VM whose CPU OpenBLAS does not recognize," \
    "name its core type, e.g. OPENBLAS_CORETYPE=SkylakeX)" >&2
  exit 1
fi
# PyTorch 1.13 multiplies bf16 through oneDNN only on CPUs with AVX-512 (BW, VL, DQ); elsewhere
# its reference loops run them at a few GFLOP/s (2.4 measured on an AVX2 AMD EPYC), and
# Strata's bf16 products are fp32 ones there (no bf16 dot products): no comparison at all.
if [ "$precision" = bf16 ] && [ "$device" = host ] && ! grep -q -w avx512bw /proc/cpuinfo; then
  echo "bench_gpt_vs_torch: this CPU has no AVX-512, so PyTorch's bf16 products would run on its" \
    "reference loops at a few GFLOP/s and Strata's on fp32 products: compare PRECISION=fp32 here" >&2
  exit 1
fi
vocab=256
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
median() { /usr/bin/python3 -c 'import statistics, sys; print(f"{statistics.median(float(x) for x in sys.argv[1:]):.1f}")' "$@"; }
calc() { /usr/bin/python3 -c "print(f'{$1:$2}')"; }

compare() {  # LAYERS D_MODEL HEADS SEQ MICRO STEPS REPEAT
  local L=$1 C=$2 NH=$3 T=$4 B=$5 STEPS=$6 REPEAT=$7 s_runs=() t_runs=() g_runs=() r s t g
  cat > "$dir/cfg.json" <<JSON
{"train_micro_batch_size_per_gpu": $B, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0, "bf16": {"enabled": $bf16},
 "optimizer": {"type": "AdamW", "params": {"lr": 0.0003}}, "zero_optimization": {"stage": 0}}
JSON
  for r in $(seq "$REPEAT"); do
    "$strata" train --model gpt --data "$root/docs/user-guide.md" --layers "$L" --d-model "$C" --heads "$NH" \
      --seq-len "$T" --config "$dir/cfg.json" --steps $((STEPS + 2)) --device "$device" --device-budget 16GiB \
      --val-fraction 0 --quiet --log-json "$dir/s.jsonl" > /dev/null
    s=$(/usr/bin/python3 -c 'import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])][2:]
print("%.1f" % statistics.median(r["tokens_per_s"] for r in rows))' "$dir/s.jsonl")
    t=$("$python" "$root/scripts/bench_gpt_torch.py" "$L" "$NH" "$C" "$T" "$vocab" "$B" "$STEPS" "$threads" \
      "$torch_device" "$precision" | awk '{print $2}')
    g=$("$python" "$root/scripts/bench_matmul_torch.py" "$C" $((B * T)) "$threads" "$torch_device" "$precision" |
      awk '{print $2}')
    echo "run $r: strata $s tokens/s, torch $t tokens/s, torch matmul $g GFLOP/s"
    s_runs+=("$s") t_runs+=("$t") g_runs+=("$g")
  done
  local sm tm gm per_token
  sm=$(median "${s_runs[@]}") tm=$(median "${t_runs[@]}") gm=$(median "${g_runs[@]}")
  per_token=$(calc "6 * (12 * $L * $C * $C + $vocab * $C) + 12 * $L * $T * $C" ".0f")
  echo "GPT $L x $C ($NH heads), micro-batch $B x seq $T, $precision, on $device ($threads threads), median of $REPEAT:" \
    "strata $sm tokens/s ($(calc "$sm * $per_token / 1e9" .1f) model GFLOP/s, $(calc "$sm * $per_token / 1e9 / $gm" .2f)" \
    "of torch's matmul $gm GFLOP/s), torch $tm tokens/s ($(calc "$tm * $per_token / 1e9 / $gm" .2f) of it)," \
    "ratio $(calc "$sm / $tm" .2f)"
}

if [ $# -gt 0 ]; then
  compare "${1:-6}" "${2:-192}" "${3:-6}" "${4:-64}" "${5:-8}" "${6:-20}" "${7:-3}"
else
  compare 4 256 4 128 8 10 3
  compare 8 512 8 256 4 10 3
  compare 12 768 12 256 4 10 3
fi
