"""What the Python tests share: torch (or exit 77, skipped, where it is not installed), two
threads for torch, and counted checks that report every failure before the test exits (one of
them: a call that must raise StrataError with a given text)."""
import sys

try:
    import torch
except ImportError:
    print("SKIPPED: torch is not installed (apt-get install python3-torch)")
    sys.exit(77)

torch.set_num_threads(2)
checks = {"passed": 0, "failed": 0}


def check(cond, what):
    checks["passed" if cond else "failed"] += 1
    if not cond:
        print("FAILED:", what, file=sys.stderr)


def finish():
    """Prints the counts and exits 1 when a check failed."""
    print(f"{checks['passed']} checks passed, {checks['failed']} failed")
    sys.exit(1 if checks["failed"] else 0)


def raises(fn, text, what):
    """Checks that fn() raises strata.StrataError whose message holds `text`."""
    import strata  # after torch: a test without torch exits 77 above
    try:
        fn()
    except strata.StrataError as e:
        check(text in str(e), f"{what}: message {e!r} lacks {text!r}")
        return
    check(False, f"{what}: no StrataError")
