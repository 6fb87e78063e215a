#!/usr/bin/python3
"""Offload at scale: a GPT whose model states are several times the host budget, trained with
ZeRO-3, optimizer state and parameters on NVMe, against its floor.

  scripts/bench_scale.py STRATA --dir NVME_DIR --out OUT_DIR [--layers 36 --d-model 1536 ...]

Each of --runs rounds measures, on the same directory and one after the other:
  io       `strata bench io --json --iters 3 --qd 2xQD` mixed read+write GB/s, before the train runs
           and again after them (the median of the six: the drive's floor rate, which drifts on a VM);
           the engine runs aio.queue_depth = --qd in each of its two stores (optimizer state and
           parameters), so the drive sees up to twice that in flight, as in bench io's mixed run;
  compute  `strata bench gpt --json`: the same blocks' training pass with everything resident;
  sync     `strata train` --steps steps, the optimizer after backward (overlap_step false);
  overlap  the same with offload_optimizer.overlap_step (the optimizer during backward).
Per step of a train run, the first --warmup left out (the first step records the gather trace and
touches every file; the first overlapped step has no tail of an earlier step to overlap its forward
with, which every later step of a run has): the step time, the NVMe bytes
it moved (and per parameter), the I/O floor and the ratio step / max(compute, floor). The floor is the
bytes the synchronous step moves over the round's mixed GB/s, for both runs: an overlapped step that is
undone (clipping, overflow) and redone moves more, and that is its cost, not a higher floor. Each run's line counts
the measured steps that clipped, were rolled back and were deferred (under clipping the overlapped step waits for the
norm and runs as the tail: docs/offload.md). --moments bf16
keeps the optimizer's moments in bf16 (bf16.bf16_optimizer_states: 8 bytes of state a parameter, not 12),
--moments q8 in 8-bit blocks (optimizer.moments "q8": 6.125). --spares N keeps the swap files once plus N spare files
per length (offload_optimizer.spare_sub_groups and offload_param.spare_chunks; 0, two generations). Reports medians over
rounds, the NVMe footprint (every swap file's bytes, from the ledger) against the state it holds, the process's peak
RSS against the bound the RSS test asserts (host + device budgets + the RSS before setup + 40 MiB), writes
scale.json, and draws the last overlapped step's trace as scale-step.svg (scripts/trace_svg.py)."""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import trace_svg  # noqa: E402  (scripts/trace_svg.py: standard library only)


def run_json(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out[out.index("{"):])


def config(a, overlap):
    return {
        "train_micro_batch_size_per_gpu": a.micro_batch,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": a.clip,
        "bf16": {"enabled": True, **({"bf16_optimizer_states": True} if a.moments == "bf16" else {})},
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "weight_decay": 0.01},
                      **({"moments": "q8"} if a.moments == "q8" else {})},
        "zero_optimization": {
            "stage": 3,
            "overlap_comm": True,
            "stage3_param_persistence_threshold": 0,
            "sub_group_size": a.sub_group,
            "offload_optimizer": {"device": "nvme", "nvme_path": a.dir, "buffer_count": a.buffers,
                                  "overlap_step": overlap, "spare_sub_groups": a.spares},
            "offload_param": {"device": "nvme", "nvme_path": a.dir, "buffer_count": 4, "buffer_size": a.sub_group,
                              "max_in_cpu": 0, "spare_chunks": a.spares},
        },
        "aio": {"queue_depth": a.qd},
        "memory_budget": {"device": a.device_budget, "host": a.host_budget},
    }


def shape_args(a):
    return ["--layers", str(a.layers), "--d-model", str(a.d_model), "--heads", str(a.heads), "--vocab",
            str(a.vocab), "--seq-len", str(a.seq_len)]


