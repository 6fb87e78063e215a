#!/usr/bin/python3
"""Records what a fixed set of training runs produce, so a refactor can show it changed no
bit: ZeRO stages 0-3 with the optimizer state and parameters on the device, in host RAM and
on NVMe, at world 1 and 2 (MLP and GPT), the budget-driven demo, and the pipeline
executor's --verify runs; and the overlapped optimizer step (offload_optimizer.overlap_step:
the lane over host or NVMe state, its tail, the deferred step, an fp16 overflow undone) with
and without clipping. Per run it keeps the final parameters' tensor bytes (safetensors data,
not the metadata, which names the stage), every step's loss as logged, and what the
overlapped step did each step (skipped, undone, deferred).

  record_runs.py record STRATA OUT_DIR     run everything with the `strata` binary given
  record_runs.py compare DIR_A DIR_B       exit 1 naming every run whose bytes or losses differ

Record on main before a change (build it in a worktree), record after, compare."""
import hashlib
import json
import os
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
PLACEMENTS = [("0", "none", "none"), ("1", "none", "none"), ("1", "cpu", "none"), ("1", "nvme", "none"),
              ("2", "none", "none"), ("2", "cpu", "none"), ("2", "nvme", "none"), ("3", "none", "none"),
              ("3", "cpu", "cpu"), ("3", "nvme", "none"), ("3", "nvme", "nvme"), ("3", "cpu", "nvme")]
MODELS = {
    "mlp": ["--model", "mlp", "--layers", "4", "--hidden", "64"],
    "gpt": ["--model", "gpt", "--layers", "2", "--heads", "2", "--d-model", "32", "--seq-len", "16",
            "--data", None],  # the fixed corpus below
}


def corpus(path):
    """A fixed text for the GPT runs, written by this script: a file of the repository would
    change with the documentation and make every GPT run differ."""
    with open(path, "w") as f:
        for i in range(3000):
            f.write(f"line {i}: {i * 7919 % 1000} foxes jump over {i * 104729 % 997} dogs; {i * i % 89} sleep.\n")
    return path


# (stage, optimizer offload, parameter offload, gradient_clipping) with overlap_step on: at
# 0.05 every step of these small models clips (the lane's bet is lost and undone, over host
# and NVMe state, or, at stage 3, deferred to the tail); unclipped, the bet is kept (and at
# stage 3 finishes as the tail). And at stage 3, fp16 from a loss scale the first steps overflow
# at (2^22 for the MLP, 2^18 for the GPT): the lane's bet is lost and undone, then kept.
OVERFLOW_POWER = {"mlp": 22, "gpt": 18}
OVERLAPPED = [("1", "nvme", "none", 0.05), ("2", "cpu", "none", 0.05), ("3", "nvme", "nvme", 0.05),
              ("1", "nvme", "none", 0.0), ("2", "cpu", "none", 0.0), ("3", "nvme", "nvme", 0.0)]


def config(stage, opt, par, nvme, clip=1.0, overlap=False, fp16_power=None):
    offload_opt = {"device": opt, "nvme_path": nvme}
    if overlap:
        offload_opt["overlap_step"] = True
    precision = {"bf16": {"enabled": True}} if fp16_power is None else \
        {"fp16": {"enabled": True, "initial_scale_power": fp16_power, "hysteresis": 1}}
    return {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, **precision,
            "gradient_clipping": clip, "optimizer": {"type": "AdamW", "params": {"lr": 0.003}},
            "zero_optimization": {"stage": int(stage), "stage3_param_persistence_threshold": 0,
                                  "offload_optimizer": offload_opt,
                                  "offload_param": {"device": par, "nvme_path": nvme, "buffer_count": 4,
                                                    "buffer_size": 8192}}}


def tensor_bytes(path):
    with open(path, "rb") as f:
        b = f.read()
    n = struct.unpack("<Q", b[:8])[0]
    header = json.loads(b[8:8 + n])
    header.pop("__metadata__", None)
    return {k: [v["shape"], b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]].hex()]
            for k, v in sorted(header.items())}


