"""PyTorch as the oracle for the GPT (models/gpt): the same model written in torch, loaded
from the safetensors Strata writes, on the batches Strata's sampler draws.

1. Loss and gradients of one micro-batch: Strata's fp32 host pass (gpt_oracle_dump) against
   torch in float64. The loss must agree within 1e-5 relative; each gradient element within
   gamma_K * (L + 2) * max|g| of its tensor, where gamma_K = K u / (1 - K u) is the classic
   bound for a length-K fp32 sum (u = fp32 epsilon / 2) and K = N + 4C + V is the longest
   chain of sums feeding it (the tokens of the micro-batch, the MLP's inner width and the
   vocabulary), once per layer the gradient flows through. Torch's own fp32 result is held to
   the same bound, to show the bound is not loose enough to pass anything.
2. Training: 20 AdamW steps of `strata train --model gpt` (stage 0, fp32, clipping 1.0) from
   the engine's initial weights give the same per-step losses as torch.optim.AdamW with
   clip_grad_norm_ on the same batches, within 1e-3 relative.
3. The unit-scaled GPT (--unit-scaled): the same two checks against the unit-scaled model written
   in torch, where each gradient tensor must be torch's times one positive constant of its own
   (the unit-scaled backward's scales), and training (no clipping) uses torch parameter groups at
   each weight's learning-rate multiplier.
Usage: gpt_oracle_test.py STRATA_BIN ORACLE_DUMP_BIN DATA_FILE SCRATCH_DIR
"""
import json
import math
import os
import struct
import subprocess
import sys

import torch

L, NH, C, T, V, B, STEPS, SEED = 2, 2, 32, 16, 256, 4, 20, 7
SCORE_TEMPERATURE = 0.25  # UnitScales::kScoreTemperature


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32", (path, name, info["dtype"])
        b, e = info["data_offsets"]
        t = torch.frombuffer(bytearray(data[b:e]), dtype=torch.float32).reshape(info["shape"])
        out[name] = t
    return out


def gelu_second_moment():
    """E[gelu(x)^2], x ~ N(0,1), tanh GELU: Simpson's rule over [-12, 12] in float64."""
    x = torch.linspace(-12.0, 12.0, 24001, dtype=torch.float64)
    f = torch.nn.functional.gelu(x, approximate="tanh") ** 2 * torch.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
    w = torch.ones_like(x)
    w[1:-1:2], w[2:-1:2] = 4.0, 2.0
    return (f * w).sum().item() * (24.0 / 24000) / 3.0


# The unit-scaled model's fixed scales after attention (causal rows average 1 to T values) and GELU.
ATT_SCALE = math.sqrt(T / sum(1.0 / t for t in range(1, T + 1)))
GELU_SCALE = 1.0 / math.sqrt(gelu_second_moment())


def forward(p, tokens, targets, dtype, unit=False):
    """GPT-2 forward in torch: Conv1D weights [in, out], tanh GELU, tied head. unit: the unit-scaled
    model of models/gpt/unit_scale.h, written from its description (scaled products, scaled
    embedding, attention and GELU, attention scores at a quarter of GPT-2's scale, weighted
    residual adds, the head over sqrt(C))."""
    P = {k: v.to(dtype) for k, v in p.items()}
    Bn, Tn = tokens.shape
    one = lambda n: 1.0 / math.sqrt(n) if unit else 1.0  # noqa: E731
    att_scale = ATT_SCALE if unit else 1.0
    gelu_scale = GELU_SCALE if unit else 1.0

    def add(x, branch, j):  # residual add j
        return math.sqrt((j + 1) / (j + 2)) * x + math.sqrt(1 / (j + 2)) * branch if unit else x + branch

    x = (P["wte.weight"][tokens] + P["wpe.weight"][:Tn]) * one(2)
    for l in range(L):
        h = f"h.{l}."
        a = torch.nn.functional.layer_norm(x, (C,), P[h + "ln_1.weight"], P[h + "ln_1.bias"], 1e-5)
        qkv = (a @ P[h + "attn.c_attn.weight"]) * one(C) + P[h + "attn.c_attn.bias"]
        q, k, v = qkv.split(C, dim=2)
        q, k, v = (t.view(Bn, Tn, NH, C // NH).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (SCORE_TEMPERATURE if unit else 1.0) / math.sqrt(C // NH)
        mask = torch.tril(torch.ones(Tn, Tn, dtype=torch.bool))
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(Bn, Tn, C) * att_scale
        x = add(x, (y @ P[h + "attn.c_proj.weight"]) * one(C) + P[h + "attn.c_proj.bias"], 2 * l)
        m = torch.nn.functional.layer_norm(x, (C,), P[h + "ln_2.weight"], P[h + "ln_2.bias"], 1e-5)
        m = torch.nn.functional.gelu((m @ P[h + "mlp.c_fc.weight"]) * one(C) + P[h + "mlp.c_fc.bias"],
                                     approximate="tanh") * gelu_scale
        x = add(x, (m @ P[h + "mlp.c_proj.weight"]) * one(4 * C) + P[h + "mlp.c_proj.bias"], 2 * l + 1)
    x = torch.nn.functional.layer_norm(x, (C,), P["ln_f.weight"], P["ln_f.bias"], 1e-5)
    logits = (x @ P["wte.weight"].T) * one(C)
    return torch.nn.functional.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))


