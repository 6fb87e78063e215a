#!/usr/bin/env bash
# strata export: a checkpoint saved at world 2 (stage 2, two shard files) exports to the same
# tensor bytes as the run's own --save-params; bf16 export is each fp32 master rounded to
# nearest even; export's peak RSS above the same binary's baseline stays under its bound
# (the largest tensor plus fixed buffers) on a model several times that bound. Then
# --init-from: a run started from the exported file with lr 0 keeps exactly those weights
# (fp32 and from the bf16 file), and a file missing a tensor, with an extra one or a
# mis-shaped one is refused naming it, and so is one holding a NaN or an infinity (naming the
# element); so is an --out that is a directory or in a missing one. [regression] cases: an
# --out that is the checkpoint, inside it or one of its files (a link) is refused naming both
# paths with the checkpoint unchanged; SIGINT and SIGTERM mid-export and a write error (a
# file size limit) leave no OUT.tmp and exit non-zero.
set -euo pipefail
source "$(dirname "$0")/common.sh" "$1" export
py=/usr/bin/python3  # Debian's, with numpy
layers=24 hidden=1024
mlp=(--model mlp --layers $layers --hidden $hidden --seed 2 --device host)
config() {  # stage lr
  cat <<JSON
{"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": $2, "weight_decay": 0.01}},
 "zero_optimization": {"stage": $1, "offload_optimizer": {"device": "cpu"}}}
JSON
}
config 2 0.001 > "$dir/train.json"
config 1 0 > "$dir/frozen.json"
"$strata" launch -n 2 -- "$strata" train "${mlp[@]}" --config "$dir/train.json" --steps 1 --save-dir "$dir/ck" \
  --save-params "$dir/ref.st" > "$dir/train.log"
"$strata" export --checkpoint "$dir/ck" --out "$dir/e.st" > "$dir/export.log"
tensors_equal "$dir/ref.st" "$dir/e.st" $((2 * layers)) || fail "the export differs from the run's own parameters"
"$strata" export --checkpoint "$dir/ck" --out "$dir/e16.st" --dtype bf16 > /dev/null
"$py" - "$dir/e.st" "$dir/e16.st" <<'PY' || fail "the bf16 export is not the fp32 masters rounded to nearest even"
import json, struct, sys
import numpy as np
def load(p):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n]); h.pop("__metadata__")
    return {k: (v["dtype"], b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]) for k, v in h.items()}
f32, b16 = load(sys.argv[1]), load(sys.argv[2])
assert f32.keys() == b16.keys()
for k in f32:
    assert f32[k][0] == "F32" and b16[k][0] == "BF16", k
    u = np.frombuffer(f32[k][1], dtype=np.uint32).astype(np.uint64)
    want = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    assert np.array_equal(want, np.frombuffer(b16[k][1], dtype=np.uint16)), k
PY
echo "export: the world-2 checkpoint's masters equal --save-params byte for byte; bf16 is their RNE rounding"

# Peak RSS: export against `checkpoint show` (the same binary, reading only the manifest).
"$py" - "$strata" "$dir" $((hidden * hidden * 4)) $((layers * (hidden * hidden + hidden) * 4)) <<'PY' ||
import os, subprocess, sys
strata, d, largest, model = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
def peak(args):
    p = subprocess.Popen([strata] + args, stdout=subprocess.DEVNULL)
    _, status, ru = os.wait4(p.pid, 0)
    assert status == 0, args
    return ru.ru_maxrss * 1024
base = min(peak(["checkpoint", "show", d + "/ck"]) for _ in range(3))
exp = peak(["export", "--checkpoint", d + "/ck", "--out", d + "/rss.st"])
bound = largest + 12 * 2**20  # the largest tensor + fixed buffers (1M-element piece, conversion, chunk caches)
print(f"export peak RSS {exp / 2**20:.1f} MiB, baseline {base / 2**20:.1f} MiB: growth {(exp - base) / 2**20:.1f} MiB "
      f"against a bound of {bound / 2**20:.1f} MiB for a model of {model / 2**20:.1f} MiB ({model / bound:.1f}x the bound)")
sys.exit(0 if exp - base < bound and model > 4 * bound else 1)
PY
  fail "export's peak RSS is above its bound"

