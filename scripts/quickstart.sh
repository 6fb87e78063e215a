#!/usr/bin/env bash
# The main job: installs what is missing, builds Strata, and runs the demo. Until the
# training demo lands it shows what this machine offers (`strata info`) and measures its
# device runtime (`strata bench device`).
set -euo pipefail
source "$(dirname "$0")/deps.sh"
strata_install_deps
strata_configure "$STRATA_ROOT/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$STRATA_ROOT/build" -j"${STRATA_JOBS:-2}" --target strata
"$STRATA_ROOT/build/bin/strata" info
echo
"$STRATA_ROOT/build/bin/strata" bench device
