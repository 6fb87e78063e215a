#!/usr/bin/env bash
# What Strata writes, read back by readers that share no code with it (Python's standard
# library): the parameters `--save-params` wrote as safetensors must be, name by name, the
# fp32 masters the checkpoint writer put in its shard files (another writer, another
# format), at world 2 with the masters split across both ranks' files. A writer that puts a
# tensor's bytes under another name, in another order or with wrong offsets fails this.
# Exits 77 (skipped) where io_uring is unavailable.
set -euo pipefail
source "$(dirname "$0")/common.sh" "$1" save-readback
cat > "$dir/ds.json" <<'JSON'
{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
 "zero_optimization": {"stage": 2, "reduce_bucket_size": 700},
 "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}}
JSON
"$strata" launch -n 2 -- "$strata" train --model mlp --layers 3 --hidden 40 --config "$dir/ds.json" --steps 4 \
  --save-params "$dir/params.safetensors" --save-dir "$dir/ckpt" > "$dir/log" 2>&1 || fail "$(tail -5 "$dir/log")"
python3 - "$dir/params.safetensors" "$dir/ckpt" <<'PY'
import json, os, struct, sys
path, root = sys.argv[1], sys.argv[2]
raw = open(path, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
header.pop("__metadata__", None)
saved = {}
end = 0
for name, e in header.items():
    assert e["dtype"] == "F32", (name, e)
    a, b = e["data_offsets"]
    count = 1
    for d in e["shape"]:
        count *= d
    assert b - a == 4 * count, (name, e)
    saved[name] = (e["shape"], struct.unpack(f"<{count}f", raw[8 + n + a:8 + n + b]))
    end = max(end, b)
assert 8 + n + end == len(raw), "bytes past the last tensor"
step = sorted(d for d in os.listdir(root) if d.startswith("step-"))[-1]
manifest = json.load(open(os.path.join(root, step, "manifest.json")))
assert manifest["world_size"] == 2
files = [open(os.path.join(root, step, f["name"]), "rb").read() for f in manifest["files"]]
split = 0
for t in manifest["tensors"]:
    values = [None] * t["numel"]
    segs = t["states"]["master"]
    split += len({s[0] for s in segs}) > 1
    for file, offset, elem, count in segs:
        values[elem:elem + count] = struct.unpack(f"<{count}f", files[file][offset:offset + 4 * count])
    shape, data = saved.pop(t["name"])
    assert shape == t["shape"], (t["name"], shape, t["shape"])
    assert list(data) == values, f"{t['name']}: safetensors and checkpoint masters differ"
assert not saved, f"tensors only in the safetensors file: {list(saved)}"
assert split > 0, "no tensor spans both ranks' files (the test would not see a sharding mistake)"
print(f"ok: {len(manifest['tensors'])} tensors in {path} equal the checkpoint's masters bit for bit "
      f"({split} of them split over both ranks' files)")
PY
