#!/usr/bin/env bash
# Two "hosts": two network namespaces joined by a veth pair, one rank in each, talking Gloo
# over that link only (STRATA_COMM_IFACE) and meeting through a shared rendezvous directory,
# as two machines with a shared filesystem do: once under one `strata launch --nnodes 2` per
# host, once started by hand with the launcher's environment. They train to the same bytes as two ranks on
# loopback; taking the link down mid-run ends both ranks within the comm timeout plus 5 s,
# each naming the op and saying that every peer is alive (the network failed). Skipped
# (exit 77, with the reason) where network namespaces cannot be made.
set -euo pipefail
strata=$1
fail() { echo "FAIL: $*" >&2; exit 1; }
skip() { echo "SKIPPED: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "network namespaces need root"
command -v ip > /dev/null || skip "no 'ip' command (iproute2)"
tag=$$
a=strata-a$tag b=strata-b$tag va=sa$tag vb=sb$tag
dir=$(mktemp -d "${STRATA_TEST_TMPDIR:-/var/tmp}/strata-two-hosts-test-XXXXXX")
cleanup() {
  ip netns del "$a" 2> /dev/null || true
  ip netns del "$b" 2> /dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT
ip netns add "$a" 2> "$dir/err" || skip "ip netns add failed: $(cat "$dir/err")"
ip netns add "$b"
ip link add "$va" netns "$a" type veth peer name "$vb" netns "$b" 2> "$dir/err" || skip "no veth: $(cat "$dir/err")"
ip -n "$a" addr add 10.231.0.1/24 dev "$va"
ip -n "$b" addr add 10.231.0.2/24 dev "$vb"
for ns in "$a" "$b"; do ip -n "$ns" link set lo up; done
ip -n "$a" link set "$va" up
ip -n "$b" link set "$vb" up

cat > "$dir/ds.json" <<'JSON'
{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "bf16": {"enabled": true},
 "zero_optimization": {"stage": 2}, "optimizer": {"type": "AdamW", "params": {"lr": 0.001}}}
JSON
timeout_ms=4000
# rank NS IFACE RANK RUN LOG ARGS...: one rank in namespace NS, Gloo bound to IFACE.
rank() {
  local ns=$1 iface=$2 r=$3 run=$4 log=$5
  shift 5
  ip netns exec "$ns" env STRATA_RANK="$r" STRATA_WORLD_SIZE=2 STRATA_RENDEZVOUS="file://$dir/rdzv" \
    STRATA_RUN_ID="$run" STRATA_COMM_IFACE="$iface" STRATA_COMM_TIMEOUT_MS=$timeout_ms \
    "$strata" train --model mlp --layers 3 --hidden 64 --config "$dir/ds.json" "$@" > "$log" 2>&1
}

# Each "host" runs its own launcher, torchrun-style (--nnodes, --node-rank, --run-id), with
# the rendezvous directory shared.
node() {
  local ns=$1 iface=$2 k=$3
  ip netns exec "$ns" env STRATA_COMM_IFACE="$iface" STRATA_COMM_TIMEOUT_MS=$timeout_ms \
    "$strata" launch -n 1 --nnodes 2 --node-rank "$k" --run-id same --rendezvous "$dir/rdzv" -- \
    "$strata" train --model mlp --layers 3 --hidden 64 --config "$dir/ds.json" --steps 5 \
    --save-params "$dir/veth.safetensors" > "$dir/node$k.log" 2>&1
}
node "$a" "$va" 0 &
pa=$!
node "$b" "$vb" 1 &
pb=$!
wait "$pa" || fail "node 0 over the veth link failed: $(tail -3 "$dir/node0.log")"
wait "$pb" || fail "node 1 over the veth link failed: $(tail -3 "$dir/node1.log")"
grep -q "world 2" "$dir/node0.log" || fail "node 0 did not train at world 2: $(cat "$dir/node0.log")"
"$strata" launch -n 2 -- "$strata" train --model mlp --layers 3 --hidden 64 --config "$dir/ds.json" --steps 5 \
  --save-params "$dir/loopback.safetensors" > "$dir/loop.log" 2>&1 || fail "loopback run: $(tail -3 "$dir/loop.log")"
cmp -s "$dir/veth.safetensors" "$dir/loopback.safetensors" || fail "the two-namespace run differs from loopback"
echo "ok: two ranks in two network namespaces over veth train to the same bytes as on loopback"

rank "$a" "$va" 0 down "$dir/a2.log" --steps 1000000 &
pa=$!
rank "$b" "$vb" 1 down "$dir/b2.log" --steps 1000000 &
pb=$!
for _ in $(seq 1 300); do grep -q "^step" "$dir/a2.log" 2> /dev/null && break; sleep 0.1; done
grep -q "^step" "$dir/a2.log" || fail "no step before the link went down: $(cat "$dir/a2.log")"
t0=$(date +%s)
ip -n "$a" link set "$va" down
for p in "$pa" "$pb"; do
  rc=0
  wait "$p" || rc=$?
  [ "$rc" = 1 ] || fail "a rank exited $rc after the link went down"
done
took=$(($(date +%s) - t0))
[ "$took" -le $((timeout_ms / 1000 + 5)) ] || fail "the ranks took $took s to end after the link went down"
# Both ranks wait on the same transfer and time out together; the first to look finds its
# peer alive (the network failed), the other may already find the first one gone.
network=0
for r in 0 1; do
  log=$dir/$([ $r = 0 ] && echo a2 || echo b2).log
  grep -q "strata: error: rank $r/2: .*no answer within $timeout_ms ms" "$log" || fail "rank $r's error: $(grep error "$log")"
  grep -q "Every other rank is alive and beating: the network between the ranks failed" "$log" && network=$((network + 1))
done
[ "$network" -ge 1 ] || fail "no rank said the network failed: $(grep -h error "$dir/a2.log" "$dir/b2.log")"
echo "ok: link down mid-run: both ranks ended in $took s naming the op and the network"
