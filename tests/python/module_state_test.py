"""State in PyTorch's terms (issue 55): after training through strata.torch,
engine.module_state_dict() holds every parameter's trained value (the engine's fp32 master in
the parameter's dtype, tied weights under both names, buffers as they are) and loads into a
fresh copy of the model, which then computes the engine's own evaluation loss;
gathered_parameters() lends the module its full parameters between steps (evaluated as plain
torch, the same loss) and refuses writes that would not reach the engine; close() leaves the
trained values in the module, so model.state_dict() and torch.save work. At stages 0 and 3.
Exits 77 without torch."""
import io

from harness import check, finish, torch  # exits 77 without torch

import numpy as np

import strata
import strata.torch as st



class Block(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.norm = torch.nn.LayerNorm(c)
        self.fc = torch.nn.Linear(c, c)
        self.register_buffer("gain", torch.full((c,), 0.5))  # a buffer: not the engine's

    def forward(self, x):
        return x + torch.tanh(self.fc(self.norm(x))) * self.gain


class Lm(torch.nn.Module):
    """Tied embedding and head: the head block borrows the embedding's weight."""

    def __init__(self, vocab=32, c=16, layers=2):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, c)
        self.blocks = torch.nn.ModuleList([Block(c) for _ in range(layers)])
        self.head = torch.nn.Linear(c, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, idx):
        x = self.embed(idx)
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def loss_of(model, x, y):
    logits = model(x)
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def config(stage):
    return {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "gradient_clipping": 0,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01}},
            "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0}}


g = torch.Generator().manual_seed(3)
data = [torch.randint(0, 32, (2, 9), generator=g) for _ in range(4)]
held = torch.randint(0, 32, (2, 9), generator=g)

for stage in (0, 3):
    torch.manual_seed(0)
    model = Lm()
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    engine = st.initialize(model, config(stage))
    for idx in data:
        engine.backward(loss_of(engine, idx[:, :-1], idx[:, 1:]))
        engine.step()
    masters = engine.parameters_numpy()
    with torch.no_grad():
        eval_loss = float(loss_of(engine, held[:, :-1], held[:, 1:]))

    state = engine.module_state_dict()
    check(list(state.keys()) == list(initial.keys()), f"stage {stage}: state_dict keys {list(state.keys())}")
    check(all(state[k].shape == initial[k].shape for k in initial), f"stage {stage}: shapes differ")
    check(np.array_equal(state["blocks.1.fc.weight"].numpy(), masters["blocks.1.fc.weight"]),
          f"stage {stage}: module_state_dict is not the fp32 master")
    check(torch.equal(state["head.weight"], state["embed.weight"]), f"stage {stage}: the tied head is not the embedding")
    check(not torch.equal(state["embed.weight"], initial["embed.weight"]), f"stage {stage}: the state is untrained")
    check(torch.equal(state["blocks.0.gain"], initial["blocks.0.gain"]), f"stage {stage}: a buffer changed")
    torch.manual_seed(1)
    fresh = Lm()
    fresh.load_state_dict(state)
    with torch.no_grad():
        fresh_loss = float(loss_of(fresh, held[:, :-1], held[:, 1:]))
    check(abs(fresh_loss - eval_loss) <= 1e-6 * abs(eval_loss),
          f"stage {stage}: a fresh model loaded from module_state_dict computes {fresh_loss} against the engine's "
          f"evaluation {eval_loss}")

    with engine.gathered_parameters() as m:
        check(m is model and model.blocks[0].fc.weight.shape == (16, 16), f"stage {stage}: not gathered")
        with torch.no_grad():
            plain = float(loss_of(model, held[:, :-1], held[:, 1:]))
    check(abs(plain - eval_loss) <= 1e-6 * abs(eval_loss),
          f"stage {stage}: inside gathered_parameters the module computes {plain}, not {eval_loss}")
    check(model.blocks[0].fc.weight.numel() == 0, f"stage {stage}: the placeholders did not come back")
    try:
        with engine.gathered_parameters():
            with torch.no_grad():
                model.blocks[1].fc.bias.add_(1.0)
        check(False, f"stage {stage}: a write inside gathered_parameters was accepted")
    except strata.StrataError as e:
        check("blocks.1.fc.bias" in str(e) and "read-only" in str(e), f"stage {stage}: unclear: {e}")
    check(np.array_equal(engine.parameters_numpy()["blocks.1.fc.bias"], masters["blocks.1.fc.bias"]),
          f"stage {stage}: the refused write reached the engine")
    # The engine still trains after both.
    engine.backward(loss_of(engine, data[0][:, :-1], data[0][:, 1:]))
    engine.step()
    last = engine.parameters_numpy()

    engine.close()
    after = model.state_dict()
    check(all(np.array_equal(after[k].numpy(), last[k]) for k in last), f"stage {stage}: close() did not leave the "
                                                                          f"trained values in the module")
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    buf.seek(0)
    check(torch.equal(torch.load(buf)["blocks.0.fc.weight"], after["blocks.0.fc.weight"]),
          f"stage {stage}: torch.save of the closed engine's module")
    try:
        engine.gathered_parameters().__enter__()
        check(False, f"stage {stage}: gathered_parameters after close accepted")
    except strata.StrataError as e:
        check("after close()" in str(e), f"stage {stage}: unclear: {e}")
    print(f"stage {stage}: module_state_dict loads into a fresh model that computes the engine's evaluation loss "
          f"({eval_loss:.6f}); gathered_parameters lends the full values and refuses writes; close() leaves the "
          f"trained values in the module")

finish()
