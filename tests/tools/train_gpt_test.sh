#!/usr/bin/env bash
# `strata train --model gpt`: the same GPT's parameters are bitwise identical across ZeRO
# stages 0-3 and optimizer/parameter placements on the device, in host RAM and on NVMe, at
# world 1 and at world 2 (two ranks under `strata launch`); the saved tensors are compared,
# not the files (their metadata names the stage). Then the refusals: a sequence longer than
# the position table, a device budget below one block's live window plus its activations
# (naming the minimum), and data files that cannot train.
set -euo pipefail
source "$(dirname "$0")/common.sh" "$1" train-gpt
data="$(dirname "$0")/../../docs/user-guide.md"
shape=(--model gpt --layers 2 --heads 2 --d-model 32 --steps 3 --seed 5 --device host)
base=("${shape[@]}" --data "$data")
model=("${base[@]}" --seq-len 16)

config() {  # stage optimizer-device param-device
  cat <<JSON
{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "bf16": {"enabled": true},
 "gradient_clipping": 1.0, "optimizer": {"type": "AdamW", "params": {"lr": 0.003}},
 "zero_optimization": {"stage": $1, "stage3_param_persistence_threshold": 0,
   "offload_optimizer": {"device": "$2", "nvme_path": "$dir/nvme"},
   "offload_param": {"device": "$3", "nvme_path": "$dir/nvme", "buffer_count": 4, "buffer_size": 8192}}}
JSON
}


cases=("0 none none" "1 none none" "1 cpu none" "1 nvme none" "2 none none" "2 cpu none" "2 nvme none"
       "3 none none" "3 cpu cpu" "3 nvme none" "3 nvme nvme" "3 cpu nvme")
for world in 1 2; do
  ref=""
  for c in "${cases[@]}"; do
    set -- $c
    name="w$world-s$1-$2-$3"
    config "$1" "$2" "$3" > "$dir/$name.json"
    if [ "$world" = 1 ]; then
      "$strata" train "${model[@]}" --config "$dir/$name.json" --save-params "$dir/$name.safetensors" \
        --log-json "$dir/$name.jsonl" > "$dir/$name.log"
    else
      "$strata" launch -n 2 -- "$strata" train "${model[@]}" --config "$dir/$name.json" \
        --save-params "$dir/$name.safetensors" > "$dir/$name.log"
    fi
    if [ -z "$ref" ]; then
      ref=$name
    else
      tensors_equal "$dir/$ref.safetensors" "$dir/$name.safetensors" 28 || fail "$name's parameters differ from $ref's"
    fi
  done
  echo "world $world: ${#cases[@]} stage x placement runs give bitwise-identical GPT parameters"
done
# The progress line: at most 120 characters, the whole device's peak (the trainer's activations
# too, --log-json's device_memory_peak_bytes) against its budget; --verbose beside the ledger's.
python3 - "$dir/w1-s0-none-none.log" "$dir/w1-s0-none-none.jsonl" <<'PY' || fail "the progress lines: $(cat "$dir/w1-s0-none-none.log")"
import json, re, sys
lines = [l.rstrip("\n") for l in open(sys.argv[1]) if l.startswith("step ")]
steps = [json.loads(l) for l in open(sys.argv[2])]
assert lines and all(len(l) <= 120 for l in lines), [l for l in lines if len(l) > 120]
m = re.search(r"  dev ([0-9.]+)(?: (B|KiB|MiB|GiB))?/([0-9.]+) (B|KiB|MiB|GiB)  host ", lines[-1])
scale = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}[m.group(2) or m.group(4)]
peak = steps[-1]["device_memory_peak_bytes"] / scale
assert abs(float(m.group(1)) - peak) <= 0.051, (lines[-1], peak)
PY
out=$("$strata" train "${model[@]}" --config "$dir/w1-s0-none-none.json" --verbose 2>&1) ||
  fail "--verbose: $out"
grep -q "; device total peak [0-9.]* [A-Za-z]*)" <<<"$out" || fail "no device total peak with --verbose: $out"
tensors_equal "$dir/w1-s0-none-none.safetensors" "$dir/w2-s0-none-none.safetensors" 28 &&
  fail "world 1 and world 2 trained identical bits: the ranks cannot have seen different batches"

# FP8 products (the config's fp8 block): stages and placements stay bitwise identical with
# them (per-tensor and per-block scaling), and FP8 is not the bf16 result. (At this size and
# this early, every row of a tensor shares the tensor's power-of-two scale, so block scaling
# may give the per-tensor bits; tests/models/fp8_test.cc tests it block by block.)
fp8() {  # stage optimizer-device param-device block-scaling
  config "$1" "$2" "$3" | python3 -c 'import json, sys; c = json.load(sys.stdin)
c["fp8"] = {"enabled": True, "amax_history_len": 4, "block_scaling": sys.argv[1] == "1"}; print(json.dumps(c))' "$4"
}
for c in "0 none none 0" "3 nvme nvme 0" "0 none none 1" "3 cpu cpu 1"; do
  set -- $c
  fp8 "$@" > "$dir/fp8-$1-$2-$4.json"
  "$strata" train "${model[@]}" --config "$dir/fp8-$1-$2-$4.json" --save-params "$dir/fp8-$1-$2-$4.safetensors" \
    > "$dir/fp8-$1-$2-$4.log"