"$strata" train "${mlp[@]}" --config "$dir/frozen.json" --steps 1 --init-from "$dir/e.st" --save-params "$dir/i.st" > "$dir/i.log"
grep -q "initialised $((2 * layers)) tensors from" "$dir/i.log" || fail "no init message: $(cat "$dir/i.log")"
tensors_equal "$dir/e.st" "$dir/i.st" || fail "--init-from (fp32) did not start from the file's weights"
"$strata" export --checkpoint "$dir/ck" --out "$dir/e16b.st" --dtype bf16 > /dev/null
"$strata" train "${mlp[@]}" --config "$dir/frozen.json" --steps 1 --init-from "$dir/e16b.st" --save-params "$dir/i16.st" > /dev/null
"$py" - "$dir/e16b.st" "$dir/i16.st" <<'PY' || fail "--init-from (bf16) did not start from the file's weights"
import json, struct, sys
import numpy as np
def load(p):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n]); h.pop("__metadata__", None)
    return {k: b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]] for k, v in h.items()}
a, b = load(sys.argv[1]), load(sys.argv[2])
for k in a:
    want = np.frombuffer(a[k], dtype=np.uint16).astype(np.uint32) << 16
    assert np.array_equal(want, np.frombuffer(b[k], dtype=np.uint32)), k
PY
echo "--init-from: a frozen (lr 0) run keeps the file's weights exactly, from fp32 and from bf16"

# Files that do not fit the model.
"$py" - "$dir/e.st" "$dir" <<'PY'
import json, struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n]); meta = h.pop("__metadata__")
data = b[8 + n:]
def write(name, tensors):
    out, blobs, off = {"__metadata__": meta}, [], 0
    for k, (shape, blob) in tensors.items():
        out[k] = {"dtype": "F32", "shape": shape, "data_offsets": [off, off + len(blob)]}
        blobs.append(blob); off += len(blob)
    hb = json.dumps(out).encode(); hb += b" " * (-len(hb) % 8)
    open(sys.argv[2] + "/" + name, "wb").write(struct.pack("<Q", len(hb)) + hb + b"".join(blobs))
