#!/usr/bin/env bash
# `strata train --model DIR` on Hugging Face directories end to end: `strata init` writes a
# sharded bf16 Llama directory; training from it gives the same losses, bit for bit, at ZeRO
# stage 0 and at stage 3 with parameters and optimizer state on NVMe under a small host budget,
# and after a resume from its checkpoint; a directory with config.json alone starts from the
# same values `strata init` wrote; broken directories are refused naming the tensor or file.
# Exits 77 (skipped) where io_uring is unavailable.
set -euo pipefail
source "$(dirname "$0")/common.sh" "$1" train-llama
cfg=$dir/cfg
mkdir -p "$cfg"
cat > "$cfg/config.json" <<'JSON'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 384, "hidden_size": 64,
 "intermediate_size": 160, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
 "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
 "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 64},
 "tie_word_embeddings": false, "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2}
JSON
"$strata" init --model "$cfg" --out "$dir/model" --max-shard-size 60KB --seed 3 > "$dir/init.txt"
grep -q "30 tensors in 8 files" "$dir/init.txt" || fail "not sharded as planned: $(cat "$dir/init.txt")"
[ -f "$dir/model/model.safetensors.index.json" ] || fail "no index written"
data=$(dirname "$0")/../../docs/user-guide.md
ds() {  # $1: stage, $2: extra zero_optimization keys, $3: dtype block
  cat <<JSON
{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "gradient_clipping": 1.0, $3
 "zero_optimization": {"stage": $1 $2},
 "optimizer": {"type": "AdamW", "params": {"lr": 0.002, "weight_decay": 0.01}}}
JSON
}
ds 0 "" "" > "$dir/s0.json"
ds 3 ", \"stage3_param_persistence_threshold\": 0, \"offload_optimizer\": {\"nvme_path\": \"$dir/nvme\"},
 \"offload_param\": {\"nvme_path\": \"$dir/nvme\"}" "\"memory_budget\": {\"host\": \"1MiB\"}," > "$dir/s3.json"
losses() { python3 -c 'import json,sys; print(" ".join(repr(json.loads(l)["loss"]) for l in open(sys.argv[1])))' "$1"; }
run=(train --model "$dir/model" --data "$data" --seq-len 32 --seed 5 --device host)

out=$("$strata" "${run[@]}" --config "$dir/s0.json" --steps 6 --log-json "$dir/l0.jsonl" --save-dir "$dir/ck" --save-every 3)
grep -q "loaded 30 tensors from $dir/model (8 shard files)" <<<"$out" || fail "no load line: $out"
l0=$(losses "$dir/l0.jsonl")
out=$("$strata" "${run[@]}" --config "$dir/s3.json" --steps 6 --log-json "$dir/l3.jsonl" --explain)
grep -q "nvme" <<<"$out" || fail "stage 3 placed nothing on NVMe: $out"
[ "$(losses "$dir/l3.jsonl")" = "$l0" ] || fail "stage 3 from NVMe differs from stage 0: $(losses "$dir/l3.jsonl") vs $l0"
echo "ok: stage 0 and stage 3 with NVMe offload under a 1 MiB host budget give the same losses: $l0"
"$strata" "${run[@]}" --config "$dir/s0.json" --steps 6 --log-json "$dir/lr.jsonl" --resume "$dir/ck/step-00000003" >/dev/null
[ "$(losses "$dir/lr.jsonl")" = "$(cut -d' ' -f4- <<<"$l0")" ] || fail "resumed losses differ: $(losses "$dir/lr.jsonl")"
echo "ok: resumed at step 3, the same losses"

# Two ranks: stage 0 and stage 3 from NVMe train the same parameters bit for bit, and at stage 3
# each rank reads only the byte ranges of the shards it owns (about half of what stage 0 reads).
for st in s0 s3; do
  "$strata" launch -n 2 -- "$strata" "${run[@]}" --config "$dir/$st.json" --steps 2 \
    --save-params "$dir/w2-$st.safetensors" > "$dir/w2-$st.log"
