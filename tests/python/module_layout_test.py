"""strata.torch with the module layouts people bring (issue 55, item 2): a Hugging Face-shaped
causal LM (the decoder layers nested two levels down in `model.layers`, a final norm, an LM
head, a 0-d parameter on the model itself, a buffer, a dict output as ModelOutput is), with
and without its head tied to the embedding, and a ModuleList of ModuleLists. The blocks are
found through the nesting, the parameters of no block train as the engine's last layer, and
each layout trains to torch's own AdamW within fp32 tolerance; in bf16 ZeRO stages 0-3 with
state on the device, in host RAM and on NVMe give the bits of stage 0. Exits 77 without torch."""
import json
import os
import tempfile
import types

from harness import check, finish, torch  # exits 77 without torch

import strata.torch as st
from torch_models import config, worst_relative


class Decoder(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.norm = torch.nn.LayerNorm(c)
        self.up, self.down = torch.nn.Linear(c, 2 * c), torch.nn.Linear(2 * c, c, bias=False)

    def forward(self, x, gate):
        return x + self.down(torch.nn.functional.silu(self.up(self.norm(x))) * gate.to(x.dtype))


class Inner(torch.nn.Module):  # Hugging Face's LlamaModel: embedding, layers, final norm
    def __init__(self, vocab, c, depth):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(vocab, c)
        self.layers = torch.nn.ModuleList([Decoder(c) for _ in range(depth)])
        self.norm = torch.nn.LayerNorm(c)
        self.register_buffer("gate", torch.linspace(0.5, 1.5, 2 * c))  # a buffer the blocks read

    def forward(self, idx):
        x = self.embed_tokens(idx)
        for layer in self.layers:
            x = layer(x, self.gate)
        return self.norm(x)


class CausalLm(torch.nn.Module):  # Hugging Face's LlamaForCausalLM: `model` and `lm_head`
    def __init__(self, vocab=48, c=16, depth=3, tied=False):
        super().__init__()
        self.model = Inner(vocab, c, depth)
        self.lm_head = torch.nn.Linear(c, vocab, bias=False)
        if tied:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.logit_scale = torch.nn.Parameter(torch.tensor(0.9))  # a 0-d parameter of the model itself

    def forward(self, idx):
        logits = self.lm_head(self.model(idx)) * self.logit_scale
        return {"logits": logits, "hidden_norm": logits.detach().norm()}


class Grid(torch.nn.Module):  # a ModuleList of ModuleLists
    def __init__(self, c=12):
        super().__init__()
        self.rows = torch.nn.ModuleList([torch.nn.ModuleList([torch.nn.Linear(c, c) for _ in range(2)])
                                         for _ in range(2)])
        self.bias = torch.nn.Parameter(torch.zeros(c))

    def forward(self, x):
        for row in self.rows:
            for cell in row:
                x = torch.tanh(cell(x))
        return x + self.bias


def make(kind):
    torch.manual_seed(0)
    return {"lm": lambda: CausalLm(), "lm_tied": lambda: CausalLm(tied=True), "grid": Grid}[kind]()


def data(kind, count):
    g = torch.Generator().manual_seed(5)
    if kind == "grid":
        return [(torch.randn(4, 12, generator=g), torch.randn(4, 12, generator=g)) for _ in range(count)]
    return [(idx[:, :-1], idx[:, 1:]) for idx in (torch.randint(0, 48, (4, 9), generator=g) for _ in range(count))]


def loss_of(kind, run, x, y):
    if kind == "grid":
        return ((run(x) - y) ** 2).mean()
    logits = run(x)["logits"]
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1))


def train_strata(kind, cfg, steps):
    model = make(kind)
    engine = st.initialize(model, cfg)
    batches = data(kind, 2 * steps)
    for s in range(steps):
        for k in range(2):
            engine.backward(loss_of(kind, engine, *batches[2 * s + k]))
        engine.step()
    state = engine.module_state_dict()
    params = engine.parameters_numpy()
    engine.close()
    return params, state, model


def train_torch(kind, steps):
    model = make(kind)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01, eps=1e-8)
    batches = data(kind, 2 * steps)
    for s in range(steps):
        model.zero_grad()
        for k in range(2):
            (loss_of(kind, model, *batches[2 * s + k]) / 2).backward()
        opt.step()
    return {n: p.detach().numpy().reshape(-1) for n, p in model.named_parameters()}


names = [type(b).__name__ for b in st.find_blocks(make("lm"))]
check(names == ["Embedding", "Decoder", "Decoder", "Decoder", "LayerNorm", "Linear"],
      f"the nested causal LM's blocks: {names}")
check(len(st.find_blocks(make("grid"))) == 4, "a ModuleList of ModuleLists: each Linear is a block")

for kind in ("lm", "lm_tied", "grid"):
    mine, state, model = train_strata(kind, config(0), 8)
    ref = train_torch(kind, 8)
    worst = worst_relative({n: a.reshape(-1) for n, a in mine.items()}, ref)
    print(f"{kind}: 8 AdamW steps through strata (stage 0, fp32) against torch: worst relative difference "
          f"{worst:.2e}")
    check(set(mine) == set(ref) and worst < 1e-5, f"{kind}: against torch {worst}")
    plain = model.state_dict()
    check(list(state) == list(plain), f"{kind}: module_state_dict has the module's keys in order")
    check(all(torch.equal(state[k], plain[k]) for k in plain), f"{kind}: module_state_dict equals the closed "
          f"module's state_dict (parameters, buffers)")

# A config written for the Hugging Face trainer ("auto" values) runs as it does from the CLI: the
# bucket sizes come from the model's config.hidden_size, the scheduler's steps from total_steps.
hf_config = json.load(open(os.path.join(os.path.dirname(__file__), "..", "engine", "ds_configs",
                                        "hf_transformers_zero3.json")))
model = make("lm")
model.config = types.SimpleNamespace(hidden_size=16)
check(st.hidden_size_of(model) == 16 and st.hidden_size_of(make("grid")) == 12, "the hidden size an \"auto\" reads")
e = st.initialize(model, hf_config, total_steps=4)
for x, y in data("lm", 4):
    e.backward(loss_of("lm", e, x, y))
    result = e.step()
check(result["step"] == 4, "a Hugging Face trainer config trains through strata.torch")
e.close()
print("a Hugging Face trainer config with \"auto\" values trains through strata.torch, as from the CLI")

with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
    cases = [(0, "none", "none"), (1, "cpu", "none"), (2, "nvme", "none"), (3, "none", "none"), (3, "cpu", "cpu"),
             (3, "nvme", "nvme")]
    for kind in ("lm", "lm_tied", "grid"):
        first = None
        for stage, opt, params in cases:
            got, _, _ = train_strata(kind, config(stage, opt, params, bf16=True, nvme=tmp + "/nvme"), 3)
            if first is None:
                first = got
            else:
                check(all(got[n].tobytes() == first[n].tobytes() for n in first),
                      f"{kind} bf16: stage {stage} ({opt}/{params}) differs from stage 0")
        print(f"{kind} (bf16): {len(cases)} stage x placement runs give bitwise-identical parameters")

finish()
