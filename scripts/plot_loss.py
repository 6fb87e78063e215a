"""Plots the training and validation loss of a `strata train --log-json` file as a PNG.
Usage: plot_loss.py LOG.jsonl OUT.png [TITLE]  (matplotlib from Debian: python3-matplotlib)"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    log, out = sys.argv[1], sys.argv[2]
    title = sys.argv[3] if len(sys.argv) > 3 else "strata train"
    rows = [json.loads(line) for line in open(log) if line.strip()]
    steps = [r["step"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    ax.plot(steps, [r["loss"] for r in rows], lw=0.8, alpha=0.7, label="train loss (per step)")
    val = [(r["step"], r["val_loss"]) for r in rows if "val_loss" in r]
    if val:
        ax.plot([s for s, _ in val], [v for _, v in val], "o-", lw=1.5, label="validation loss")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats per byte)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out)
    print(f"plot: {out}")


if __name__ == "__main__":
    main()
