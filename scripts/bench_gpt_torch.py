"""PyTorch's training of the GPT that `strata train --model gpt` trains (same shape, batch,
sequence length, fp32, AdamW, same thread count) on the CPU or, with DEVICE cuda, on the GPU
(eager PyTorch, fp32 without TF32), for the side-by-side in bench_gpt_vs_torch.sh; with
PRECISION bf16 the products run under bf16 autocast. Prints the median tokens/s over the
timed steps.
Usage: bench_gpt_torch.py LAYERS HEADS D_MODEL SEQ VOCAB MICRO STEPS THREADS [DEVICE [PRECISION]]"""
import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F


class Block(torch.nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.NH = NH
        self.ln_1, self.ln_2 = torch.nn.LayerNorm(C), torch.nn.LayerNorm(C)
        self.c_attn, self.c_proj = torch.nn.Linear(C, 3 * C), torch.nn.Linear(C, C)
        self.c_fc, self.c_fc_proj = torch.nn.Linear(C, 4 * C), torch.nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.NH, C // self.NH).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // self.NH)
        causal = torch.tril(torch.ones(T, T, dtype=torch.bool, device=x.device))
        att = att.masked_fill(~causal, float("-inf")).softmax(-1)
        x = x + self.c_proj((att @ v).transpose(1, 2).reshape(B, T, C))
        return x + self.c_fc_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(torch.nn.Module):
    def __init__(self, L, NH, C, T, V):
        super().__init__()
        self.wte, self.wpe = torch.nn.Embedding(V, C), torch.nn.Embedding(T, C)
        self.h = torch.nn.ModuleList(Block(C, NH) for _ in range(L))
        self.ln_f = torch.nn.LayerNorm(C)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for b in self.h:
            x = b(x)
        logits = self.ln_f(x) @ self.wte.weight.T
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def main():
    L, NH, C, T, V, B, steps, threads = (int(a) for a in sys.argv[1:9])
    device = sys.argv[9] if len(sys.argv) > 9 else "cpu"
    bf16 = len(sys.argv) > 10 and sys.argv[10] == "bf16"
    torch.set_num_threads(threads)
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 products, as Strata's
    torch.manual_seed(0)
    model = GPT(L, NH, C, T, V).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    rates = []
    for s in range(steps + 2):
        idx = torch.randint(0, V, (B, T), device=device)
        sync(device)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=bf16):
            loss = model(idx, torch.roll(idx, -1, 1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sync(device)
        if s >= 2:  # two warm-up steps
            rates.append(B * T / (time.perf_counter() - t0))
    print(f"torch_tokens_per_s {statistics.median(rates):.1f}")


if __name__ == "__main__":
    main()
