"""LoRA fine-tuning through strata.torch: a Llama with Hugging Face's names (torch_llama.py),
its q_proj and v_proj wrapped with adapters as PEFT wraps them and every other parameter
frozen, trains against the same training in torch alone (AdamW over the adapters): the
adapters within the bound the fp32 CPU path holds (1e-5 relative), the frozen weights bit
for bit as they started, optimizer state and gradient accumulators for the adapters only
(the ledger's bytes, exactly), and ZeRO-3 with the optimizer state and parameters on NVMe
bitwise equal to stage 0. Edits made inside gathered_parameters(modifier_rank=0) between steps
reach the engine as torch's edits reach its model; save_pretrained writes the adapters merged
into a Hugging Face directory that this test's own safetensors reader and `strata train --model
DIR` read back. Exits 77 (skipped) without torch."""
import json
import os
import struct
import subprocess
import sys
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


def edit(model):
    """What the edit test does between steps 3 and 4: halves an adapter, shifts a frozen weight."""
    with torch.no_grad():
        model.model.layers[1].self_attn.v_proj.lora_B.weight.mul_(0.5)
        model.model.layers[0].mlp.down_proj.weight.add_(0.01)


def train_torch(edited=False):
    model = make()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3, weight_decay=0.01, eps=1e-8)
    data = batches()
    for s in range(STEPS):
        if edited and s == 3:
            edit(model)
        opt.zero_grad()
        for k in range(ACCUM):
            x, y = data[s * ACCUM + k]
            (loss_of(model, x, y) / ACCUM).backward()
        opt.step()
    return {n: p.detach().numpy().copy() for n, p in model.named_parameters()}


def train_strata(cfg, edited=False, save=None, offload=False, inside=None):
    model = make()
    engine = st.initialize(model, cfg)
    data = batches()
    for s in range(STEPS):
        if edited and s == 3:
            with engine.gathered_parameters(modifier_rank=0) as module:
                edit(module)
        for k in range(ACCUM):
            x, y = data[s * ACCUM + k]
            engine.backward(loss_of(engine, x, y))
        result = engine.step()
        if offload and s == 2:
            before = engine.memory()["device"]["used_bytes"]
            moved = engine.offload_states()
            between = engine.memory()["device"]["used_bytes"]
            check(between == 0 and moved > 0, f"offload_states moved {moved} B; the device holds {between} B")
            check(engine.reload_states() == moved and engine.memory()["device"]["used_bytes"] == before,
                  "reload_states brings every byte back")
            print(f"offload_states: {moved} B off the device (it held {before} B), 0 B left there; reload_states "
                  f"brought them back")
    memory = engine.memory()
    if inside is not None:  # the module's own state_dict inside the gather context
        with engine.gathered_parameters() as module:
            inside.update({k: v.detach().clone() for k, v in module.state_dict().items()})
    params = engine.parameters_numpy()
    if save is not None:
        engine.save_pretrained(save, config=HF_CONFIG, dtype="fp32")
    engine.close()
    return model, params, memory, result


HF_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 256, "hidden_size": 32,
             "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
             "max_position_embeddings": 16, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
             "tie_word_embeddings": False}


