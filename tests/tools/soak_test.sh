#!/usr/bin/env bash
# The soak in little (scripts/soak.py; by hand with --kills 200): a GPT with its parameters and
# optimizer state on NVMe, saving every step, killed with SIGKILL six times at random moments
# and resumed from latest, ends with one uninterrupted run's parameter bytes, with peak RSS,
# swap-file bytes and checkpoint bytes flat over the runs and at most one staging directory
# left by a kill. The swap files are kept once plus one spare per length (--spares 1), so the
# kills also land between early commits. Exits 77 (skipped) where io_uring is unavailable.
set -euo pipefail
source "$(dirname "$0")/common.sh" "$1" soak
/usr/bin/python3 "$(dirname "$0")/../../scripts/soak.py" --strata "$strata" --dir "$dir/soak" --kills 6 --seed 2 --spares 1
