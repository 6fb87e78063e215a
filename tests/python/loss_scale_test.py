"""fp16 with a loss scale through strata.torch (issue 58): the loss is multiplied by the engine's
scale exactly once before backward and the engine divides it out exactly once, so each step's
gradient norm is the unscaled one torch computes on the same model in fp32 (to fp16's
precision) and the parameters follow torch's AdamW. A static scale of 1024 and a dynamic scale
that starts at 2^21 are both checked: the dynamic one must skip exactly the steps whose scaled
gradients overflow fp16 in torch's own arithmetic, halving the scale each time, and then train.
Adam is blind to a gradient's scale, so the parameters alone would not show a scale applied
twice or not at all; the norms and the skipped steps do. Exits 77 without torch."""
import math

from harness import check, finish, torch  # exits 77 without torch

import numpy as np

import strata.torch as st

FP16_MAX = 65504.0


class Block(torch.nn.Module):
    def __init__(self, width=24):
        super().__init__()
        self.fc = torch.nn.Linear(width, width)

    def forward(self, x):
        # fp32 arithmetic on fp16 parameters (torch's CPU kernels have no fp16 matmul): the
        # gradient reaches each parameter cast to fp16, where a scaled one can overflow.
        return torch.tanh(torch.nn.functional.linear(x.float(), self.fc.weight.float(), self.fc.bias.float()))


class Mlp(torch.nn.Module):
    def __init__(self, width=24, depth=3):
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(width) for _ in range(depth)])

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x


STEPS, ACCUM = 6, 2


def batches():
    g = torch.Generator().manual_seed(7)
    return [(torch.randn(4, 24, generator=g), torch.randn(4, 24, generator=g)) for _ in range(STEPS * ACCUM)]


def config(fp16, stage):
    return {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": ACCUM, "gradient_clipping": 0,
            "fp16": fp16, "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.01, "eps": 1e-8}},
            "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0}}


def loss_of(model, x, y):
    return ((model(x) - y) ** 2).mean()


def train_strata(cfg):
    torch.manual_seed(0)
    engine = st.initialize(Mlp(), cfg)
    data, results = batches(), []
    for s in range(STEPS):
        scale = engine.engine.loss_scale()
        for k in range(ACCUM):
            x, y = data[s * ACCUM + k]
            engine.backward(loss_of(engine, x, y))
        r = engine.step()
        r["scale_used"] = scale
        results.append(r)
    params = engine.parameters_numpy()
    engine.close()
    return params, results


def train_torch(skipped):
    """torch's AdamW in fp32 on the same batches, skipping the steps Strata skipped: each step's
    gradient norm (the mean over micro-batches, as the engine reduces) and largest |gradient|."""
    torch.manual_seed(0)
    model = Mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01, eps=1e-8)
    data, norms, peaks = batches(), [], []
    for s in range(STEPS):
        model.zero_grad()
        for k in range(ACCUM):
            x, y = data[s * ACCUM + k]
            (loss_of(model, x, y) / ACCUM).backward()
        grads = [p.grad for p in model.parameters()]
        norms.append(math.sqrt(sum(float((g.double() ** 2).sum()) for g in grads)))
        peaks.append(max(float(g.abs().max()) for g in grads))
        if not skipped[s]:
            opt.step()
    return {n: p.detach().numpy() for n, p in model.named_parameters()}, norms, peaks


def worst_drift(a, b, trained):
    """Largest |a - b| over Adam's bound on it: each step moves an element by about lr whatever
    its gradient's size, so fp16's noise on a near-zero gradient can move it either way."""
    return max(float(np.abs(a[k] - b[k]).max()) for k in b) / (2 * 3e-3 * max(trained, 1))


final = {}
for stage in (0, 3):
    # Static: every step trains; the norm is the unscaled one.
    params, res = train_strata(config({"enabled": True, "loss_scale": 1024}, stage))
    ref, norms, _ = train_torch([False] * STEPS)
    check(all(not r["skipped"] for r in res), f"stage {stage}, static 1024: a step was skipped: {res}")
    check(all(r["loss_scale"] == 1024 and r["scale_used"] == 1024 for r in res),
          f"stage {stage}, static 1024: the scale moved: {res}")
    for s, r in enumerate(res):
        rel = abs(r["grad_norm"] - norms[s]) / norms[s]
        check(rel < 1e-2, f"stage {stage}, static 1024, step {s + 1}: grad norm {r['grad_norm']:.6g} against torch's "
                          f"{norms[s]:.6g} (relative {rel:.2e}): the scale is not divided out exactly once")
    final[stage] = params
    w = worst_drift(params, ref, STEPS)
    check(w < 1, f"stage {stage}, static 1024: parameters {w:.2f} of Adam's drift bound from torch's AdamW")
    print(f"stage {stage}, fp16 with a static loss scale of 1024: grad norms within 1e-2 of torch's, "
          f"parameters within {w:.2f} of Adam's drift bound")

    # Dynamic from 2^21: the first steps overflow fp16 (their scaled gradients pass 65504) and
    # are skipped with the scale halved, until a scale fits; then it trains.
    dyn = {"enabled": True, "loss_scale": 0, "initial_scale_power": 21, "loss_scale_window": 1000, "hysteresis": 1,
           "min_loss_scale": 1}
    params, res = train_strata(config(dyn, stage))
    skipped = [r["skipped"] for r in res]
    ref, norms, peaks = train_torch(skipped)
    check(any(skipped) and not all(skipped), f"stage {stage}, dynamic: expected some skipped steps, got {skipped}")
    for s, r in enumerate(res):
        # A micro-batch's gradient times the scale, in fp16: overflow where the largest passes
        # fp16's range (a margin either side for the fp16 model's own gradients).
        scaled = peaks[s] * ACCUM * r["scale_used"]
        if r["skipped"]:
            check(scaled > FP16_MAX / 4, f"stage {stage}, dynamic, step {s + 1}: skipped at scale {r['scale_used']:g} "
                                         f"though torch's gradients times it peak at {scaled:.3g}")
            if s + 1 < STEPS:
                check(res[s + 1]["scale_used"] == r["scale_used"] / 2, f"stage {stage}, dynamic, step {s + 2}: scale "
                      f"{res[s + 1]['scale_used']:g} after skipping at {r['scale_used']:g}")
        else:
            check(scaled < FP16_MAX * 4, f"stage {stage}, dynamic, step {s + 1}: trained at scale "
                                         f"{r['scale_used']:g} though torch's gradients times it reach {scaled:.3g}")
            rel = abs(r["grad_norm"] - norms[s]) / norms[s]
            check(rel < 1e-2, f"stage {stage}, dynamic, step {s + 1}: grad norm {r['grad_norm']:.6g} against "
                              f"torch's {norms[s]:.6g} at scale {r['scale_used']:g}")
    w = worst_drift(params, ref, skipped.count(False))
    check(w < 1, f"stage {stage}, dynamic: parameters {w:.2f} of Adam's drift bound from torch's AdamW skipping the "
                 f"same steps")
    print(f"stage {stage}, fp16 with a dynamic scale from 2^21: skipped {skipped.count(True)} steps "
          f"(scales {[r['scale_used'] for r in res]}), trained steps' grad norms within 1e-2 of torch's, "
          f"parameters within {w:.2f} of Adam's drift bound")

same = all(np.array_equal(final[0][k], final[3][k]) for k in final[0])
check(same, "fp16 with a static loss scale: stage 3 ends with other parameters than stage 0")
finish()
