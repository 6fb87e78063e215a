#!/usr/bin/python3
"""Plots the per-step loss of several `strata train --log-json` files and, below, the relative
difference of each run given with a reference (RUN.jsonl:LABEL:REF.jsonl) from it, as a PNG.
Usage: plot_loss_compare.py OUT.png TITLE LOG.jsonl:LABEL[:REF.jsonl] [...]
(TITLE: what was run, e.g. "GPT 6 x 128, ZeRO-3 fp32: pipelined against plain";
matplotlib from Debian: python3-matplotlib)"""
import json
import sys

try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    sys.exit("plot_loss_compare: matplotlib is missing: apt-get install python3-matplotlib")

FLOOR = 1e-12  # where a difference of exactly 0 is drawn on the logarithmic axis


def losses(path):
    rows = [json.loads(line) for line in open(path) if line.strip()]
    rows = [r for r in rows if "step" in r and "loss" in r]
    return [r["step"] for r in rows], [r["loss"] for r in rows]


def load(spec):
    path, label, *ref = spec.split(":")
    steps, loss = losses(path)
    return label, steps, loss, losses(ref[0])[1] if ref else None


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    out, title = sys.argv[1], sys.argv[2]
    runs = [load(s) for s in sys.argv[3:]]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 5.6), dpi=110, sharex=True,
                                      gridspec_kw={"height_ratios": [2, 1]})
    # Runs that agree draw on top of each other: each later one thinner and dashed, so the
    # earlier ones still show under it.
    styles = ["-", "--", "-.", ":"]
    for i, (label, steps, loss, _) in enumerate(runs):
        top.plot(steps, loss, styles[i % len(styles)], lw=max(0.7, 1.6 - 0.3 * i), alpha=0.85, label=label)
    for i, (label, steps, loss, ref) in enumerate(runs):
        if ref is None:
            continue
        rel = [abs(a - b) / b for a, b in zip(loss, ref)]
        bottom.semilogy(steps[:len(rel)], [max(r, FLOOR) for r in rel], lw=0.9, color=f"C{i}",
                        label=label + (f" (equal at every step: drawn at {FLOOR:g})" if not any(rel) else ""))
    top.set_ylabel("training loss\n(cross-entropy, nats per byte)", fontsize=9)
    top.set_title(title, fontsize=9)
    top.grid(alpha=0.3)
    top.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    bottom.set_xlabel("training step")
    bottom.set_ylabel("relative difference\nfrom its reference\n(|loss - ref| / ref)", fontsize=8)
    bottom.grid(alpha=0.3)
    if bottom.get_lines():
        bottom.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)
    fig.tight_layout()
    fig.savefig(out, bbox_inches="tight")
    print(f"plot: {out}")


if __name__ == "__main__":
    main()
