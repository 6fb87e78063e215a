#!/usr/bin/env bash
# The main job: installs what is missing, builds Strata, shows what the machine offers, and
# trains a byte-level GPT on the text of Debian's `fortunes` package (ZeRO-3, bf16, model
# states larger than the device budget: budget-driven placement puts part of them on NVMe),
# printing step, loss, tokens/s and memory per tier, validation loss every 50 steps and a
# generated sample; writes build/demo/gpt.jsonl and the loss plot build/demo/gpt-loss.png,
# saves a checkpoint every 200 steps in the background (build/demo/gpt-ckpt), verifies the
# last one and exports its weights (build/demo/gpt.safetensors).
# Then it trains the demo MLP with ZeRO stage 3 (bf16, optimizer state in pinned host RAM, CPU
# AdamW) on two local ranks through `strata launch`, printing step, loss, step time and
# memory per tier; writes the per-step log, the final parameters (safetensors) and a
# Perfetto trace under build/demo/. Then trains a model 16x larger than its device budget
# and 2x its host budget with budget-driven placement (memory_budget): the plan (--explain),
# then per step the bytes moved over the link and to/from NVMe (swap files under
# build/demo/nvme, removed at the end). Both run on the host device (the emulated GPU whose
# budgets the demo sets), with or without a GPU: `--device cuda` runs the first on GPUs.
set -euo pipefail
source "$(dirname "$0")/deps.sh"
strata_install_deps fortunes python3-matplotlib
strata_configure "$STRATA_ROOT/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$STRATA_ROOT/build" -j"${STRATA_JOBS:-2}" --target strata strata_c
strata_python_path  # `import strata` with Debian's python3
strata="$STRATA_ROOT/build/bin/strata"
out="$STRATA_ROOT/build/demo"
mkdir -p "$out"
"$strata" info
echo
echo "== GPT: a byte-level GPT on Debian's fortunes (the fortune files themselves, not their .dat indexes)"
sed "s#build/demo/nvme#$out/nvme#g" "$STRATA_ROOT/scripts/configs/gpt-demo.json" > "$out/gpt-demo.json"
"$strata" train --model gpt --data /usr/share/games/fortunes --layers 6 --d-model 192 --heads 6 --seq-len 128 \
  --remat always --config "$out/gpt-demo.json" --steps 600 --eval-every 50 --sample 400 --device host \
  --log-json "$out/gpt.jsonl" --save-dir "$out/gpt-ckpt" --save-every 200 --keep 2 --save-async
/usr/bin/python3 "$STRATA_ROOT/scripts/plot_loss.py" "$out/gpt.jsonl" "$out/gpt-loss.png" \
  "GPT 6 x 192 on fortunes (byte level), ZeRO-3 bf16, states on device + host + NVMe"
"$strata" checkpoint verify "$out/gpt-ckpt"
"$strata" export --checkpoint "$out/gpt-ckpt" --out "$out/gpt.safetensors"
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
