#!/usr/bin/env bash
# `strata pipeline --config`: stages on ZeRO-3 engines with optimizer state and parameters
# on NVMe, as threads and as processes under `strata launch`, one and two data-parallel
# replicas, with clipping on, in fp32, bf16 and fp16, and zb-auto from the times measured in
# ZB-H1 steps; --verify must find the parameters bitwise equal to the plain
# data-parallel engine run, the report must show each stage's NVMe traffic, no swap file may
# be left behind, and configs the pipeline cannot run are refused naming the key or flag,
# device budgets too small naming the activations or the stage's minimum.
# Exits 77 (skipped) where io_uring is unavailable.
set -euo pipefail
source "$(dirname "$0")/common.sh" "$1" pipeline-engine
config() {  # $1: gradient_accumulation_steps, $2: compute ("fp32", "bf16" or "fp16")
  local bf16=false fp16=false
  [ "$2" = bf16 ] && bf16=true
  [ "$2" = fp16 ] && fp16=true
  cat > "$dir/ds.json" <<JSON
{"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": $1, "gradient_clipping": 0.05,
 "bf16": {"enabled": $bf16}, "fp16": {"enabled": $fp16},
 "optimizer": {"type": "AdamW", "params": {"lr": 0.001, "weight_decay": 0.01}},
 "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
   "offload_optimizer": {"device": "nvme", "nvme_path": "$dir/nvme"},
   "offload_param": {"device": "nvme", "nvme_path": "$dir/nvme", "max_in_cpu": 0}}}
JSON
}
check() {  # $1: what ran, $2: its output
  grep -q "parameters: bitwise equal to the plain data-parallel run" <<<"$2" || fail "$1: not bitwise equal: $2"
  grep -Eq "engine: .*NVMe read [1-9]" <<<"$2" || fail "$1: no NVMe reads reported: $2"
  # Each stage's last clipping coefficient is min(1, 0.05 / its grad norm) (gradient_clipping
  # 0.05): under strata launch the fields were once shifted by one (grad norm 1, clip 8.7e-322).
  awk '/grad norm .*, clip / { n = $(NF - 2) + 0; c = $NF + 0; want = 0.05 / n < 1 ? 0.05 / n : 1
         if (c < 0.99 * want || c > 1.01 * want) bad = 1; lines++ } END { exit bad || lines == 0 }' <<<"$2" ||
    fail "$1: a stage's clip coefficient is not min(1, 0.05 / grad norm): $2"
  [ -z "$(find "$dir/nvme" -mindepth 1 2>/dev/null)" ] || fail "$1: swap files left behind: $(find "$dir/nvme")"
  echo "ok: $1"
}

config 8 fp32
out=$("$strata" pipeline --kind zb-h1 -p 2 -m 8 --layers 4 --config "$dir/ds.json" --verify 2>&1) || fail "zb-h1: $out"
check "zb-h1, 2 stages as threads" "$out"
# The trace: one process per stage with the executor's and the engine's rows, drawn per stage.
out=$("$strata" pipeline --kind zb-h1 -p 2 -m 8 --layers 4 --config "$dir/ds.json" --trace "$dir/t.json" 2>&1) ||
  fail "zb-h1 with --trace: $out"
