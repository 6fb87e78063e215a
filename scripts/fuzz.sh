#!/usr/bin/env bash
# Builds the libFuzzer harnesses (fuzz/: config reader, schedule text, swap-file header,
# safetensors reader, checkpoint manifest, tokenizer.json) with clang, ASan and UBSan into
# build-fuzz, then runs each for SECONDS seconds (default 10) over a scratch copy of its seed
# corpus (fuzz/corpus/<name>), so what a run discovers never lands in the repository. Fails on any
# crash, sanitizer report, leak, input slower than 1 s or using more than 2 GiB; the input
# is left in build-fuzz/findings/<name>/ (replay: build-fuzz/bin/fuzz_<name> FILE).
# Environment: STRATA_JOBS=N build parallelism (default 2).
# Usage: scripts/fuzz.sh [SECONDS]
set -euo pipefail
source "$(dirname "$0")/deps.sh"
strata_install_deps clang libclang-rt-14-dev
seconds=${1:-10}
jobs=${STRATA_JOBS:-2}
dir="$STRATA_ROOT/build-fuzz"
harnesses=(config schedule swap_header safetensors manifest tokenizer_json)
start=$(date +%s)

echo "== fuzz: build (clang, libFuzzer, ASan + UBSan) in $dir"
CC=clang CXX=clang++ strata_configure "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTRATA_FUZZ=ON \
  -DSTRATA_WITH_CUDA=OFF -DSTRATA_WITH_NCCL=OFF -DBUILD_TESTING=OFF
cmake --build "$dir" -j"$jobs" --target strata_fuzzers
built=$(date +%s)
echo "== fuzz: built in $((built - start)) s"

failed=()
for name in "${harnesses[@]}"; do
  work="$dir/fuzz-work/$name"
  findings="$dir/findings/$name"
  rm -rf "$work" "$findings"
  mkdir -p "$work/corpus" "$findings"
  cp "$STRATA_ROOT/fuzz/corpus/$name"/* "$work/corpus/"
  # -timeout and -rss_limit_mb make slow and memory-hungry inputs findings; ASan reports
  # leaks at the end of each input's run (detect_leaks).
  if ASAN_OPTIONS="detect_leaks=1" UBSAN_OPTIONS="print_stacktrace=1" \
    "$dir/bin/fuzz_$name" -max_total_time="$seconds" -timeout=1 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$findings/" "$work/corpus" > "$work/log" 2>&1; then
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/log")
    cov=$(grep -o 'cov: [0-9]*' "$work/log" | tail -1)
    echo "fuzz_$name: ${runs:-?} inputs in ${seconds} s, $cov, no finding"
  else
    echo "fuzz_$name: FINDING (input in $findings/); the end of its log:" >&2
    tail -40 "$work/log" >&2
    failed+=("$name")
  fi
done
echo "== fuzz: $(( $(date +%s) - start )) s in all (build $((built - start)) s, ${#harnesses[@]} x ${seconds} s runs)"
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: findings in ${failed[*]}" >&2
  exit 1
fi
