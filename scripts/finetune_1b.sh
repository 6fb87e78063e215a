#!/usr/bin/env bash
# Fine-tunes a 1B Llama from a Hugging Face directory with ZeRO-3 from NVMe under a host budget
# of a quarter of its model states, and reports what issue 50 asks to see: the bytes read at
# load, tokens/s, the peak RSS against `strata estimate`'s bound, and the NVMe traffic.
# The model is Llama 3.2 1B's published config.json (scripts/configs/hf/llama-3.2-1b) (1.24B parameters, tied head, GQA 32/8,
# llama3 rope scaling), its weights random, written here in bf16 by `strata init` (nothing can
# be downloaded on these machines); a real checkpoint directory goes in the same --model slot.
# Usage: scripts/finetune_1b.sh [DIR (default /var/tmp/strata-1b)] [STEPS (default 4)]
# Needs about 25 GB free in DIR (2.5 GB of weights, 17 GB of NVMe state) and 12 GB of RAM.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-/var/tmp/strata-1b}
steps=${2:-4}
strata=$root/build/bin/strata
mkdir -p "$dir/nvme"
[ -f "$dir/model/config.json" ] || "$strata" init --model "$root/scripts/configs/hf/llama-3.2-1b" --out "$dir/model" --dtype bf16 --max-shard-size 1GB
# Model states at 16 bytes per parameter (bf16 weights and gradients, fp32 master, m and v):
# 19.8 GB (18.4 GiB); the host budget is a quarter of that, the rest lives on NVMe. reduce_bucket_size
# (DeepSpeed's key) keeps the reduction scratch at 50M elements: the tied embedding is one
# 262M-parameter layer, and the default (500M) would size the scratch to all of it.
cat > "$dir/ds.json" <<JSON
{"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
 "bf16": {"enabled": true},
 "optimizer": {"type": "AdamW", "params": {"lr": 2e-5, "weight_decay": 0.0}},
 "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0, "sub_group_size": 16000000,
   "reduce_bucket_size": 50000000,
   "offload_optimizer": {"device": "nvme", "nvme_path": "$dir/nvme", "buffer_count": 6},
   "offload_param": {"device": "nvme", "nvme_path": "$dir/nvme", "buffer_count": 4, "buffer_size": 16000000,
                     "max_in_cpu": 0}},
 "aio": {"queue_depth": 32},
 "memory_budget": {"device": "6GiB", "host": "4.6GiB"}}
JSON
flags=(--model "$dir/model" --config "$dir/ds.json" --seq-len 128)
"$strata" estimate "${flags[@]}" | tee "$dir/estimate.txt"
sync && echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true
"$strata" train "${flags[@]}" --data "$root/docs/user-guide.md" --steps "$steps" --log-json "$dir/log.jsonl" --explain \
  | tee "$dir/train.txt"
/usr/bin/python3 - "$dir/log.jsonl" "$dir/estimate.txt" "$dir/train.txt" <<'PY'
import json, re, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
est = open(sys.argv[2]).read()
train = open(sys.argv[3]).read()
bound = re.search(r"process RSS peak ([0-9.]+ [KMG]iB)", est).group(1)
load = re.search(r"loaded .*", train).group(0)
later = rows[1:] or rows
tps = statistics.median(r["tokens_per_s"] for r in later)
rss = max(r["rss"]["peak_bytes"] for r in rows) / 2**30
io = later[-1]["io"]
print(f"1B fine-tune summary: {load}")
print(f"  median tokens/s after the first step {tps:.1f}; step ms {statistics.median(r['step_ms'] for r in later):.0f}")
print(f"  peak RSS {rss:.2f} GiB against strata estimate's bound {bound}")
print(f"  per step: NVMe read {io['nvme_read_bytes'] / 1e9:.2f} GB, written {io['nvme_write_bytes'] / 1e9:.2f} GB")
print(f"  losses {[round(r['loss'], 4) for r in rows]}")
PY
