"""strata.torch under PyTorch training loops (Debian's python3-torch, the host device):
an MLP and a small GPT written in torch train through strata.torch.initialize to torch's own
AdamW results within fp32 tolerance (stage 0; the GPT's head tied to its embedding), and to
LAMB and Muon written in torch; ZeRO stages 0-3 with optimizer state and
parameters on the device, in host RAM and on NVMe give bitwise-identical parameters (Muon's
too); a checkpoint saved and loaded into a fresh model continues with the same bits; misuse raises
StrataError with Strata's message. Exits 77 (skipped) without torch."""
import math
import tempfile

from harness import check, finish, raises, torch  # exits 77 without torch

import strata.torch as st
from torch_models import Gpt, Mlp, config, worst_relative


def batches(kind, steps, accum, seed=1):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps * accum):
        if kind == "mlp":
            out.append((torch.randn(4, 24, generator=g), torch.randn(4, 24, generator=g)))
        else:
            idx = torch.randint(0, 64, (2, 9), generator=g)
            out.append((idx[:, :-1], idx[:, 1:]))
    return out


def loss_of(kind, model, x, y):
    if kind == "mlp":
        return ((model(x) - y) ** 2).mean()
    logits = model(x)
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def make(kind):
    torch.manual_seed(0)
    return Mlp() if kind == "mlp" else Gpt()


def train_strata(kind, cfg, steps, engine_out=None):
    model = make(kind)
    engine = st.initialize(model, cfg)
    accum = cfg["gradient_accumulation_steps"]
    data = batches(kind, steps, accum)
    for s in range(steps):
        for k in range(accum):
            x, y = data[s * accum + k]
            engine.backward(loss_of(kind, engine, x, y))
        result = engine.step()
    params = engine.parameters_numpy()
    if engine_out is not None:
        engine_out.append(engine)
    else:
        engine.close()  # its swap files and nvme_path go now, not when the collector runs
    return params, result


def train_torch(kind, steps, accum=2, update=None):
    """torch's own training of the same model on the same batches: torch.optim.AdamW, or
    update(step, model) after each step's gradients."""
    model = make(kind)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01, eps=1e-8) if update is None else None
    data = batches(kind, steps, accum)
    for s in range(steps):
        model.zero_grad()
        for k in range(accum):
            x, y = data[s * accum + k]
            (loss_of(kind, model, x, y) / accum).backward()
        if opt is not None:
            opt.step()
        else:
            with torch.no_grad():
                update(s + 1, model)
    return {n: p.detach().numpy() for n, p in model.named_parameters()}


for kind, steps in (("mlp", 20), ("gpt", 8)):
    mine, result = train_strata(kind, config(0), steps)
    ref = train_torch(kind, steps)
    check(set(mine) == set(ref), f"{kind}: the same parameter names as torch")
    worst = worst_relative(mine, ref)
    print(f"{kind}: {steps} AdamW steps through strata (stage 0, fp32) against torch.optim.AdamW: "
          f"worst relative difference {worst:.2e}")
    check(worst < 1e-5 and result["step"] == steps, f"{kind}: strata against torch AdamW: {worst}")

def lamb_update(lr=3e-3, wd=0.01, b1=0.9, b2=0.999, eps=1e-8, lo=0.01, hi=10.0):
    """DeepSpeed's FusedLamb arithmetic per tensor, written in torch."""
    state = {}

    def update(t, model):
        step_size = lr * math.sqrt(1 - b2 ** t) / (1 - b1 ** t)
        for n, p in model.named_parameters():
            m, v = state.setdefault(n, (torch.zeros_like(p), torch.zeros_like(p)))
            m.mul_(b1).add_(p.grad, alpha=1 - b1)
            v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
            u = m / (v.sqrt() + eps) + wd * p
            wn, un = p.double().norm().item(), u.double().norm().item()
            ratio = min(max(wn / un, lo), hi) if wn > 0 and un > 0 else 1.0
            p.sub_(step_size * ratio * u)
    return update


lamb = config(0)
lamb["optimizer"] = {"type": "Lamb", "params": {"lr": 3e-3, "weight_decay": 0.01}}
mine, _ = train_strata("mlp", lamb, 20)
worst = worst_relative(mine, train_torch("mlp", 20, update=lamb_update()))
print(f"mlp: 20 LAMB steps through strata (stage 0, fp32) against LAMB written in torch: worst relative difference "
      f"{worst:.2e}")
check(worst < 1e-5, f"LAMB against torch: {worst}")


def muon_update(hidden, lr=0.02, adam_lr=3e-3, wd=0.01, mu=0.95):
    """torch.optim.Muon's arithmetic (PyTorch 2.9's; Debian's PyTorch predates it) written in
    torch, its Newton-Schulz iterations in float64, on the parameters hidden(name) names;
    torch.optim.AdamW on the rest."""
    state, adamw = {}, []

    def orthogonalized(u):
        a, b, c = 3.4445, -4.7750, 2.0315
        x = u.double()
        tall = x.shape[0] > x.shape[1]
        x = x.T if tall else x
        x = x / x.norm().clamp(min=1e-7)
        for _ in range(5):
            g = x @ x.T
            x = a * x + (b * g + c * (g @ g)) @ x
        return x.T if tall else x

    def update(t, model):
        if not adamw:
            rest = [p for n, p in model.named_parameters() if not hidden(n)]
            adamw.append(torch.optim.AdamW(rest, lr=adam_lr, weight_decay=wd, eps=1e-8))
        for n, p in model.named_parameters():
            if hidden(n):
                m = state.setdefault(n, torch.zeros_like(p))
                m.lerp_(p.grad, 1 - mu)
                rows, cols = p.shape
                step = lr * max(1.0, rows / cols) ** 0.5 * orthogonalized(p.grad.lerp(m, mu))
                p.mul_(1 - lr * wd)
                p.sub_(step.float())
        adamw[0].step()
    return update


