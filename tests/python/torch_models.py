"""The torch models the strata.torch tests train (an MLP; a small GPT-2 with its head tied to
the token embedding), the config they train with and the tolerance measure they are held to
against torch."""
import math

from harness import torch


class Mlp(torch.nn.Module):
    def __init__(self, width=24, depth=3):
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(width, width) for _ in range(depth)])

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


class Block(torch.nn.Module):
    def __init__(self, c, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(c), torch.nn.LayerNorm(c)
        self.qkv, self.proj = torch.nn.Linear(c, 3 * c), torch.nn.Linear(c, c)
        self.fc, self.out = torch.nn.Linear(c, 4 * c), torch.nn.Linear(4 * c, c)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(c // self.heads)
        att = att.masked_fill(torch.triu(torch.ones(t, t, dtype=torch.bool), 1), float("-inf")).softmax(-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, c))
        return x + self.out(torch.nn.functional.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class Gpt(torch.nn.Module):
    """GPT-2's shape, its LM head tied to the token embedding as Hugging Face's GPT-2 ties it."""

    def __init__(self, vocab=64, c=32, heads=2, layers=2, positions=16):
        super().__init__()
        self.wte, self.wpe = torch.nn.Embedding(vocab, c), torch.nn.Embedding(positions, c)
        self.h = torch.nn.ModuleList([Block(c, heads) for _ in range(layers)])
        self.ln_f, self.head = torch.nn.LayerNorm(c), torch.nn.Linear(c, vocab, bias=False)
        self.head.weight = self.wte.weight

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.h:
            x = block(x)
        return self.head(self.ln_f(x))


def worst_relative(a, b):
    """Worst difference relative to each tensor's largest value. The key third of an
    attention's qkv.bias has an exactly zero gradient (softmax ignores a shift shared by a
    row's logits), so its gradient is rounding noise near Adam's eps and each element moves
    up to lr per step in either direction: it is held to that bound instead."""
    worst = 0.0
    for n in b:
        x, y = a[n].copy(), b[n].copy()
        if n.endswith("qkv.bias"):
            c = y.size // 3
            assert abs(x[c:2 * c] - y[c:2 * c]).max() <= 2 * 3e-3 * 8 * 1.01, n
            x[c:2 * c] = y[c:2 * c] = 0
        worst = max(worst, float(abs(x - y).max() / max(1e-12, abs(y).max())))
    return worst


def config(stage=0, opt="none", params="none", bf16=False, accum=2, nvme=None):
    """AdamW (lr 3e-3, weight decay 0.01) without clipping, micro-batches of 4, at a ZeRO stage with
    the optimizer state and parameters on "none" (the device), "cpu" or "nvme"."""
    return {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": accum, "gradient_clipping": 0,
            "bf16": {"enabled": bf16},
            "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.01, "eps": 1e-8}},
            "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0,
                                  "offload_optimizer": {"device": opt, "nvme_path": nvme},
                                  "offload_param": {"device": params, "nvme_path": nvme, "buffer_count": 4,
                                                    "buffer_size": 4096}}}
