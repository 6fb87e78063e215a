#!/usr/bin/python3
"""Turns scripts/gpu_check.sh's report.json into the README's GPU section (Markdown): the
figures measured, the ratios the issue's targets are stated in, and each target beside its
ratio. A figure the run did not produce reads "not measured" with the step's reason; nothing
is estimated in its place. Python 3 standard library only (Debian's /usr/bin/python3).
Usage: scripts/gpu_report.py REPORT.json [--out FILE]"""
import json
import sys

# The targets, as each line of the section names them.
TARGETS = {
    "gpt": "bf16 GPT >= 1.0x PyTorch eager autocast (GPT-2 124M, seq 1024)",
    "grad": "offloaded gradient path >= 0.8x measured pinned D2H bandwidth",
    "step": "offloaded step <= 1.15x max(GPU compute, link floor)",
    "adam": "GPU AdamW >= 0.85x HBM roofline",
}


class ReportError(Exception):
    pass


def die(message):
    sys.stderr.write(f"gpu_report: {message}\n")
    sys.exit(2)


def validate(report):
    """The shape gpu_check_collect.py writes; anything else is refused by name."""
    if not isinstance(report, dict) or not isinstance(report.get("steps"), list):
        raise ReportError("not a gpu_check.sh report: expected an object with a \"steps\" list")
    for i, s in enumerate(report["steps"]):
        if not isinstance(s, dict) or not isinstance(s.get("name"), str) or not isinstance(s.get("status"), str) \
                or not isinstance(s.get("figures", {}), dict):
            raise ReportError(f"steps[{i}] is not a step: expected name, status and a figures object")


def fmt(x, digits=3):
    return f"{x:.{digits}g}" if isinstance(x, float) else str(x)


class View:
    def __init__(self, report):
        self.steps = {s["name"]: s for s in report["steps"]}

    def fig(self, step, key):
        s = self.steps.get(step)
        v = s.get("figures", {}).get(key) if s else None
        return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    def why(self, *steps):
        """Why a figure is missing: the first named step that did not give it."""
        for name in steps:
            s = self.steps.get(name)
            if s is None:
                return f"{name} not in the report"
            if s["status"] != "passed":
                return f"{name} {s['status']}" + (f": {s['reason']}" if s.get("reason") else "")
        return "its log had no figure: see " + ", ".join(self.steps[n].get("log") or n for n in steps)


def ratio_line(view, key, value, op, threshold, detail, steps):
    if value is None:
        return f"- {TARGETS[key]}: not measured ({view.why(*steps)})"
    met = value >= threshold if op == ">=" else value <= threshold
    return f"- {TARGETS[key]}: {value:.2f}x ({detail}) - {'met' if met else 'missed'}"


def targets(view):
    lines = []
    s, t = view.fig("train_gpt_124m_bf16", "tokens_per_s"), view.fig("torch_gpt_124m_bf16", "tokens_per_s")
    r = s / t if s and t else None
    lines.append(ratio_line(view, "gpt", r, ">=", 1.0, f"Strata {fmt(s, 6)} tokens/s, PyTorch {fmt(t, 6)} tokens/s",
                            ["train_gpt_124m_bf16", "torch_gpt_124m_bf16"]))
    g, d = view.fig("train_offload", "grad_path_gbps"), view.fig("bench_device", "d2h_gbps")
    r = g / d if g and d else None
    lines.append(ratio_line(view, "grad", r, ">=", 0.8, f"{fmt(g)} GB/s against D2H {fmt(d)} GB/s",
                            ["train_offload", "bench_device"]))
    step_s, floor, detail = offload_floor(view)
    r = step_s / floor if step_s and floor else None
    lines.append(ratio_line(view, "step", r, "<=", 1.15, detail, ["train_offload", "bench_gpt_offload_compute", "bench_device"]))
    a = view.fig("bench_adam_cuda", "fraction_of_roofline")
    lines.append(ratio_line(view, "adam", a, ">=", 0.85,
                            f"{fmt(view.fig('bench_adam_cuda', 'gbps'))} GB/s against {fmt(view.fig('bench_adam_cuda', 'roofline_gbps'))} GB/s",
                            ["bench_adam_cuda"]))
    return lines


def offload_floor(view):
    """The offloaded run's last step against the larger of its GPU compute (the same pass with
    everything on the GPU, `strata bench gpt`) and its link floor (the step's H2D and D2H bytes
    at the measured pinned rates, the two directions overlapping)."""
    step_ms, tps = view.fig("train_offload", "last_step_ms"), view.fig("train_offload", "last_tokens_per_s")
    h2d, d2h = view.fig("train_offload", "h2d_bytes"), view.fig("train_offload", "d2h_bytes")
    h_rate, d_rate = view.fig("bench_device", "h2d_gbps"), view.fig("bench_device", "d2h_gbps")
    pass_tps = view.fig("bench_gpt_offload_compute", "tokens_per_s")
    if not (step_ms and tps and pass_tps and h2d is not None and d2h is not None and h_rate and d_rate):
        return None, None, ""
    step_s = step_ms / 1e3
    compute_s = tps * step_s / pass_tps
    link_s = max(h2d / (h_rate * 1e9), d2h / (d_rate * 1e9))
    return step_s, max(compute_s, link_s), f"step {step_s:.3g} s, GPU compute {compute_s:.3g} s, link floor {link_s:.3g} s"


