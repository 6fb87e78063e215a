#!/usr/bin/env python3
"""Draws a Chrome trace (strata train --trace) as an SVG timeline: one row per lane
(compute, gather, copy, nvme read, nvme write, optimizer, reduce), one box per event.

  scripts/trace_svg.py TRACE.json OUT.svg [--from-ms A] [--to-ms B]

Without a window it draws the last complete step (the last "optimizer step" event and
everything since the one before it)."""
import argparse
import html
import json

COLORS = {"compute": "#4e79a7", "gather": "#f28e2b", "copy": "#e15759", "nvme read": "#76b7b2",
          "nvme write": "#59a14f", "optimizer": "#edc948", "reduce": "#b07aa1"}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("out")
    ap.add_argument("--from-ms", type=float)
    ap.add_argument("--to-ms", type=float)
    a = ap.parse_args()
    with open(a.trace) as f:
        t = json.load(f)
    events = t["traceEvents"] if isinstance(t, dict) else t
    lanes = {e["tid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"}
    boxes = [(lanes.get(e["tid"], str(e["tid"])), e["ts"] / 1e3, e["dur"] / 1e3, e["name"])
             for e in events if e.get("ph") == "X"]
    if not boxes:
        raise SystemExit(f"{a.trace}: no events")
    if a.from_ms is None or a.to_ms is None:
        steps = sorted(b[1] for b in boxes if b[0] == "optimizer" and b[3] == "step")
        ends = sorted(b[1] + b[2] for b in boxes if b[0] == "optimizer" and b[3] == "step")
        if len(steps) >= 2:
            a.from_ms, a.to_ms = ends[-2], ends[-1]
        else:
            a.from_ms, a.to_ms = min(b[1] for b in boxes), max(b[1] + b[2] for b in boxes)
    t0, span = a.from_ms, max(a.to_ms - a.from_ms, 1e-6)
    order = [l for l in COLORS if any(b[0] == l for b in boxes)]
    order += sorted({b[0] for b in boxes} - set(order))
    width, left, row_h, top = 1200, 90, 26, 30
    scale = (width - left - 10) / span
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{top + row_h * len(order) + 30}" '
           f'font-family="sans-serif" font-size="12">',
           f'<text x="{left}" y="18">{html.escape(a.trace)}: {span:.1f} ms from {t0:.1f} ms</text>']
    for i, lane in enumerate(order):
        y = top + i * row_h
        out.append(f'<text x="4" y="{y + 17}">{html.escape(lane)}</text>')
        out.append(f'<line x1="{left}" y1="{y + row_h - 1}" x2="{width - 10}" y2="{y + row_h - 1}" stroke="#ddd"/>')
        for l, s, d, name in boxes:
            if l != lane or s + d < t0 or s > t0 + span:
                continue
            x = left + max(0.0, s - t0) * scale
            w = max(0.5, min(s + d, t0 + span) - max(s, t0)) * scale
            out.append(f'<rect x="{x:.1f}" y="{y + 3}" width="{w:.1f}" height="{row_h - 7}" '
                       f'fill="{COLORS.get(lane, "#999")}"><title>{html.escape(name)} {d:.2f} ms</title></rect>')
    y = top + len(order) * row_h + 18
    for k in range(0, 11):
        x = left + k * (width - left - 10) / 10
        out.append(f'<text x="{x:.0f}" y="{y}" text-anchor="middle" fill="#555">{span * k / 10:.0f}</text>')
    out.append("</svg>")
    with open(a.out, "w") as f:
        f.write("\n".join(out))


if __name__ == "__main__":
    main()