done
tensors_equal "$dir/w2-s0.safetensors" "$dir/w2-s3.safetensors" 30 || fail "world 2: stage 3 differs from stage 0"
read_bytes() { grep -o "rank 0 read [0-9.]* [KMG]iB" "$1" | awk '{v=$4; u=$5; m=(u=="KiB")?1024:(u=="MiB")?1048576:1073741824; printf "%d\n", v*m}'; }
r0=$(read_bytes "$dir/w2-s0.log")
r3=$(read_bytes "$dir/w2-s3.log")
[ -n "$r3" ] && [ "$r3" -lt $((r0 * 6 / 10)) ] || fail "stage 3 rank 0 read $r3 bytes, stage 0 $r0: not its shards alone"
echo "ok: world 2, stage 0 = stage 3 from NVMe; rank 0 read $r3 bytes at stage 3, $r0 at stage 0"

# A checkpoint several times the host budget loads inside it: each rank's ranges go straight
# to their partitions (parameters on NVMe here), never through a copy of the model in RAM.
mkdir -p "$dir/deep"
cat > "$dir/deep/config.json" <<'JSON'
{"model_type": "llama", "vocab_size": 1024, "hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 32,
 "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256}
JSON
"$strata" init --model "$dir/deep" --out "$dir/deep-model" --dtype fp32 --max-shard-size 4MB >/dev/null
cat > "$dir/deep.json" <<JSON
{"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
 "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0, "sub_group_size": 65536,
   "reduce_bucket_size": 65536,
   "offload_param": {"nvme_path": "$dir/nvme", "buffer_count": 2, "buffer_size": 65536}},
 "memory_budget": {"host": "6MiB"}, "optimizer": {"type": "AdamW", "params": {"lr": 0.001}}}
JSON
"$strata" train --model "$dir/deep-model" --data "$data" --seq-len 32 --device host --config "$dir/deep.json" \
  --steps 1 --log-json "$dir/deep.jsonl" >/dev/null
python3 - "$dir/deep-model" "$dir/deep.jsonl" <<'PY'
import json, os, sys
weights = sum(os.path.getsize(os.path.join(sys.argv[1], f)) for f in os.listdir(sys.argv[1]) if f.endswith(".safetensors"))
host = json.loads(open(sys.argv[2]).readline())["tiers"]["host"]
assert weights > 4 * host["budget_bytes"] and host["peak_bytes"] <= host["budget_bytes"], (weights, host)
print(f"ok: a {weights / 2**20:.1f} MiB checkpoint loaded and trained within a {host['budget_bytes'] / 2**20:.0f} MiB "
      f"host budget (peak {host['peak_bytes'] / 2**20:.2f} MiB)")
PY

# Export back to Hugging Face's layout, sharded: fp32 loads back bit for bit (one step at lr 0
# and no decay saves the weights it loaded), bf16 is the fp32 values rounded to nearest even.
"$strata" export --checkpoint "$dir/ck/step-00000006" --format hf --dtype fp32 --max-shard-size 100KB \
  --out "$dir/out32" >/dev/null
"$strata" export --checkpoint "$dir/ck/step-00000006" --format hf --dtype bf16 --out "$dir/out16" >/dev/null
grep -q '"model_type": "llama"' "$dir/out32/config.json" || fail "exported config.json: $(cat "$dir/out32/config.json")"
sed 's/"lr": 0.002, "weight_decay": 0.01/"lr": 0.0, "weight_decay": 0.0/' "$dir/s0.json" > "$dir/lr0.json"
"$strata" train --model "$dir/out32" --data "$data" --seq-len 32 --device host --config "$dir/lr0.json" --steps 1 \
  --save-params "$dir/back.safetensors" >/dev/null
python3 - "$dir/out32" "$dir/out16" "$dir/back.safetensors" <<'PY'
import json, os, struct, sys
def tensors(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n]); h.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]) for k, v in h.items()}
def hf_dir(d):
    files = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))
    out = {}
    for f in files:
        out.update(tensors(os.path.join(d, f)))
    return files, out
files32, t32 = hf_dir(sys.argv[1])
files16, t16 = hf_dir(sys.argv[2])
back = tensors(sys.argv[3])
assert len(files32) > 1 and os.path.exists(os.path.join(sys.argv[1], "model.safetensors.index.json")), files32
index = json.load(open(os.path.join(sys.argv[1], "model.safetensors.index.json")))
assert set(index["weight_map"]) == set(t32) and index["metadata"]["total_size"] == sum(len(v[2]) for v in t32.values())
assert set(back) == set(t32) and all(back[k][2] == t32[k][2] for k in t32), "fp32 export did not load back bit for bit"
for k, (dt, shape, raw) in t32.items():
    words = struct.unpack(f"<{len(raw) // 4}I", raw)
    want = bytes()
    rounded = [((w + 0x7FFF + ((w >> 16) & 1)) >> 16) & 0xFFFF for w in words]
    assert t16[k][0] == "BF16" and struct.unpack(f"<{len(rounded)}H", t16[k][2]) == tuple(rounded), k
