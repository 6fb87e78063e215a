"""PyTorch as the oracle for the Llama family (models/llama): each model written here in torch,
independently, with Hugging Face's parameter names and rotary layout (rotate_half), loaded from a
Hugging Face directory this test writes (config.json and an fp32 model.safetensors of random
weights), on the batches Strata's sampler draws.

Three tiny models cover the family's variants: a Llama (grouped-query attention with 2 kv heads,
untied head, llama3 rope scaling with all three frequency bands), a Qwen2 (q/k/v biases, one kv
head, tied head) and a Qwen3 (per-head q/k RMSNorm, head_dim 16 != hidden/heads 12).

1. Loss and gradients of one micro-batch: Strata's fp32 host pass (llama_oracle_dump) against
   torch in float64. The loss must agree within 1e-5 relative; each gradient element within
   gamma_K * (L + 2) * max|g| of its tensor, gamma_K = K u / (1 - K u) the bound of a length-K
   fp32 sum (u = fp32 epsilon / 2), K = N + Q + I + V the longest chain of sums feeding it (the
   tokens, the attention width, the MLP's inner width and the vocabulary), once per layer the
   gradient flows through. Torch's own fp32 result is held to the same bound. The pass with
   re-materialization (always) must give the same bits.
2. Training: 20 AdamW steps of `strata train --model DIR` (stage 0, fp32, clipping 1.0) give
   torch.optim.AdamW's per-step losses with clip_grad_norm_ on the same batches, within 1e-3
   relative.
Usage: llama_oracle_test.py STRATA_BIN ORACLE_DUMP_BIN SCRATCH_DIR
"""
import json
import math
import os
import struct
import subprocess
import sys

import torch

from gpt_oracle_test import read_safetensors  # the same reader (F32 tensors by name)

T, B, STEPS, SEED, V = 16, 4, 20, 11, 300

