#!/usr/bin/env bash
# Builds everything and runs every test suite (ctest), then the stream/event, io and offload
# tests again under ThreadSanitizer and the io suite under AddressSanitizer (leaks: every buffer and
# descriptor released). Installs missing Debian packages first. Environment:
#   STRATA_STRICT=ON   warnings are errors (CI sets it)
#   STRATA_TSAN=0      skip the ThreadSanitizer pass
#   STRATA_ASAN=0      skip the AddressSanitizer pass
#   STRATA_JOBS=N      build parallelism (default 2)
set -euo pipefail
source "$(dirname "$0")/deps.sh"
# python3-torch: the GPT's PyTorch oracle (tests/models/gpt_oracle_test.py).
strata_install_deps python3-torch
jobs=${STRATA_JOBS:-2}
strict=${STRATA_STRICT:-OFF}

echo "== build (strict=$strict)"
strata_configure "$STRATA_ROOT/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTRATA_STRICT="$strict"
cmake --build "$STRATA_ROOT/build" -j"$jobs"
strata_python_path  # `import strata` with Debian's python3 (python/strata, build/lib/libstrata_c.so)

echo "== tests"
(cd "$STRATA_ROOT/build" && ctest --output-on-failure -j"$jobs")

if [ "${STRATA_TSAN:-1}" != "0" ]; then
  echo "== ThreadSanitizer: device streams and events, io engine, offload (engine with NVMe tiers)"
  strata_configure "$STRATA_ROOT/build-tsan" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTRATA_SANITIZE=thread \
    -DSTRATA_WITH_CUDA=OFF -DSTRATA_STRICT="$strict"
  cmake --build "$STRATA_ROOT/build-tsan" -j"$jobs" --target strata_device_tests strata_io_tests strata_offload_tests
  # Timing assertions (throttle) are meaningless under TSan's slowdown, and the guard's
  # tests fork; everything else runs.
  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" setarch "$(uname -m)" -R \
    "$STRATA_ROOT/build-tsan/bin/strata_device_tests" "~[throttle]~[cuda]~[pku]"
  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" setarch "$(uname -m)" -R \
    "$STRATA_ROOT/build-tsan/bin/strata_io_tests"
  # The engine's gather, io, reduce and transfer streams against its ledger and stores; the
  # planner's brute-force comparisons are single-threaded and slow under TSan.
  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" setarch "$(uname -m)" -R \
    "$STRATA_ROOT/build-tsan/bin/strata_offload_tests" "~[brute]~[pku]"
fi
if [ "${STRATA_ASAN:-1}" != "0" ]; then
  echo "== AddressSanitizer (leak check included): io engine, buffer pool, swap files"
  strata_configure "$STRATA_ROOT/build-asan" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTRATA_SANITIZE=address \
    -DSTRATA_WITH_CUDA=OFF -DSTRATA_STRICT="$strict"
  cmake --build "$STRATA_ROOT/build-asan" -j"$jobs" --target strata_io_tests
  # No test spec: the runner skips (and names) [uring]/[mount] tests this machine cannot run.
  ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:detect_stack_use_after_return=1" \
    "$STRATA_ROOT/build-asan/bin/strata_io_tests"
fi
echo "== all test stages passed"
