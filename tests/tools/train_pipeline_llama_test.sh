#!/usr/bin/env bash
# `strata train --model DIR --pipeline-stages P`: Hugging Face Llama-family directories
# (written by `strata init`: a Llama, the same Llama with a tied head, a Qwen3 with q/k norms)
# split over 2 pipeline stages as threads give the plain trainer's losses, gradient norms and
# final parameters bit for bit under every schedule (gpipe, 1f1b, interleaved, and the
# zero-bubble zb-h1, zb-h2 and zb-auto: the blocks split B from W), in fp32 at ZeRO-1 and in
# bf16 at ZeRO-3 with parameters and optimizer state on NVMe; the tied head's embedding
# gradient crosses the stages (the tie) to the same bits; two replicas under strata launch
# give the plain two-rank losses; a directory with config.json alone starts from the plain
# trainer's initial values; a run resumed from a pipelined checkpoint ends with the bits of
# one that never stopped, and one of another architecture is refused (the checkpoint records
# config.json, as the plain trainer's do); --sample draws the plain trainer's tokens; what the Llama pipeline
# cannot take (FP8, layers that do not split) is refused by name.
# Exits 77 (skipped) where io_uring is unavailable.
set -euo pipefail
source "$(dirname "$0")/common.sh" "$1" train-pipeline-llama
data=$(dirname "$0")/../../docs/user-guide.md
mkdir -p "$dir/llama" "$dir/tied" "$dir/qwen3" "$dir/cfgonly"
cat > "$dir/llama/config.json" <<'JSON'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 384, "hidden_size": 64,
 "intermediate_size": 160, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
 "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
 "tie_word_embeddings": false, "torch_dtype": "bfloat16"}
JSON
sed 's/"tie_word_embeddings": false/"tie_word_embeddings": true/' "$dir/llama/config.json" > "$dir/tied/config.json"
cat > "$dir/qwen3/config.json" <<'JSON'
{"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 320, "hidden_size": 48,
 "intermediate_size": 96, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
 "head_dim": 16, "max_position_embeddings": 128, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
 "attention_bias": false, "tie_word_embeddings": false, "torch_dtype": "bfloat16"}
JSON
cp "$dir/qwen3/config.json" "$dir/cfgonly/config.json"
for m in llama tied qwen3; do
  "$strata" init --model "$dir/$m" --out "$dir/$m-hf" --seed 3 >/dev/null
