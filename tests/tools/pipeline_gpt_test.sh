#!/usr/bin/env bash
# `strata pipeline --model gpt`: the GPT's embeddings, blocks and head as pipeline layers, the
# token embedding tied between the first and the last stage. Stages as threads and as
# processes (the tie over Gloo), with local parameters (gradients bitwise equal to the
# sequential loop) and on ZeRO-3 engines with optimizer state and parameters on NVMe
# (parameters bitwise equal to the plain data-parallel engine run, one and two replicas),
# zb-auto from measured times, and what the GPT pipeline refuses (an fp8 config among them), by name.
# Exits 77 (skipped) where io_uring is unavailable.
set -euo pipefail
source "$(dirname "$0")/common.sh" "$1" pipeline-gpt
readme="$(dirname "$0")/../../docs/user-guide.md"
gpt=(--model gpt --data "$readme" --d-model 32 --heads 4 --seq-len 16 --vocab 256 --micro-batch-size 2)
cat > "$dir/ds.json" <<JSON
{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 8, "gradient_clipping": 0.5,
 "optimizer": {"type": "AdamW", "params": {"lr": 0.001, "weight_decay": 0.01}},
 "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
   "offload_optimizer": {"device": "nvme", "nvme_path": "$dir/nvme"},
   "offload_param": {"device": "nvme", "nvme_path": "$dir/nvme", "max_in_cpu": 0}}}
JSON
check() {  # $1: what ran, $2: its output, $3: the verdict wanted
  grep -q "$3" <<<"$2" || fail "$1: not bitwise equal: $2"
  echo "ok: $1"
}

out=$("$strata" pipeline "${gpt[@]}" --layers 6 --kind 1f1b -p 4 -m 8 --verify 2>&1) || fail "1f1b: $out"
check "1f1b, 4 stages as threads, local parameters" "$out" "gradients: bitwise equal to the sequential loop"
grep -Eq "GPT last step: loss [0-9.]+" <<<"$out" || fail "no loss reported: $out"
out=$("$strata" launch -n 2 -- "$strata" pipeline "${gpt[@]}" --layers 6 --kind zb-h1 -p 2 -m 8 --verify 2>&1) ||
  fail "zb-h1 as processes: $out"
check "zb-h1, 2 stages as processes (the tie over Gloo)" "$out" "gradients: bitwise equal to the sequential loop"

engines="parameters: bitwise equal to the plain data-parallel run"
out=$("$strata" pipeline "${gpt[@]}" --layers 2 --kind zb-h1 -p 2 -m 8 --steps 3 --config "$dir/ds.json" \
  --verify 2>&1) || fail "zb-h1 on engines: $out"
check "zb-h1, ZeRO-3 on NVMe, 2 stages as threads" "$out" "$engines"
grep -Eq "engine: .*NVMe read [1-9]" <<<"$out" || fail "no NVMe reads reported: $out"
out=$("$strata" pipeline "${gpt[@]}" --layers 6 --kind interleaved -p 2 -v 2 -m 8 --replicas 2 \
  --config "$dir/ds.json" --verify 2>&1) || fail "interleaved on engines: $out"
check "interleaved, ZeRO-3 on NVMe, 2 stages x 2 replicas as threads" "$out" "$engines"
out=$("$strata" launch -n 4 -- "$strata" pipeline "${gpt[@]}" --layers 2 --kind zb-h2 -p 2 -m 8 --replicas 2 \
  --config "$dir/ds.json" --verify 2>&1) || fail "zb-h2 on engines as processes: $out"
check "zb-h2, ZeRO-3 on NVMe, 2 stages x 2 replicas as processes" "$out" "$engines"
out=$("$strata" pipeline "${gpt[@]}" --layers 2 --kind zb-auto -p 2 -m 8 --measure-steps 1 \
  --config "$dir/ds.json" --verify 2>&1) || fail "zb-auto on engines: $out"
check "zb-auto from measured times, ZeRO-3 on NVMe" "$out" "$engines"
[ -z "$(find "$dir/nvme" -mindepth 1 2>/dev/null)" ] || fail "swap files left behind: $(find "$dir/nvme")"

expect_refusal "a GPT without text" "needs --data" "$strata" pipeline --model gpt -p 2
expect_refusal "blocks that do not split" "do not split evenly" "$strata" pipeline "${gpt[@]}" --layers 3 -p 2
expect_refusal "a fixed layer time" "drop it" "$strata" pipeline "${gpt[@]}" --layers 2 -p 2 --layer-ms 3
python3 -c 'import json, sys
c = json.load(open(sys.argv[1])); c["fp8"] = {"enabled": True}; print(json.dumps(c))' "$dir/ds.json" > "$dir/fp8.json"
expect_refusal "an fp8 config (strata train --pipeline-stages trains FP8)" "train a pipelined GPT with FP8" \
  "$strata" pipeline "${gpt[@]}" --layers 2 -p 2 --config "$dir/fp8.json"
