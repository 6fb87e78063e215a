#!/usr/bin/env bash
# Builds everything and runs every test suite (ctest), then the stream/event tests again
# under ThreadSanitizer. Installs missing Debian packages first. Environment:
#   STRATA_STRICT=ON   warnings are errors (CI sets it)
#   STRATA_TSAN=0      skip the ThreadSanitizer pass
#   STRATA_JOBS=N      build parallelism (default 2)
set -euo pipefail
source "$(dirname "$0")/deps.sh"
strata_install_deps
jobs=${STRATA_JOBS:-2}
strict=${STRATA_STRICT:-OFF}

echo "== build (strict=$strict)"
strata_configure "$STRATA_ROOT/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTRATA_STRICT="$strict"
cmake --build "$STRATA_ROOT/build" -j"$jobs"

echo "== tests"
(cd "$STRATA_ROOT/build" && ctest --output-on-failure -j"$jobs")

if [ "${STRATA_TSAN:-1}" != "0" ]; then
  echo "== ThreadSanitizer: device streams and events"
  strata_configure "$STRATA_ROOT/build-tsan" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTRATA_SANITIZE=thread \
    -DSTRATA_WITH_CUDA=OFF -DSTRATA_STRICT="$strict"
  cmake --build "$STRATA_ROOT/build-tsan" -j"$jobs" --target strata_device_tests
  # Timing assertions (throttle) are meaningless under TSan's slowdown; everything else runs.
  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" setarch "$(uname -m)" -R \
    "$STRATA_ROOT/build-tsan/bin/strata_device_tests" "~[throttle]~[cuda]"
fi
echo "== all test stages passed"
