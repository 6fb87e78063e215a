#!/usr/bin/python3
"""Plots the training and validation loss of a `strata train --log-json` file as a PNG.
Usage: plot_loss.py LOG.jsonl OUT.png [TITLE]  (TITLE: what was run, e.g. "GPT 6 x 192 on fortunes";
matplotlib from Debian: python3-matplotlib)"""
import json
import sys

try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    sys.exit("plot_loss: matplotlib is missing: apt-get install python3-matplotlib")


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    log, out = sys.argv[1], sys.argv[2]
    rows = [json.loads(line) for line in open(log) if line.strip()]
    rows = [r for r in rows if "step" in r and "loss" in r]
    if not rows:
        sys.exit(f"plot_loss: {log} has no training steps")
    steps = [r["step"] for r in rows]
    title = sys.argv[3] if len(sys.argv) > 3 else f"strata train, {steps[-1]} steps"
    fig, ax = plt.subplots(figsize=(7, 4.4), dpi=110)
    ax.plot(steps, [r["loss"] for r in rows], lw=0.8, alpha=0.7, label="training loss (each step)")
    val = [(r["step"], r["val_loss"]) for r in rows if "val_loss" in r]
    if val:
        ax.plot([s for s, _ in val], [v for _, v in val], "o-", lw=1.5, label="validation loss")
    ax.set_xlabel("training step")
    ax.set_ylabel("cross-entropy (nats per byte)")
    ax.set_ylim(bottom=0)  # a cross-entropy's zero is a floor worth seeing
    ax.set_xlim(left=0)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    # Below the axes: a legend inside would cover the early, high losses or the late curve.
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=2, fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(out, bbox_inches="tight")
    print(f"plot: {out}")


if __name__ == "__main__":
    main()