def read_safetensors(path):
    """This test's own reader: the 8-byte header length, the JSON header, little-endian data."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        check(info["dtype"] == "F32", f"{name} saved as {info['dtype']}")
        lo, hi = info["data_offsets"]
        out[name] = np.frombuffer(data[lo:hi], dtype="<f4").reshape(info["shape"])
    return out


initial = {n: p.detach().numpy().copy() for n, p in make().named_parameters()}
trainable = {n for n, p in make().named_parameters() if p.requires_grad}
frozen = set(initial) - trainable
check(len(trainable) == 8 and len(frozen) == 21, f"{len(trainable)} adapters and {len(frozen)} frozen tensors")
ref = train_torch()
inside = {}
model, mine, memory, result = train_strata(config(0, accum=ACCUM), inside=inside)
state_worst = worst_relative({n: inside[n].numpy() for n in trainable}, {n: ref[n] for n in trainable})
check(set(inside) == set(ref) and state_worst < 1e-5 and
      all(inside[n].numpy().tobytes() == ref[n].tobytes() for n in frozen),
      f"model.state_dict() inside gathered_parameters() against torch's: {state_worst}")
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
        _, got, memory, _ = train_strata(cfg, offload=opt == "none")
        same = all(got[n].tobytes() == mine[n].tobytes() for n in mine)
        check(same, f"ZeRO-3, optimizer on {opt}, parameters on {par}: bitwise equal to stage 0")
        if opt == "cpu":
            check(memory["host"]["optimizer_bytes"] == 12 * adapter_elems,
                  f"host optimizer state {memory['host']['optimizer_bytes']} B for {adapter_elems} adapter elements")
print("ZeRO-3 with optimizer state and parameters in host RAM or on NVMe: bitwise equal to stage 0")

# Edits between steps inside gathered_parameters(modifier_rank=0), as torch's own edits.
ref = train_torch(edited=True)
with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
    out = f"{tmp}/tuned"
    model, mine, _, _ = train_strata(config(3, "cpu", "nvme", accum=ACCUM, nvme=f"{tmp}/nvme"), edited=True, save=out)
    worst = worst_relative({n: mine[n] for n in trainable}, {n: ref[n] for n in trainable})
    shifted = "model.layers.0.mlp.down_proj.weight"
    check(worst < 1e-5, f"edited adapters against torch: {worst}")
    check(mine[shifted].tobytes() == ref[shifted].tobytes() and not np.array_equal(mine[shifted], initial[shifted]),
          "the edited frozen weight is the edited value, bit for bit")
    print(f"gathered_parameters(modifier_rank=0): an adapter halved and a frozen weight shifted between steps 3 and 4 "
          f"train on as torch's edited model (adapters' worst relative difference {worst:.2e})")

    # save_pretrained: the adapters merged, Hugging Face's names, read back by this test and by strata train.
    saved = read_safetensors(f"{out}/model.safetensors")
    names = {n.replace(".base_layer", "") for n in initial if ".lora_" not in n}
    check(set(saved) == names, f"saved names {sorted(set(saved) ^ names)} differ from a plain Llama's")
    worst_merge = 0.0
    for n, p in model.named_parameters():
        if ".lora_" in n or n not in frozen and ".base_layer" not in n:
            continue
        want = p.detach().double()
        if ".base_layer" in n:
            lora = model.get_submodule(n.rsplit(".base_layer", 1)[0])
            want = want + lora.scaling * (lora.lora_B.weight.detach().double() @ lora.lora_A.weight.detach().double())
        got = torch.from_numpy(saved[n.replace(".base_layer", "")].copy()).double()
        worst_merge = max(worst_merge, float((got - want).abs().max() / want.abs().max()))
    check(worst_merge < 1e-6, f"merged weights against torch's merge: {worst_merge}")
    check(json.load(open(f"{out}/config.json"))["torch_dtype"] == "float32", "config.json carries torch_dtype")
    strata_bin = os.environ.get("STRATA_BIN", os.path.join(os.path.dirname(os.environ["STRATA_LIBRARY"]), "..",
                                                           "bin", "strata"))
    cfg = f"{tmp}/cfg.json"
    json.dump({"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}}, open(cfg, "w"))
    run = subprocess.run([strata_bin, "train", "--model", out, "--data", os.path.join(os.path.dirname(__file__), "..",
                          "..", "docs", "user-guide.md"), "--seq-len", "8", "--steps", "2", "--config", cfg,
                          "--val-fraction", "0", "--log-json", f"{tmp}/log.jsonl", "--quiet"],
                         capture_output=True, text=True)
    losses = [json.loads(line)["loss"] for line in open(f"{tmp}/log.jsonl")] if run.returncode == 0 else []
    check(run.returncode == 0 and len(losses) == 2 and all(np.isfinite(losses)),
          f"strata train --model on the saved directory: {run.returncode} {run.stderr[-400:]}")
    print(f"save_pretrained: {len(saved)} tensors with the adapters merged (worst relative difference from torch's "
          f"merge {worst_merge:.1e}); strata train --model trained it 2 steps (loss {losses[0]:.3f}, "
          f"{losses[-1]:.3f})" if losses else "save_pretrained: strata train failed")
sys.stdout.flush()

finish()
