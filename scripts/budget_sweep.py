#!/usr/bin/python3
"""Memory budget against speed: trains a model for a few steps at each point of a sweep of
one tier's budget (memory_budget.device or .host; the others fixed), with budget-driven
placement, and records per point the measured step time, tokens/s and each tier's peak
beside `strata estimate`'s prediction. Writes a CSV and a PNG (step time and tokens/s
against the budget; each tier's measured peak as markers over the prediction's dashed line).

  budget_sweep.py STRATA --tier device --points 8MiB,12MiB,16MiB,24MiB,48MiB --out DIR
      [--config scripts/configs/gpt-demo.json] [--host 40MiB] [--device 24MiB] [--nvme 256MiB]
      [--steps 8] [--from-csv] [-- MODEL FLAGS...]   (default: the main job's GPT on Debian's fortunes)

A budget nothing fits is recorded with the smallest budget that would (from the refusal).
--from-csv redraws DIR/budget-TIER.png from the DIR/budget-TIER.csv of an earlier run without
training (give it that run's --config and model flags: the title names them). Needs matplotlib (Debian: python3-matplotlib), checked before the first run."""
import argparse
import csv
import json
import os
import re
import shutil
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
    row["steps"] = args.steps
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


def describe(model, data):
    """The model flags in words: "GPT 6 x 192 (6 heads, sequence 128, remat always) on fortunes"."""
    flags = {model[i]: model[i + 1] for i in range(len(model) - 1) if model[i].startswith("--")}
    if flags.get("--model") != "gpt" or "--layers" not in flags or "--d-model" not in flags:
        return " ".join(model)
    extra = [f"{flags['--heads']} heads" if "--heads" in flags else "",
             f"sequence {flags['--seq-len']}" if "--seq-len" in flags else "",
             f"remat {flags['--remat']}" if "--remat" in flags else ""]
    text = flags.get("--data", data)
    return (f"GPT {flags['--layers']} x {flags['--d-model']} ({', '.join(e for e in extra if e)}) "
            f"on {os.path.basename(text)}")


def plot(rows, tier, png, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    ok = [r for r in rows if r.get("step_ms") not in (None, "")]
    x = [r[f"{tier}_budget"] / 2**20 for r in ok]
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 5.2))
    colors = {"device_total": "tab:blue", "host": "tab:orange", "nvme": "tab:green"}
    names = {"device_total": "device (engine + activations)", "host": "host", "nvme": "nvme"}
    # The estimate as a dashed line under the measurement's markers: both stay visible where
    # they agree (the markers sit on the line) and where they part.
    for t, c in colors.items():
        a.plot(x, [r[f"{t}_predicted"] / 2**20 for r in ok], "--", color=c, lw=1.4, zorder=2)
        a.plot(x, [r[f"{t}_measured"] / 2**20 for r in ok], "o", color=c, ms=6, mfc="white", mew=1.6, zorder=3)
    a.plot(x, x, "-", color="gray", lw=5, alpha=0.25, zorder=1)  # wide and pale: visible under an estimate at it
    a.set_ylim(bottom=0)
    a.set_xlabel(f"memory_budget.{tier} (MiB)")
    a.set_ylabel("peak memory (MiB)")
    a.set_title("peak per tier: measured and estimated", fontsize=10)
    a.grid(alpha=0.3)
    handles = [Line2D([], [], color=c, lw=6, label=names[t]) for t, c in colors.items()]
    handles += [Line2D([], [], color="black", marker="o", mfc="white", ls="", label="measured peak"),
                Line2D([], [], color="black", ls="--", label="strata estimate"),
                Line2D([], [], color="gray", lw=5, alpha=0.25, label=f"the {tier} budget (y = x)")]
    a.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, fontsize=8, frameon=False)
    b.plot(x, [r["step_ms"] for r in ok], "o-", color="tab:red", label="step time (left axis)")
    # Different headroom on the two axes, so that the slowest point's circle and the fastest
    # point's square never land on the same spot.
    b.set_ylim(bottom=0, top=max(r["step_ms"] for r in ok) * 1.12 if ok else None)
    b.set_xlabel(f"memory_budget.{tier} (MiB)")
    b.set_ylabel("median step time (ms)", color="tab:red")
    b.grid(alpha=0.3)
    c = b.twinx()
    c.plot(x, [r["tokens_per_s"] for r in ok], "s--", color="tab:purple", label="tokens/s (right axis)")
    c.set_ylim(bottom=0, top=max(r["tokens_per_s"] for r in ok) * 1.3 if ok else None)
    c.set_ylabel("median throughput (tokens/s)", color="tab:purple")
    b.set_title("speed against the budget", fontsize=10)
    handles = b.get_lines() + c.get_lines()
    refused = [r for r in rows if r not in ok]
    if refused:
        rx = [r[f"{tier}_budget"] / 2**20 for r in refused]
        handles += b.plot(rx, [0] * len(rx), "x", color="black", ms=9, mew=2, clip_on=False, zorder=4,
                          label="refused: nothing fits (" + ", ".join(f"{v:g} MiB" for v in rx) + ")")
    b.legend(handles=handles, labels=[h.get_label() for h in handles], loc="upper center",
             bbox_to_anchor=(0.5, -0.14), ncol=2, fontsize=8, frameon=False)
    a.set_xlim(b.get_xlim())  # one budget axis for both panels (a refused budget widens it)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=110, bbox_inches="tight")


