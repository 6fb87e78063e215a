"""Builds scripts/gpu_check.sh's report as the steps finish: report.json (machine-readable:
per step its name, kind, command, exit status, seconds, budget, log file and the figures
parsed from what it printed or wrote) and report.md (a table of the steps, then
scripts/gpu_report.py's section). Rewritten after every step so a run cut short by the lease
still leaves both. Figures a step did not print are left out, never guessed.
Usage: gpu_check_collect.py start OUT --build DIR --budget S --quick 0|1
       gpu_check_collect.py step OUT NAME KIND BUDGET_S EXIT|- SECONDS LOG COMMAND [NOTE]
       gpu_check_collect.py finish OUT
NOTE: "cases=N" (a test suite's [cuda] cases) or "unavailable=WHY" (a step not run)."""
import datetime
import json
import os
import re
import socket
import statistics
import sys

sys.dont_write_bytecode = True  # no __pycache__ beside the sources (or in a read-only copy)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_report  # noqa: E402  (the README section, appended to report.md)


def now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def last_json_object(text):
    """The JSON object a `--json` bench printed: the last one that starts at a line start and
    parses (stderr shares the log, so warnings may stand before or after it)."""
    found, decoder = {}, json.JSONDecoder()
    for m in re.finditer(r"^\{", text, re.M):
        try:
            obj, _ = decoder.raw_decode(text, m.start())
        except ValueError:
            continue
        if isinstance(obj, dict):
            found = obj
    return found


def pcie_gbps(gen, width):
    """Nominal one-way PCIe bandwidth in GB/s (transfer rate x lanes x line-code efficiency)."""
    rate = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0}.get(gen)
    if rate is None:
        return None
    code = 0.8 if gen <= 2 else (128 / 130 if gen <= 5 else 242 / 256)
    return rate * width * code / 8


def figures_info(text, work, name):
    f = {}
    m = re.search(r"^gpu: (.+)$", text, re.M)
    if m:
        parts = [p.strip() for p in m.group(1).split(",")]
        if len(parts) >= 5:
            f["gpu_name"], f["gpu_memory_mib"], f["driver_version"] = parts[0], parts[1], parts[2]
            try:
                f["pcie_gen"], f["pcie_width"] = int(parts[3]), int(parts[4])
                nominal = pcie_gbps(f["pcie_gen"], f["pcie_width"])
                if nominal:
                    f["link_nominal_gbps"] = round(nominal, 2)
            except ValueError:
                pass
    f["gpus"] = len(re.findall(r"^GPU \d+:", text, re.M))
    return f


def pick(d, keys):
    return {k: d[k] for k in keys if k in d}


def figures_bench_device(text, work, name):
    return pick(last_json_object(text), ("h2d_gbps", "d2h_gbps", "event_roundtrip_us", "bytes", "device"))


def figures_bench_adam(text, work, name):
    return pick(last_json_object(text), ("fraction_of_roofline", "gbps", "roofline_gbps", "step_ms", "params"))


def figures_bench_gpt(text, work, name):
    return pick(last_json_object(text), ("tokens_per_s", "fraction_of_gemm", "model_flops_per_s", "gemm_flops_per_s",
                                         "pass_s", "products", "layers", "d_model", "seq_len", "micro_batch",
                                         "parameters", "vocab", "remat"))


def figures_torch(text, work, name):
    m = re.search(r"torch_tokens_per_s ([0-9.]+)", text)
    return {"tokens_per_s": float(m.group(1))} if m else {}


def train_rows(work, name):
    try:
        with open(os.path.join(work, name + ".jsonl")) as f:
            return [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError):
        return []


def figures_train(text, work, name):
    rows = train_rows(work, name)
    if not rows:
        return {}
    timed = rows[2:] if len(rows) > 2 else rows[1:] or rows  # the first steps warm up
    return {"steps": len(rows), "tokens_per_s": statistics.median(r["tokens_per_s"] for r in timed),
            "step_ms": statistics.median(r["step_ms"] for r in timed),
            "loss_first": rows[0]["loss"], "loss_last": rows[-1]["loss"]}


def figures_train_offload(text, work, name):
    f = figures_train(text, work, name)
    rows = train_rows(work, name)
    if not rows:
        return f
    last = rows[-1]
    io = last.get("io", {})
    f.update({"last_step_ms": last["step_ms"], "last_tokens_per_s": last["tokens_per_s"],
              "h2d_bytes": io.get("h2d_bytes"), "d2h_bytes": io.get("d2h_bytes"),
              "io_wait_ms": io.get("io_wait_ms"), "device_peak_bytes": last.get("device_memory_peak_bytes"),
              "device_budget_bytes": last.get("tiers", {}).get("device", {}).get("budget_bytes")})
    f.update(trace_figures(os.path.join(work, name + ".trace.json"), io.get("d2h_bytes")))
    return f


