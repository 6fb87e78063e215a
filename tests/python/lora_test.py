"""LoRA fine-tuning through strata.torch: a Llama with Hugging Face's names (torch_llama.py),
its q_proj and v_proj wrapped with adapters as PEFT wraps them and every other parameter
frozen, trains against the same training in torch alone (AdamW over the adapters): the
adapters within the bound the fp32 CPU path holds (1e-5 relative), the frozen weights bit
for bit as they started, optimizer state and gradient accumulators for the adapters only
(the ledger's bytes, exactly), and ZeRO-3 with the optimizer state and parameters on NVMe
bitwise equal to stage 0. Exits 77 (skipped) without torch."""
import tempfile

from harness import check, finish, torch  # exits 77 without torch

import numpy as np
import strata.torch as st
from torch_llama import LlamaForCausalLM, add_lora
from torch_models import config, worst_relative

STEPS, ACCUM = 6, 2


def make():
    torch.manual_seed(0)
    return add_lora(LlamaForCausalLM())


def batches():
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(STEPS * ACCUM):
        idx = torch.randint(0, 64, (2, 9), generator=g)
        out.append((idx[:, :-1], idx[:, 1:]))
    return out


def loss_of(model, x, y):
    logits = model(x)
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def train_torch():
    model = make()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3, weight_decay=0.01, eps=1e-8)
    data = batches()
    for s in range(STEPS):
        opt.zero_grad()
        for k in range(ACCUM):
            x, y = data[s * ACCUM + k]
            (loss_of(model, x, y) / ACCUM).backward()
        opt.step()
    return {n: p.detach().numpy().copy() for n, p in model.named_parameters()}


def train_strata(cfg):
    model = make()
    engine = st.initialize(model, cfg)
    data = batches()
    for s in range(STEPS):
        for k in range(ACCUM):
            x, y = data[s * ACCUM + k]
            engine.backward(loss_of(engine, x, y))
        result = engine.step()
    memory = engine.memory()
    params = engine.parameters_numpy()
    engine.close()
    return model, params, memory, result


initial = {n: p.detach().numpy().copy() for n, p in make().named_parameters()}
trainable = {n for n, p in make().named_parameters() if p.requires_grad}
frozen = set(initial) - trainable
check(len(trainable) == 8 and len(frozen) == 21, f"{len(trainable)} adapters and {len(frozen)} frozen tensors")
ref = train_torch()
model, mine, memory, result = train_strata(config(0, accum=ACCUM))
check(result["step"] == STEPS, "every step taken")
worst = worst_relative({n: mine[n] for n in trainable}, {n: ref[n] for n in trainable})
print(f"LoRA on a Llama (Hugging Face names, q_proj and v_proj adapted): {STEPS} AdamW steps through strata "
      f"(stage 0, fp32) against torch: adapters' worst relative difference {worst:.2e}")
check(worst < 1e-5, f"adapters against torch: {worst}")
check(all(not np.array_equal(mine[n], initial[n]) for n in trainable if "lora_B" in n), "the adapters trained")
check(all(mine[n].tobytes() == initial[n].tobytes() for n in frozen), "frozen weights keep every bit in the engine")
check(all(p.detach().numpy().tobytes() == initial[n].tobytes() for n, p in model.named_parameters() if n in frozen),
      "frozen weights keep every bit in the module after close()")


# Optimizer state (fp32 master, exp_avg, exp_avg_sq) and fp32 accumulators for the adapters only:
# per unit (decoder layer) one trainable engine layer, its elements padded to 16.
def padded(n):
    return (n + 15) // 16 * 16


units = {}
for n in trainable:
    units.setdefault(n.split(".")[2], 0)  # model.layers.N....
    units[n.split(".")[2]] += initial[n].size
adapter_elems = sum(padded(e) for e in units.values())
opt_bytes = sum(memory[t]["optimizer_bytes"] for t in ("device", "host", "nvme"))
grad_bytes = sum(memory[t]["grads_bytes"] for t in ("device", "host", "nvme"))
base_elems = sum(initial[n].size for n in frozen)
print(f"optimizer state {opt_bytes} B and accumulators {grad_bytes} B for {sum(units.values())} adapter elements; "
      f"none for the {base_elems} frozen ones (they would take {16 * base_elems} B more)")
check(opt_bytes == 12 * adapter_elems and grad_bytes == 4 * adapter_elems,
      f"optimizer {opt_bytes} B and accumulators {grad_bytes} B for {adapter_elems} padded adapter elements")

with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
    for opt, par in (("cpu", "nvme"), ("nvme", "nvme"), ("none", "cpu")):
        cfg = config(3, opt, par, accum=ACCUM, nvme=f"{tmp}/{opt}-{par}")
        _, got, memory, _ = train_strata(cfg)
        same = all(got[n].tobytes() == mine[n].tobytes() for n in mine)
        check(same, f"ZeRO-3, optimizer on {opt}, parameters on {par}: bitwise equal to stage 0")
        if opt == "cpu":
            check(memory["host"]["optimizer_bytes"] == 12 * adapter_elems,
                  f"host optimizer state {memory['host']['optimizer_bytes']} B for {adapter_elems} adapter elements")
print("ZeRO-3 with optimizer state and parameters in host RAM or on NVMe: bitwise equal to stage 0")

finish()