done
tensors_equal "$dir/fp8-0-none-0.safetensors" "$dir/fp8-3-nvme-0.safetensors" 28 ||
  fail "FP8: stage 3 on NVMe differs from stage 0"
tensors_equal "$dir/fp8-0-none-1.safetensors" "$dir/fp8-3-cpu-1.safetensors" 28 ||
  fail "FP8 with block scaling: stage 3 in host RAM differs from stage 0"
tensors_equal "$dir/fp8-0-none-0.safetensors" "$dir/w1-s0-none-none.safetensors" 28 &&
  fail "FP8 trained the bf16 run's bits: the products were not quantized"
out=$("$strata" train --model mlp --layers 2 --hidden 32 --steps 1 --device host --config "$dir/fp8-0-none-0.json" 2>&1) &&
  fail "FP8 with the MLP was accepted"
grep -q "fp8.enabled: FP8 matrix products are implemented for the GPT" <<<"$out" || fail "unclear: $out"
echo "fp8: stages and placements bitwise identical with FP8 products (per-tensor and per-block); MLP refused"

# The unit-scaled GPT (--unit-scaled) in fp16 with no loss scaler, and with FP8 products cast at
# scale 1: bitwise identical across stages and placements at world 1 and 2 (its matrices step at
# their own learning rates, cut wherever the shards fall); a dynamic loss scaler is refused by name.
unit() {  # stage optimizer-device param-device fp8
  config "$1" "$2" "$3" | python3 -c 'import json, sys; c = json.load(sys.stdin); del c["bf16"]
c["fp16"] = {"enabled": True, "loss_scale": 1}; c["gradient_clipping"] = 1000
if sys.argv[1] == "1": c["fp8"] = {"enabled": True, "scaling": "none"}
print(json.dumps(c))' "$4"
}
for c in "1 0 none none 0" "1 3 nvme nvme 0" "1 2 cpu none 0" "1 0 none none 1" "1 3 cpu cpu 1" "2 1 none none 0" \
         "2 3 nvme nvme 0"; do
  set -- $c
  name="unit-w$1-s$2-$3-$5"
  unit "$2" "$3" "$4" "$5" > "$dir/$name.json"
  run=("$strata" train "${model[@]}" --unit-scaled --config "$dir/$name.json" --save-params "$dir/$name.safetensors")
  if [ "$1" = 1 ]; then "${run[@]}" > "$dir/$name.log"; else "$strata" launch -n 2 -- "${run[@]}" > "$dir/$name.log"; fi
done
for pair in "unit-w1-s0-none-0 unit-w1-s3-nvme-0" "unit-w1-s0-none-0 unit-w1-s2-cpu-0" \
            "unit-w1-s0-none-1 unit-w1-s3-cpu-1" "unit-w2-s1-none-0 unit-w2-s3-nvme-0"; do
  set -- $pair
  tensors_equal "$dir/$1.safetensors" "$dir/$2.safetensors" 28 || fail "unit-scaled: $2 differs from $1"
done
tensors_equal "$dir/unit-w1-s0-none-0.safetensors" "$dir/unit-w1-s0-none-1.safetensors" 28 &&
  fail "unit-scaled FP8 trained the fp16 run's bits: the products were not quantized"
grep -q "unit-scaled" "$dir/unit-w1-s0-none-0.log" || fail "the run does not say it is unit-scaled"
unit 0 none none 0 | python3 -c 'import json, sys; c = json.load(sys.stdin); c["fp16"]["loss_scale"] = 0
print(json.dumps(c))' > "$dir/unit-dynamic.json"
out=$("$strata" train "${model[@]}" --unit-scaled --config "$dir/unit-dynamic.json" 2>&1) &&
  fail "--unit-scaled with a dynamic loss scaler was accepted"
grep -q "set fp16.loss_scale to 1" <<<"$out" || fail "unclear: $out"
echo "unit-scaled: stages and placements bitwise identical in fp16 and FP8 at world 1 and 2; a loss scaler refused"

config 0 none none > "$dir/plain.json"
# What a run says once: bytes fed to a larger vocabulary, and the optimizer (Strata's defaults
# named when the config has none); --quiet prints the last step alone, steps_per_print thins.
out=$("$strata" train "${model[@]}" --config "$dir/plain.json" --vocab 512 --quiet 2>&1) || fail "--vocab 512: $out"
grep -q "was read as bytes (tokens 0-255), but the model's vocabulary is 512: only 256 of its embedding rows" <<<"$out" ||
  fail "no warning for bytes in a 512-entry vocabulary: $out"
[ "$(grep -c '^step ' <<<"$out")" = 1 ] && grep -q '^step    3/3 ' <<<"$out" || fail "--quiet printed other steps: $out"
grep -q "optimizer: AdamW lr 0.003, betas 0.9/0.999" <<<"$out" || fail "the optimizer is not stated: $out"
grep -q "was read as bytes" <<<"$("$strata" train "${model[@]}" --config "$dir/plain.json" 2>&1)" &&
  fail "a byte-level model warned about its bytes"