def grads_of(params, tokens, targets, dtype, unit=False):
    p = {k: v.clone().to(dtype).requires_grad_(True) for k, v in params.items()}
    loss = forward(p, tokens, targets, dtype, unit)
    loss.backward()
    return loss.item(), {k: v.grad for k, v in p.items()}


def train_flags(unit):
    return ["--model", "gpt", "--layers", str(L), "--heads", str(NH), "--d-model", str(C), "--seq-len", str(T),
            "--seed", str(SEED), "--device", "host"] + (["--unit-scaled"] if unit else [])


def check_gradients(strata, dump, data, scratch, unit=False):
    """Plain: Strata's gradients are torch's within the bound. Unit-scaled: each tensor's gradient
    is torch's true gradient of the unit-scaled forward times one positive constant of its own
    (least squares), within the same bound, which is all Adam needs (it ignores the constants)."""
    cfg = os.path.join(scratch, "fp32.json")
    weights = os.path.join(scratch, "w3.safetensors")
    # Weights after 3 steps of strata train (not just the initial ones), written by Strata.
    subprocess.run([strata, "train", *train_flags(unit), "--data", data, "--config", cfg, "--steps", "3",
                    "--save-params", weights], check=True, stdout=subprocess.DEVNULL)
    subprocess.run([dump, scratch, data, str(L), str(NH), str(C), str(T), str(V), str(B), str(STEPS), str(SEED),
                    weights] + (["--unit-scaled"] if unit else []), check=True, stdout=subprocess.DEVNULL)
    oracle = json.load(open(os.path.join(scratch, "oracle.json")))
    params = read_safetensors(weights)
    sg = read_safetensors(os.path.join(scratch, "grads.safetensors"))
    tokens = torch.tensor(oracle["batches"][0][0]).view(B, T)
    targets = torch.tensor(oracle["batches"][0][1]).view(B, T)
    ref_loss, ref = grads_of(params, tokens, targets, torch.float64, unit)
    _, t32 = grads_of(params, tokens, targets, torch.float32, unit)
    rel = abs(oracle["loss"] - ref_loss) / abs(ref_loss)
    what = "unit-scaled " if unit else ""
    print(f"{what}loss: strata {oracle['loss']:.8f} torch(f64) {ref_loss:.8f} relative error {rel:.2e} (bound 1e-5)")
    assert rel <= 1e-5, rel
    u = torch.finfo(torch.float32).eps / 2
    K = B * T + 4 * C + V
    bound = K * u / (1 - K * u) * (L + 2)
    worst, worst_t32, consts = 0.0, 0.0, []
    assert set(sg) == set(ref), (set(sg) ^ set(ref))
    for name, g in ref.items():
        got = sg[name].double()
        c = 1.0
        if unit:  # the tensor's constant
            c = (got * g).sum().item() / (g * g).sum().item()
            assert c > 0, f"{name}: the gradient points the wrong way (constant {c})"
            consts.append(c)
        scale = g.abs().max().item() or 1.0
        err = (got / c - g).abs().max().item() / scale
        err32 = (t32[name].double() - g).abs().max().item() / scale
        worst, worst_t32 = max(worst, err), max(worst_t32, err32)
        assert err <= bound, f"{name}: {what}gradient error {err:.3e} of its max |g| above the bound {bound:.3e}"
    extra = f", constants {min(consts):.3g} to {max(consts):.3g}" if unit else ""
    print(f"{what}gradients: {len(ref)} tensors, worst error {worst:.2e} of max|g| (torch fp32: {worst_t32:.2e}); "
          f"bound {bound:.2e} (K={K}, L={L}){extra}")


