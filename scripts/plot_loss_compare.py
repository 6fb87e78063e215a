"""Plots the per-step loss of several `strata train --log-json` files and, below, the relative
difference of each run given with a reference (RUN.jsonl:LABEL:REF.jsonl) from it, as a PNG.
Usage: plot_loss_compare.py OUT.png TITLE LOG.jsonl:LABEL[:REF.jsonl] [...]
(matplotlib from Debian: python3-matplotlib)"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def losses(path):
    rows = [json.loads(line) for line in open(path) if line.strip()]
    return [r["step"] for r in rows], [r["loss"] for r in rows]


def load(spec):
    path, label, *ref = spec.split(":")
    steps, loss = losses(path)
    return label, steps, loss, losses(ref[0])[1] if ref else None


def main():
    out, title = sys.argv[1], sys.argv[2]
    runs = [load(s) for s in sys.argv[3:]]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 5), dpi=110, sharex=True,
                                      gridspec_kw={"height_ratios": [2, 1]})
    for label, steps, loss, _ in runs:
        top.plot(steps, loss, lw=0.9, alpha=0.8, label=label)
    for label, steps, loss, ref in runs:
        if ref is None:
            continue
        rel = [abs(a - b) / b for a, b in zip(loss, ref)]
        bottom.semilogy(steps[:len(rel)], [max(r, 1e-12) for r in rel], lw=0.9, label=label)
    top.set_ylabel("cross-entropy (nats per byte)")
    top.set_title(title, fontsize=9)
    top.grid(alpha=0.3)
    top.legend(fontsize=8)
    bottom.set_xlabel("step")
    bottom.set_ylabel("relative difference\nfrom its reference", fontsize=8)
    bottom.grid(alpha=0.3)
    bottom.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out)
    print(f"plot: {out}")


if __name__ == "__main__":
    main()
