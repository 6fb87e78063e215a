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


def forward(p, tokens, targets, dtype):
    """GPT-2 forward in torch: Conv1D weights [in, out], tanh GELU, tied head."""
    P = {k: v.to(dtype) for k, v in p.items()}
    Bn, Tn = tokens.shape
    x = P["wte.weight"][tokens] + P["wpe.weight"][:Tn]
    for l in range(L):
        h = f"h.{l}."
        a = torch.nn.functional.layer_norm(x, (C,), P[h + "ln_1.weight"], P[h + "ln_1.bias"], 1e-5)
        qkv = a @ P[h + "attn.c_attn.weight"] + P[h + "attn.c_attn.bias"]
        q, k, v = qkv.split(C, dim=2)
        q, k, v = (t.view(Bn, Tn, NH, C // NH).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // NH)
        mask = torch.tril(torch.ones(Tn, Tn, dtype=torch.bool))
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(Bn, Tn, C)
        x = x + y @ P[h + "attn.c_proj.weight"] + P[h + "attn.c_proj.bias"]
        m = torch.nn.functional.layer_norm(x, (C,), P[h + "ln_2.weight"], P[h + "ln_2.bias"], 1e-5)
        m = torch.nn.functional.gelu(m @ P[h + "mlp.c_fc.weight"] + P[h + "mlp.c_fc.bias"], approximate="tanh")
        x = x + m @ P[h + "mlp.c_proj.weight"] + P[h + "mlp.c_proj.bias"]
    x = torch.nn.functional.layer_norm(x, (C,), P["ln_f.weight"], P["ln_f.bias"], 1e-5)
    logits = x @ P["wte.weight"].T
    return torch.nn.functional.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))


def grads_of(params, tokens, targets, dtype):
    p = {k: v.clone().to(dtype).requires_grad_(True) for k, v in params.items()}
    loss = forward(p, tokens, targets, dtype)
    loss.backward()
    return loss.item(), {k: v.grad for k, v in p.items()}


def check_gradients(strata, dump, data, scratch):
    # Weights after 3 steps of strata train (not just the initial ones), written by Strata.
    cfg = os.path.join(scratch, "fp32.json")
    weights = os.path.join(scratch, "w3.safetensors")
    subprocess.run([strata, "train", "--model", "gpt", "--data", data, "--layers", str(L), "--heads", str(NH),
                    "--d-model", str(C), "--seq-len", str(T), "--config", cfg, "--steps", "3", "--seed", str(SEED),
                    "--device", "host", "--save-params", weights], check=True, stdout=subprocess.DEVNULL)
    subprocess.run([dump, scratch, data, str(L), str(NH), str(C), str(T), str(V), str(B), str(STEPS), str(SEED), weights],
                   check=True, stdout=subprocess.DEVNULL)
    oracle = json.load(open(os.path.join(scratch, "oracle.json")))
    params = read_safetensors(weights)
    sg = read_safetensors(os.path.join(scratch, "grads.safetensors"))
    tokens = torch.tensor(oracle["batches"][0][0]).view(B, T)
    targets = torch.tensor(oracle["batches"][0][1]).view(B, T)
    ref_loss, ref = grads_of(params, tokens, targets, torch.float64)
    _, t32 = grads_of(params, tokens, targets, torch.float32)
    rel = abs(oracle["loss"] - ref_loss) / abs(ref_loss)
    print(f"loss: strata {oracle['loss']:.8f} torch(f64) {ref_loss:.8f} relative error {rel:.2e} (bound 1e-5)")
    assert rel <= 1e-5, rel
    u = torch.finfo(torch.float32).eps / 2
    K = B * T + 4 * C + V
    bound = K * u / (1 - K * u) * (L + 2)
    worst, worst_t32 = 0.0, 0.0
    assert set(sg) == set(ref), (set(sg) ^ set(ref))
    for name, g in ref.items():
        scale = g.abs().max().item() or 1.0
        err = (sg[name].double() - g).abs().max().item() / scale
        err32 = (t32[name].double() - g).abs().max().item() / scale
        worst, worst_t32 = max(worst, err), max(worst_t32, err32)
        assert err <= bound, f"{name}: gradient error {err:.3e} of its max |g| above the bound {bound:.3e}"
    print(f"gradients: {len(ref)} tensors, worst error {worst:.2e} of max|g| (torch fp32: {worst_t32:.2e}); "
          f"bound {bound:.2e} (K={K}, L={L})")


def check_training(strata, data, scratch):
    cfg = os.path.join(scratch, "fp32.json")
    log = os.path.join(scratch, "train.jsonl")
    subprocess.run([strata, "train", "--model", "gpt", "--data", data, "--layers", str(L), "--heads", str(NH),
                    "--d-model", str(C), "--seq-len", str(T), "--config", cfg, "--steps", str(STEPS), "--seed",
                    str(SEED), "--device", "host", "--log-json", log], check=True, stdout=subprocess.DEVNULL)
    strata_losses = [json.loads(line)["loss"] for line in open(log)]
    oracle = json.load(open(os.path.join(scratch, "oracle.json")))
    params = {k: v.clone().requires_grad_(True) for k, v in read_safetensors(os.path.join(scratch, "init.safetensors")).items()}
    opt = torch.optim.AdamW(params.values(), lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01)
    worst = 0.0
    for s in range(STEPS):
        tokens = torch.tensor(oracle["batches"][s][0]).view(B, T)
        targets = torch.tensor(oracle["batches"][s][1]).view(B, T)
        opt.zero_grad()
        loss = forward(params, tokens, targets, torch.float32)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params.values(), 1.0)
        opt.step()
        rel = abs(strata_losses[s] - loss.item()) / loss.item()
        worst = max(worst, rel)
        assert rel <= 1e-3, f"step {s + 1}: strata {strata_losses[s]} torch {loss.item()} relative {rel:.2e}"
    print(f"training: {STEPS} AdamW steps, losses {strata_losses[0]:.4f} -> {strata_losses[-1]:.4f}, "
          f"worst relative difference from torch {worst:.2e} (bound 1e-3)")


def main():
    strata, dump, data, scratch = sys.argv[1:5]
    os.makedirs(scratch, exist_ok=True)
    with open(os.path.join(scratch, "fp32.json"), "w") as f:
        json.dump({"train_micro_batch_size_per_gpu": B, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
                   "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.95], "eps": 1e-8,
                                                             "weight_decay": 0.01}},
                   "zero_optimization": {"stage": 0}}, f)
    torch.set_num_threads(1)
    check_gradients(strata, dump, data, scratch)
    check_training(strata, data, scratch)
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
