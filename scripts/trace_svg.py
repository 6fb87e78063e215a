#!/usr/bin/env python3
"""Draws a Chrome trace (strata train --trace, strata pipeline --config --trace) as an SVG
timeline: one row per lane (compute, send/recv, gather, copy, nvme read, nvme write,
optimizer, reduce) and, in a trace of several processes (pipeline stages), per process,
one box per event.

  scripts/trace_svg.py TRACE.json OUT.svg [--from-ms A] [--to-ms B] [--title T]

Without a window it draws the last complete step (the last "optimizer step" event and
everything since the one before it; with several processes, from the earliest of their
second-to-last steps' ends to the latest of their last)."""
import argparse
import html
import json

COLORS = {"compute": "#4e79a7", "send/recv": "#9c755f", "gather": "#f28e2b", "copy": "#e15759", "nvme read": "#76b7b2",
          "nvme write": "#59a14f", "optimizer": "#edc948", "reduce": "#b07aa1"}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("out")
    ap.add_argument("--from-ms", type=float)
    ap.add_argument("--to-ms", type=float)
    ap.add_argument("--title")
    a = ap.parse_args()
    with open(a.trace) as f:
        t = json.load(f)
    events = t["traceEvents"] if isinstance(t, dict) else t
    lanes = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    procs = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    # (process, lane, start ms, duration ms, name)
    boxes = [(e["pid"], lanes.get((e["pid"], e["tid"]), str(e["tid"])), e["ts"] / 1e3, e["dur"] / 1e3, e["name"])
             for e in events if e.get("ph") == "X"]
    if not boxes:
        raise SystemExit(f"{a.trace}: no events")
    pids = sorted({b[0] for b in boxes})
    if a.from_ms is None or a.to_ms is None:
        ends = {p: sorted(b[2] + b[3] for b in boxes if b[0] == p and b[1] == "optimizer" and b[4] == "step")
                for p in pids}
        if all(len(e) >= 2 for e in ends.values()):
            a.from_ms, a.to_ms = min(e[-2] for e in ends.values()), max(e[-1] for e in ends.values())
        else:
            a.from_ms, a.to_ms = min(b[2] for b in boxes), max(b[2] + b[3] for b in boxes)
    t0, span = a.from_ms, max(a.to_ms - a.from_ms, 1e-6)
    rows = []  # (process, lane, label)
    for p in pids:
        present = {b[1] for b in boxes if b[0] == p}
        order = [l for l in COLORS if l in present] + sorted(present - set(COLORS))
        prefix = f"{procs.get(p, p)}: " if len(pids) > 1 else ""
        rows += [(p, l, prefix + l) for l in order]
    width, left, row_h, top = 1200, 150 if len(pids) > 1 else 90, 26, 30
    scale = (width - left - 10) / span
    title = a.title or a.trace
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{top + row_h * len(rows) + 30}" '
           f'font-family="sans-serif" font-size="12">',
           f'<text x="{left}" y="18">{html.escape(title)}: {span:.1f} ms from {t0:.1f} ms</text>']
    for i, (proc, lane, label) in enumerate(rows):
        y = top + i * row_h
        out.append(f'<text x="4" y="{y + 17}">{html.escape(label)}</text>')
        out.append(f'<line x1="{left}" y1="{y + row_h - 1}" x2="{width - 10}" y2="{y + row_h - 1}" stroke="#ddd"/>')
        for p, l, s, d, name in boxes:
            if p != proc or l != lane or s + d < t0 or s > t0 + span:
                continue
            x = left + max(0.0, s - t0) * scale
            w = max(0.5, min(s + d, t0 + span) - max(s, t0)) * scale
            out.append(f'<rect x="{x:.1f}" y="{y + 3}" width="{w:.1f}" height="{row_h - 7}" '
                       f'fill="{COLORS.get(lane, "#999")}"><title>{html.escape(name)} {d:.2f} ms</title></rect>')
    y = top + len(rows) * row_h + 18
    for k in range(0, 11):
        x = left + k * (width - left - 10) / 10
        out.append(f'<text x="{x:.0f}" y="{y}" text-anchor="middle" fill="#555">{span * k / 10:.0f}</text>')
    out.append("</svg>")
    with open(a.out, "w") as f:
        f.write("\n".join(out))


if __name__ == "__main__":
    main()