def lr_scale(name, unit):
    """The engine's per-parameter learning-rate multiplier: 1 / the fixed scale the weight computes
    with: the product's forward scale, times attention's output scale for the attention projection
    and GELU's for the MLP's down projection; the tied wte the head's, 1 / sqrt(C), and wpe the same."""
    if not unit:
        return 1.0
    if name in ("wte.weight", "wpe.weight"):
        return math.sqrt(C)
    fan_in = {"attn.c_attn.weight": math.sqrt(C), "attn.c_proj.weight": math.sqrt(C) / ATT_SCALE,
              "mlp.c_fc.weight": math.sqrt(C), "mlp.c_proj.weight": math.sqrt(4 * C) / GELU_SCALE}
    for suffix, s in fan_in.items():
        if name.endswith(suffix):
            return s
    return 1.0


def check_training(strata, dump, data, scratch, unit=False):
    """20 AdamW steps of strata train against torch.optim.AdamW on the same batches. Unit-scaled:
    no clipping, and torch steps each weight at lr x its lr_scale with decay at the base rate."""
    cfg = os.path.join(scratch, "fp32.json")
    log = os.path.join(scratch, "train.jsonl")
    subprocess.run([strata, "train", *train_flags(unit), "--data", data, "--config", cfg, "--steps", str(STEPS),
                    "--log-json", log], check=True, stdout=subprocess.DEVNULL)
    strata_losses = [json.loads(line)["loss"] for line in open(log)]
    oracle = json.load(open(os.path.join(scratch, "oracle.json")))
    params = {k: v.clone().requires_grad_(True) for k, v in read_safetensors(os.path.join(scratch, "init.safetensors")).items()}
    lr, wd = 3e-3, 0.01
    groups = [{"params": [p], "lr": lr * lr_scale(n, unit), "weight_decay": wd / lr_scale(n, unit)}
              for n, p in params.items()]
    opt = torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=wd)
    worst = 0.0
    for s in range(STEPS):
        tokens = torch.tensor(oracle["batches"][s][0]).view(B, T)
        targets = torch.tensor(oracle["batches"][s][1]).view(B, T)
        opt.zero_grad()
        loss = forward(params, tokens, targets, torch.float32, unit)
        loss.backward()
        if not unit:
            torch.nn.utils.clip_grad_norm_(params.values(), 1.0)
        opt.step()
        rel = abs(strata_losses[s] - loss.item()) / loss.item()
        worst = max(worst, rel)
        assert rel <= 1e-3, f"step {s + 1}: strata {strata_losses[s]} torch {loss.item()} relative {rel:.2e}"
    what = "unit-scaled " if unit else ""
    print(f"{what}training: {STEPS} AdamW steps, losses {strata_losses[0]:.4f} -> {strata_losses[-1]:.4f}, "
          f"worst relative difference from torch {worst:.2e} (bound 1e-3)")


def write_config(scratch, clipping):
    os.makedirs(scratch, exist_ok=True)
    with open(os.path.join(scratch, "fp32.json"), "w") as f:
        json.dump({"train_micro_batch_size_per_gpu": B, "gradient_accumulation_steps": 1, "gradient_clipping": clipping,
                   "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.95], "eps": 1e-8,
                                                             "weight_decay": 0.01}},
                   "zero_optimization": {"stage": 0}}, f)


def main():
    strata, dump, data, scratch = sys.argv[1:5]
    torch.set_num_threads(1)
    write_config(scratch, 1.0)
    check_gradients(strata, dump, data, scratch)
    check_training(strata, dump, data, scratch)
    unit = os.path.join(scratch, "unit")
    write_config(unit, 0.0)
    check_gradients(strata, dump, data, unit, unit=True)
    check_training(strata, dump, data, unit, unit=True)
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