# Muon on the hidden matrices: the middle Linear of the MLP; the GPT's blocks' four matrices,
# stored (out, in) as torch.nn.Linear stores them (qkv 3c x c and fc 4c x c take the shape factor).
for kind, steps, hidden in (("mlp", 20, lambda n: n == "layers.1.weight"),
                            ("gpt", 8, lambda n: n.startswith("h.") and n.endswith("weight") and ".ln" not in n)):
    muon = config(0)
    muon["optimizer"] = {"type": "Muon", "params": {"lr": 0.02, "adam_lr": 3e-3, "weight_decay": 0.01, "eps": 1e-8}}
    mine, _ = train_strata(kind, muon, steps)
    worst = worst_relative(mine, train_torch(kind, steps, update=muon_update(hidden)))
    print(f"{kind}: {steps} Muon steps through strata (stage 0, fp32) against Muon written in torch: worst relative "
          f"difference {worst:.2e}")
    check(worst < 1e-5, f"{kind}: Muon against torch: {worst}")

with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
    cases = [(0, "none", "none"), (1, "cpu", "none"), (1, "nvme", "none"), (2, "none", "none"), (2, "nvme", "none"),
             (3, "none", "none"), (3, "cpu", "cpu"), (3, "nvme", "nvme"), (3, "cpu", "nvme")]

    def same_across(kind, runs, optimizer=None):
        """The parameters of 3 bf16 steps at each (stage, optimizer device, parameter device) are
        the first run's bits."""
        first = None
        for stage, opt, params in runs:
            cfg = config(stage, opt, params, bf16=True, nvme=tmp + "/nvme")
            if optimizer is not None:
                cfg["optimizer"] = optimizer
            got, _ = train_strata(kind, cfg, 3)
            if first is None:
                first = got
            else:
                same = all(got[n].tobytes() == first[n].tobytes() for n in first)
                check(same, f"{kind} bf16 {cfg['optimizer']['type']}: stage {stage} ({opt}/{params}) differs from "
                            f"stage 0")

    for kind in ("mlp", "gpt"):
        same_across(kind, cases)
        print(f"{kind} (bf16): {len(cases)} stage x placement runs give bitwise-identical parameters")
    # Muon: at stages 1-3 the ranks gather each matrix whole (on NVMe after a scan of its state).
    for kind in ("mlp", "gpt"):
        same_across(kind, cases, {"type": "Muon", "params": {"lr": 0.02, "adam_lr": 3e-3, "weight_decay": 0.01}})
        print(f"{kind} (bf16, Muon): {len(cases)} stage x placement runs give bitwise-identical parameters")

    # A checkpoint: saved after 3 steps, loaded into a fresh model, the next 2 steps are the same.
    cfg = config(3, "cpu", "none")
    kept = []
    train_strata("mlp", cfg, 3, kept)
    a = kept[0]
    a.save(tmp + "/ck", {"next_step": 3})
    fresh = Mlp(depth=3)
    b = st.initialize(fresh, cfg)
    check(b.load(tmp + "/ck") == {"next_step": 3}, "load returns the trainer state")
    more = batches("mlp", 2, 2, seed=9)
    for engine in (a, b):
        for i, (x, y) in enumerate(more):
            engine.backward(loss_of("mlp", engine, x, y))
            engine.step()
    pa, pb = a.parameters_numpy(), b.parameters_numpy()
    check(all(pa[n].tobytes() == pb[n].tobytes() for n in pa), "a loaded checkpoint continues with the same bits")
    # An evaluation between steps: the same output as the training forward, nothing stepped.
    x = more[0][0]
    with torch.no_grad():
        first, again = b(x), b(x)
    check(torch.equal(first, again), "two evaluations agree")
    b.backward(loss_of("mlp", b, x, more[0][1]))
    b.backward(loss_of("mlp", b, x, more[0][1]))
    check(b.step()["step"] == 6, "training goes on after an evaluation")
    mem = b.memory()
    check(mem["device"]["used_bytes"] > 0 and mem["host"]["used_bytes"] > 0, f"memory report: {mem}")
    check(b.io_stats()["step_seconds"] > 0, "io report")
    print("checkpoint: saved after step 3, loaded into a fresh model, steps 4-5 with the same bits; "
          "evaluation under no_grad between steps")


raises(lambda: st.initialize(make("mlp"), dict(config(0), zero_optimisation={"stage": 1})), "zero_optimisation",
       "a misspelt config key")
e = st.initialize(make("mlp"), config(0))
raises(e.step, "step() without backward()", "step before backward")
raises(lambda: e.engine.gather(42), "layer 42", "an unknown layer")
raises(lambda: e.load("/nonexistent/ck"), "/nonexistent/ck", "a missing checkpoint")
raises(lambda: st.initialize(make("mlp"), config(0), device="cuda"), "host device", "a CUDA device")
raises(lambda: st.initialize(make("mlp"), dict(config(1), optimizer={"type": "Lamb", "params": {"lr": 1e-3}})),
       "needs zero_optimization.stage 0", "LAMB under ZeRO stage 1")
print("misuse: a misspelt key, step before backward, an unknown layer, a missing checkpoint, a CUDA device, "
      "LAMB under ZeRO")

finish()