t = {k: (v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]]) for k, v in h.items()}
write("missing.st", {k: v for k, v in t.items() if k != "layers.3.bias"})
write("extra.st", dict(t, **{"lm_head.weight": ([2], b"\0" * 8)}))
w = dict(t); w["layers.0.bias"] = ([2, t["layers.0.bias"][0][0] // 2], t["layers.0.bias"][1])
write("shape.st", w)
PY
for c in "missing:has no tensor 'layers.3.bias', which this model registers" \
         "extra:has tensor 'lm_head.weight', which this model does not register" \
         "shape:tensor 'layers.0.bias' has shape \[2, 512\] but the model's is \[1024\]"; do
  out=$("$strata" train "${mlp[@]}" --config "$dir/frozen.json" --steps 1 --init-from "$dir/${c%%:*}.st" 2>&1) &&
    fail "--init-from ${c%%:*}.st was accepted"
  grep -q "${c#*:}" <<<"$out" || fail "unclear: $out"
done
echo "--init-from refusals: a missing, an extra and a mis-shaped tensor, each named"
# An --out that cannot be written is refused naming it, before the checkpoint is read.
for c in "$dir:is a directory: give a file name inside it" "$dir/none/e.st:the directory '$dir/none' does not exist"; do
  out=$("$strata" export --checkpoint "$dir/ck" --out "${c%%:*}" 2>&1) && fail "export to ${c%%:*} was accepted"
  grep -qF -- "--out '${c%%:*}'" <<<"$out" && grep -qF -- "${c#*:}" <<<"$out" || fail "unclear: $out"
done
echo "export refusals: an --out that is a directory or in a missing one, each named"

# [regression] --init-from with a NaN or an infinity: every step was skipped as an overflow
# and the run ended with exit 0.
"$py" - "$dir/e.st" "$dir" <<'PY'
import json, struct, sys
b = bytearray(open(sys.argv[1], "rb").read())
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
for name, tensor, elem, value in (("nan.st", "layers.1.weight", 5, float("nan")),
                                  ("inf.st", "layers.2.bias", 7, float("-inf"))):
    c = bytearray(b)
    at = 8 + n + h[tensor]["data_offsets"][0] + 4 * elem
    c[at:at + 4] = struct.pack("<f", value)
    open(sys.argv[2] + "/" + name, "wb").write(c)
PY
for c in "nan:tensor 'layers.1.weight' holds nan at element 5" "inf:tensor 'layers.2.bias' holds -inf at element 7"; do
  expect_refusal "--init-from ${c%%:*}.st" "${c#*:}" \
    "$strata" train "${mlp[@]}" --config "$dir/frozen.json" --steps 1 --init-from "$dir/${c%%:*}.st"
done

# [regression] An --out inside the checkpoint being read overwrote its file (the manifest
# here); each is refused before a byte is written, naming both paths.
step=$(tr -d '[:space:]' < "$dir/ck/latest")
ck="$dir/ck/$step"
ln "$ck/manifest.json" "$dir/hard.json"
ln -s "$ck" "$dir/steplink"
ln "$ck/manifest.json" "$dir/t.st.tmp"
sums() { find "$dir/ck" -type f -print0 | sort -z | xargs -0 md5sum; }
before=$(sums)
for c in "$dir/ck|$dir/ck|is the checkpoint directory '$dir/ck'" \
         "$dir/ck|$ck|lies inside the checkpoint directory '$dir/ck'" \
         "$dir/ck|$ck/manifest.json|lies inside the checkpoint directory '$dir/ck'" \
         "$ck|$ck/manifest.json|lies inside the checkpoint directory '$ck'" \
         "$ck|$dir/steplink/e.st|lies inside the checkpoint directory '$ck'" \
         "$ck|$dir/ck/latest|is the checkpoint's file '$dir/ck/latest'" \
         "$dir/ck|$dir/hard.json|is the checkpoint's file '$ck/manifest.json'" \
         "$dir/ck|$dir/t.st|'$dir/t.st.tmp' is the checkpoint's file '$ck/manifest.json'"; do
  IFS='|' read -r from out want <<<"$c"
  msg=$("$strata" export --checkpoint "$from" --out "$out" 2>&1) && fail "export from $from to $out was accepted"
  grep -qF -- "--out '$out'" <<<"$msg" && grep -qF -- "--checkpoint '$from'" <<<"$msg" ||
    fail "the refusal does not name both paths: $msg"
  grep -qF -- "$want" <<<"$msg" || fail "the refusal does not say \"$want\": $msg"
done
[ "$before" = "$(sums)" ] || fail "a refused export changed the checkpoint"
[ ! -e "$dir/steplink/e.st" ] && [ ! -e "$dir/t.st" ] || fail "a refused export wrote its output"
rm -f "$dir/hard.json" "$dir/steplink" "$dir/t.st.tmp"
echo "export refusals: an --out that is the checkpoint, inside it or one of its files; the checkpoint unchanged"

# [regression] SIGINT or SIGTERM mid-export: the export stops at the next piece, removes
# OUT.tmp and exits 128 + the signal. The export is stopped (SIGSTOP) as soon as OUT.tmp
# appears, so the signal lands while tensors remain; a run that finished first is retried.
for sig in INT TERM; do
  for try in 1 2 3; do
    rm -f "$dir/sig.st" "$dir/sig.st.tmp"
    "$strata" export --checkpoint "$dir/ck" --out "$dir/sig.st" > "$dir/sig.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 1000); do [ -e "$dir/sig.st.tmp" ] && break; sleep 0.005; done
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
  grep -q "export: interrupted by signal .* the partial '$dir/sig.st.tmp' was removed" "$dir/sig.log" ||
    fail "SIG$sig: unclear: $(cat "$dir/sig.log")"
  [ ! -e "$dir/sig.st.tmp" ] && [ ! -e "$dir/sig.st" ] || fail "SIG$sig left $(ls "$dir"/sig.st*)"
done
echo "export: SIGINT and SIGTERM stop it with no OUT.tmp left (exit 130, 143)"

# [regression] A write error mid-export (a file size limit: 8 MiB of a larger file) unwinds
# the writer, which removes OUT.tmp; SIGXFSZ killed the process and left it.
set +e
out=$( (ulimit -f 8192; "$strata" export --checkpoint "$dir/ck" --out "$dir/lim.st") 2>&1)
rc=$?
set -e
[ "$rc" = 1 ] || fail "under ulimit -f: exit $rc, not 1: $out"
grep -q "EFBIG" <<<"$out" && grep -qF "$dir/lim.st.tmp" <<<"$out" || fail "unclear: $out"
[ ! -e "$dir/lim.st.tmp" ] && [ ! -e "$dir/lim.st" ] || fail "a failed export left $(ls "$dir"/lim.st*)"
echo "export: a write error mid-export leaves no OUT.tmp"