python3 - "$dir/plain.json" "$dir/bare.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
del c["optimizer"]
c["steps_per_print"] = 2
json.dump(c, open(sys.argv[2], "w"))
PY
out=$("$strata" train --model gpt --layers 2 --heads 2 --d-model 32 --steps 5 --seed 5 --device host --data "$data" \
  --seq-len 16 --config "$dir/bare.json" 2>&1) || fail "no optimizer block: $out"
grep -q "optimizer: AdamW lr 0.001, .* (Strata's defaults: the config has no optimizer block)" <<<"$out" ||
  fail "Strata's default optimizer is not named: $out"
[ "$(grep '^step ' <<<"$out" | awk '{print $2}' | tr '\n' ' ')" = "1/5 2/5 4/5 5/5 " ] ||
  fail "steps_per_print 2 did not print steps 1, 2, 4 and 5: $out"
echo "ok: the bytes warning, the optimizer line, --quiet and steps_per_print"
out=$("$strata" train "${base[@]}" --config "$dir/plain.json" --seq-len 64 --positions 32 2>&1) &&
  fail "a sequence longer than the position table was accepted"
grep -q "seq-len 64 is above the model's position table (wpe.weight has 32 rows)" <<<"$out" || fail "unclear: $out"
out=$("$strata" train "${model[@]}" --config "$dir/plain.json" --device-budget 64KiB --explain 2>&1) &&
  fail "64 KiB device accepted"
grep -Eq "device budget 64.00 KiB: raise memory_budget.device \(or --device-budget\) to at least [0-9.]* [KMG]iB, or use a smaller micro-batch or --seq-len(, or --remat always)?\.$" <<<"$out" ||
  fail "unclear: $out"
grep -q "^  why: it is below one GPT block's live window plus its activations" <<<"$out" || fail "no reason: $out"
first=$(grep "strata: error: device budget" <<<"$out")
[ "${#first}" -lt 215 ] || fail "the fix is not a first line under 200 characters: $first"
printf 'short' > "$dir/short.txt"
out=$("$strata" train "${shape[@]}" --seq-len 16 --config "$dir/plain.json" --data "$dir/short.txt" 2>&1) && fail "5 bytes accepted"
grep -q "short.txt' is too short" <<<"$out" || fail "unclear: $out"
: > "$dir/empty.txt"
out=$("$strata" train "${shape[@]}" --seq-len 16 --config "$dir/plain.json" --data "$dir/empty.txt" 2>&1) && fail "empty data accepted"
grep -q "empty.txt' holds no tokens" <<<"$out" || fail "unclear: $out"
echo "refusals: sequence above the position table, device budget below the minimum, short and empty data"
# strata bench gpt: the figures agree with each other and with the model FLOPs of config.h
# (6 per matrix weight plus 12 L T C per token; 2 blocks of 64, vocab 256, seq 32: 6 x (2 x 12 x 64^2 + 256 x 64)
# + 12 x 2 x 32 x 64 = 737280 FLOPs per token).
j=$("$strata" bench gpt --layers 2 --d-model 64 --heads 4 --seq-len 32 --micro-batch 2 --iters 3 --json)
python3 - "$j" <<'PY' || fail "bench gpt: $j"
import json, sys
j = json.loads(sys.argv[1])
assert j["model_flops_per_token"] == 737280, j["model_flops_per_token"]
assert abs(j["tokens_per_s"] * j["pass_s"] - 2 * 32) < 1e-6 * 64
assert abs(j["model_flops_per_s"] - j["tokens_per_s"] * 737280) < 1e-6 * j["model_flops_per_s"]
assert j["gemm_flops_per_s"] > 1e8 and 0 < j["fraction_of_gemm"] < 2, j
# The library's best on the same products, and the pass's fraction of it, from the same figures.
assert j["library_gemm_flops_per_s"] > 1e8, j
assert abs(j["fraction_of_library_gemm"] - j["model_flops_per_s"] / j["library_gemm_flops_per_s"]) < 1e-9, j
PY
echo "bench gpt: tokens/s, model FLOP/s and the GEMM fractions agree"
# FP8 products on the host: the simulation's pass, against the bf16 GEMM where the CPU has it.
j=$("$strata" bench gpt --layers 2 --d-model 64 --heads 4 --seq-len 32 --micro-batch 2 --iters 2 --products fp8 --json)
python3 - "$j" <<'PY' || fail "bench gpt --products fp8: $j"
import json, sys
j = json.loads(sys.argv[1])
assert j["products"] == "fp8" and j["device"] == "host" and j["gemm_products"] in ("bf16", "fp32"), j
assert j["tokens_per_s"] > 0 and 0 < j["fraction_of_gemm"] < 2, j
PY
expect_refusal "bench gpt fp16 products on the host" "runs on --device cuda only" \
  "$strata" bench gpt --layers 2 --d-model 64 --heads 4 --seq-len 32 --products fp16
expect_refusal "bench gpt on an unknown device" "use host or cuda" "$strata" bench gpt --device tpu
echo "1 passed, 0 failed"
