#!/usr/bin/env bash
# `strata bench calibrate` and `strata plan` against `strata train`: calibrate (in full: the
# quick form's single gradient-path sample is too noisy to time steps with) writes every
# rate; plan, on two budgets of one GPT, chooses differently (everything on the device; the
# optimizer state on NVMe when device and host are small), and each choice, trained from the
# config plan emits, runs within 15% of its predicted step time (scripts/plan_check.py:
# medians of 5 alternated plans and runs; up to three tries, since this machine's speed moves by
# 10-25% between processes and a systematic error fails every try); a budget
# nothing fits is refused naming the smallest budget that would; a damaged calibration file
# is refused naming the file and the key, and a malformed --budget naming the tier or item.
# Exits 77 (skipped) where io_uring is unavailable (calibrate measures NVMe).
set -euo pipefail
source "$(dirname "$0")/common.sh" "$1" plan
root=$(cd "$(dirname "$0")/../.." && pwd)

"$strata" bench calibrate --nvme "$dir/nvme" --out "$dir/cal.json" > "$dir/calibrate.txt"
python3 - "$dir/cal.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
keys = ["gemm_fp32_flops", "gemm_bf16_flops", "adam_params_per_s", "grad_path_ns_per_elem", "h2d_gbps", "d2h_gbps",
        "nvme_read_gbps", "nvme_write_gbps", "nvme_mixed_gbps", "reduce_scatter_busbw_gbps",
        "all_gather_busbw_gbps", "all_reduce_busbw_gbps"]
missing = [k for k in keys if not isinstance(c.get(k), (int, float)) or c[k] < 0]
sys.exit(f"calibration lacks {missing}: {c}" if missing else 0)
PY
[ -z "$(ls -A "$dir/nvme")" ] || fail "calibrate left files in its NVMe directory: $(ls -A "$dir/nvme")"

cat > "$dir/base.json" <<'JSON'
{"bf16": {"enabled": true}, "gradient_clipping": 1.0,
 "optimizer": {"type": "AdamW", "params": {"lr": 0.001, "weight_decay": 0.01}},
 "zero_optimization": {"stage3_param_persistence_threshold": 0, "sub_group_size": 65536,
   "offload_optimizer": {"buffer_count": 4}, "offload_param": {"buffer_count": 4, "buffer_size": 65536, "max_in_cpu": 0}}}
JSON
check() {  # $1: budget; prints plan_check's JSON, fails when off by more than 15% three times running
  # (the machine's speed drifts between a profile and a run; more tries tell drift from error).
  # A try that fails calibrates again before the next: the rates in the file, the drive's
  # above all, drift too (this VM's NVMe moved between 0.5 and 1.5 GB/s from hour to hour).
  # The tight budget's usual shortfall (0.82-0.86 on 2 AMD cores) is not drift: its trace shows
  # the NVMe step and the pass both slower while the step's own threads share the cores,
  # which the model does not count yet.
  local args=("$root/scripts/plan_check.py" "$strata" --calibration "$dir/cal.json" --budget "$1"
    --nvme-path "$dir/nvme" --config "$dir/base.json" --steps 12 --repeat 5 --json) try
  for try in 1 2 3; do
    if python3 "${args[@]}" | tee /dev/stderr; then return 0; fi
    [ "$try" = 3 ] || "$strata" bench calibrate --nvme "$dir/nvme" --out "$dir/cal.json" > "$dir/calibrate.txt"
  done
  fail "plan for $1: measured step time more than 15% off the prediction three times, calibrated anew each time (above)"
}
roomy=$(check device=64MiB,host=256MiB | tail -1)
tight=$(check device=8MiB,host=10MiB,nvme=512MiB | tail -1)
echo "$roomy"
echo "$tight"
python3 - "$roomy" "$tight" <<'PY'
import json, sys
roomy, tight = json.loads(sys.argv[1]), json.loads(sys.argv[2])
assert roomy["choice"] != tight["choice"], (roomy["choice"], tight["choice"])
assert roomy["peaks"]["nvme"] == 0 and tight["peaks"]["nvme"] > 0, (roomy["peaks"], tight["peaks"])
PY

# The plan counts bytes: per step over the link and to and from NVMe, and NVMe writes a day at
# the planned speed against the drive's rated endurance (--drive-tbw).
plan_bytes=$("$strata" plan --model gpt --layers 4 --d-model 128 --heads 4 --seq-len 64 --iters 1 \
  --budget device=8MiB,host=10MiB,nvme=512MiB --nvme-path "$dir/nvme" --config "$dir/base.json" \
  --calibration "$dir/cal.json" --drive-tbw 600 --json)