def title(a, cfg, rows):
    """What was run, from the arguments and the config; the fixed budgets and the steps from the
    rows, so that a redraw from a CSV says what that sweep ran."""
    first = rows[0] if rows else {}
    fixed = ", ".join(f"{t} {first[f'{t}_budget'] / 2**20:g}MiB" if f"{t}_budget" in first else f"{t} {v}"
                      for t, v in (("device", a.device), ("host", a.host), ("nvme", a.nvme)) if t != a.tier)
    steps = first.get("steps", a.steps)
    stage = cfg.get("zero_optimization", {}).get("stage", 0)
    precision = "bf16" if cfg.get("bf16", {}).get("enabled") else "fp16" if cfg.get("fp16", {}).get("enabled") else "fp32"
    return (f"{describe(a.model, a.data)}, ZeRO-{stage} {precision}, budget-driven placement\n"
            f"memory_budget.{a.tier} swept ({fixed}); {steps} steps a point, medians of steps 2-{steps}")


def read_csv(path):
    """The rows of an earlier run's CSV, numbers as numbers."""
    def value(v):
        try:
            return float(v) if "." in v else int(v)
        except ValueError:
            return v
    with open(path, newline="") as f:
        return [{k: value(v) for k, v in r.items() if v != ""} for r in csv.DictReader(f)]


def main():
    argv = sys.argv[1:]
    model = DEFAULT_MODEL
    if "--" in argv:
        model = argv[argv.index("--") + 1:]
        argv = argv[:argv.index("--")]
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("strata")
    ap.add_argument("--tier", choices=["device", "host"], required=True)
    ap.add_argument("--points", help="comma-separated sizes of the swept budget (not with --from-csv)")
    ap.add_argument("--config", default=os.path.join(ROOT, "scripts", "configs", "gpt-demo.json"))
    ap.add_argument("--device", default="24MiB")
    ap.add_argument("--host", default="40MiB")
    ap.add_argument("--nvme", default="256MiB")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--data", default="/usr/share/games/fortunes", help="GPT training text")
    ap.add_argument("--out", required=True)
    ap.add_argument("--from-csv", action="store_true",
                    help="redraw OUT/budget-TIER.png from OUT/budget-TIER.csv without training")
    a = ap.parse_args(argv)
    if not a.points and not a.from_csv:
        ap.error("--points is required (or --from-csv, to redraw an earlier sweep)")
    a.model_est = model
    a.model = model + (["--data", a.data] if "gpt" in model else [])
    # Everything the sweep needs, before the first point trains.
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot  # noqa: F401
    except ImportError:
        sys.exit("budget_sweep: matplotlib is missing, and it draws the PNG: apt-get install python3-matplotlib")
    if not a.from_csv and not shutil.which(a.strata):
        sys.exit(f"budget_sweep: {a.strata} is not an executable strata binary (build it: cmake --build build)")
    if not a.from_csv and "gpt" in model and not os.path.exists(a.data):
        sys.exit(f"budget_sweep: no training text {a.data} (Debian's fortunes: apt-get install fortunes)")
    cfg = json.load(open(a.config))
    os.makedirs(a.out, exist_ok=True)
    csv_path, png_path = (os.path.join(a.out, f"budget-{a.tier}.{ext}") for ext in ("csv", "png"))
    if a.from_csv:
        if not os.path.isfile(csv_path):
            sys.exit(f"budget_sweep: --from-csv: {csv_path} is missing: run the sweep first (without --from-csv)")
        rows = read_csv(csv_path)
        plot(rows, a.tier, png_path, title(a, cfg, rows))
        print(f"wrote {png_path}")
        return
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
    with open(csv_path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    plot(rows, a.tier, png_path, title(a, cfg, rows))
    print(f"wrote {csv_path} and {png_path}")


if __name__ == "__main__":
    main()
