#!/usr/bin/env bash
# One prepared check for a lent GPU machine (H100/H200; minutes are scarce and a command may
# run at most ~10 minutes): every [cuda] test suite, then the GPU benchmarks of the CLI (the
# pinned link, the GPT in bf16 against PyTorch eager at GPT-2 124M shapes, an offloaded run of
# a model larger than its device budget with --trace, AdamW when the CLI has a GPU bench), each
# under its own `timeout` and going on after a failing step. Writes report.json and report.md
# (scripts/gpu_check_collect.py) after every step, so a run cut short still leaves a report.
# The build is made beforehand on a CPU machine and carried over (docs/gpu_check.md).
# Usage: scripts/gpu_check.sh [--build DIR] [--out DIR] [--budget-seconds N] [--quick] [--dry-run]
# Exit: 0 every step passed, 1 some step failed or timed out, 2 bad usage or an incomplete
# build, 77 no GPU here (skipped). --dry-run prints the plan and runs nothing (no GPU needed).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
usage() { sed -n '9,11p' "$0" | sed 's/^# \{0,1\}//'; }
refuse() { echo "gpu_check: $*" >&2; exit 2; }

build=$root/build out=gpu-report budget= quick=0 dry=0
while [ $# -gt 0 ]; do
  case $1 in
    --build|--out|--budget-seconds)
      [ $# -ge 2 ] && [ -n "$2" ] || refuse "$1 needs a value (see --help)"
      case $1 in --build) build=$2 ;; --out) out=$2 ;; *) budget=$2 ;; esac
      shift 2 ;;
    --quick) quick=1; shift ;;
    --dry-run) dry=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) refuse "unknown argument '$1' (see --help)" ;;
  esac
