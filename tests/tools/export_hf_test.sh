#!/usr/bin/env bash
# strata export --format hf: a checkpoint whose trainer state records a Hugging Face config
# (model.hf_config, saved here through the C API from Python, as the Llama trainer does)
# exports to a directory that an independent reader (JSON and the safetensors layout, in
# Python) finds complete: config.json is the recorded config with torch_dtype set, the
# index's weight_map and total_size match the shards, the shards follow --max-shard-size (a
# tensor above it alone), fp32 is the checkpoint's masters byte for byte and bf16 their
# rounding to nearest even. Refused, naming why and leaving no output: a GPT checkpoint
# (no hf_config: --format safetensors is suggested), an --out that is not empty, one inside
# the checkpoint, --max-shard-size without --format hf and a size in bits. [regression]
# guards shared with the single-file export: bounded peak RSS, and SIGINT, SIGTERM and a
# write error mid-export leave neither OUT.tmp nor OUT.
# Usage: export_hf_test.sh STRATA LIBSTRATA_C PYTHON_DIR
set -euo pipefail
source "$(dirname "$0")/common.sh" "$1" export-hf
lib=$2 pydir=$3
py=/usr/bin/python3  # Debian's, with numpy

# A Llama-named checkpoint with its config recorded, and its masters as the reference.
STRATA_LIBRARY=$lib PYTHONPATH=$pydir "$py" - "$dir" <<'PY'
import json, sys
import numpy as np
import strata
d = sys.argv[1]
e = strata.Engine({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
                   "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "zero_optimization": {"stage": 0}})
shapes = [("model.embed_tokens.weight", [256, 16]), ("model.layers.0.input_layernorm.weight", [16]),
          ("model.layers.0.self_attn.q_proj.weight", [16, 16]), ("model.layers.0.mlp.up_proj.weight", [44, 16]),
          ("model.norm.weight", [16]), ("lm_head.weight", [256, 16])]
for i, (name, shape) in enumerate(shapes):
    e.register(name, shape, i, init="normal", scale=0.5)
e.setup()
config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 16,
          "num_hidden_layers": 1, "vocab_size": 256, "torch_dtype": "float32"}
e.save(d + "/ck", {"next_step": 0, "seed": 0, "model": {"hf_config": config}})
np.save(d + "/ref.npy", e.full_parameters())
json.dump({"config": config, "shapes": shapes}, open(d + "/ref.json", "w"))
PY

# check_dir OUT DTYPE MAX_SHARD_BYTES: the directory against the reference (see the header).
check_dir() {
  "$py" - "$dir" "$@" <<'PY'
import json, os, struct, sys
import numpy as np
d, out, dtype, limit = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
ref = json.load(open(d + "/ref.json"))
masters = np.load(d + "/ref.npy")
esize = 4 if dtype == "F32" else 2
files = sorted(os.listdir(out))
config = json.load(open(out + "/config.json"))
want = dict(ref["config"], torch_dtype={"F32": "float32", "BF16": "bfloat16"}[dtype])
assert config == want, (config, want)
if "model.safetensors.index.json" in files:
    index = json.load(open(out + "/model.safetensors.index.json"))
    shards = sorted(set(index["weight_map"].values()))
    n = len(shards)
    assert shards == [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)], shards
    assert files == sorted(shards + ["config.json", "model.safetensors.index.json"]), files
else:
    index, shards = None, ["model.safetensors"]
    assert files == ["config.json", "model.safetensors"], files
found, total = {}, 0
for s in shards:
    b = open(out + "/" + s, "rb").read()
    hn = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + hn])
    assert h.pop("__metadata__")["format"] == "pt"
    size = 0
    for k, v in h.items():
        assert k not in found and v["dtype"] == dtype, (k, v)
        lo, hi = v["data_offsets"]
        found[k] = (s, v["shape"], b[8 + hn + lo:8 + hn + hi])
        size += hi - lo
    assert size <= limit or len(h) == 1, (s, size)  # only a tensor above the limit may exceed it
    total += size
if index is not None:
    assert index["metadata"]["total_size"] == total
    assert index["weight_map"] == {k: v[0] for k, v in found.items()}
