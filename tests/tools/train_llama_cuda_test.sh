#!/usr/bin/env bash
# `strata train --model DIR --device cuda`: a Llama-family decoder on the GPU (the CUDA kernels
# of models/llama/kernels.h) follows the host device's losses and gradient norms step by step
# (fp32 within 1e-4, bf16 within 2e-2) for a Llama (grouped-query attention, untied head, llama3
# rope scaling) and a Qwen3-style model (q/k norms, tied head), and its parameters are the same
# bits at ZeRO stage 0 and at stage 3 with parameters and optimizer state on NVMe. Exits 77
# (skipped) without a GPU, and where io_uring is unavailable.
set -euo pipefail
source "$(dirname "$0")/common.sh" "$1" train-llama-cuda
gpu=$("$strata" info --json | python3 -c 'import json, sys
b = {x["name"]: x for x in json.load(sys.stdin)["backends"]}
print(1 if b["cuda"]["available"] else 0)')
if [ "$gpu" != 1 ]; then
  echo "SKIPPED: no GPU here (see strata info)"
  exit 77
fi
device=cuda
data=$(dirname "$0")/../../docs/user-guide.md
mkdir -p "$dir/llama" "$dir/qwen3"
cat > "$dir/llama/config.json" <<'JSON'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 384, "hidden_size": 64,
 "intermediate_size": 160, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
 "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
 "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 64},
 "tie_word_embeddings": false, "torch_dtype": "float32"}
JSON
cat > "$dir/qwen3/config.json" <<'JSON'
{"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 384, "hidden_size": 48,
 "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 1,
 "head_dim": 16, "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
 "tie_word_embeddings": true, "attention_bias": false, "torch_dtype": "float32"}
JSON
config() {  # $1: file, $2: stage, $3: optimizer device, $4: parameter device, $5: bf16 (true/false)
  cat > "$1" <<JSON
{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "gradient_clipping": 1.0,
 "bf16": {"enabled": $5}, "optimizer": {"type": "AdamW", "params": {"lr": 0.003, "weight_decay": 0.01}},
 "zero_optimization": {"stage": $2, "stage3_param_persistence_threshold": 0,
   "offload_optimizer": {"device": "$3", "nvme_path": "$dir/nvme"},
   "offload_param": {"device": "$4", "nvme_path": "$dir/nvme", "max_in_cpu": 0}}}
JSON
}
follows() {  # $1: what, $2: host log, $3: GPU log, $4: relative tolerance
  python3 - "$2" "$3" "$4" <<'PY' || fail "$1: the GPU run left the host run's curve"
import json, sys
h = [json.loads(l) for l in open(sys.argv[1])]
g = [json.loads(l) for l in open(sys.argv[2])]
tol = float(sys.argv[3])
assert len(h) == len(g) == 6, (len(h), len(g))
for x, y in zip(h, g):
    assert abs(x["loss"] - y["loss"]) <= tol * x["loss"], (x["step"], x["loss"], y["loss"])
    assert abs(x["grad_norm"] - y["grad_norm"]) <= 10 * tol * x["grad_norm"], (x["step"], x["grad_norm"], y["grad_norm"])
assert g[-1]["loss"] < g[0]["loss"], "the loss did not go down"
print("  losses host", [round(x["loss"], 6) for x in h], "gpu", [round(y["loss"], 6) for y in g])
PY
  echo "ok: $1: the host device's losses and gradient norms within $4"
}

for m in llama qwen3; do
  run=(train --model "$dir/$m" --data "$data" --seq-len 32 --steps 6 --seed 3 --val-fraction 0)
  for bf16 in false true; do
    tol=1e-4
    [ "$bf16" = true ] && tol=2e-2
    config "$dir/c.json" 3 none none "$bf16"
    "$strata" "${run[@]}" --config "$dir/c.json" --device host --log-json "$dir/host-$m-$bf16.jsonl" >/dev/null
    out=$("$strata" "${run[@]}" --config "$dir/c.json" --device "$device" --log-json "$dir/gpu-$m-$bf16.jsonl" \
      --save-params "$dir/gpu-$m-$bf16-s3.st" 2>&1) || fail "$m on $device (bf16 $bf16): $out"
    grep -q "device cuda:0" <<<"$out" || fail "no CUDA device in: $out"
    follows "$m on the GPU, ZeRO-3, bf16 $bf16" "$dir/host-$m-$bf16.jsonl" "$dir/gpu-$m-$bf16.jsonl" "$tol"
  done
  for c in "0 none none" "3 nvme nvme"; do
    set -- $c
    config "$dir/p.json" "$1" "$2" "$3" true
    "$strata" "${run[@]}" --config "$dir/p.json" --device "$device" --save-params "$dir/p.st" >/dev/null
    tensors_equal "$dir/gpu-$m-true-s3.st" "$dir/p.st" || fail "$m: stage $1, optimizer $2, parameters $3 changed bits"
  done
  echo "ok: $m on the GPU: the same parameters at stage 0 and at stage 3 from NVMe"
done