def tests_table(view):
    rows = [s for s in view.steps.values() if s.get("kind") in ("catch2", "script")]
    if not rows:
        return ["No [cuda] test ran: not measured."]
    out = ["| suite | status | passed | failed | skipped | seconds |", "| --- | --- | --- | --- | --- | --- |"]
    for s in rows:
        f = s.get("figures", {})
        passed = f.get("passed", f.get("checks_passed", "-"))
        out.append(f"| {s['name']} | {s['status']} | {passed} | {f.get('failed', '-')} | {f.get('skipped', '-')} | "
                   f"{s.get('seconds', '-')} |")
    return out


def figure(view, step, key, unit="", digits=3):
    v = view.fig(step, key)
    return f"{fmt(v, digits)}{unit}" if v is not None else f"not measured ({view.why(step)})"


def nominal_share(view):
    d, n = view.fig("bench_device", "d2h_gbps"), view.fig("gpu_info", "link_nominal_gbps")
    return f"; D2H at {d / n:.2f} of it" if d and n else ""


def render(report):
    validate(report)
    v = View(report)
    info = v.steps.get("gpu_info", {}).get("figures", {})
    gpu = info.get("gpu_name", "GPU not recorded")
    out = ["## The GPU check", ""]
    if report.get("sample"):
        out += ["**Sample figures (tests/tools/gpu_report_sample.json), not a measurement.**", ""]
    out += [f"`scripts/gpu_check.sh` on {gpu} (driver {info.get('driver_version', '?')}, "
            f"PCIe gen {info.get('pcie_gen', '?')} x{info.get('pcie_width', '?')}), {report.get('started_utc', '?')}"
            f"{', --quick' if report.get('quick') else ''}.", "", "Targets:", ""]
    out += targets(v)
    out += ["", "Figures:", "",
            f"- pinned H2D {figure(v, 'bench_device', 'h2d_gbps', ' GB/s')}, D2H {figure(v, 'bench_device', 'd2h_gbps', ' GB/s')}"
            f" (nominal link {figure(v, 'gpu_info', 'link_nominal_gbps', ' GB/s')}{nominal_share(v)})",
            f"- GPT-2 124M bf16, 8 x 1024, pass alone: {figure(v, 'bench_gpt_124m_bf16', 'tokens_per_s', ' tokens/s', 6)},"
            f" fraction of cuBLAS GEMM {figure(v, 'bench_gpt_124m_bf16', 'fraction_of_gemm')}",
            f"- GPT-2 124M bf16, full step (ZeRO-0): Strata {figure(v, 'train_gpt_124m_bf16', 'tokens_per_s', ' tokens/s', 6)},"
            f" PyTorch eager {figure(v, 'torch_gpt_124m_bf16', 'tokens_per_s', ' tokens/s', 6)}",
            f"- offloaded run: step {figure(v, 'train_offload', 'last_step_ms', ' ms', 5)},"
            f" throughput {figure(v, 'train_offload', 'last_tokens_per_s', ' tokens/s', 5)}, gradient path"
            f" {figure(v, 'train_offload', 'grad_path_gbps', ' GB/s')} (the last step's D2H bytes over the trace's reduce-lane busy time)",
            f"- GPU AdamW: {figure(v, 'bench_adam_cuda', 'fraction_of_roofline')} of the HBM roofline",
            "", "[cuda] tests:", ""]
    out += tests_table(v)
    return "\n".join(out) + "\n"


def main(argv):
    args, out = argv[1:], None
    if "--out" in args:
        i = args.index("--out")
        if i + 1 >= len(args):
            die("--out needs a file name")
        out = args[i + 1]
        del args[i:i + 2]
    if len(args) != 1 or args[0].startswith("-"):
        die("expected one report.json (and optionally --out FILE)\n" + __doc__)
    path = args[0]
    try:
        with open(path) as f:
            report = json.load(f)
        text = render(report)
    except OSError as e:
        die(f"cannot read {path}: {e.strerror}: pass the report.json that gpu_check.sh wrote")
    except ValueError as e:
        die(f"{path} is not valid JSON ({e}): pass the report.json that gpu_check.sh wrote")
    except ReportError as e:
        die(f"{path}: {e}")
    if out:
        with open(out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main(sys.argv)