at = 0
assert list(found) == [n for n, _ in ref["shapes"]], list(found)  # the checkpoint's order
for name, shape in ref["shapes"]:
    s, got_shape, data = found[name]
    assert got_shape == shape, (name, got_shape, shape)
    m = masters[at:at + int(np.prod(shape))]
    at += m.size
    if dtype == "F32":
        assert data == m.tobytes(), name
    else:
        u = m.view(np.uint32).astype(np.uint64)
        rne = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
        assert np.array_equal(rne, np.frombuffer(data, dtype=np.uint16)), name
assert at == masters.size
print(f"{out}: {len(shards)} weight file(s), {len(found)} tensors, {total} bytes of {dtype} as expected")
PY
}

# 16 KiB lm_head and embeddings (fp32) exceed 5000 bytes: each alone; the small ones share.
out=$("$strata" export --checkpoint "$dir/ck" --format hf --out "$dir/hf" --max-shard-size 5000)
grep -q "exported 6 tensors" <<<"$out" && grep -q "peak RSS" <<<"$out" || fail "export said: $out"
check_dir "$dir/hf" F32 5000
[ "$(ls "$dir/hf" | grep -c safetensors$)" -ge 3 ] || fail "expected several shards: $(ls "$dir/hf")"
"$strata" export --checkpoint "$dir/ck" --format hf --out "$dir/hf16" --dtype bf16 --max-shard-size 2KB > /dev/null
check_dir "$dir/hf16" BF16 2000
"$strata" export --checkpoint "$dir/ck" --format hf --out "$dir/one" > /dev/null
check_dir "$dir/one" F32 5000000000
echo "export --format hf: sharded fp32 byte for byte, bf16 rounded to nearest even, one file when it fits"