python3 - "$plan_bytes" <<'PY' || fail "strata plan --drive-tbw: $plan_bytes"
import json, sys
best = json.loads(sys.argv[1])["best"][0]
assert best["nvme_write_bytes_per_step"] > 0 and best["nvme_read_bytes_per_step"] > 0, best
per_day = best["nvme_write_bytes_per_step"] * 86400 / (best["step_ms"] / 1e3)
assert abs(best["nvme_write_bytes_per_day"] - per_day) <= 1e-6 * per_day, (best, per_day)
assert abs(best["drive_endurance_days"] - 600e12 / per_day) <= 1e-6 * 600e12 / per_day, best
PY
"$strata" plan --model gpt --layers 4 --d-model 128 --heads 4 --seq-len 64 --iters 1 \
  --budget device=8MiB,host=10MiB,nvme=512MiB --nvme-path "$dir/nvme" --config "$dir/base.json" \
  --calibration "$dir/cal.json" --drive-tbw 600 > "$dir/plan_bytes.txt"
grep -q "per step and rank: link H2D" "$dir/plan_bytes.txt" && grep -q "a drive rated 600 TBW lasts" "$dir/plan_bytes.txt" \
  || fail "plan text lacks the bytes per step or the drive's endurance: $(cat "$dir/plan_bytes.txt")"
echo "ok: plan counts bytes per step and the drive's endurance"

# plan_check passes strata plan's refusal on as Strata's message, not a Python traceback.
set +e
err=$(python3 "$root/scripts/plan_check.py" "$strata" --calibration "$dir/cal.json" --budget device=1MiB,host=1MiB \
  --repeat 1 -- --layers 4 --d-model 128 --heads 4 --seq-len 64 2>&1)
rc=$?
set -e
[ "$rc" -ne 0 ] || fail "plan_check accepted a budget nothing fits"
grep -q "^plan_check: strata plan failed:" <<<"$err" && grep -q "^strata: error: " <<<"$err" ||
  fail "plan_check does not show Strata's message: $err"
if grep -q Traceback <<<"$err"; then fail "plan_check printed a traceback: $err"; fi
echo "ok: plan_check shows strata plan's refusal"

# Nothing fits: refused, naming the smallest budget of a tier that would.
set +e
err=$("$strata" plan --model gpt --layers 4 --d-model 128 --heads 4 --seq-len 64 --budget device=1MiB,host=64MiB \
  --calibration "$dir/cal.json" 2>&1)
rc=$?
set -e
[ "$rc" -ne 0 ] || fail "plan accepted device=1MiB,host=64MiB"
grep -q "raise --budget to device=" <<<"$err" || fail "the refusal names no budget that would fit: $err"
least=$(grep -o 'device=[0-9.]* [KMG]iB ([0-9]* B)' <<<"$err" | grep -o '([0-9]*' | tr -d '(')
"$strata" plan --model gpt --layers 4 --d-model 128 --heads 4 --seq-len 64 --budget "device=$least,host=64MiB" \
  --calibration "$dir/cal.json" --iters 1 > /dev/null 2>&1 || fail "plan refused the device budget it named ($least B)"

# A damaged calibration file names the file and the key.
python3 -c "import json,sys; c=json.load(open(sys.argv[1])); del c['nvme_read_gbps']; json.dump(c, open(sys.argv[2],'w'))" \
  "$dir/cal.json" "$dir/bad.json"
set +e
err=$("$strata" plan --model gpt --layers 2 --budget device=64MiB,host=64MiB --calibration "$dir/bad.json" 2>&1)
set -e
grep -q "bad.json" <<<"$err" && grep -q "nvme_read_gbps" <<<"$err" && grep -q "bench calibrate" <<<"$err" \
  || fail "a calibration without nvme_read_gbps is not refused by name: $err"
# A malformed --budget names the tier or item at fault.
for case in "device=1GiB,device=2GiB|tier 'device' is given twice" "gpu=1GiB,host=1GiB|tier 'gpu' is not device, host or nvme" \
  "device=1GiB|must give the device and the host" "device=1GiB,host=-1|--budget host = '-1' is not a non-negative number" \
  "device=1GiB,host=1GiB,|'' is not TIER=BYTES"; do
  set +e
  err=$("$strata" plan --model gpt --layers 2 --budget "${case%%|*}" --calibration "$dir/cal.json" 2>&1)
  rc=$?
  set -e
  [ "$rc" -ne 0 ] && grep -qF -- "${case#*|}" <<<"$err" || fail "--budget ${case%%|*} not refused as '${case#*|}': $err"
done
# A Hugging Face directory (config.json alone): planned from its architecture, profiled through
# `strata bench llama`, and the emitted config trains it.
mkdir -p "$dir/llama"
cat > "$dir/llama/config.json" <<'JSON'
{"model_type": "qwen3", "vocab_size": 320, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
 "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 128}
JSON
"$strata" plan --model "$dir/llama" --seq-len 32 --budget device=4MiB,host=64MiB --iters 1 \
  --calibration "$dir/cal.json" --emit-config "$dir/llama.json" > "$dir/llama_plan.txt"
grep -q "^chosen: " "$dir/llama_plan.txt" || fail "no choice for the llama: $(cat "$dir/llama_plan.txt")"
"$strata" train --model "$dir/llama" --seq-len 32 --config "$dir/llama.json" --data "$root/docs/user-guide.md" --steps 2 \
  >/dev/null || fail "the emitted config does not train the llama"
echo "PASS"