MODELS = {
    "llama": {"model_type": "llama", "hidden_size": 48, "intermediate_size": 80, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
              "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0, "original_max_position_embeddings": 32},
              "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False, "hidden_act": "silu"},
    "qwen2": {"model_type": "qwen2", "hidden_size": 48, "intermediate_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 1, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
              "tie_word_embeddings": True, "use_sliding_window": False, "sliding_window": 4096,
              "max_window_layers": 2, "hidden_act": "silu"},
    "qwen3": {"model_type": "qwen3", "hidden_size": 48, "intermediate_size": 96, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-6,
              "rope_theta": 1000000.0, "tie_word_embeddings": False, "attention_bias": False, "hidden_act": "silu"},
}


def full_config(c):
    out = {"architectures": ["X"], "vocab_size": V, "max_position_embeddings": 64, "initializer_range": 0.02,
           "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": 2}
    out.update(c)
    return out


def dims(c):
    C, H = c["hidden_size"], c["num_attention_heads"]
    D = c.get("head_dim", C // H)
    return C, H, c.get("num_key_value_heads", H), D, c["intermediate_size"], c["num_hidden_layers"]


def has_qkv_bias(c):
    return c["model_type"] == "qwen2" or c.get("attention_bias", False)


def random_weights(c, gen):
    """Hugging Face's tensors of the model, random (norm weights near 1, biases non-zero)."""
    C, H, KV, D, I, L = dims(c)
    w = {"model.embed_tokens.weight": torch.randn(V, C, generator=gen) * 0.5}
    for l in range(L):
        p = f"model.layers.{l}."
        w[p + "input_layernorm.weight"] = 1 + 0.1 * torch.randn(C, generator=gen)
        for n, rows in (("q", H * D), ("k", KV * D), ("v", KV * D)):
            w[p + f"self_attn.{n}_proj.weight"] = torch.randn(rows, C, generator=gen) / math.sqrt(C)
            if has_qkv_bias(c):
                w[p + f"self_attn.{n}_proj.bias"] = 0.1 * torch.randn(rows, generator=gen)
        w[p + "self_attn.o_proj.weight"] = torch.randn(C, H * D, generator=gen) / math.sqrt(H * D)
        if c["model_type"] != "qwen2" and c.get("attention_bias", False):
            w[p + "self_attn.o_proj.bias"] = 0.1 * torch.randn(C, generator=gen)
        if c["model_type"] == "qwen3":
            w[p + "self_attn.q_norm.weight"] = 1 + 0.1 * torch.randn(D, generator=gen)
            w[p + "self_attn.k_norm.weight"] = 1 + 0.1 * torch.randn(D, generator=gen)
        w[p + "post_attention_layernorm.weight"] = 1 + 0.1 * torch.randn(C, generator=gen)
        w[p + "mlp.gate_proj.weight"] = torch.randn(I, C, generator=gen) / math.sqrt(C)
        w[p + "mlp.up_proj.weight"] = torch.randn(I, C, generator=gen) / math.sqrt(C)
        w[p + "mlp.down_proj.weight"] = torch.randn(C, I, generator=gen) / math.sqrt(I)
    w["model.norm.weight"] = 1 + 0.1 * torch.randn(C, generator=gen)
    if not c["tie_word_embeddings"]:
        w["lm_head.weight"] = torch.randn(V, C, generator=gen) / math.sqrt(C)
    return w


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        data = t.to(torch.float32).contiguous().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def inv_freq(c):
    """Hugging Face's rotary inverse frequencies (default, linear, llama3), in float64."""
    _, _, _, D, _, _ = dims(c)
    f = 1.0 / (c["rope_theta"] ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    r = c.get("rope_scaling")
    if r and r.get("rope_type", r.get("type")) == "linear":
        f = f / r["factor"]
    elif r and r.get("rope_type", r.get("type")) == "llama3":
        old, lo, hi, factor = r["original_max_position_embeddings"], r["low_freq_factor"], r["high_freq_factor"], r["factor"]
        wavelen = 2 * math.pi / f
        scaled = torch.where(wavelen > old / lo, f / factor, f)
        smooth = (old / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old / hi) & ~(wavelen > old / lo)
        f = torch.where(medium, smoothed, scaled)
    return f


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def rms_norm(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def forward(c, p, tokens, targets, dtype):
    C, H, KV, D, I, L = dims(c)
    eps = c["rms_norm_eps"]
    g = {k: v.to(dtype) for k, v in p.items()}
    Bn, Tn = tokens.shape
    angles = torch.arange(Tn, dtype=torch.float64)[:, None] * inv_freq(c)[None, :]
    emb = torch.cat((angles, angles), dim=-1)
    cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
    x = g["model.embed_tokens.weight"][tokens]
    mask = torch.ones(Tn, Tn, dtype=torch.bool).tril()
    for l in range(L):
        pre = f"model.layers.{l}."

        def lin(name, inp):
            y = inp @ g[pre + name + ".weight"].T
            b = g.get(pre + name + ".bias")
            return y if b is None else y + b

        h = rms_norm(x, g[pre + "input_layernorm.weight"], eps)
        q = lin("self_attn.q_proj", h).view(Bn, Tn, H, D).transpose(1, 2)
        k = lin("self_attn.k_proj", h).view(Bn, Tn, KV, D).transpose(1, 2)
        v = lin("self_attn.v_proj", h).view(Bn, Tn, KV, D).transpose(1, 2)
        if c["model_type"] == "qwen3":
            q = rms_norm(q, g[pre + "self_attn.q_norm.weight"], eps)
            k = rms_norm(k, g[pre + "self_attn.k_norm.weight"], eps)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(H // KV, dim=1)
        v = v.repeat_interleave(H // KV, dim=1)
        s = (q @ k.transpose(-1, -2)) / math.sqrt(D)
        s = s.masked_fill(~mask, float("-inf"))
        y = (s.softmax(-1) @ v).transpose(1, 2).reshape(Bn, Tn, H * D)
        x = x + lin("self_attn.o_proj", y)
        h = rms_norm(x, g[pre + "post_attention_layernorm.weight"], eps)
        gate, up = lin("mlp.gate_proj", h), lin("mlp.up_proj", h)
        x = x + lin("mlp.down_proj", torch.nn.functional.silu(gate) * up)
    x = rms_norm(x, g["model.norm.weight"], eps)
    head = g["model.embed_tokens.weight"] if c["tie_word_embeddings"] else g["lm_head.weight"]
    logits = x @ head.T
    return torch.nn.functional.cross_entropy(logits.view(-1, V), targets.reshape(-1))


def grads_of(c, params, tokens, targets, dtype):
    p = {k: v.clone().to(dtype).requires_grad_(True) for k, v in params.items()}
    loss = forward(c, p, tokens, targets, dtype)
    loss.backward()
    return loss.item(), {k: v.grad.double() for k, v in p.items()}


def check_gradients(name, c, model_dir, dump, data, scratch):
    out = os.path.join(scratch, "never")
    os.makedirs(out, exist_ok=True)
    subprocess.run([dump, model_dir, data, str(T), str(B), str(STEPS), str(SEED), out], check=True,
                   stdout=subprocess.DEVNULL)
    oracle = json.load(open(os.path.join(out, "oracle.json")))
    params = read_safetensors(os.path.join(model_dir, "model.safetensors"))
    sg = read_safetensors(os.path.join(out, "grads.safetensors"))
    tokens = torch.tensor(oracle["batches"][0][0]).view(B, T)
    targets = torch.tensor(oracle["batches"][0][1]).view(B, T)
    ref_loss, ref = grads_of(c, params, tokens, targets, torch.float64)
    _, t32 = grads_of(c, params, tokens, targets, torch.float32)
    rel = abs(oracle["loss"] - ref_loss) / abs(ref_loss)
    print(f"{name}: loss strata {oracle['loss']:.8f} torch(f64) {ref_loss:.8f} relative error {rel:.2e} (bound 1e-5)")
    assert rel <= 1e-5, rel
    C, H, KV, D, I, L = dims(c)
    u = torch.finfo(torch.float32).eps / 2
    K = B * T + H * D + I + V
    bound = K * u / (1 - K * u) * (L + 2)
    assert set(sg) == set(ref), set(sg) ^ set(ref)
    worst, worst32 = 0.0, 0.0
    for n, g in ref.items():
        scale = g.abs().max().item() or 1.0
        err = (sg[n].double() - g).abs().max().item() / scale
        worst, worst32 = max(worst, err), max(worst32, (t32[n] - g).abs().max().item() / scale)
        assert err <= bound, f"{name} {n}: gradient error {err:.3e} of its max |g| above the bound {bound:.3e}"
    print(f"{name}: gradients of {len(ref)} tensors, worst error {worst:.2e} of max|g| (torch fp32: {worst32:.2e}); "
          f"bound {bound:.2e} (K={K}, L={L})")
    remat = os.path.join(scratch, "always")
    os.makedirs(remat, exist_ok=True)
    subprocess.run([dump, model_dir, data, str(T), str(B), "1", str(SEED), remat, "always"], check=True,
                   stdout=subprocess.DEVNULL)
    rg = read_safetensors(os.path.join(remat, "grads.safetensors"))
    assert all(torch.equal(rg[n], sg[n]) for n in sg), f"{name}: re-materialized gradients differ"
    return oracle


def check_training(name, c, model_dir, strata, oracle, data, scratch):
    cfg = os.path.join(scratch, "fp32.json")
    with open(cfg, "w") as f:
        json.dump({"train_micro_batch_size_per_gpu": B, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
                   "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.95], "eps": 1e-8,
                                                             "weight_decay": 0.01}},
                   "zero_optimization": {"stage": 0}}, f)
    log = os.path.join(scratch, "train.jsonl")
    subprocess.run([strata, "train", "--model", model_dir, "--data", data, "--config", cfg, "--steps", str(STEPS),
                    "--seq-len", str(T), "--seed", str(SEED), "--device", "host", "--log-json", log], check=True,
                   stdout=subprocess.DEVNULL)
    losses = [json.loads(line)["loss"] for line in open(log)]
    params = {k: v.clone().requires_grad_(True)
              for k, v in read_safetensors(os.path.join(model_dir, "model.safetensors")).items()}
    opt = torch.optim.AdamW(params.values(), lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01)
    worst = 0.0
    for s in range(STEPS):
        tokens = torch.tensor(oracle["batches"][s][0]).view(B, T)
        targets = torch.tensor(oracle["batches"][s][1]).view(B, T)
        opt.zero_grad()
        loss = forward(c, params, tokens, targets, torch.float32)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params.values(), 1.0)
        opt.step()
        rel = abs(losses[s] - loss.item()) / loss.item()
        worst = max(worst, rel)
        assert rel <= 1e-3, f"{name} step {s + 1}: strata {losses[s]} torch {loss.item()} relative {rel:.2e}"
    print(f"{name}: {STEPS} AdamW steps, losses {losses[0]:.4f} -> {losses[-1]:.4f}, worst relative difference "
          f"from torch {worst:.2e} (bound 1e-3)")


def write_data(path):
    """Tokens of a noisy counting sequence over the whole vocabulary (llm.c's uint16 format)."""
    gen = torch.Generator().manual_seed(5)
    n = 6000
    steps = torch.randint(1, 4, (n,), generator=gen)
    toks = (torch.cumsum(steps, 0) % V).tolist()
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
        f.write(struct.pack(f"<{n}H", *toks))


def main():
    strata, dump, scratch = sys.argv[1:4]
    torch.set_num_threads(1)
    os.makedirs(scratch, exist_ok=True)
    data = os.path.join(scratch, "tokens.bin")
    write_data(data)
    gen = torch.Generator().manual_seed(1234)
    for name, c in MODELS.items():
        model_dir = os.path.join(scratch, name)
        os.makedirs(model_dir, exist_ok=True)
        with open(os.path.join(model_dir, "config.json"), "w") as f:
            json.dump(full_config(c), f, indent=2)
        write_safetensors(os.path.join(model_dir, "model.safetensors"), random_weights(c, gen))
        work = os.path.join(scratch, name + ".work")
        os.makedirs(work, exist_ok=True)
        oracle = check_gradients(name, full_config(c), model_dir, dump, data, work)
        check_training(name, full_config(c), model_dir, strata, oracle, data, work)
    print(f"{len(MODELS)} models passed, 0 failed")


if __name__ == "__main__":
    main()