print(f"ok: export hf: fp32 in {len(files32)} shards loads back bit for bit; bf16 is the fp32 rounded to nearest even")
PY

# config.json alone: the values strata init wrote for the same seed, at fp32 (bf16 on disk rounds).
"$strata" init --model "$cfg" --out "$dir/model32" --dtype fp32 --seed 5 >/dev/null
"$strata" train --model "$cfg" --data "$data" --seq-len 32 --seed 5 --device host --config "$dir/s0.json" --steps 2 \
  --log-json "$dir/la.jsonl" > "$dir/alone.txt"
grep -q "config.json alone" "$dir/alone.txt" || fail "no initialisation note: $(cat "$dir/alone.txt")"
"$strata" train --model "$dir/model32" --data "$data" --seq-len 32 --seed 5 --device host --config "$dir/s0.json" \
  --steps 2 --log-json "$dir/lb.jsonl" >/dev/null
[ "$(losses "$dir/la.jsonl")" = "$(losses "$dir/lb.jsonl")" ] || fail "config.json alone != strata init's weights"
echo "ok: config.json alone starts from the weights strata init writes"

# bf16 compute learns.
ds 0 "" '"bf16": {"enabled": true},' > "$dir/bf16.json"
"$strata" "${run[@]}" --config "$dir/bf16.json" --steps 8 --log-json "$dir/lbf.jsonl" >/dev/null
python3 - "$dir/lbf.jsonl" <<'PY'
import json, sys
l = [json.loads(x)["loss"] for x in open(sys.argv[1])]
assert l[-1] < l[0] - 0.05, l
print(f"ok: bf16 losses {l[0]:.4f} -> {l[-1]:.4f}")
PY

# Sizing from config.json alone: estimate and the pass's benchmark.
est=$("$strata" estimate --model "$cfg" --seq-len 32 --config "$dir/s3.json")
grep -q "178624 parameters" <<<"$est" || fail "estimate: $est"
"$strata" bench llama --model "$cfg" --seq-len 32 --micro-batch 2 --iters 1 --json \
  | python3 -c 'import json,sys; j=json.load(sys.stdin); assert j["tokens_per_s"] > 0 and j["parameters"] == 178624, j'
echo "ok: estimate and bench llama from config.json alone"

# Refusals, naming what is wrong.
cp -r "$dir/model" "$dir/broken"
rm "$dir/broken/model-00002-of-00008.safetensors"
expect_refusal "a missing shard" "model-00002-of-00008.safetensors" "$strata" "${run[@]/$dir\/model/$dir/broken}" \
  --config "$dir/s0.json" --steps 1
mkdir -p "$dir/wide" && cp "$dir"/model/*.safetensors "$dir/model/model.safetensors.index.json" "$dir/wide/"
sed 's/"intermediate_size": 160/"intermediate_size": 192/' "$dir/model/config.json" > "$dir/wide/config.json"
expect_refusal "mis-shaped tensors" "model.layers.0.mlp.gate_proj.weight" "$strata" train --model "$dir/wide" \
  --data "$data" --seq-len 32 --device host --config "$dir/s0.json" --steps 1
expect_refusal "GPT shape flags" "--d-model sets the GPT's shape" "$strata" "${run[@]}" --d-model 32 \
  --config "$dir/s0.json" --steps 1
# The pipeline itself: tests/tools/train_pipeline_llama_test.sh.
expect_refusal "2 pipeline stages for 3 blocks" "cannot split the model's 5 pipeline layers" "$strata" "${run[@]}" \
  --pipeline-stages 2 \
  --config "$dir/s0.json" --steps 1
expect_refusal "a sequence past max_position_embeddings" "max_position_embeddings 256" "$strata" train \
  --model "$dir/model" --data "$data" --seq-len 512 --device host --config "$dir/s0.json" --steps 1
[ ! -e "$dir/nvme" ] || fail "swap files left behind"
echo "all train llama checks passed"
