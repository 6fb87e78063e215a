"""A Llama written in plain torch with Hugging Face's class and parameter names
(LlamaForCausalLM: model.embed_tokens, model.layers.N.self_attn.{q,k,v,o}_proj,
mlp.{gate,up,down}_proj, input_layernorm, post_attention_layernorm, model.norm, lm_head;
grouped-query attention, rotary embeddings, RMSNorm, SwiGLU), and LoRA adapters added the
way PEFT adds them (each target Linear wrapped with its base_layer frozen, lora_A Kaiming-
uniform, lora_B zero, scaled by alpha / r; every other parameter frozen)."""
import math

from harness import torch


class LlamaRMSNorm(torch.nn.Module):
    def __init__(self, c, eps=1e-5):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(c))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class LlamaAttention(torch.nn.Module):
    def __init__(self, c, heads, kv_heads, positions, theta=10000.0):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, c // heads
        self.q_proj = torch.nn.Linear(c, heads * self.hd, bias=False)
        self.k_proj = torch.nn.Linear(c, kv_heads * self.hd, bias=False)
        self.v_proj = torch.nn.Linear(c, kv_heads * self.hd, bias=False)
        self.o_proj = torch.nn.Linear(heads * self.hd, c, bias=False)
        inv = 1.0 / theta ** (torch.arange(0, self.hd, 2).float() / self.hd)
        freqs = torch.outer(torch.arange(positions).float(), inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, x):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.hd).transpose(1, 2)
        cos, sin = self.cos[:t], self.sin[:t]
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        group = self.heads // self.kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(self.hd)
        att = att.masked_fill(torch.triu(torch.ones(t, t, dtype=torch.bool), 1), float("-inf")).softmax(-1)
        return self.o_proj((att @ v).transpose(1, 2).reshape(b, t, self.heads * self.hd))


class LlamaMLP(torch.nn.Module):
    def __init__(self, c, hidden):
        super().__init__()
        self.gate_proj = torch.nn.Linear(c, hidden, bias=False)
        self.up_proj = torch.nn.Linear(c, hidden, bias=False)
        self.down_proj = torch.nn.Linear(hidden, c, bias=False)

    def forward(self, x):
        return self.down_proj(torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(torch.nn.Module):
    def __init__(self, c, heads, kv_heads, hidden, positions):
        super().__init__()
        self.self_attn = LlamaAttention(c, heads, kv_heads, positions)
        self.mlp = LlamaMLP(c, hidden)
        self.input_layernorm, self.post_attention_layernorm = LlamaRMSNorm(c), LlamaRMSNorm(c)

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(torch.nn.Module):
    def __init__(self, vocab, c, heads, kv_heads, hidden, layers, positions):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(vocab, c)
        self.layers = torch.nn.ModuleList(
            [LlamaDecoderLayer(c, heads, kv_heads, hidden, positions) for _ in range(layers)])
        self.norm = LlamaRMSNorm(c)

    def forward(self, idx):
        x = self.embed_tokens(idx)
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


class LlamaForCausalLM(torch.nn.Module):
    def __init__(self, vocab=256, c=32, heads=4, kv_heads=2, hidden=64, layers=2, positions=16):
        super().__init__()
        self.model = LlamaModel(vocab, c, heads, kv_heads, hidden, layers, positions)
        self.lm_head = torch.nn.Linear(c, vocab, bias=False)

    def forward(self, idx):
        return self.lm_head(self.model(idx))


class LoraLinear(torch.nn.Module):
    """PEFT's LoRA layer: base_layer(x) + lora_B(lora_A(x)) * alpha / r."""

    def __init__(self, base, r=4, alpha=8):
        super().__init__()
        self.base_layer = base
        self.lora_A = torch.nn.Linear(base.in_features, r, bias=False)
        self.lora_B = torch.nn.Linear(r, base.out_features, bias=False)
        torch.nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))
        torch.nn.init.zeros_(self.lora_B.weight)
        self.scaling = alpha / r

    def forward(self, x):
        return self.base_layer(x) + self.lora_B(self.lora_A(x)) * self.scaling


def add_lora(model, targets=("q_proj", "v_proj"), r=4, alpha=8):
    """Wraps every Linear named in `targets` and freezes every parameter but the adapters'."""
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if name in targets and isinstance(child, torch.nn.Linear):
                setattr(module, name, LoraLinear(child, r, alpha))
    for name, p in model.named_parameters():
        p.requires_grad_(".lora_" in name)
    return model