done
[ "$quick" = 1 ] && default_budget=240 || default_budget=480
budget=${budget:-$default_budget}
case $out in /*) ;; *) out=$PWD/$out ;; esac  # the steps run in $out/work
[[ $budget =~ ^[0-9]+$ ]] && [ "$budget" -ge 60 ] && [ "$budget" -le 3600 ] ||
  refuse "--budget-seconds '$budget' is not a whole number of seconds in 60..3600"

[ -d "$build" ] && build=$(cd "$build" && pwd)  # absolute: the steps run in $out/work
bin=$build/bin strata=$build/bin/strata
[ -x "$strata" ] || refuse "no strata binary at $strata: build first (scripts/test.sh or cmake --build build) or pass --build DIR"
suites=()
for t in "$bin"/strata_*_tests; do [ -x "$t" ] && suites+=("$t"); done
[ ${#suites[@]} -gt 0 ] || refuse "no test binaries $bin/strata_*_tests: build with the tests (they are on by default), or pass --build DIR"

if [ "$dry" = 0 ]; then
  if ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "SKIPPED: no nvidia-smi here (no NVIDIA driver): run this on the GPU machine (docs/gpu_check.md), or --dry-run for the plan"
    exit 77
  fi
  gpus=$(nvidia-smi -L 2>/dev/null) || true  # captured: grep -q in a pipe could cut it short
  if ! grep -q '^GPU ' <<<"$gpus"; then
    echo "SKIPPED: nvidia-smi lists no GPU here: run this on the GPU machine, or --dry-run for the plan"
    exit 77
  fi
  [ -x /usr/bin/python3 ] || refuse "no /usr/bin/python3: it writes report.json (Debian: apt-get install python3)"
fi

q() { printf '%q ' "$@"; }
names=() kinds=() budgets=() cmds=() notes=()
add() {  # add NAME KIND BUDGET_S COMMAND [NOTE]: NOTE is passed to the collector (e.g. cases=13)
  names+=("$1") kinds+=("$2") budgets+=("$3") cmds+=("$4") notes+=("${5:-}")
}
work=$out/work

add gpu_info info 10 "nvidia-smi -L; echo \"gpu: \$(nvidia-smi --query-gpu=name,memory.total,driver_version,pcie.link.gen.max,pcie.link.width.max --format=csv,noheader,nounits | head -1)\"; $(q "$strata" info --json)"
iters=10; [ "$quick" = 1 ] && iters=5
add bench_device bench_device 15 "$(q "$strata" bench device --device cuda --size 256MiB --iters $iters --json)"

# The [cuda] entries of ctest (tests/CMakeLists.txt, strata_add_test_suite): the tests tagged
# [cuda] and no other hardware tag. Listed as [CUDA]: Catch2's tags ignore case, and the
# runner (tests/support/test_main.cc) exits 77 before listing a spec that names [cuda] where
# there is no GPU, so the plan is the same on the CPU machine.
spec='[cuda]~[uring]~[pku]~[mount]'
for t in "${suites[@]}"; do
  n=$("$t" --list-test-names-only "${spec//cuda/CUDA}" 2>/dev/null | grep -c .)
  [ "$n" -gt 0 ] || continue
  s=${t##*/}; s=${s#strata_}; s=${s%_tests}
  add "test_$s" catch2 $((10 + 2 * n)) "$(q "$t" "$spec" --durations yes)" "cases=$n"
done

# GPT-2 124M (12 x 768, vocab 50257) in bf16, micro-batch 8 x 1024: the pass alone against
# cuBLAS on the same shapes, then the full step through the engine (ZeRO-0) against PyTorch
# eager with bf16 autocast on the same shapes (scripts/bench_gpt_torch.py).
gpt124=(--preset 124M --seq-len 1024)
steps=10; [ "$quick" = 1 ] && steps=6
add bench_gpt_124m_bf16 bench_gpt 25 "$(q "$strata" bench gpt --device cuda "${gpt124[@]}" --micro-batch 8 --products bf16 --iters $((iters / 2)) --json)"
add train_gpt_124m_bf16 train 30 "$(q "$strata" train --model gpt "${gpt124[@]}" --config "$work/gpt124m-bf16.json" \
  --data "$root/docs/user-guide.md" --steps "$steps" --device cuda --device-budget 64GiB --val-fraction 0 \
  --log-json "$work/train_gpt_124m_bf16.jsonl")"
py=${PYTHON:-/usr/bin/python3}
add torch_gpt_124m_bf16 torch 70 "if ! $(q "$py") -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then echo 'SKIPPED: $py has no torch with CUDA (set PYTHON to an interpreter that has it)'; exit 77; fi; $(q "$py" "$root/scripts/bench_gpt_torch.py" 12 12 768 1024 50257 8 "$steps" 8 cuda bf16)"

# Larger than its device budget: ZeRO-3, optimizer state and parameters in pinned host RAM,
# 8 GiB of device memory (scripts/configs/gpt-offload-gpu.json; README "The GPT on a GPU"),
# traced; then the same pass with everything on the GPU, the compute floor it is held to.
big=1.5B; [ "$quick" = 1 ] && big=774M
offload=(--preset "$big" --seq-len 1024 --remat always)
add train_offload train_offload 150 "$(q "$strata" train --model gpt "${offload[@]}" --device cuda \
  --config "$root/scripts/configs/gpt-offload-gpu.json" --data "$root/docs/user-guide.md" --steps $((steps / 2)) --val-fraction 0 \
  --log-json "$work/train_offload.jsonl" --trace "$work/train_offload.trace.json")"
add bench_gpt_offload_compute bench_gpt 60 "$(q "$strata" bench gpt --device cuda "${offload[@]}" --micro-batch 4 --products bf16 --iters 3 --json)"

adam_help=$("$strata" bench adam --help 2>/dev/null) || true
if grep -q -- '--device' <<<"$adam_help"; then
  add bench_adam_cuda bench_adam 25 "$(q "$strata" bench adam --device cuda --params 256M --iters $iters --json)"
else
  add bench_adam_cuda bench_adam 0 "" "unavailable=strata bench adam has no --device option in this build (CPU only)"
fi
[ "$quick" = 0 ] && add cli_train_gpt_cuda script 35 "$(q bash "$root/tests/tools/train_gpt_cuda_test.sh" "$strata")"
[ "$quick" = 0 ] && add cli_train_llama_cuda script 35 "$(q bash "$root/tests/tools/train_llama_cuda_test.sh" "$strata")"

# Each step gets its share of --budget-seconds: nominal budgets, scaled down when they sum
# to more (a tight budget starves the steps rather than overrunning the lease).
sum=0
for b in "${budgets[@]}"; do sum=$((sum + b)); done
for i in "${!budgets[@]}"; do
  b=${budgets[$i]}
  [ "$b" -gt 0 ] && [ "$sum" -gt "$budget" ] && b=$((b * budget / sum)) && [ "$b" -lt 1 ] && b=1
  budgets[$i]=$b
done
total=0
for b in "${budgets[@]}"; do total=$((total + b)); done

echo "gpu_check plan: build $build, out $out, budget ${budget}s$([ "$quick" = 1 ] && echo ', quick')"
for i in "${!names[@]}"; do
  if [ -z "${cmds[$i]}" ]; then
    printf '%-28s %-13s %5s   not run: %s\n' "${names[$i]}" "${kinds[$i]}" - "${notes[$i]#unavailable=}"
  else
    printf '%-28s %-13s %4ss   %s\n' "${names[$i]}" "${kinds[$i]}" "${budgets[$i]}" "${cmds[$i]//$'\n'/ }"
  fi
done
echo "total step budget: ${total}s of ${budget}s"
[ "$dry" = 1 ] && exit 0

mkdir -p "$out/logs" "$work" || refuse "cannot create $out/logs: pass --out DIR somewhere writable"
cat > "$work/gpt124m-bf16.json" <<'JSON'
{"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0, "bf16": {"enabled": true},
 "optimizer": {"type": "AdamW", "params": {"lr": 0.0003}}, "zero_optimization": {"stage": 0}}
JSON
collect() { /usr/bin/python3 "$root/scripts/gpu_check_collect.py" "$@"; }
collect start "$out" --build "$build" --budget "$budget" --quick "$quick" || refuse "scripts/gpu_check_collect.py failed to start $out/report.json"
t0=$SECONDS failed=0
for i in "${!names[@]}"; do
  name=${names[$i]} log=logs/${names[$i]}.log
  if [ -z "${cmds[$i]}" ]; then
    collect step "$out" "$name" "${kinds[$i]}" 0 - 0 "" "" "${notes[$i]}"
    continue
  fi
  left=$((budget - (SECONDS - t0)))
  if [ "$left" -lt 5 ]; then
    collect step "$out" "$name" "${kinds[$i]}" "${budgets[$i]}" - 0 "" "${cmds[$i]}" "unavailable=not run: the ${budget}s budget was spent"
    failed=1
    continue
  fi
  b=${budgets[$i]}; [ "$b" -gt "$left" ] && b=$left
  echo "== $name (${b}s): ${cmds[$i]//$'\n'/ }"
  start=$(date +%s.%N)
  (cd "$work" && timeout --kill-after=5 "$b" bash -c "${cmds[$i]}") >"$out/$log" 2>&1
  rc=$?
  secs=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')
  tail -n 3 "$out/$log" | sed 's/^/   /'
  echo "   exit $rc after ${secs}s"
  case $rc in 0|77) ;; *) failed=1 ;; esac
  collect step "$out" "$name" "${kinds[$i]}" "$b" "$rc" "$secs" "$log" "${cmds[$i]}" "${notes[$i]}" ||
    echo "gpu_check: could not add $name to $out/report.json (see above); its log is $out/$log" >&2
done
collect finish "$out"
echo "report: $out/report.md and $out/report.json (logs in $out/logs)"
exit $failed
