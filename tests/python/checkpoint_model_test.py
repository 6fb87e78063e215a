"""Committed checkpoints are immutable, driven from Python: seeded sequences of training
steps, saves (two roots, one with retention), loads of any committed checkpoint, restarts (the
engine closed and a new one initialized and resumed from `latest`) through strata.torch, with
the optimizer state and parameters on NVMe at ZeRO-3 and one save root inside the swap
directory. After every operation each committed checkpoint holds exactly the bytes it was
committed with (unless retention removed it, the oldest only, or a later save of the same
step replaced it), and a load followed by a save gives the loaded parameters back. Exits 77
(skipped) without torch."""
import hashlib
import os
import random
import tempfile

from harness import torch  # exits 77 without torch

import strata.torch as st
from torch_models import Mlp


def config(nvme):
    return {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1, "gradient_clipping": 0,
            "bf16": {"enabled": True},
            "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}},
            "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0, "sub_group_size": 500,
                                  "offload_optimizer": {"device": "nvme", "nvme_path": nvme},
                                  "offload_param": {"device": "nvme", "nvme_path": nvme, "buffer_count": 4,
                                                    "buffer_size": 4096}}}


def files_of(step_dir):
    out = {}
    for base, _, names in os.walk(step_dir):
        for n in names:
            p = os.path.join(base, n)
            with open(p, "rb") as f:
                out[os.path.relpath(p, step_dir)] = hashlib.sha256(f.read()).hexdigest()
    return out


def steps_under(root):
    if not os.path.isdir(root):
        return []
    return sorted(int(n[5:]) for n in os.listdir(root)
                  if n.startswith("step-") and os.path.exists(os.path.join(root, n, "manifest.json")))


def run(seed, tmp):
    rng = random.Random(seed)
    nvme = tmp + "/nvme"
    roots = {tmp + "/a": 0, nvme + "/rank0/b": 2}  # root -> keep
    committed = {r: {} for r in roots}  # root -> step -> files
    cfg = config(nvme)

    def start():
        torch.manual_seed(0)
        return st.initialize(Mlp(width=32), cfg)

    engine = start()
    step = 0
    loaded = None
    counts = {"step": 0, "save": 0, "load": 0, "restart": 0}
    checks = 0

    def check_all():
        nonlocal checks
        for root, steps in committed.items():
            present = steps_under(root)
            for s in list(steps):
                d = f"{root}/step-{s:08d}"
                if not os.path.isdir(d):
                    keep = roots[root]
                    assert keep > 0 and len(present) >= keep and s < present[-keep], f"{d} is gone"
                    del steps[s]
                    continue
                assert files_of(d) == steps[s], f"{d} changed"
                checks += 1

    def train_one():
        nonlocal step
        g = torch.Generator().manual_seed(1000 + step)
        x = torch.randn(4, 32, generator=g)
        engine.backward(((engine(x) - x.flip(1)) ** 2).mean())
        engine.step()
        step += 1

    last_saved = None
    for _ in range(30):
        # A load right after a save (of another checkpoint) once damaged the one just saved.
        kind = 7 if last_saved and rng.randrange(2) == 0 else rng.randrange(10)
        if kind < 4:
            train_one()
            loaded = None
            last_saved = None
            counts["step"] += 1
        elif kind < 7:
            root = rng.choice(sorted(roots))
            engine.save(root, {"next_step": step}, keep=roots[root])
            committed[root][step] = files_of(f"{root}/step-{step:08d}")
            last_saved = (root, step)
            if loaded is not None:
                now = engine.parameters_numpy()
                assert all(now[n].tobytes() == loaded[n].tobytes() for n in now), "a load did not restore"
            counts["save"] += 1
        elif kind < 9:
            all_ck = [(r, s) for r in sorted(committed) for s in sorted(committed[r]) if (r, s) != last_saved]
            if not all_ck:
                continue
            root, s = rng.choice(all_ck)
            step = engine.load(f"{root}/step-{s:08d}")["next_step"]
            loaded = engine.parameters_numpy()
            counts["load"] += 1
        else:
            root = rng.choice(sorted(roots))
            if not steps_under(root):
                continue
            engine.close()
            engine = start()
            step = engine.load(root)["next_step"]
            loaded = engine.parameters_numpy()
            counts["restart"] += 1
        check_all()
    engine.close()
    check_all()
    print(f"seed {seed}: {counts['step']} steps, {counts['save']} saves, {counts['load']} loads, "
          f"{counts['restart']} restarts; {checks} checkpoint checks, every committed checkpoint unchanged")
    return counts


# [regression] A trainer state over 64 KiB saved, but its load failed ("does not fit in
# capacity 65536"): the state is now read at its size.
with tempfile.TemporaryDirectory(prefix="strata-ckpt-state-") as tmp:
    torch.manual_seed(0)
    e = st.initialize(Mlp(width=32), config(tmp + "/nvme"))
    big = {"next_step": 0, "history": [i * 0.5 for i in range(40000)]}  # about 400 KB of JSON
    e.save(tmp + "/ck", big)
    assert e.load(tmp + "/ck") == big, "a large trainer state did not come back"
    e.close()
    print("a 400 KB trainer state saves and loads")

total = 0
for seed in (1, 2):
    with tempfile.TemporaryDirectory(prefix="strata-ckpt-model-") as tmp:
        c = run(seed, tmp)
        total += c["load"] + c["restart"]
assert total > 0, "no load was driven"
print("3 passed, 0 failed")
