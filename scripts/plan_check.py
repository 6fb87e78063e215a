#!/usr/bin/python3
"""Checks `strata plan` against `strata train`: plans a GPT within the given budgets, trains the
chosen config (the plan's --emit-config) for a few steps on the host device, and compares the
predicted step time with the measured one (median of the steps after the first two, which
record the gather trace and re-plan). With --repeat N, plan and training alternate N times and
the medians are compared. Prints the choice, both times and their ratio; with --json one
object.

  plan_check.py STRATA --calibration FILE --budget device=..,host=..[,nvme=..] [--nvme-path DIR]
      [--config BASE] [--batch 8] [--world 1] [--steps 8] [--repeat 1] [--iters 5] [--tolerance 0.15] [--json]
      [-- GPT FLAGS...]   (default: 4 blocks x 128, 4 heads, 64-byte sequences)

Exit status 1 when the measured step time is off the prediction by more than --tolerance."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
DEFAULT_MODEL = ["--layers", "4", "--d-model", "128", "--heads", "4", "--seq-len", "64"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("strata")
    ap.add_argument("--calibration", required=True)
    ap.add_argument("--budget", required=True)
    ap.add_argument("--nvme-path", default="")
    ap.add_argument("--config", default="", help="base config for strata plan (optimizer, precision, buffers)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--world", type=int, default=1, help="ranks (strata launch -n N on this host)")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=1, help="training runs; the median of their medians is used")
    ap.add_argument("--tolerance", type=float, default=0.15)
    ap.add_argument("--iters", type=int, default=5, help="profiled passes per micro-batch (strata plan --iters)")
    ap.add_argument("--data", default=os.path.join(ROOT, "docs", "design.md"))
    ap.add_argument("--json", action="store_true")
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    a = ap.parse_args(argv[:split])
    model = argv[split + 1:] or DEFAULT_MODEL
    with tempfile.TemporaryDirectory() as tmp:
        cfg = os.path.join(tmp, "plan.json")
        plan = [a.strata, "plan", "--model", "gpt", *model, "--budget", a.budget, "--batch", str(a.batch),
                "--calibration", a.calibration, "--json", "--top", "1000", "--world", str(a.world), "--iters", str(a.iters)]
        if a.nvme_path:
            plan += ["--nvme-path", a.nvme_path]
        if a.config:
            plan += ["--config", a.config]
        best = None
        predicted, measured = [], []
        # Plan (profiling the pass) and train alternate, so both see the machine in the same
        # state; the first plan's choice is trained each time and its prediction read anew.
        for k in range(a.repeat):
            extra = ["--emit-config", cfg] if k == 0 else []
            done = subprocess.run(plan + extra, capture_output=True, text=True)
            if done.returncode != 0:  # Strata's own message (what to change), not a traceback
                raise SystemExit(f"plan_check: strata plan failed:\n{done.stderr.strip() or done.stdout.strip()}")
            out = json.loads(done.stdout)
            if best is None:
                best = out["best"][0]
            predicted.append(next(c["step_ms"] for c in out["best"] if c["label"] == best["label"]))
            log = os.path.join(tmp, "log.jsonl")
            train = [a.strata, "train", "--model", "gpt", *model, "--remat", best["remat"], "--config", cfg,
                     "--data", a.data, "--device", "host", "--steps", str(a.steps), "--log-json", log]
            if a.world > 1:
                train = [a.strata, "launch", "-n", str(a.world), "--", *train]
            done = subprocess.run(train, capture_output=True, text=True)
            if done.returncode != 0:
                raise SystemExit(f"strata train of the planned config failed:\n{done.stdout}\n{done.stderr}")
            with open(log) as f:
                steps = [json.loads(l)["step_ms"] for l in f if l.strip()]
            measured.append(statistics.median(steps[2:] if len(steps) > 2 else steps))
    got, want = statistics.median(measured), statistics.median(predicted)
    ratio = want / got
    out = {"budget": a.budget, "choice": best["label"], "predicted_ms": want, "measured_ms": got, "ratio": ratio,
           "runs_predicted_ms": predicted, "runs_measured_ms": measured,
           "peaks": {t: best[t + "_peak"] for t in ("device", "host", "nvme")},
           "parts_ms": {k: best[k + "_ms"] for k in ("compute", "gradients", "optimizer", "link", "nvme", "comm")}}
    if a.json:
        print(json.dumps(out))
    else:
        print(f"{a.budget}: chose {best['label']}; predicted {want:.1f} ms, measured {got:.1f} ms "
              f"(medians of {a.repeat} alternated plans and runs), predicted/measured {ratio:.3f}")
    return 0 if abs(ratio - 1) <= a.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
