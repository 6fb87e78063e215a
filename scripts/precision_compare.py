"""Trains the main job's GPT (6 x 192 on Debian's fortunes, ZeRO-3, scripts/configs/gpt-demo.json)
once per precision recipe and compares the validation loss against bf16's:
  bf16           bf16 products (the main job)
  fp8            FP8 products, delayed per-tensor scaling (Transformer Engine's recipe: E4M3 forward,
                 E5M2 gradients, amax history of 1024 steps)
  fp8-block      FP8 with per-block scales (1 x 128 activation and gradient tiles, 128 x 128 weight blocks)
  fp8-history1   FP8 with a one-step amax history
  fp32-products  the bf16 run with its products in fp32 (oneDNN kept off its bf16 instructions), a control
  bf16-no-clip   the bf16 run without gradient clipping, a control for the unit-scaled runs (which have none)
  fp16           fp16 weights, gradients and products with DeepSpeed's dynamic loss scaler
  fp16-no-scaler the same with no loss scaler (loss_scale 1): what unit scaling is for
  unit-fp16      the unit-scaled GPT (--unit-scaled) in fp16 with no loss scaler
  unit-fp8       the unit-scaled GPT with FP8 products cast at scale 1 (fp8.scaling none), fp16
                 weights and gradients, no loss scaler
  fp8-unscaled   the plain GPT the same way (FP8 at scale 1, fp16, no loss scaler): what unit scaling is for
Writes a CSV of every evaluation and a PNG of the validation curves, and prints each recipe's final
validation loss, its relative difference to bf16, its tokens/s and, from the step logs, the share of
steps the loss scaler skipped.

  precision_compare.py STRATA OUT_DIR [--steps 600] [--eval-every 50] [--recipes bf16,fp8,...]
                       [--from-logs]   (plot OUT_DIR/<recipe>.jsonl from an earlier run instead of training)

Every run gets the same 40 MiB device budget (the FP8 operands' scratch does not fit the demo's 24 MiB
beside the activations), so only the precision differs; the unit-scaled runs also turn gradient
clipping off (their gradients carry one constant per tensor, which a global norm would mix). Exit
status 1 when a recipe's final validation loss is more than --tolerance (2%) above or below bf16's
(fp16-no-scaler, fp8-unscaled and bf16-no-clip are reported, not held to it; they are drawn dashed). matplotlib from Debian: python3-matplotlib."""
import argparse
import csv
import json
import os
import subprocess
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
FP16 = {"bf16": {"enabled": False}, "fp16": {"enabled": True, "loss_scale": 1}}
UNIT = {**FP16, "gradient_clipping": 0}
RECIPES = {  # name: (changes to the config, extra flags, environment)
    "bf16": ({}, [], {}),
    "fp8": ({"fp8": {"enabled": True}}, [], {}),
    "fp8-block": ({"fp8": {"enabled": True, "block_scaling": True}}, [], {}),
    "fp8-history1": ({"fp8": {"enabled": True, "amax_history_len": 1}}, [], {}),
    "fp32-products": ({}, [], {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}),
    "bf16-no-clip": ({"gradient_clipping": 0}, [], {}),
    "fp16": ({"bf16": {"enabled": False}, "fp16": {"enabled": True}}, [], {}),
    "fp16-no-scaler": (FP16, [], {}),
    "unit-fp16": (UNIT, ["--unit-scaled"], {}),
    "unit-fp8": ({**UNIT, "fp8": {"enabled": True, "scaling": "none"}}, ["--unit-scaled"], {}),
    "fp8-unscaled": ({**FP16, "fp8": {"enabled": True, "scaling": "none"}}, [], {}),
}
# The plain model without scaling and the no-clipping control: reported, not held to the tolerance.
UNTOLERATED = {"fp16-no-scaler", "fp8-unscaled", "bf16-no-clip"}
MODEL = ["--model", "gpt", "--data", "/usr/share/games/fortunes", "--layers", "6", "--d-model", "192",
         "--heads", "6", "--seq-len", "128", "--remat", "always", "--device", "host"]


def config(out, changes):
    with open(os.path.join(ROOT, "scripts", "configs", "gpt-demo.json")) as f:
        c = json.loads(f.read().replace("build/demo/nvme", os.path.join(out, "nvme")))
    c["memory_budget"]["device"] = "40MiB"
    c.update(changes)
    return c


def read_log(log):
    rows = [json.loads(line) for line in open(log) if line.strip()]
    val = [(r["step"], r["val_loss"]) for r in rows if "val_loss" in r]
    tps = sorted(r["tokens_per_s"] for r in rows[len(rows) // 10:])
    skipped = sum(1 for r in rows if r.get("skipped"))
    return val, tps[len(tps) // 2], skipped / max(1, len(rows))


def run(strata, out, name, steps, eval_every):
    path = os.path.join(out, name + ".json")
    changes, flags, env = RECIPES[name]
    with open(path, "w") as f:
        json.dump(config(out, changes), f)
    log = os.path.join(out, name + ".jsonl")
    done = subprocess.run([strata, "train", *MODEL, *flags, "--config", path, "--steps", str(steps), "--eval-every",
                           str(eval_every), "--log-json", log], capture_output=True, text=True,
                          env={**os.environ, **env})
    if done.returncode != 0:
        raise SystemExit(f"{name}: strata train failed:\n{done.stderr[-2000:]}")
    return read_log(log)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("strata")
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--recipes", default=",".join(RECIPES))
    ap.add_argument("--tolerance", type=float, default=0.02)
    ap.add_argument("--from-logs", action="store_true")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    names = a.recipes.split(",")
    for n in names:
        if n not in RECIPES:
            raise SystemExit(f"--recipes: unknown recipe '{n}': use some of {', '.join(RECIPES)}")
    if a.from_logs:
        results = {n: read_log(os.path.join(a.out, n + ".jsonl")) for n in names}
    else:
        results = {n: run(a.strata, a.out, n, a.steps, a.eval_every) for n in names}
    with open(os.path.join(a.out, "precision.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["recipe", "step", "val_loss"])
        for n, (val, _, _) in results.items():
            for s, v in val:
                w.writerow([n, s, v])
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    for n, (val, _, _) in results.items():
        ax.plot([s for s, _ in val], [v for _, v in val], "o--" if n in UNTOLERATED else "o-", ms=3, lw=1.2, label=n)
    later = [v for val, _, _ in results.values() for s, v in val[1:]]  # the first evaluation would flatten the rest
    if later:
        ax.set_ylim(min(later) * 0.98, max(later) * 1.02)
    ax.set_xlabel("step")
    ax.set_ylabel("validation cross-entropy (nats per byte)")
    ax.set_title("GPT 6 x 192 on fortunes, ZeRO-3: validation loss by precision recipe", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    png = os.path.join(a.out, "precision.png")
    fig.savefig(png)
    ref = results.get("bf16", (None,))[0]
    bad = False
    for n, (val, tps, skipped) in results.items():
        rel = (val[-1][1] - ref[-1][1]) / ref[-1][1] if ref else 0.0
        bad |= abs(rel) > a.tolerance and n not in UNTOLERATED
        print(f"{n:14s} final val loss {val[-1][1]:.4f} (step {val[-1][0]})  vs bf16 {rel:+.2%}  {tps:.0f} tokens/s"
              f"  steps skipped {skipped:.1%}")
    print(f"csv: {os.path.join(a.out, 'precision.csv')}  plot: {png}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
