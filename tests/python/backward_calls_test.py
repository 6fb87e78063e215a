"""Several backward() calls per micro-batch through strata.torch (the invariance matrix's Python
row; DeepSpeed PR #7981: ZeRO-1/2 with CPU offload kept only the last call's gradients until
April 2026). Two patterns a training loop uses: a batch in two halves, each forward and
backward on its own, and one forward with two losses, each backward on its own
(retain_graph=True). Each is held to torch's own AdamW over the same calls within fp32
tolerance (keeping only the last call's gradients is far outside it); at one micro-batch per
step (DeepSpeed's case) and at two; in bf16 every ZeRO stage and placement gives the bits of
stage 0; and step() inside an unfinished micro-batch is refused. Exits 77 without torch."""
import tempfile

from harness import check, finish, raises, torch  # exits 77 without torch

import strata.torch as st
from torch_models import Gpt, Mlp, config, worst_relative


def make(kind):
    torch.manual_seed(0)
    return Mlp() if kind == "mlp" else Gpt()


def data(kind, count, seed=3):
    g = torch.Generator().manual_seed(seed)
    if kind == "mlp":
        return [(torch.randn(4, 24, generator=g), torch.randn(4, 24, generator=g)) for _ in range(count)]
    out = []
    for _ in range(count):
        idx = torch.randint(0, 64, (4, 9), generator=g)
        out.append((idx[:, :-1], idx[:, 1:]))
    return out


def losses(kind, run, x, y, pattern):
    """The micro-batch's losses, in the order their backward calls run: (loss, retain_graph)."""
    def loss(out, target):
        if kind == "mlp":
            return ((out - target) ** 2).mean()
        return torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), target.reshape(-1))
    if pattern == "halves":  # each half's forward then its backward
        return [lambda: (loss(run(x[:2]), y[:2]), False), lambda: (loss(run(x[2:]), y[2:]), False)]
    shared = {}

    def first():  # one forward, two losses: the mean and a weighted sum of squares of its output
        shared["out"] = run(x)
        return loss(shared["out"], y), True

    return [first, lambda: (0.01 * (shared["out"].float() ** 2).mean(), False)]


def train_strata(kind, cfg, steps, pattern):
    engine = st.initialize(make(kind), cfg)
    accum = cfg["gradient_accumulation_steps"]
    batches = data(kind, steps * accum)
    for s in range(steps):
        for k in range(accum):
            calls = losses(kind, engine, *batches[s * accum + k], pattern)
            for i, call in enumerate(calls):
                value, retain = call()
                engine.backward(value, retain_graph=retain, micro_batch_end=i == len(calls) - 1)
        result = engine.step()
    params = engine.parameters_numpy()
    engine.close()
    check(result["step"] == steps, f"{kind} {pattern}: {steps} steps taken")
    return params


def train_torch(kind, steps, accum, pattern, only_last=False):
    """torch's own training over the same calls; only_last: each micro-batch keeps only its last
    call's gradients (the DeepSpeed bug), to show how far off that is."""
    model = make(kind)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01, eps=1e-8)
    batches = data(kind, steps * accum)
    for s in range(steps):
        model.zero_grad()
        for k in range(accum):
            kept = {p: p.grad for p in model.parameters()}  # the earlier micro-batches' sum
            for call in losses(kind, model, *batches[s * accum + k], pattern):
                if only_last:
                    for p in model.parameters():
                        p.grad = kept[p]  # this micro-batch's earlier calls dropped
                value, retain = call()
                (value / accum).backward(retain_graph=retain)
        opt.step()
    return {n: p.detach().numpy() for n, p in model.named_parameters()}


for kind, steps in (("mlp", 12), ("gpt", 6)):
    for pattern in ("halves", "two_losses"):
        for accum in (1, 2):
            mine = train_strata(kind, config(1, "cpu", accum=accum), steps, pattern)
            ref = train_torch(kind, steps, accum, pattern)
            worst = worst_relative(mine, ref)
            wrong = worst_relative(train_torch(kind, steps, accum, pattern, only_last=True), ref)
            print(f"{kind} {pattern}, {accum} micro-batch(es) per step, stage 1 with CPU offload: {steps} AdamW steps "
                  f"against torch: worst relative difference {worst:.2e} (keeping only the last call: {wrong:.2e})")
            check(worst < 1e-5, f"{kind} {pattern} accum {accum}: against torch {worst}")
            check(wrong > 100 * max(worst, 1e-7), f"{kind} {pattern}: the dropped-call run is not told apart: {wrong}")

with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
    cases = [(0, "none", "none"), (1, "cpu", "none"), (2, "nvme", "none"), (3, "cpu", "cpu"), (3, "nvme", "nvme")]
    for kind in ("mlp", "gpt"):
        for accum in (1, 2):
            first = None
            for stage, opt, params in cases:
                got = train_strata(kind, config(stage, opt, params, bf16=True, accum=accum, nvme=tmp + "/nvme"), 3,
                                   "halves")
                if first is None:
                    first = got
                else:
                    check(all(got[n].tobytes() == first[n].tobytes() for n in first),
                          f"{kind} bf16 accum {accum}: stage {stage} ({opt}/{params}) differs from stage 0")
            print(f"{kind} (bf16, {accum} micro-batch(es), two backward calls each): {len(cases)} stage x placement "
                  f"runs give bitwise-identical parameters")


e = st.initialize(make("mlp"), config(3, "cpu"))
x, y = data("mlp", 1)[0]
e.backward(((e(x) - y) ** 2).mean(), micro_batch_end=False)
raises(e.step, "micro_batch_end=True", "step() inside an unfinished micro-batch")
e.backward(((e(x) - y) ** 2).mean())  # the refused step() changed nothing: this ends the first micro-batch
e.backward(((e(x) - y) ** 2).mean())
check(e.step()["step"] == 1, "training goes on after a refused step()")
e.close()
print("misuse: step() before a micro-batch's last backward() is refused")

finish()
