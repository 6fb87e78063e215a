#!/usr/bin/env bash
# The main job: installs what is missing, builds Strata, shows what the machine offers, and
# trains the demo MLP with ZeRO stage 3 (bf16, optimizer state in pinned host RAM, CPU
# AdamW) on two local ranks through `strata launch`, printing step, loss, step time and
# memory per tier; writes the per-step log, the final parameters (safetensors) and a
# Perfetto trace under build/demo/. Then trains a model 16x larger than its device budget
# and 2x its host budget with budget-driven placement (memory_budget): the plan (--explain),
# then per step the bytes moved over the link and to/from NVMe (swap files under
# build/demo/nvme, removed at the end). Both run on the host device (the emulated GPU whose
# budgets the demo sets), with or without a GPU: `--device cuda` runs the first on GPUs.
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
  --config "$STRATA_ROOT/scripts/configs/zero3-bf16.json" --steps 20 --device host \
  --log-json "$out/train.jsonl" --save-params "$out/mlp.safetensors" --trace "$out/trace.json"
echo
echo "per-step log: $out/train.jsonl; parameters: $out/mlp.safetensors; trace: $out/trace.json.rank0"
echo
echo "== offload: a model 16x the device budget and 2x the host budget, the rest on NVMe"
sed "s#build/demo/nvme#$out/nvme#g" "$STRATA_ROOT/scripts/configs/zero3-budget-nvme.json" > "$out/zero3-budget-nvme.json"
"$strata" train --model mlp --layers 16 --hidden 256 --config "$out/zero3-budget-nvme.json" --steps 5 --explain --device host \
  --log-json "$out/offload.jsonl" --trace "$out/offload-trace.json"
echo "per-step log: $out/offload.jsonl; trace: $out/offload-trace.json"