python3 - "$dir/t.json" <<'PY'
import json, re, sys
ev = json.load(open(sys.argv[1]))["traceEvents"]
procs = {e["pid"]: e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "process_name"}
assert procs == {0: "stage 0", 1: "stage 1"}, procs
lanes = {(e["pid"], e["tid"]): e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
for pid in procs:
    used = {lanes[(e["pid"], e["tid"])] for e in ev if e["ph"] == "X" and e["pid"] == pid}
    need = {"compute", "send/recv", "gather", "nvme read", "nvme write", "optimizer", "reduce"}
    assert need <= used, (pid, need - used)
    computes = [e["name"] for e in ev if e["ph"] == "X" and e["pid"] == pid and lanes[(pid, e["tid"])] == "compute"
                and re.fullmatch(r"(F|B|W|BW)[0-9]+", e["name"])]  # the executor's actions (the engine's waits too)
    assert sorted(computes) == sorted([f"{k}{m}" for k in "FBW" for m in range(8)]), computes
PY
/usr/bin/python3 "$(dirname "$0")/../../scripts/trace_svg.py" "$dir/t.json" "$dir/t.svg"
grep -q "stage 1: nvme write" "$dir/t.svg" || fail "the SVG has no per-stage rows"
echo "ok: trace with every stage's engine rows"
out=$("$strata" pipeline --kind interleaved -p 2 -v 2 -m 8 --layers 8 --replicas 2 --config "$dir/ds.json" \
  --verify 2>&1) || fail "interleaved: $out"
check "interleaved, 2 stages x 2 replicas as threads" "$out"
out=$("$strata" launch -n 4 -- "$strata" pipeline --kind zb-h2 -p 2 -m 8 --layers 4 --replicas 2 \
  --config "$dir/ds.json" --verify 2>&1) || fail "zb-h2 as processes: $out"
check "zb-h2, 2 stages x 2 replicas as processes" "$out"
# --json under strata launch: rank 0's report, unprefixed, is one JSON document whose engines
# carry their own fields (clip coefficients in (0, 1]).
out=$("$strata" launch -n 2 -- "$strata" pipeline --kind 1f1b -p 2 -m 8 --layers 4 --config "$dir/ds.json" \
  --json 2>&1) || fail "--json as processes: $out"
python3 -c 'import json, sys
j = json.loads(sys.argv[1])
assert all(0 < e["clip_coef"] <= 1 and e["activation_peak_bytes"] > 0 for e in j["engines"]), j["engines"]' "$out" ||
  fail "--json under strata launch is not JSON with each engine's fields: $out"
echo "ok: --json under strata launch"

# zb-auto scheduled from the per-stage F/B/W times of two ZB-H1 steps on the same engines' config.
out=$("$strata" pipeline --kind zb-auto -p 2 -m 8 --layers 4 --config "$dir/ds.json" --measure-steps 2 --verify 2>&1) ||
  fail "zb-auto from measured times: $out"
grep -Eq "zb-auto from 2 ZB-H1 step\(s\)' measured times: stage 0 F [0-9.]+ B [0-9.]+ W [0-9.]+ ms; stage 1 F" \
  <<<"$out" || fail "no measured times printed: $out"
check "zb-auto from measured times" "$out"
# zb-auto's memory limit from the device budget: the most micro-batches whose replayed
# activations and engine minimum fit (3 = 2p - 1 with room; 2 when 2.25 MiB leaves one
# layer's buffer above that limit's 2.00 MiB need), and refused below a limit of 1.
auto=(pipeline --kind zb-auto -p 2 -m 8 --layers 4 --width 256 --rows 64 --config "$dir/ds.json")
out=$("$strata" "${auto[@]}" --device-budget 8MiB 2>&1) || fail "zb-auto in 8 MiB: $out"
grep -q "zb-auto memory limit 3 micro-batches" <<<"$out" || fail "not the full limit in 8 MiB: $out"
out=$("$strata" "${auto[@]}" --device-budget 2300KiB --verify 2>&1) || fail "zb-auto in 2300 KiB: $out"
grep -q "zb-auto memory limit 2 micro-batches" <<<"$out" || fail "the limit does not follow the budget: $out"
check "zb-auto with its memory limit from the budget" "$out"
if msg=$("$strata" "${auto[@]}" --device-budget 1MiB 2>&1); then fail "zb-auto in 1 MiB accepted"; fi
grep -q "even a memory limit of 1 micro-batch needs .* raise --device-budget" <<<"$msg" || fail "no minimum named: $msg"

if msg=$("$strata" pipeline --kind 1f1b -p 2 -m 8 --measure-steps 1 2>&1); then fail "--measure-steps with 1f1b accepted"; fi
grep -q "needs --kind zb-auto" <<<"$msg" || fail "--measure-steps refusal does not name --kind: $msg"

if msg=$("$strata" pipeline -p 2 -m 4 --config "$dir/ds.json" 2>&1); then fail "4 micro-batches against 8 accepted"; fi
grep -q "gradient_accumulation_steps is 8 but the schedule has 4 micro-batches" <<<"$msg" || fail "no key named: $msg"
config 8 bf16
out=$("$strata" pipeline --kind zb-h1 -p 2 -m 8 --layers 4 --config "$dir/ds.json" --verify 2>&1) || fail "bf16: $out"
check "zb-h1 in bf16, 2 stages as threads" "$out"
# In bf16 a stage also holds fp32 copies of the layers an action gathers: zb-auto's minimum
# counts them, and a run at exactly the budget it names trains (the activations' pool
# neither fragments nor lets the engine's buffers fragment the rest).
need=$({ "$strata" "${auto[@]}" --device-budget 1MiB 2>&1 || true; } |
  sed -n 's/.*limit of 1 micro-batch needs .* (\([0-9]*\) B.*/\1/p')
[[ -n $need ]] || fail "zb-auto in bf16 under 1 MiB named no minimum"
out=$("$strata" "${auto[@]}" --device-budget "$need" 2>&1) || fail "zb-auto in bf16 at the $need B it named: $out"
grep -q "zb-auto memory limit 1 micro-batches" <<<"$out" || fail "not a limit of 1 at the named minimum: $out"
echo "ok: zb-auto's minimum counts the fp32 copies of a bf16 stage"
config 8 fp16
out=$("$strata" pipeline --kind zb-h1 -p 2 -m 8 --layers 4 --config "$dir/ds.json" --verify 2>&1) || fail "fp16: $out"
check "zb-h1 in fp16 with a dynamic loss scaler, 2 stages as threads" "$out"
if msg=$("$strata" pipeline -p 2 -m 8 --replicas 2 2>&1); then fail "--replicas without --config accepted"; fi
grep -q "needs --config" <<<"$msg" || fail "--replicas refusal does not name --config: $msg"
config 8 fp32
if msg=$("$strata" pipeline -p 2 -m 8 --layers 4 --config "$dir/ds.json" --device-budget 4KiB 2>&1); then
  fail "a 4 KiB device accepted"
fi
grep -q "the schedule's activations need .* raise the device budget" <<<"$msg" || fail "no activations named: $msg"
if msg=$("$strata" pipeline -p 2 -m 8 --layers 4 --width 64 --config "$dir/ds.json" --device-budget 96KiB 2>&1); then
  fail "a 96 KiB device accepted"
fi
grep -q "reserved for the schedule's activations.*Raise the device budget to at least" <<<"$msg" ||
  fail "the engine's refusal does not name the stage's minimum: $msg"
echo "ok: refusals name the key"