def train(a, overlap, tag, trace):
    cfg_path = os.path.join(a.out, f"{tag}.json")
    with open(cfg_path, "w") as f:
        json.dump(config(a, overlap), f, indent=1)
    log = os.path.join(a.out, f"{tag}.jsonl")
    cmd = [a.strata, "train", "--model", "gpt", "--config", cfg_path, "--steps", str(a.steps), "--log-json", log,
           "--data", a.data, "--seed", "1"] + shape_args(a)
    if trace:
        cmd += ["--trace", trace]
    print("  $", " ".join(cmd), flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{tag}: strata train failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    with open(log) as f:
        return [json.loads(line) for line in f if line.strip()]


def nvme_bytes(steps, warmup):
    """The median NVMe bytes a step moved, the first `warmup` steps left out."""
    return statistics.median(s["io"]["nvme_read_bytes"] + s["io"]["nvme_write_bytes"] for s in steps[warmup:])


def summarize(steps, mixed_gbps, compute_s, warmup, floor_bytes):
    """floor_bytes: what the synchronous step moves (the floor of both runs)."""
    rows = []
    floor = floor_bytes / (mixed_gbps * 1e9)
    for s in steps[warmup:]:  # the module docstring says why the first ones are left out
        moved = s["io"]["nvme_read_bytes"] + s["io"]["nvme_write_bytes"]
        step = s["step_ms"] / 1e3
        rows.append({"step_s": step, "nvme_bytes": moved, "floor_s": floor,
                     "ratio": step / max(compute_s, floor), "rolled_back": s.get("rolled_back", False),
                     "deferred": s.get("deferred", False), "clipped": s.get("clip_coef", 1.0) < 1.0,
                     "optimizer_wait_s": s["io"].get("optimizer_wait_ms", 0) / 1e3,
                     "rss_peak": s["rss"]["peak_bytes"], "rss_base": s["rss"]["base_bytes"], "loss": s["loss"],
                     "nvme_files": s["tiers"]["nvme"]["peak_bytes"]})
    med = lambda k: statistics.median(r[k] for r in rows)
    return {"steps": rows, "step_s": med("step_s"), "floor_s": med("floor_s"), "ratio": med("ratio"),
            "nvme_bytes": med("nvme_bytes"), "optimizer_wait_s": med("optimizer_wait_s"),
            "rss_peak": max(r["rss_peak"] for r in rows), "rss_base": max(r["rss_base"] for r in rows),
            "nvme_files": max(r["nvme_files"] for r in rows),
            "rolled_back": sum(r["rolled_back"] for r in rows), "deferred": sum(r["deferred"] for r in rows),
            "clipped": sum(r["clipped"] for r in rows)}


def parse_bytes(text):
    units = {"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "kb": 10**3, "mb": 10**6, "gb": 10**9, "b": 1}
    t = text.strip().lower()
    for u, m in units.items():
        if t.endswith(u):
            return int(float(t[:-len(u)]) * m)
    return int(float(t))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("strata")
    ap.add_argument("--dir", required=True, help="directory on the NVMe drive (swap files, bench io file)")
    ap.add_argument("--out", required=True, help="where configs, logs, scale.json and scale-step.svg go")
    ap.add_argument("--data", default=os.path.join(HERE, "..", "docs", "user-guide.md"))
    ap.add_argument("--layers", type=int, default=36)
    ap.add_argument("--d-model", type=int, default=1536)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--micro-batch", type=int, default=1)
    ap.add_argument("--sub-group", type=int, default=16_000_000, help="sub_group_size and offload_param.buffer_size")
    ap.add_argument("--buffers", type=int, default=6, help="offload_optimizer.buffer_count")
    ap.add_argument("--clip", type=float, default=1.0, help="gradient_clipping")
    ap.add_argument("--moments", choices=("fp32", "bf16", "q8"), default="fp32",
                    help="the optimizer's moments: fp32, bf16 (bf16.bf16_optimizer_states) or q8 (optimizer.moments)")
    ap.add_argument("--spares", type=int, default=0,
                    help="offload_optimizer.spare_sub_groups and offload_param.spare_chunks (0: two generations of "
                         "the swap files)")
    ap.add_argument("--host-budget", default="3.75GiB", help="a quarter of the 1B model states")
    ap.add_argument("--device-budget", default="1GiB")
    ap.add_argument("--steps", type=int, default=6, help="per train run")
    ap.add_argument("--warmup", type=int, default=2, help="first steps of a train run left out")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--io-size", default="4GiB")
    ap.add_argument("--qd", type=int, default=32,
                    help="aio.queue_depth of each of the engine's two NVMe stores; bench io runs at twice it")
    a = ap.parse_args()
    if a.steps <= a.warmup:
        ap.error(f"--steps {a.steps} leaves nothing to measure after --warmup {a.warmup}: give more steps")
    if not shutil.which(a.strata):
        sys.exit(f"bench_scale: {a.strata} is not an executable strata binary (build it: cmake --build build)")
    os.makedirs(a.out, exist_ok=True)
    os.makedirs(a.dir, exist_ok=True)
    params = None
    rounds = []
    for r in range(a.runs):
        print(f"round {r + 1}/{a.runs}", flush=True)
        io_cmd = [a.strata, "bench", "io", "--json", "--iters", "3", "--dir", a.dir, "--size", a.io_size,
                  "--qd", str(2 * a.qd)]
        mixed_runs = run_json(io_cmd)["runs"]["mixed_gbps"]
        gpt = run_json([a.strata, "bench", "gpt", "--json", "--iters", "3", "--micro-batch", str(a.micro_batch)]
                       + shape_args(a))
        params = gpt["parameters"]
        compute = gpt["pass_s"]
        print(f"  mixed {statistics.median(mixed_runs):.3f} GB/s before, compute {compute:.2f} s", flush=True)
        last = r == a.runs - 1
        logs = {tag: train(a, overlap, tag, os.path.join(a.out, "overlap-trace.json") if (last and overlap) else None)
                for tag, overlap in (("sync", False), ("overlap", True))}
        after = run_json(io_cmd)["runs"]["mixed_gbps"]
        mixed = statistics.median(mixed_runs + after)
        print(f"  mixed {statistics.median(after):.3f} GB/s after; the round's floor rate {mixed:.3f} GB/s", flush=True)
        res = {"mixed_gbps": mixed, "mixed_runs": mixed_runs + after, "compute_s": compute}
        sync_bytes = nvme_bytes(logs["sync"], a.warmup)
        for tag in ("sync", "overlap"):
            s = summarize(logs[tag], mixed, compute, a.warmup, sync_bytes)
            res[tag] = s
            print(f"  {tag:8s} step {s['step_s']:.2f} s  floor {s['floor_s']:.2f} s  ratio {s['ratio']:.3f}  "
                  f"NVMe {s['nvme_bytes'] / 1e9:.2f} GB ({s['nvme_bytes'] / params:.1f} B a parameter)  "
                  f"optimizer wait {s['optimizer_wait_s']:.2f} s  "
                  f"clipped {s['clipped']}  rolled back {s['rolled_back']}  deferred {s['deferred']}  rss peak {s['rss_peak'] / 2**30:.2f} GiB", flush=True)
        rounds.append(res)
    host, device = parse_bytes(a.host_budget), parse_bytes(a.device_budget)
    # fp32 master, exp_avg and exp_avg_sq (bf16 or q8 with --moments); bf16 parameters and gradients
    states = int(params * {"fp32": 16, "bf16": 12, "q8": 10.125}[a.moments])
    # What the NVMe tier holds: the optimizer state and the bf16 parameters, once.
    on_nvme = int(params * ({"fp32": 12, "bf16": 8, "q8": 6.125}[a.moments] + 2))
    med = lambda f: statistics.median(f(x) for x in rounds)
    summary = {
        "parameters": params, "model_states_bytes": states, "host_budget": host, "device_budget": device,
        "states_over_host_budget": states / host, "mixed_gbps": med(lambda x: x["mixed_gbps"]),
        "compute_s": med(lambda x: x["compute_s"]),
        **{f"{t}_{k}": med(lambda x, t=t, k=k: x[t][k])
           for t in ("sync", "overlap") for k in ("step_s", "floor_s", "ratio", "optimizer_wait_s", "nvme_bytes")},
        "moments": a.moments, "spares": a.spares, "nvme_state_bytes": on_nvme,
        "nvme_files": max(max(x["sync"]["nvme_files"], x["overlap"]["nvme_files"]) for x in rounds),
        "rss_peak": max(max(x["sync"]["rss_peak"], x["overlap"]["rss_peak"]) for x in rounds),
        "rss_base": max(max(x["sync"]["rss_base"], x["overlap"]["rss_base"]) for x in rounds),
        "rounds": rounds,
    }
    with open(os.path.join(a.out, "scale.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(f"\nGPT {a.layers} x {a.d_model}: {params / 1e9:.2f}B parameters, model states "
          f"{states / 2**30:.1f} GiB = {states / host:.1f}x the host budget ({a.host_budget})")
    print(f"compute (everything resident) {summary['compute_s']:.2f} s; bench io mixed "
          f"{summary['mixed_gbps']:.3f} GB/s (medians of {a.runs} rounds)")
    for t in ("sync", "overlap"):
        print(f"{t:8s} step {summary[t + '_step_s']:.2f} s  I/O floor {summary[t + '_floor_s']:.2f} s  "
              f"step / max(compute, floor) = {summary[t + '_ratio']:.3f}  NVMe "
              f"{summary[t + '_nvme_bytes'] / params:.1f} B a parameter a step")
    print(f"NVMe footprint {summary['nvme_files'] / 1e9:.2f} GB of swap files for {on_nvme / 1e9:.2f} GB of state "
          f"(optimizer state and parameters): {summary['nvme_files'] / on_nvme:.3f}x (spare files per length {a.spares})")
    # The bound tests/tools/rss_bound_test.sh asserts (docs/offload.md, "How the estimate and the plan are built").
    bound = host + device + summary["rss_base"] + (40 << 20)
    print(f"peak RSS {summary['rss_peak'] / 2**30:.2f} GiB against the bound {bound / 2**30:.2f} GiB (host + device "
          f"budgets {(host + device) / 2**30:.2f} GiB + the RSS before setup {summary['rss_base'] / 2**30:.2f} GiB "
          f"+ 40 MiB)")
    trace = os.path.join(a.out, "overlap-trace.json")
    if os.path.exists(trace):
        svg = os.path.join(a.out, "scale-step.svg")
        size = f"{params / 1e9:.2f}B" if params >= 1e9 else f"{params / 1e6:.1f}M"
        trace_svg.render(trace, svg, title=f"GPT {a.layers} x {a.d_model} ({size} parameters), ZeRO-3, "
                         f"optimizer state and parameters on NVMe, overlap_step: host budget {a.host_budget}, "
                         f"device {a.device_budget}")
        print(f"trace of the last overlapped step: {svg}")


if __name__ == "__main__":
    main()
