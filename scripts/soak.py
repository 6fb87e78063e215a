#!/usr/bin/python3
"""The soak: a small GPT with its parameters and optimizer state on NVMe trains on a copy of
docs/user-guide.md, saving every step (synchronous and --save-async saves alternate), and is
killed with SIGKILL at a random moment (0.3-2.5 s in: setup, saves and steps), then resumed from
`latest` (which must verify against its checksums after every kill), --kills times; the last
checkpoint taken 5 steps further must have the parameter bytes of one uninterrupted run to
that step, and each run's log that run's losses (the first step off is named). Throughout,
the figures that would show a leak: each run's peak RSS, the swap files' bytes on the NVMe
path while a run trains (a killed run's leftovers are removed by the next one, so they must
not pile up), the committed checkpoints' bytes (--keep 2) and the staging directories a kill
inside a save leaves (at most one: the next run removes it); the uninterrupted run's RSS step
by step.
Writes DIR/soak.json and, with matplotlib, DIR/soak.png; exits 1 when the bytes differ or a
figure grows (peak RSS over the first runs' by more than --rss-slack, the later runs' smallest
swap bytes or bytes per committed checkpoint above the first runs' by more than 5%, more than
--keep + 1 committed checkpoints after a kill, or a moment above what replacing a file can
explain). --spares N keeps the swap files once plus N spare files per length
(offload_optimizer.spare_sub_groups and offload_param.spare_chunks; 0, two generations).
Usage: soak.py --strata BIN --dir DIR [--kills N] [--seed N] [--rss-slack F] [--spares N]"""
import argparse
import json
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import time

KEEP = 2  # the runs' --keep

def tensors(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    h.pop("__metadata__", None)
    return {k: b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]] for k, v in h.items()}


def tree_bytes(root, suffix=""):
    """Bytes of the files under root ending in suffix; hidden directories (a save's staging,
    left by a kill until the next run removes it) are not counted."""
    total = 0
    for d, dirs, files in os.walk(root):
        dirs[:] = [x for x in dirs if not x.startswith(".")]
        for f in files:
            if f.endswith(suffix):
                try:
                    total += os.path.getsize(os.path.join(d, f))
                except OSError:
                    pass  # removed while walking
    return total


def committed(root):
    """The committed checkpoints under root: step-N directories holding their manifest."""
    try:
        return [x for x in os.listdir(root) if x.startswith("step-") and
                os.path.exists(os.path.join(root, x, "manifest.json"))]
    except OSError:
        return []


def peak_rss(log):
    peak = 0
    try:
        for line in open(log):
            j = json.loads(line)
            if "rss" in j:
                peak = max(peak, j["rss"]["peak_bytes"])
    except (OSError, ValueError):
        pass
    return peak


def have_matplotlib():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot  # noqa: F401
        return True
    except ImportError:
        return False


