#!/usr/bin/env bash
# `strata train --model gpt --device cuda`: the GPT on the GPU (cuBLAS products and the
# kernels of models/gpt/detail/gpt_cuda.cu) follows the host device's losses and gradient
# norms step by step (fp32 within 1e-4, bf16 within 2e-2), its parameters are bitwise
# identical across ZeRO stages 0 and 3 and with optimizer state in host RAM or on NVMe; FP8
# products (cuBLASLt) and the unit-scaled GPT in fp16 follow the host's recipes within 2e-2, and
# FP8 block scaling, which the GPU path lacks, is refused by name. Exits 77 (skipped) without a GPU, and
# where io_uring is unavailable.
set -euo pipefail
source "$(dirname "$0")/common.sh" "$1" train-gpt-cuda
gpu=$("$strata" info --json | python3 -c 'import json, sys
b = {x["name"]: x for x in json.load(sys.stdin)["backends"]}
print(1 if b["cuda"]["available"] else 0)')
if [ "$gpu" != 1 ]; then
  echo "SKIPPED: no GPU here (see strata info)"
  exit 77
fi
readme="$(dirname "$0")/../../docs/user-guide.md"
gpt=(--model gpt --data "$readme" --layers 2 --heads 4 --d-model 64 --seq-len 32 --steps 6 --seed 3)
config() {  # $1: file, $2: stage, $3: optimizer device, $4: parameter device, $5: bf16 (true/false)
  cat > "$1" <<JSON
{"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2, "gradient_clipping": 1.0,
 "bf16": {"enabled": $5}, "optimizer": {"type": "AdamW", "params": {"lr": 0.003, "weight_decay": 0.01}},
 "zero_optimization": {"stage": $2, "stage3_param_persistence_threshold": 0,
   "offload_optimizer": {"device": "$3", "nvme_path": "$dir/nvme"},
   "offload_param": {"device": "$4", "nvme_path": "$dir/nvme", "max_in_cpu": 0}}}
JSON
}
close() {  # $1: what, $2: host log, $3: GPU log, $4: relative tolerance
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

for bf16 in false true; do
  tol=1e-4
  [ "$bf16" = true ] && tol=2e-2
  config "$dir/c.json" 3 none none "$bf16"
  "$strata" train "${gpt[@]}" --config "$dir/c.json" --device host --log-json "$dir/host-$bf16.jsonl" >/dev/null
  out=$("$strata" train "${gpt[@]}" --config "$dir/c.json" --device cuda --log-json "$dir/gpu-$bf16.jsonl" \
    --save-params "$dir/gpu-$bf16-s3.st" 2>&1) || fail "GPT on cuda (bf16 $bf16): $out"
  grep -q "device cuda:0" <<<"$out" || fail "no CUDA device in: $out"
  close "GPT on the GPU, ZeRO-3, bf16 $bf16" "$dir/host-$bf16.jsonl" "$dir/gpu-$bf16.jsonl" "$tol"
done

for c in "0 none none" "3 cpu cpu" "3 nvme nvme"; do
  set -- $c
  config "$dir/p.json" "$1" "$2" "$3" true
  "$strata" train "${gpt[@]}" --config "$dir/p.json" --device cuda --save-params "$dir/p.st" >/dev/null
  tensors_equal "$dir/gpu-true-s3.st" "$dir/p.st" || fail "GPU: stage $1, optimizer $2, parameters $3 changed bits"
  echo "ok: GPU: stage $1 with optimizer on $2 and parameters on $3: ZeRO-3 on the GPU's bits"
done

# Low precision on the GPU: FP8 products on cuBLASLt's FP8 kernels (delayed scaling), and the
# unit-scaled GPT in fp16 with no loss scaler, each against the same recipe on the host device.
lowp() {  # $1: file, $2: extra JSON members
  cat > "$1" <<JSON
{"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2, "optimizer": {"type": "AdamW",
 "params": {"lr": 0.003, "weight_decay": 0.01}}, "zero_optimization": {"stage": 3}, $2}
JSON
}
lowp "$dir/fp8.json" '"gradient_clipping": 1.0, "fp8": {"enabled": true}'
lowp "$dir/unit.json" '"gradient_clipping": 300, "fp16": {"enabled": true, "loss_scale": 1}'
lowp "$dir/block.json" '"fp8": {"enabled": true, "block_scaling": true}'
for r in "fp8 fp8.json" "unit unit.json --unit-scaled"; do
  set -- $r
  name=$1 file=$2
  shift 2
  "$strata" train "${gpt[@]}" --config "$dir/$file" "$@" --device host --log-json "$dir/host-$name.jsonl" >/dev/null
  out=$("$strata" train "${gpt[@]}" --config "$dir/$file" "$@" --device cuda --log-json "$dir/gpu-$name.jsonl" 2>&1) ||
    fail "GPT on cuda ($name): $out"
  close "GPT on the GPU, $name" "$dir/host-$name.jsonl" "$dir/gpu-$name.jsonl" 2e-2
done
expect_refusal "FP8 block scaling on the GPU" "block_scaling runs on the host device only" \
  "$strata" train "${gpt[@]}" --config "$dir/block.json" --device cuda
echo "ok: the GPT on the GPU"