# Refusals, each leaving no output behind.
cat > "$dir/gpt.json" <<'JSON'
{"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 0.001}}, "zero_optimization": {"stage": 1}}
JSON
head -c 20000 "$(dirname "$0")/../../docs/user-guide.md" > "$dir/data.txt"
"$strata" train --model gpt --layers 1 --heads 2 --d-model 16 --seq-len 8 --data "$dir/data.txt" --steps 1 \
  --device host --config "$dir/gpt.json" --save-dir "$dir/gpt" > "$dir/gpt.log"
expect_refusal "a GPT checkpoint for --format hf" \
  "records none.*export it with --format safetensors" \
  "$strata" export --checkpoint "$dir/gpt" --format hf --out "$dir/gpt-hf"
[ ! -e "$dir/gpt-hf" ] && [ ! -e "$dir/gpt-hf.tmp" ] || fail "a refused export left output"
mkdir "$dir/full" && echo mine > "$dir/full/notes.txt"
expect_refusal "an --out that is not empty" "'$dir/full' exists and is not empty (it holds 'notes.txt')" \
  "$strata" export --checkpoint "$dir/ck" --format hf --out "$dir/full"
[ "$(cat "$dir/full/notes.txt")" = mine ] && [ ! -e "$dir/full.tmp" ] || fail "the refused --out was touched"
expect_refusal "an --out inside the checkpoint" "lies inside the checkpoint directory" \
  "$strata" export --checkpoint "$dir/ck" --format hf --out "$dir/ck/step-00000000/hf"
cp -r "$dir/ck" "$dir/named.tmp"
expect_refusal "an --out written through the checkpoint (OUT.tmp)" \
  "--out '$dir/named/', written through '$dir/named.tmp', is the checkpoint directory" \
  "$strata" export --checkpoint "$dir/named.tmp" --format hf --out "$dir/named/"
[ ! -e "$dir/named" ] && [ -f "$dir/named.tmp/latest" ] || fail "the refused export touched the checkpoint"
expect_refusal "--max-shard-size without --format hf" "it needs --format hf" \
  "$strata" export --checkpoint "$dir/ck" --out "$dir/x.safetensors" --max-shard-size 1GB
expect_refusal "a shard size in bits" "reads as bits" \
  "$strata" export --checkpoint "$dir/ck" --format hf --out "$dir/bits" --max-shard-size 5Gb
# A larger checkpoint (32 tensors of 2 MiB): export's peak RSS above the same binary's
# baseline stays under the largest tensor plus fixed buffers; SIGINT and SIGTERM mid-export
# and a write error (a file size limit) leave no OUT.tmp and no OUT.
STRATA_LIBRARY=$lib PYTHONPATH=$pydir "$py" - "$dir" <<'PY'
import sys
import strata
e = strata.Engine({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
                   "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "zero_optimization": {"stage": 0}})
for i in range(32):
    e.register(f"model.layers.{i}.mlp.up_proj.weight", [512, 1024], i, init="normal", scale=0.02)
e.setup()
e.save(sys.argv[1] + "/big", {"next_step": 0, "seed": 0, "model": {"hf_config": {"model_type": "llama"}}})
PY
"$py" - "$strata" "$dir" <<'PY' || fail "export --format hf's peak RSS is above its bound"
import os, subprocess, sys
strata, d = sys.argv[1], sys.argv[2]
def peak(args):
    p = subprocess.Popen([strata] + args, stdout=subprocess.DEVNULL)
    _, status, ru = os.wait4(p.pid, 0)
    assert status == 0, args
    return ru.ru_maxrss * 1024
base = min(peak(["checkpoint", "show", d + "/big"]) for _ in range(3))
exp = peak(["export", "--checkpoint", d + "/big", "--format", "hf", "--out", d + "/rss", "--max-shard-size", "10MB"])
bound, model = 2 * 2**20 + 12 * 2**20, 32 * 2 * 2**20
print(f"export --format hf peak RSS {exp / 2**20:.1f} MiB, baseline {base / 2**20:.1f} MiB: growth "
      f"{(exp - base) / 2**20:.1f} MiB against a bound of {bound / 2**20:.1f} MiB for a model of {model / 2**20:.0f} MiB")
sys.exit(0 if exp - base < bound and model > 4 * bound else 1)
PY
for sig in INT TERM; do
  for try in 1 2 3; do
    rm -rf "$dir/sig" "$dir/sig.tmp"
    "$strata" export --checkpoint "$dir/big" --format hf --out "$dir/sig" --max-shard-size 10MB > "$dir/sig.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 1000); do [ -e "$dir/sig.tmp" ] && break; sleep 0.005; done
    kill -STOP "$pid" 2>/dev/null || true
    kill -"$sig" "$pid" 2>/dev/null || true
    kill -CONT "$pid" 2>/dev/null || true
    set +e
    wait "$pid"
    rc=$?
    set -e
    [ "$rc" = 0 ] || break
    echo "(the export finished before SIG$sig landed; again, try $try)"
  done
  want=$([ "$sig" = INT ] && echo 130 || echo 143)
  [ "$rc" = "$want" ] || fail "SIG$sig: exit $rc, not $want: $(cat "$dir/sig.log")"
  grep -q "export: interrupted by signal .* the partial '$dir/sig.tmp' was removed" "$dir/sig.log" ||
    fail "SIG$sig: unclear: $(cat "$dir/sig.log")"
  [ ! -e "$dir/sig.tmp" ] && [ ! -e "$dir/sig" ] || fail "SIG$sig left $(ls -d "$dir"/sig*)"
done
set +e
out=$( (ulimit -f 8192; "$strata" export --checkpoint "$dir/big" --format hf --out "$dir/lim") 2>&1)
rc=$?
set -e
[ "$rc" != 0 ] && grep -q "File too large" <<<"$out" || fail "a write past the file size limit: exit $rc: $out"
[ ! -e "$dir/lim.tmp" ] && [ ! -e "$dir/lim" ] || fail "a failed write left $(ls -d "$dir"/lim*)"
echo "export --format hf: bounded RSS; SIGINT, SIGTERM and a write error leave nothing behind"

# The default format is today's single file.
"$strata" export --checkpoint "$dir/ck" --out "$dir/e.safetensors" > /dev/null
[ -f "$dir/e.safetensors" ] || fail "--format safetensors (default) wrote no file"
echo "PASS"