def plot(report, straight_rss, path):
    """Peak RSS per run, swap files and checkpoints per run, and the uninterrupted run's RSS."""
    import matplotlib.pyplot as plt
    runs = report["runs"]
    x = [r["run"] + 1 for r in runs]
    mib = 2.0**20
    fig, ax = plt.subplots(1, 3, figsize=(13, 4))
    rss = [r["peak_rss"] / mib for r in runs]
    ax[0].plot(x, rss, ".", markersize=3)
    ax[0].set_ylim(0, max(rss + [1]) * 1.2)
    ax[0].set_ylabel("peak RSS of the run (MiB)")
    ax[0].set_title(f"{report['kills']} SIGKILLs: {'same bytes as one run' if report['same_bytes'] else 'BYTES DIFFER'}")
    # Hollow circles under crosses: both show where the two are about the same size.
    ax[1].plot(x, [r["checkpoint_bytes"] / mib for r in runs], "o", markersize=5, mfc="none",
               label=f"committed checkpoints (keep {KEEP})")
    ax[1].plot(x, [r["swap_bytes"] / mib for r in runs], "x", markersize=3, label="swap files while training")
    ax[1].set_ylim(0, max([r["checkpoint_bytes"] / mib for r in runs] + [1]) * 1.4)
    ax[1].set_ylabel("bytes on disk (MiB)")
    ax[1].legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, fontsize=8, frameon=False)
    ax[1].set_title("swap files and checkpoints")
    for a in ax[:2]:
        a.set_xlabel("run (killed at a random moment, then resumed)")
    ax[2].plot(range(1, len(straight_rss) + 1), [v / mib for v in straight_rss])
    ax[2].set_ylim(0, max([v / mib for v in straight_rss] + [1]) * 1.2)
    ax[2].set_xlabel("training step")
    ax[2].set_ylabel("RSS after the step (MiB)")
    ax[2].set_title(f"the uninterrupted run, {report['steps']} steps")
    fig.suptitle("soak: GPT 4 x 64 (sequence 32) with parameters and optimizer state on NVMe, saving every step, "
                 f"{report['kills']} SIGKILLs at random moments, each resumed from latest", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100, bbox_inches="tight")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--strata", required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--kills", type=int, default=200)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rss-slack", type=float, default=0.15)
    ap.add_argument("--spares", type=int, default=0)
    a = ap.parse_args()
    if a.kills < 1:
        sys.exit("soak: --kills must be >= 1")
    if not shutil.which(a.strata):
        sys.exit(f"soak: {a.strata} is not an executable strata binary (build it: cmake --build build)")
    # Said before the kills start: the verdict (the exit status) does not need the picture, so a
    # missing matplotlib skips soak.png rather than stopping the soak (the ctest runs this too).
    draw = have_matplotlib()
    if not draw:
        print(f"soak: no matplotlib (apt-get install python3-matplotlib): {os.path.join(a.dir, 'soak.png')} "
              "will not be drawn", flush=True)
    os.makedirs(a.dir, exist_ok=True)
    nvme, ck = os.path.join(a.dir, "nvme"), os.path.join(a.dir, "ck")
    cfg = os.path.join(a.dir, "config.json")
    json.dump({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "bf16": {"enabled": True},
               "gradient_clipping": 1.0, "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}},
               "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                                     "offload_optimizer": {"device": "nvme", "nvme_path": nvme,
                                                           "spare_sub_groups": a.spares},
                                     "offload_param": {"device": "nvme", "nvme_path": nvme, "buffer_count": 4,
                                                       "buffer_size": 65536, "spare_chunks": a.spares}}},
              open(cfg, "w"))
    # The text is copied: the runs span minutes, and a file edited meanwhile would give the
    # uninterrupted run other batches (the README did, twice, before this copy).
    data = os.path.join(a.dir, "text.txt")
    shutil.copyfile(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "user-guide.md"), data)
    model = ["--model", "gpt", "--layers", "4", "--heads", "4", "--d-model", "64", "--seq-len", "32",
             "--vocab", "256", "--seed", "3", "--device", "host", "--data", data, "--val-fraction", "0",
             "--config", cfg]

    def train(*extra, log=None):
        args = [a.strata, "train", *model, *extra] + (["--log-json", log] if log else [])
        return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    rng = random.Random(a.seed)
    runs, started = [], time.time()
    for i in range(a.kills):
        log = os.path.join(a.dir, f"run{i}.jsonl")
        resume = ["--resume", "latest"] if os.path.exists(os.path.join(ck, "latest")) else []
        extra = ["--save-async"] if i % 2 else []
        p = train("--steps", "1000000", "--save-dir", ck, "--save-every", "1", "--keep", str(KEEP), *resume, *extra,
                  log=log)
        wait = rng.uniform(0.3, 2.5)
        swap = 0
        deadline = time.time() + wait
        while time.time() < deadline and p.poll() is None:  # the swap files' bytes while it trains
            swap = max(swap, tree_bytes(nvme, ".swap"))
            time.sleep(0.05)
        if p.poll() is not None:
            sys.exit(f"soak: run {i + 1} ended before its kill: {p.stderr.read()[-2000:]}")
        p.send_signal(signal.SIGKILL)
        p.wait()
        latest = open(os.path.join(ck, "latest")).read().strip() if os.path.exists(os.path.join(ck, "latest")) else ""
        if latest:  # every chunk of what the next run resumes from against its checksum
            v = subprocess.run([a.strata, "checkpoint", "verify", ck], capture_output=True, text=True)
            if v.returncode != 0:
                sys.exit(f"soak: kill {i + 1}: {latest} does not verify: {v.stderr.strip() or v.stdout.strip()}")
        staging = len([x for x in os.listdir(ck) if x.startswith(".") and os.path.isdir(os.path.join(ck, x))]) \
            if os.path.isdir(ck) else 0
        if staging > 1:
            sys.exit(f"soak: kill {i + 1}: {staging} staging directories under {ck}: the runs do not remove them")
        runs.append({"run": i, "killed_after_s": round(wait, 3), "latest": latest, "staging_left": staging,
                     "peak_rss": peak_rss(log), "swap_bytes": swap, "checkpoint_bytes": tree_bytes(ck),
                     "checkpoints": len(committed(ck))})
        print(f"kill {i + 1}/{a.kills}: after {wait:.2f} s, latest {latest or '-'}, peak RSS "
              f"{runs[-1]['peak_rss'] / 2**20:.1f} MiB, swap {swap / 2**20:.2f} MiB, checkpoints "
              f"{runs[-1]['checkpoint_bytes'] / 2**20:.2f} MiB ({runs[-1]['checkpoints']})", flush=True)
    if not runs[-1]["latest"]:
        sys.exit("soak: no checkpoint was ever committed: give the runs longer (a larger model or fewer kills)")
    # The chain taken 5 steps further, and one uninterrupted run to that step (its RSS step by step).
    end = int(runs[-1]["latest"].split("-")[1]) + 5
    p = train("--steps", str(end), "--save-dir", ck, "--save-every", "1", "--keep", str(KEEP), "--resume", "latest",
              "--save-params", os.path.join(a.dir, "chain.st"))
    _, err = p.communicate()
    if p.returncode != 0:
        sys.exit(f"soak: the final resumed run failed: {err[-2000:]}")
    ref_log = os.path.join(a.dir, "straight.jsonl")
    p = train("--steps", str(end), "--save-params", os.path.join(a.dir, "straight.st"), log=ref_log)
    _, err = p.communicate()
    if p.returncode != 0:
        sys.exit(f"soak: the uninterrupted run failed: {err[-2000:]}")
    straight_rss = [json.loads(line)["rss"]["bytes"] for line in open(ref_log) if '"rss"' in line]
    same = tensors(os.path.join(a.dir, "chain.st")) == tensors(os.path.join(a.dir, "straight.st"))
    # Where the chain left the uninterrupted run: the first step whose loss or gradient norm
    # differs, and the run (and the checkpoint it resumed from) that took it.
    ref = {j["step"]: (j["loss"], j["grad_norm"]) for j in map(json.loads, open(ref_log)) if "step" in j}
    first_off = None
    for r in runs:
        try:
            lines = [json.loads(line) for line in open(os.path.join(a.dir, f"run{r['run']}.jsonl"))]
        except (OSError, ValueError):
            continue
        for j in lines:
            if "step" in j and ref.get(j["step"]) != (j["loss"], j["grad_norm"]):
                if first_off is None or j["step"] < first_off["step"]:
                    first_off = {"step": j["step"], "run": r["run"], "loss": j["loss"], "want": ref.get(j["step"]),
                                 "resumed_from": runs[r["run"] - 1]["latest"] if r["run"] > 0 else "",
                                 "async_saves": r["run"] % 2 == 1}
                break

    rss = [r["peak_rss"] for r in runs if r["peak_rss"] > 0]
    swaps = [r["swap_bytes"] for r in runs if r["swap_bytes"] > 0]
    cks = [r["checkpoint_bytes"] for r in runs if r["checkpoint_bytes"] > 0]
    # Bytes per committed checkpoint: a kill between committing one and pruning the oldest
    # leaves a third whole checkpoint until the next run's first save prunes it, a moment
    # that can land on any kill (saves take much of a step here), twice in a row as well.
    # Whole checkpoints that pile up are counted (never more than keep + 1 after a kill);
    # bytes that pile up inside checkpoints lift the bytes of each (a checkpoint of this model
    # has the same size at every step, but for a few bytes of manifest and trainer state).
    per_ck = [r["checkpoint_bytes"] / r["checkpoints"] for r in runs if r["checkpoints"] > 0]
    base_rss = sorted(rss[:10])[len(rss[:10]) // 2] if rss else 0
    problems = []
    if not same:
        problems.append(f"the chain of killed and resumed runs ended with other parameter bytes than one run; first "
                        f"step off: {first_off}")
    if rss and max(rss) > base_rss * (1 + a.rss_slack):
        problems.append(f"peak RSS grew to {max(rss) / 2**20:.1f} MiB from {base_rss / 2**20:.1f} MiB")
    piled = [r for r in runs if r["checkpoints"] > KEEP + 1]
    if piled:
        problems.append(f"{piled[0]['checkpoints']} committed checkpoints after kill {piled[0]['run'] + 1} with "
                        f"--keep {KEEP}: at most {KEEP + 1} may exist (one a kill kept from pruning)")
    # Growth, not moments: a swap file being replaced exists twice for a moment (one file of
    # several: up to a quarter more). A moment lifts one sample; leftovers that piled up lift
    # every later one, so growth compares the floors (the smallest sample of the last third
    # against the first third's). A median of the two samples a six-kill run has per third is
    # their mean, which one moment moves.
    for what, xs, moment in (("swap files", swaps, 1.25), ("bytes per committed checkpoint", per_ck, 1.05)):
        if len(xs) < 6:
            continue
        third = len(xs) // 3
        early, late = min(xs[:third]), min(xs[-third:])
        if late > early * 1.05:
            problems.append(f"{what}: the last runs' smallest {late:.0f} bytes against the first runs' {early:.0f}")
        if max(xs) > early * moment:
            problems.append(f"{what}: {max(xs):.0f} bytes at one point, over {moment}x the first runs' smallest "
                            f"{early:.0f}")
    if straight_rss and max(straight_rss[len(straight_rss) // 10:]) > straight_rss[len(straight_rss) // 10] * 1.1:
        problems.append("the uninterrupted run's RSS grew over its steps")
    report = {"kills": len(runs), "steps": end, "seconds": round(time.time() - started, 1), "same_bytes": same,
              "peak_rss_bytes": {"min": min(rss, default=0), "max": max(rss, default=0), "first_runs_median": base_rss},
              "swap_bytes": {"min": min(swaps, default=0), "max": max(swaps, default=0)},
              "checkpoint_bytes": {"min": min(cks, default=0), "max": max(cks, default=0)},
              "straight_rss_bytes": {"first": straight_rss[0] if straight_rss else 0, "all": straight_rss,
                                     "last": straight_rss[-1] if straight_rss else 0},
              "first_divergence": first_off, "problems": problems, "runs": runs}
    json.dump(report, open(os.path.join(a.dir, "soak.json"), "w"), indent=1)
    if draw:
        plot(report, straight_rss, os.path.join(a.dir, "soak.png"))
    print(f"soak: {len(runs)} kills in {report['seconds']} s, step {end}; final bytes "
          f"{'equal to one uninterrupted run' if same else 'DIFFER'}; peak RSS {min(rss, default=0) / 2**20:.1f}-"
          f"{max(rss, default=0) / 2**20:.1f} MiB; swap files {min(swaps, default=0) / 2**20:.2f}-"
          f"{max(swaps, default=0) / 2**20:.2f} MiB; checkpoints {min(cks, default=0) / 2**20:.2f}-"
          f"{max(cks, default=0) / 2**20:.2f} MiB")
    for pr in problems:
        print("soak: FAIL:", pr)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