def train(strata, name, args, world, work, out, steps=3):
    log, params = os.path.join(work, name + ".jsonl"), os.path.join(work, name + ".safetensors")
    cmd = [strata, "train", *args, "--steps", str(steps), "--seed", "5", "--device", "host", "--log-json", log,
           "--save-params", params]
    if world > 1:
        cmd = [strata, "launch", "-n", str(world), "--", *cmd]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    steps_logged = [json.loads(line) for line in open(log)]
    losses = [s["loss"] for s in steps_logged]
    # What the overlapped step did with its lane each step (a run whose lane stopped running
    # would still give the synchronous bits); not the layers left to its tail, which depend on
    # how far the lane had got when the step kept it.
    lane = [[s.get(k) for k in ("skipped", "rolled_back", "deferred")] for s in steps_logged]
    tensors = tensor_bytes(params)
    record = {"losses": losses, "lane": lane, "tensors": {k: [s, hashlib.sha256(bytes.fromhex(h)).hexdigest()]
                                            for k, (s, h) in tensors.items()}}
    with open(os.path.join(out, name + ".json"), "w") as f:
        json.dump(record, f, indent=1)
    print(f"{name}: {len(losses)} steps, {len(tensors)} tensors")


def record(strata, out):
    os.makedirs(out, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=os.environ.get("STRATA_TEST_TMPDIR", "/var/tmp")) as work:
        text = corpus(os.path.join(work, "corpus.txt"))
        for model, margs in MODELS.items():
            margs = [text if a is None else a for a in margs]
            for world in (1, 2):
                for stage, opt, par in PLACEMENTS:
                    name = f"{model}-w{world}-s{stage}-{opt}-{par}"
                    cfg = os.path.join(work, name + ".cfg.json")
                    json.dump(config(stage, opt, par, os.path.join(work, "nvme")), open(cfg, "w"))
                    train(strata, name, [*margs, "--config", cfg], world, work, out)
                for stage, opt, par, clip in OVERLAPPED:
                    name = f"{model}-w{world}-s{stage}-{opt}-{par}-overlap-clip{clip:g}"
                    cfg = os.path.join(work, name + ".cfg.json")
                    json.dump(config(stage, opt, par, os.path.join(work, "nvme"), clip, True), open(cfg, "w"))
                    train(strata, name, [*margs, "--config", cfg], world, work, out)
                name = f"{model}-w{world}-s3-nvme-nvme-overlap-fp16-overflow"
                cfg = os.path.join(work, name + ".cfg.json")
                json.dump(config("3", "nvme", "nvme", os.path.join(work, "nvme"), 0.0, True, OVERFLOW_POWER[model]),
                          open(cfg, "w"))
                train(strata, name, [*margs, "--config", cfg], world, work, out, steps=6)
        budget = os.path.join(work, "budget.json")
        with open(os.path.join(ROOT, "scripts", "configs", "zero3-budget-nvme.json")) as f:
            text = f.read().replace("build/demo/nvme", os.path.join(work, "nvme"))
        open(budget, "w").write(text)
        train(strata, "mlp-budget-demo", ["--model", "mlp", "--layers", "16", "--hidden", "256", "--config", budget],
              1, work, out)
    for kind in ("gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2", "zb-auto"):
        args = ["--kind", kind, "--stages", "4", "--micro", "8", "--verify", "--json"]
        if kind == "interleaved":
            args += ["--chunks", "2"]
        r = json.loads(subprocess.run([strata, "pipeline", *args], check=True, capture_output=True, text=True).stdout)
        keep = {k: r[k] for k in ("gradients_bitwise_equal", "peak_activations", "stages", "micro_batches")}
        with open(os.path.join(out, f"pipeline-{kind}.json"), "w") as f:
            json.dump(keep, f, indent=1)
        print(f"pipeline {kind}: gradients bitwise equal to the sequential loop: {r['gradients_bitwise_equal']}")


def compare(a, b):
    names = sorted(set(os.listdir(a)) | set(os.listdir(b)))
    bad = []
    for n in names:
        pa, pb = os.path.join(a, n), os.path.join(b, n)
        if not (os.path.exists(pa) and os.path.exists(pb)):
            bad.append(f"{n}: only in {a if os.path.exists(pa) else b}")
            continue
        ra, rb = json.load(open(pa)), json.load(open(pb))
        if ra != rb:
            bad.append(f"{n}: differs")
        elif n.startswith("pipeline-") and not ra["gradients_bitwise_equal"]:
            bad.append(f"{n}: the executor's gradients differ from the sequential loop")
    for line in bad:
        print(line, file=sys.stderr)
    print(f"compared {len(names)} runs: {len(names) - len(bad)} identical, {len(bad)} different")
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "record":
        record(os.path.abspath(sys.argv[2]), sys.argv[3])
    elif len(sys.argv) == 4 and sys.argv[1] == "compare":
        sys.exit(compare(sys.argv[2], sys.argv[3]))
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
