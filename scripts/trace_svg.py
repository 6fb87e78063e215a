#!/usr/bin/python3
"""Draws a Chrome trace (strata train --trace, strata pipeline --config --trace) as an SVG
timeline: one row per lane (compute, send/recv, gather, copy, nvme read, nvme write,
optimizer, reduce, reduce work) and, in a trace of several processes (pipeline stages), per
process, one box per event, over a time axis in ms (in s for windows of 5 s or more).

  scripts/trace_svg.py TRACE.json OUT.svg [--from-ms A] [--to-ms B] [--title T]

Without a window it draws the last complete step (the last "optimizer step" event and
everything since the one before it; with several processes, from the earliest of their
second-to-last steps' ends to the latest of their last). The trace does not record the
command that made it, so pass --title to say what was run (model, placement, flags); without
it the title names the trace's processes, never the file's path. Python 3 standard library
only."""
import argparse
import html
import json
import math

COLORS = {"compute": "#4e79a7", "send/recv": "#9c755f", "gather": "#f28e2b", "copy": "#e15759", "nvme read": "#76b7b2",
          "nvme write": "#59a14f", "optimizer": "#edc948", "reduce": "#b07aa1", "reduce work": "#d4a6c8"}


def nice_step(span, ticks=8):
    """The 1, 2 or 5 x 10^k step that cuts span into about `ticks` intervals."""
    raw = span / ticks
    mag = 10 ** math.floor(math.log10(raw))
    return next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)


def duration(ms):
    """A duration in ms or s, with its unit."""
    return f"{ms / 1e3:.2f} s" if ms >= 5e3 else f"{ms:.1f} ms"


def render(trace, out, from_ms=None, to_ms=None, title=None):
    with open(trace) as f:
        t = json.load(f)
    events = t["traceEvents"] if isinstance(t, dict) else t
    lanes = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    procs = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    # (process, lane, start ms, duration ms, name)
    boxes = [(e["pid"], lanes.get((e["pid"], e["tid"]), str(e["tid"])), e["ts"] / 1e3, e["dur"] / 1e3, e["name"])
             for e in events if e.get("ph") == "X"]
    if not boxes:
        raise SystemExit(f"trace_svg: {trace}: no events")
    pids = sorted({b[0] for b in boxes})
    if from_ms is not None and to_ms is not None:
        window = "the window asked for"
    else:
        ends = {p: sorted(b[2] + b[3] for b in boxes if b[0] == p and b[1] == "optimizer" and b[4] == "step")
                for p in pids}
        if all(len(e) >= 2 for e in ends.values()):
            from_ms, to_ms = min(e[-2] for e in ends.values()), max(e[-1] for e in ends.values())
            window = "the last complete step" + (" of every process" if len(pids) > 1 else "")
        else:
            from_ms, to_ms = min(b[2] for b in boxes), max(b[2] + b[3] for b in boxes)
            window = "the whole trace (it has fewer than two optimizer steps)"
    t0, span = from_ms, max(to_ms - from_ms, 1e-6)
    if title is None:
        names = [procs[p] for p in pids if p in procs]
        title = "strata trace" + (f" of {', '.join(names)}" if names else "")
    rows = []  # (process, lane, label)
    for p in pids:
        present = {b[1] for b in boxes if b[0] == p}
        order = [l for l in COLORS if l in present] + sorted(present - set(COLORS))
        prefix = f"{procs.get(p, p)}: " if len(pids) > 1 else ""
        rows += [(p, l, prefix + l) for l in order]
    width, left, row_h, top = 1200, 150 if len(pids) > 1 else 90, 26, 48
    right = width - 10
    scale = (right - left) / span
    axis_y = top + row_h * len(rows)
    height = axis_y + 52
    out_lines = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
                 f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
                 '<rect width="100%" height="100%" fill="white"/>',
                 f'<text x="4" y="18" font-size="14" font-weight="bold">{html.escape(title)}</text>',
                 f'<text x="4" y="36" fill="#333">{html.escape(window)}: {duration(span)}, starting '
                 f'{duration(t0)} into the trace; one row per lane, one box per event</text>']
    # The time axis: s for windows of 5 s or more, else ms; ticks at 1, 2 or 5 x 10^k.
    unit, per = ("s", 1e3) if span >= 5e3 else ("ms", 1.0)
    step = nice_step(span / per)
    decimals = max(0, -math.floor(math.log10(step) + 1e-9))
    k = 0
    while k * step * per <= span * (1 + 1e-9):
        x = left + k * step * per * scale
        out_lines.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{axis_y}" stroke="#eee"/>')
        out_lines.append(f'<line x1="{x:.1f}" y1="{axis_y}" x2="{x:.1f}" y2="{axis_y + 5}" stroke="#555"/>')
        out_lines.append(f'<text x="{x:.1f}" y="{axis_y + 18}" text-anchor="middle" fill="#555">'
                         f'{k * step:.{decimals}f}</text>')
        k += 1
    out_lines.append(f'<line x1="{left}" y1="{axis_y}" x2="{right}" y2="{axis_y}" stroke="#555"/>')
    out_lines.append(f'<text x="{(left + right) / 2:.0f}" y="{axis_y + 40}" text-anchor="middle">'
                     f'time from the start of the window ({unit})</text>')
    for i, (proc, lane, label) in enumerate(rows):
        y = top + i * row_h
        out_lines.append(f'<text x="4" y="{y + 17}">{html.escape(label)}</text>')
        out_lines.append(f'<line x1="{left}" y1="{y + row_h - 1}" x2="{right}" y2="{y + row_h - 1}" stroke="#ddd"/>')
        for p, l, s, d, name in boxes:
            if p != proc or l != lane or s + d < t0 or s > t0 + span:
                continue
            x = left + max(0.0, s - t0) * scale
            w = max(0.5, min(s + d, t0 + span) - max(s, t0)) * scale
            out_lines.append(f'<rect x="{x:.1f}" y="{y + 3}" width="{w:.1f}" height="{row_h - 7}" '
                             f'fill="{COLORS.get(lane, "#999")}"><title>{html.escape(name)} {d:.2f} ms</title></rect>')
    out_lines.append("</svg>")
    with open(out, "w") as f:
        f.write("\n".join(out_lines) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("out")
    ap.add_argument("--from-ms", type=float, help="the window's start, in ms of the trace's clock")
    ap.add_argument("--to-ms", type=float, help="the window's end, in ms of the trace's clock")
    ap.add_argument("--title", help="what was run (model, placement, flags); default: the trace's processes")
    a = ap.parse_args()
    render(a.trace, a.out, a.from_ms, a.to_ms, a.title)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
