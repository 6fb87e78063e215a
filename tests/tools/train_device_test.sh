#!/usr/bin/env bash
# `strata train --device`: auto takes the GPU when one is present and the host device
# otherwise; --device cuda trains on the GPU with the MLP's forward and backward in cuBLAS
# (two ranks on two GPUs with NCCL beside Gloo), or, without a GPU, is refused naming the
# device and why; --link-gbps is refused with a CUDA device. Runs everywhere: the GPU half
# of each check runs where there is one.
set -euo pipefail
strata=$1
fail() { echo "FAIL: $*" >&2; exit 1; }
dir=$(mktemp -d "${STRATA_TEST_TMPDIR:-/var/tmp}/strata-train-device-test-XXXXXX")
trap 'rm -rf "$dir"' EXIT
cat > "$dir/ds.json" <<JSON
{"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2, "bf16": {"enabled": true},
 "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0, "offload_optimizer": {"device": "cpu"}},
 "optimizer": {"type": "AdamW", "params": {"lr": 0.001}}}
JSON
model=(--model mlp --layers 3 --hidden 64 --config "$dir/ds.json" --steps 4)
gpu=$("$strata" info --json | python3 -c 'import json, sys
b = {x["name"]: x for x in json.load(sys.stdin)["backends"]}
print(1 if b["cuda"]["available"] else 0)')

"$strata" train "${model[@]}" --device host --save-params "$dir/host.safetensors" > "$dir/host.txt"
out=$("$strata" train "${model[@]}" --save-params "$dir/auto.safetensors" --log-json "$dir/auto.jsonl")
if [ "$gpu" = 1 ]; then
  grep -q "device cuda:0" <<<"$out" || fail "--device auto did not take the GPU: $out"
else
  grep -q "device host" <<<"$out" || fail "--device auto without a GPU did not use the host device: $out"
  cmp -s "$dir/host.safetensors" "$dir/auto.safetensors" || fail "--device auto and --device host trained different bits"
fi

if [ "$gpu" = 1 ]; then
  out=$("$strata" train "${model[@]}" --device cuda --save-params "$dir/cuda.safetensors" --log-json "$dir/cuda.jsonl")
  grep -q "device cuda:0" <<<"$out" || fail "no CUDA device in: $out"
  # The GPU run follows the host run's loss curve to float tolerance.
  python3 - "$dir/host.txt" "$dir/cuda.jsonl" <<'PY'
import json, re, sys
host = [float(m) for m in re.findall(r"loss ([0-9.]+)", open(sys.argv[1]).read())]
gpu = [json.loads(l)["loss"] for l in open(sys.argv[2])]
assert len(host) == len(gpu) == 4, (host, gpu)
for h, g in zip(host, gpu):
    assert abs(h - g) <= 1e-3 * abs(h), (host, gpu)  # bf16 gradients: a rounding may flip
assert gpu[-1] < gpu[0], gpu
print("ok: GPU losses", gpu, "host", host)
PY
else
  if msg=$("$strata" train "${model[@]}" --device cuda 2>&1); then fail "--device cuda ran without a GPU: $msg"; fi
  grep -q "cuda device 0" <<<"$msg" || fail "the refusal does not name the device: $msg"
fi

# Two ranks: Gloo on the host device; on two GPUs, NCCL joins for device memory.
gpus=$("$strata" info --json | python3 -c 'import json, sys
b = {x["name"]: x for x in json.load(sys.stdin)["backends"]}
print(len(b["cuda"].get("devices", [])))')
"$strata" launch -n 2 -- "$strata" train "${model[@]}" --device host --log-json "$dir/host2.jsonl" > /dev/null
if [ "$gpus" -ge 2 ]; then
  "$strata" launch -n 2 -- "$strata" train "${model[@]}" --device cuda --log-json "$dir/cuda2.jsonl" > /dev/null
  python3 - "$dir/host2.jsonl" "$dir/cuda2.jsonl" <<'PY'
import json, sys
host = [json.loads(l)["loss"] for l in open(sys.argv[1])]
gpu = [json.loads(l)["loss"] for l in open(sys.argv[2])]
assert len(host) == len(gpu) == 4, (host, gpu)
for h, g in zip(host, gpu):
    assert abs(h - g) <= 1e-3 * abs(h), (host, gpu)
print("ok: 2 GPU ranks", gpu, "host", host)
PY
elif msg=$("$strata" launch -n 2 -- "$strata" train "${model[@]}" --device cuda 2>&1); then
  fail "two ranks ran with --device cuda on $gpus GPU(s): $msg"
else
  grep -q "cuda device" <<<"$msg" || fail "the two-rank refusal does not name the device: $msg"
fi

if msg=$("$strata" train "${model[@]}" --device cuda --link-gbps 1 2>&1); then fail "--link-gbps was accepted with cuda"; fi
grep -q -- "--link-gbps 1 throttles the host device" <<<"$msg" || fail "the --link-gbps refusal is unclear: $msg"
echo "ok: --device (GPU present: $gpu)"
