#!/usr/bin/env bash
# The main job: installs what is missing, builds Strata, shows what the machine offers, and
# trains the demo MLP with ZeRO stage 3 (bf16, optimizer state in pinned host RAM, CPU
# AdamW) on two local ranks through `strata launch`, printing step, loss, step time and
# memory per tier; writes the per-step log, the final parameters (safetensors) and a
# Perfetto trace under build/demo/.
set -euo pipefail
source "$(dirname "$0")/deps.sh"
strata_install_deps
strata_configure "$STRATA_ROOT/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$STRATA_ROOT/build" -j"${STRATA_JOBS:-2}" --target strata
strata="$STRATA_ROOT/build/bin/strata"
out="$STRATA_ROOT/build/demo"
mkdir -p "$out"
"$strata" info
echo
"$strata" launch -n 2 -- "$strata" train --model mlp --layers 8 --hidden 256 \
  --config "$STRATA_ROOT/scripts/configs/zero3-bf16.json" --steps 20 \
  --log-json "$out/train.jsonl" --save-params "$out/mlp.safetensors" --trace "$out/trace.json"
echo
echo "per-step log: $out/train.jsonl; parameters: $out/mlp.safetensors; trace: $out/trace.json.rank0"
