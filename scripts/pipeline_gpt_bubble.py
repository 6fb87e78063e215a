#!/usr/bin/python3
"""The GPT in a pipeline: per schedule, the measured bubble against the one the simulator
gives from the same run's measured per-stage F, B and W times (`strata pipeline --model gpt
--json`, the last of --steps steps). Runs each schedule --runs times and prints the medians,
their difference in points and whether it is within --limit points; exits 1 if any is not.
zb-auto is scheduled from the times measured in one ZB-H1 step (--measure-steps 1).

  pipeline_gpt_bubble.py STRATA [--stages 2] [--micro 8] [--runs 3] [--limit 5]
      [--processes] [--config FILE] [-- MODEL FLAGS...]   (default: 6 blocks x 128 on docs/user-guide.md)"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
DEFAULT_MODEL = ["--model", "gpt", "--data", os.path.join(ROOT, "docs", "user-guide.md"), "--layers", "6", "--d-model", "128",
                 "--heads", "4", "--seq-len", "64", "--vocab", "256", "--micro-batch-size", "4"]
KINDS = [("gpipe", []), ("1f1b", []), ("interleaved", ["-v", "2"]), ("zb-h1", []), ("zb-h2", []),
         ("zb-auto", ["--measure-steps", "1"])]


def run(args, kind, extra):
    cmd = [args.strata, "pipeline", "--kind", kind, "-p", str(args.stages), "-m", str(args.micro), "--steps", "2",
           "--json"] + extra + args.model
    if args.config:
        cmd += ["--config", args.config]
    if args.processes:
        if kind == "zb-auto":
            return None  # --measure-steps runs stages as threads
        cmd = [args.strata, "launch", "-n", str(args.stages), "--"] + cmd
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"pipeline_gpt_bubble: {' '.join(cmd)} failed:\n{out.stderr}{out.stdout}")
    text = "\n".join(line.removeprefix("[rank 0] ") for line in out.stdout.splitlines())  # strata launch's prefix
    j = json.loads(text[text.index("{"):])
    return j["measured"]["bubble_rate"], j["simulated_from_measured_times"]["bubble_rate"], j["measured"]["makespan_s"]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("strata")
    p.add_argument("--stages", type=int, default=2)
    p.add_argument("--micro", type=int, default=8)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--limit", type=float, default=5.0, help="points between measured and simulated")
    p.add_argument("--processes", action="store_true", help="stages as processes under strata launch")
    p.add_argument("--config", help="stages on ZeRO engines with this config")
    p.add_argument("model", nargs="*", help="model flags after --")
    args = p.parse_args()
    args.model = args.model or DEFAULT_MODEL
    mode = "processes" if args.processes else "threads"
    print(f"p={args.stages} m={args.micro}, {mode}, median of {args.runs} runs"
          + (f", engines: {args.config}" if args.config else ""))
    print(f"{'kind':12} {'measured':>9} {'simulated':>10} {'points':>7} {'step s':>8}")
    ok = True
    for kind, extra in KINDS:
        runs = [r for r in (run(args, kind, extra) for _ in range(args.runs)) if r is not None]
        if not runs:
            continue
        got = statistics.median(r[0] for r in runs)
        sim = statistics.median(r[1] for r in runs)
        span = statistics.median(r[2] for r in runs)
        diff = 100 * (got - sim)
        within = abs(diff) <= args.limit
        ok = ok and within
        print(f"{kind:12} {100 * got:8.2f}% {100 * sim:9.2f}% {diff:+7.2f} {span:8.3f}  {'ok' if within else 'OVER'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