done
ds() {  # $1: file, $2: zero stage, $3: offload device, $4: bf16 (true/false)
  cat > "$1" <<JSON
{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4, "gradient_clipping": 1.0,
 "bf16": {"enabled": $4},
 "optimizer": {"type": "AdamW", "params": {"lr": 0.002, "weight_decay": 0.01}},
 "zero_optimization": {"stage": $2, "stage3_param_persistence_threshold": 0,
   "offload_optimizer": {"device": "$3", "nvme_path": "$dir/nvme"},
   "offload_param": {"device": "$3", "nvme_path": "$dir/nvme", "max_in_cpu": 0}}}
JSON
}
ds "$dir/z1.json" 1 none false
ds "$dir/b3.json" 3 nvme true
same() {  # $1: what, $2: plain log, $3: pipelined log, [$4 $5: plain and pipelined --save-params]
  python3 - "$2" "$3" <<'PY' || fail "$1: losses or gradient norms differ"
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert len(a) == len(b) >= 2, (len(a), len(b))
for x, y in zip(a, b):
    assert x["loss"] == y["loss"] and x["grad_norm"] == y["grad_norm"], (x["step"], x["loss"], y["loss"],
                                                                       x["grad_norm"], y["grad_norm"])
assert b[-1]["loss"] < b[0]["loss"], "the loss did not go down"
PY
  if [ $# -gt 3 ]; then tensors_equal "$4" "$5" || fail "$1: parameters differ from the plain trainer's"; fi
  echo "ok: $1: the plain trainer's losses and gradient norms${4:+ and parameters}, bit for bit"
}
run=(train --data "$data" --seq-len 32 --seed 5)

# fp32, ZeRO-1: every schedule the Llama pipeline runs, each model.
for m in llama tied qwen3; do
  "$strata" "${run[@]}" --steps 4 --model "$dir/$m-hf" --device host --config "$dir/z1.json" --log-json "$dir/$m.jsonl" \
    --save-params "$dir/$m.st" --sample 12 > "$dir/$m.txt"
  for kind in gpipe 1f1b interleaved zb-h1 zb-h2 zb-auto; do
    chunks=()
    [ "$kind" = interleaved ] && chunks=(--chunks 2)
    [ "$kind" = zb-auto ] && chunks=(--measure-steps 1)  # ZB-H1 for step 1, then its measured schedule
    [ "$kind" = interleaved ] && [ "$m" = qwen3 ] && continue  # 6 layers do not split into 4 virtual stages
    out=$("$strata" "${run[@]}" --steps 4 --model "$dir/$m-hf" --config "$dir/z1.json" --pipeline-stages 2 --schedule "$kind" \
      "${chunks[@]}" --log-json "$dir/$m-$kind.jsonl" --save-params "$dir/$m-$kind.st" --sample 12 2>&1) ||
      fail "$m $kind: $out"
    grep -Eq "step +4/4 +loss [0-9.]+ .* dev [0-9.]+( [KMG]?i?B)?/[0-9.]+ [KMG]iB .*\(stage [01]\)$" <<<"$out" ||
      fail "$m $kind: no progress lines: $out"
    if [ "$kind" = zb-auto ]; then
      grep -Eq "zb-auto (from step 1's measured times|: no schedule fits)" <<<"$out" ||
        fail "$m zb-auto: no word of the measured schedule: $out"
    fi
    grep -q "reading .* tensors from $dir/$m-hf (1 shard file)" <<<"$out" || fail "$m $kind: no load line: $out"
    same "$m, $kind, 2 stages, fp32 ZeRO-1" "$dir/$m.jsonl" "$dir/$m-$kind.jsonl" "$dir/$m.st" "$dir/$m-$kind.st"
    grep -Eq "^sample \([0-9]+ bytes\)" "$dir/$m.txt" || fail "$m: the plain trainer sampled nothing: $(cat "$dir/$m.txt")"
    [ "$(grep -A1 '^sample' <<<"$out")" = "$(grep -A1 '^sample' "$dir/$m.txt")" ] ||
      fail "$m $kind: sampled text differs: $(grep -A1 '^sample' <<<"$out") vs $(grep -A1 '^sample' "$dir/$m.txt")"
  done
done
echo "ok: --sample draws the plain trainer's tokens"

# bf16, ZeRO-3 with parameters and optimizer state on NVMe.
"$strata" "${run[@]}" --steps 4 --model "$dir/qwen3-hf" --device host --config "$dir/b3.json" --log-json "$dir/qb.jsonl" \
  --save-params "$dir/qb.st" >/dev/null
"$strata" "${run[@]}" --steps 4 --model "$dir/qwen3-hf" --config "$dir/b3.json" --pipeline-stages 2 --schedule 1f1b \
  --log-json "$dir/qb-pipe.jsonl" --save-params "$dir/qb-pipe.st" >/dev/null
same "qwen3, 1f1b, bf16 ZeRO-3 on NVMe" "$dir/qb.jsonl" "$dir/qb-pipe.jsonl" "$dir/qb.st" "$dir/qb-pipe.st"
"$strata" "${run[@]}" --steps 4 --model "$dir/qwen3-hf" --config "$dir/b3.json" --pipeline-stages 2 --schedule zb-h2 \
  --log-json "$dir/qb-zb.jsonl" --save-params "$dir/qb-zb.st" >/dev/null
same "qwen3, zb-h2, bf16 ZeRO-3 on NVMe" "$dir/qb.jsonl" "$dir/qb-zb.jsonl" "$dir/qb.st" "$dir/qb-zb.st"

"$strata" "${run[@]}" --steps 4 --model "$dir/tied-hf" --device host --config "$dir/b3.json" --log-json "$dir/tb.jsonl" \
  --save-params "$dir/tb.st" >/dev/null
"$strata" "${run[@]}" --steps 4 --model "$dir/tied-hf" --config "$dir/b3.json" --pipeline-stages 2 \
  --schedule interleaved --chunks 2 --log-json "$dir/tb-pipe.jsonl" --save-params "$dir/tb-pipe.st" >/dev/null
same "tied, interleaved, bf16 ZeRO-3 on NVMe" "$dir/tb.jsonl" "$dir/tb-pipe.jsonl" "$dir/tb.st" "$dir/tb-pipe.st"
[ -z "$(find "$dir/nvme" -mindepth 1 2>/dev/null)" ] || fail "swap files left behind: $(find "$dir/nvme")"

# Two data-parallel replicas as processes: 2 stages x 2 replicas against the plain trainer
# on 2 ranks (which means the loss over ranks in fp32: within 1e-7).
"$strata" launch -n 2 -- "$strata" "${run[@]}" --steps 4 --model "$dir/tied-hf" --device host --config "$dir/z1.json" \
  --log-json "$dir/t2.jsonl" >/dev/null
"$strata" launch -n 4 -- "$strata" "${run[@]}" --steps 4 --model "$dir/tied-hf" --config "$dir/z1.json" --pipeline-stages 2 \
  --schedule 1f1b --log-json "$dir/t2-pipe.jsonl" >/dev/null
python3 - "$dir/t2.jsonl" "$dir/t2-pipe.jsonl" <<'PY' || fail "2 replicas: losses or gradient norms differ"
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert len(a) == len(b) == 4
for x, y in zip(a, b):
    assert abs(x["loss"] - y["loss"]) <= 1e-7 * x["loss"] and x["grad_norm"] == y["grad_norm"], (x, y)
PY
echo "ok: tied, 2 stages x 2 replicas as processes: the plain two-rank losses and gradient norms"

# config.json alone: Hugging Face's initialisation, the plain trainer's values.
"$strata" "${run[@]}" --steps 4 --model "$dir/cfgonly" --device host --config "$dir/z1.json" --log-json "$dir/c.jsonl" >/dev/null
out=$("$strata" "${run[@]}" --steps 4 --model "$dir/cfgonly" --config "$dir/z1.json" --pipeline-stages 2 --schedule gpipe \
  --log-json "$dir/c-pipe.jsonl" 2>&1) || fail "config.json alone: $out"
grep -q "config.json alone: starting from Hugging Face's initialisation" <<<"$out" || fail "no init line: $out"
same "config.json alone, gpipe" "$dir/c.jsonl" "$dir/c-pipe.jsonl"

# Resume: a run stopped after step 2 of 4 continues to the bits of one that never stopped.
"$strata" "${run[@]}" --steps 2 --model "$dir/tied-hf" --config "$dir/z1.json" --pipeline-stages 2 --schedule 1f1b \
  --save-dir "$dir/ck" --log-json "$dir/r1.jsonl" >/dev/null
[ -d "$dir/ck/stage0" ] && [ -d "$dir/ck/stage1" ] || fail "no per-stage checkpoints under $dir/ck"
out=$("$strata" "${run[@]}" --steps 4 --model "$dir/tied-hf" --config "$dir/z1.json" --pipeline-stages 2 --schedule 1f1b \
  --resume "$dir/ck" --log-json "$dir/r2.jsonl" --save-params "$dir/r.st" 2>&1) || fail "resume: $out"
grep -q "resumed from $dir/ck at step 3" <<<"$out" || fail "no resume line: $out"
cat "$dir/r1.jsonl" "$dir/r2.jsonl" > "$dir/r.jsonl"
same "tied, 1f1b, resumed at step 3 (against the run that never stopped)" "$dir/tied-1f1b.jsonl" "$dir/r.jsonl" "$dir/tied-1f1b.st" "$dir/r.st"

expect_refusal "a resume with another architecture" "is not the one --model $dir/llama-hf describes" \
  "$strata" "${run[@]}" --steps 4 --model "$dir/llama-hf" --config "$dir/z1.json" --pipeline-stages 2 \
  --schedule 1f1b --resume "$dir/ck"

python3 -c 'import json, sys
c = json.load(open(sys.argv[1])); c["fp8"] = {"enabled": True}; print(json.dumps(c))' "$dir/z1.json" > "$dir/fp8.json"
expect_refusal "an fp8 config" "FP8 matrix products are implemented for the GPT" \
  "$strata" "${run[@]}" --steps 4 --model "$dir/llama-hf" --config "$dir/fp8.json" --pipeline-stages 2
expect_refusal "layers that do not split" "cannot split the model's 6 pipeline layers" \
  "$strata" "${run[@]}" --steps 4 --model "$dir/qwen3-hf" --config "$dir/z1.json" --pipeline-stages 4
expect_refusal "a directory without data" "needs --data" \
  "$strata" train --model "$dir/llama-hf" --config "$dir/z1.json" --pipeline-stages 2