def trace_figures(path, d2h_bytes):
    """The gradient path of the last step: its D2H bytes over the busy time of the trace's
    reduce lane (gradients reduced and carried to host RAM) from that step's first F+B on."""
    try:
        with open(path) as f:
            events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    starts = [e["ts"] for e in events if e["name"].startswith("F+B mb0")]
    if not starts:
        return {}
    begin = max(starts)
    spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e["name"].startswith("reduce") and e["ts"] >= begin)
    busy_us, end = 0.0, float("-inf")
    for a, b in spans:  # union of the intervals
        if b > end:
            busy_us += b - max(a, end)
            end = b
    f = {"trace_reduce_busy_ms": busy_us / 1e3,
         "trace_wait_reduction_ms": sum(e["dur"] for e in events if e["name"] == "wait reduction" and e["ts"] >= begin) / 1e3}
    if d2h_bytes and busy_us > 0:
        f["grad_path_gbps"] = d2h_bytes / (busy_us / 1e6) / 1e9
    return f


def figures_catch2(text, work, name):
    f = {}
    m = re.search(r"All tests passed \((\d+) assertions? in (\d+) test cases?\)", text)
    if m:
        return {"assertions": int(m.group(1)), "passed": int(m.group(2)), "failed": 0}
    m = re.search(r"test cases:\s*(\d+)(?:\s*\|\s*(\d+) passed)?(?:\s*\|\s*(\d+) failed)?", text)
    if m:
        total, failed = int(m.group(1)), int(m.group(3) or 0)
        f = {"passed": int(m.group(2) or (total - failed)), "failed": failed}
    return f


def figures_script(text, work, name):
    return {"checks_passed": len(re.findall(r"^ok: ", text, re.M)), "failed": len(re.findall(r"^FAIL: ", text, re.M))}


PARSERS = {"info": figures_info, "bench_device": figures_bench_device, "bench_adam": figures_bench_adam,
           "bench_gpt": figures_bench_gpt, "torch": figures_torch, "train": figures_train,
           "train_offload": figures_train_offload, "catch2": figures_catch2, "script": figures_script}


def status_of(rc):
    if rc is None:
        return "unavailable"
    return {0: "passed", 77: "skipped", 124: "timed_out", 137: "timed_out"}.get(rc, "failed")


def load(out):
    with open(os.path.join(out, "report.json")) as f:
        return json.load(f)


def save(out, report):
    tmp = os.path.join(out, "report.json.tmp")
    with open(tmp, "w") as f:
        json.dump(report, f, indent=1)
        f.write("\n")
    os.replace(tmp, os.path.join(out, "report.json"))
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(steps_table(report) + "\n" + gpu_report.render(report))


def steps_table(report):
    lines = [f"# GPU check {report.get('started_utc', '')} on {report.get('host', '?')}", "",
             f"Build {report.get('build')}, budget {report.get('budget_seconds')} s"
             f"{', quick' if report.get('quick') else ''}.", "",
             "| step | status | exit | seconds | budget | figures | log |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for s in report["steps"]:
        figs = ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in s.get("figures", {}).items())
        if s.get("reason"):
            figs = (figs + "; " if figs else "") + s["reason"]
        lines.append(f"| {s['name']} | {s['status']} | {s['exit_status'] if s['exit_status'] is not None else '-'} | "
                     f"{s['seconds']} | {s['budget_s']} | {figs.replace('|', '/')} | {s['log'] or '-'} |")
    return "\n".join(lines) + "\n"


def main(argv):
    if len(argv) < 3 or argv[1] not in ("start", "step", "finish"):
        sys.exit(__doc__)
    cmd, out = argv[1], argv[2]
    if cmd == "start":
        opts = dict(zip(argv[3::2], argv[4::2]))
        save(out, {"schema": 1, "tool": "scripts/gpu_check.sh", "sample": False, "started_utc": now(),
                   "finished_utc": None, "host": socket.gethostname(), "build": opts.get("--build"),
                   "budget_seconds": int(opts.get("--budget", 0)), "quick": opts.get("--quick") == "1", "steps": []})
        return
    report = load(out)
    if cmd == "finish":
        report["finished_utc"] = now()
        save(out, report)
        return
    name, kind, budget, rc, secs, log, command = argv[3:10]
    note = argv[10] if len(argv) > 10 else ""
    rc = None if rc == "-" else int(rc)
    step = {"name": name, "kind": kind, "command": command, "budget_s": int(budget), "status": status_of(rc),
            "exit_status": rc, "seconds": round(float(secs), 1), "log": log or None, "figures": {}}
    if note.startswith("unavailable="):
        step["reason"] = note[len("unavailable="):]
    if note.startswith("cases="):
        step["figures"]["cases"] = int(note[len("cases="):])
    if log:
        try:
            with open(os.path.join(out, log), errors="replace") as f:
                text = f.read()
        except OSError:
            text = ""
        step["figures"].update(PARSERS.get(kind, lambda *a: {})(text, os.path.join(out, "work"), name))
        skip = re.search(r"^SKIPPED:? (.+)$", text, re.M)
        if rc == 77 and skip:
            step["reason"] = skip.group(1)
        if kind == "catch2":
            f = step["figures"]
            if rc == 77:
                f.update(passed=0, failed=0, skipped=f.get("cases", 0))
            elif "passed" in f:
                f["skipped"] = max(0, f.get("cases", 0) - f["passed"] - f["failed"])
    report["steps"] = [s for s in report["steps"] if s["name"] != name] + [step]
    save(out, report)


if __name__ == "__main__":
    main(sys.argv)
