#!/usr/bin/env python3
"""Memory budget against speed: trains a model for a few steps at each point of a sweep of
one tier's budget (memory_budget.device or .host; the others fixed), with budget-driven
placement, and records per point the measured step time, tokens/s and each tier's peak
beside `strata estimate`'s prediction. Writes a CSV and a PNG (step time and tokens/s
against the budget; each tier's measured peak with the prediction drawn over it).

  budget_sweep.py STRATA --tier device --points 8MiB,12MiB,16MiB,24MiB,48MiB --out DIR
      [--config scripts/configs/gpt-demo.json] [--host 40MiB] [--device 24MiB] [--nvme 256MiB]
      [--steps 5] [-- MODEL FLAGS...]   (default: the main job's GPT on Debian's fortunes)

A budget nothing fits is recorded with the smallest budget that would (from the refusal)."""
import argparse
import csv
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
TIERS = ["device", "host", "nvme"]
DEFAULT_MODEL = ["--model", "gpt", "--layers", "6", "--d-model", "192", "--heads", "6", "--seq-len", "128",
                 "--remat", "always"]
UNITS = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def parse_bytes(text):
    m = re.fullmatch(r"([0-9.]+)\s*(KiB|MiB|GiB)?", text.strip())
    if not m:
        raise SystemExit(f"budget_sweep: '{text}' is not a size like 24MiB")
    return int(float(m.group(1)) * UNITS.get(m.group(2) or "", 1))


def point(strata, args, cfg, budgets, tmp):
    cfg = json.loads(json.dumps(cfg))
    cfg["memory_budget"] = {t: f"{budgets[t] // 1024}KiB" for t in TIERS}
    for key in ("offload_optimizer", "offload_param"):
        cfg.setdefault("zero_optimization", {}).setdefault(key, {})["nvme_path"] = os.path.join(tmp, "nvme")
    path = os.path.join(tmp, "config.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    row = {f"{t}_budget": budgets[t] for t in TIERS}
    est = subprocess.run([strata, "estimate", *args.model_est, "--config", path, "--json"], capture_output=True,
                         text=True)
    if est.returncode != 0:
        m = re.search(r"at least [^(]*\((\d+) B", est.stderr)
        row["refused"] = est.stderr.strip().splitlines()[-1][:200]
        row["smallest_budget"] = int(m.group(1)) if m else ""
        return row
    e = json.loads(est.stdout)
    for t in TIERS:
        row[f"{t}_predicted"] = e["tiers"][t]["total"]
    row["device_total_predicted"] = e["device_total"]  # the engine's and the model's (activations)
    log = os.path.join(tmp, "log.jsonl")
    done = subprocess.run([strata, "train", *args.model, "--config", path, "--device", "host", "--steps",
                           str(args.steps), "--log-json", log], capture_output=True, text=True)
    if done.returncode != 0:
        row["refused"] = (done.stderr.strip().splitlines() or ["?"])[-1][:200]
        return row
    steps = [json.loads(l) for l in open(log) if l.strip()]
    timed = steps[1:] or steps  # the first step records the gather trace and re-plans
    row["step_ms"] = statistics.median(s["step_ms"] for s in timed)
    row["tokens_per_s"] = statistics.median(s["tokens_per_s"] for s in timed)
    for t in TIERS:
        row[f"{t}_measured"] = max(s["tiers"][t]["peak_bytes"] for s in steps)
    row["device_total_measured"] = max(s["device_memory_peak_bytes"] for s in steps)
    return row


def plot(rows, tier, png):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ok = [r for r in rows if "step_ms" in r]
    x = [r[f"{tier}_budget"] / 2**20 for r in ok]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    colors = {"device_total": "tab:blue", "host": "tab:orange", "nvme": "tab:green"}
    names = {"device_total": "device (engine + activations)", "host": "host", "nvme": "nvme"}
    for t in colors:
        a.plot(x, [r[f"{t}_measured"] / 2**20 for r in ok], "o-", color=colors[t], label=f"{names[t]} measured")
        a.plot(x, [r[f"{t}_predicted"] / 2**20 for r in ok], "x--", color=colors[t], label=f"{names[t]} estimate")
    a.plot(x, x, ":", color="gray", label=f"{tier} budget")
    a.set_xlabel(f"memory_budget.{tier} (MiB)")
    a.set_ylabel("peak (MiB)")
    a.set_title("peak per tier: measured and estimated")
    a.legend(fontsize=7)
    b.plot(x, [r["step_ms"] for r in ok], "o-", color="tab:red")
    b.set_xlabel(f"memory_budget.{tier} (MiB)")
    b.set_ylabel("step time (ms, median)", color="tab:red")
    c = b.twinx()
    c.plot(x, [r["tokens_per_s"] for r in ok], "s--", color="tab:purple")
    c.set_ylabel("tokens/s", color="tab:purple")
    b.set_title("speed against the budget")
    refused = [r for r in rows if "refused" in r]
    if refused:
        b.text(0.02, 0.02, "refused: " + ", ".join(f"{r[f'{tier}_budget'] / 2**20:g} MiB" for r in refused),
               transform=b.transAxes, fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main():
    argv = sys.argv[1:]
    model = DEFAULT_MODEL
    if "--" in argv:
        model = argv[argv.index("--") + 1:]
        argv = argv[:argv.index("--")]
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("strata")
    ap.add_argument("--tier", choices=["device", "host"], required=True)
    ap.add_argument("--points", required=True, help="comma-separated sizes of the swept budget")
    ap.add_argument("--config", default=os.path.join(ROOT, "scripts", "configs", "gpt-demo.json"))
    ap.add_argument("--device", default="24MiB")
    ap.add_argument("--host", default="40MiB")
    ap.add_argument("--nvme", default="256MiB")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--data", default="/usr/share/games/fortunes", help="GPT training text")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    a.model_est = model
    a.model = model + (["--data", a.data] if "gpt" in model else [])
    cfg = json.load(open(a.config))
    os.makedirs(a.out, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory(dir=os.environ.get("STRATA_TEST_TMPDIR", "/var/tmp")) as tmp:
        for p in a.points.split(","):
            budgets = {"device": parse_bytes(a.device), "host": parse_bytes(a.host), "nvme": parse_bytes(a.nvme)}
            budgets[a.tier] = parse_bytes(p)
            r = point(a.strata, a, cfg, budgets, tmp)
            rows.append(r)
            if "refused" in r:
                print(f"{a.tier} {p:>8}: refused ({r['refused']})", flush=True)
            else:
                peaks = "  ".join(f"{t} {r[f'{t}_measured'] / 2**20:7.2f} MiB (est {r[f'{t}_predicted'] / 2**20:7.2f})"
                                  for t in ["device_total", "host", "nvme"])
                print(f"{a.tier} {p:>8}: {r['step_ms']:8.1f} ms  {r['tokens_per_s']:8.0f} tok/s  {peaks}", flush=True)
    fields = sorted({k for r in rows for k in r})
    with open(os.path.join(a.out, f"budget-{a.tier}.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    plot(rows, a.tier, os.path.join(a.out, f"budget-{a.tier}.png"))
    print(f"wrote {a.out}/budget-{a.tier}.csv and .png")


if __name__ == "__main__":
    main()
