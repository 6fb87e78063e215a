#!/usr/bin/env python3
"""Checks `strata plan` against `strata train`: plans a GPT within the given budgets, trains the
chosen config (the plan's --emit-config) for a few steps on the host device, and compares the
predicted step time with the measured one (median of the steps after the first two, which
record the gather trace and re-plan). Prints the choice, both times and their ratio; with
--json one object.

  plan_check.py STRATA --calibration FILE --budget device=..,host=..[,nvme=..] [--nvme-path DIR]
      [--config BASE]      [--batch 8] [--steps 8] [--repeat 1] [--tolerance 0.15] [--json] [-- GPT FLAGS...]

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
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=1, help="training runs; the median of their medians is used")
    ap.add_argument("--tolerance", type=float, default=0.15)
    ap.add_argument("--data", default=os.path.join(ROOT, "docs", "design.md"))
    ap.add_argument("--json", action="store_true")
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    a = ap.parse_args(argv[:split])
    model = argv[split + 1:] or DEFAULT_MODEL
    with tempfile.TemporaryDirectory() as tmp:
        cfg = os.path.join(tmp, "plan.json")
        plan = [a.strata, "plan", "--model", "gpt", *model, "--budget", a.budget, "--batch", str(a.batch),
                "--calibration", a.calibration, "--emit-config", cfg, "--json", "--top", "3"]
        if a.nvme_path:
            plan += ["--nvme-path", a.nvme_path]
        if a.config:
            plan += ["--config", a.config]
        best = json.loads(subprocess.run(plan, check=True, capture_output=True, text=True).stdout)["best"][0]
        measured = []
        for _ in range(a.repeat):
            log = os.path.join(tmp, "log.jsonl")
            train = [a.strata, "train", "--model", "gpt", *model, "--remat", best["remat"], "--config", cfg,
                     "--data", a.data, "--device", "host", "--steps", str(a.steps), "--log-json", log]
            done = subprocess.run(train, capture_output=True, text=True)
            if done.returncode != 0:
                raise SystemExit(f"strata train of the planned config failed:\n{done.stdout}\n{done.stderr}")
            with open(log) as f:
                steps = [json.loads(l)["step_ms"] for l in f if l.strip()]
            measured.append(statistics.median(steps[2:] if len(steps) > 2 else steps))
    got = statistics.median(measured)
    ratio = best["step_ms"] / got
    out = {"budget": a.budget, "choice": best["label"], "predicted_ms": best["step_ms"], "measured_ms": got,
           "ratio": ratio, "runs_ms": measured,
           "parts_ms": {k: best[k + "_ms"] for k in ("compute", "gradients", "optimizer", "link", "nvme", "comm")}}
    if a.json:
        print(json.dumps(out))
    else:
        print(f"{a.budget}: chose {best['label']}; predicted {best['step_ms']:.1f} ms, measured {got:.1f} ms "
              f"(median of {a.repeat} runs), predicted/measured {ratio:.3f}")
    return 0 if abs(ratio - 1) <= a.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
