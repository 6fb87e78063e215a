"""Python survives misuse (issue 58): a view used after its layer was released or the engine
closed raises a Python error naming what released it and never reaches memory the engine
reuses or unmapped (that segfaulted the interpreter); an exception in a module's forward or
backward, or in an evaluation, drops the step and the next one trains with the bits of a run
in which it never began; a failed strata.torch.initialize removes its hooks, leaves the model's
parameters as they were, closes its engine and releases nvme_path. Exits 77 without torch."""
import subprocess
import sys
import tempfile

from harness import check, finish, torch  # exits 77 without torch

import numpy as np

import strata
import strata.torch as st



def raises(fn, kind, text, what):
    try:
        fn()
    except kind as e:
        check(text in str(e), f"{what}: message {e!r} lacks {text!r}")
        return e
    except Exception as e:  # noqa: BLE001 - the wrong kind is a failure of the test, not of the script
        check(False, f"{what}: {type(e).__name__} {e!r}, not {kind.__name__}")
        return None
    check(False, f"{what}: no {kind.__name__}")
    return None


def config(stage=3, accum=1, nvme=None):
    opt = {"device": "nvme", "nvme_path": nvme} if nvme else {"device": "none"}
    return {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": accum, "gradient_clipping": 0,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01}},
            "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0,
                                  "offload_optimizer": opt}}


# 1. Views after release, reduce_grads and close (the engine's own API).
e = strata.Engine(config())
e.register("a", [64], 0, init="ones")
e.register("b", [64], 1, init="zeros")
e.setup()
e.begin_step()
v = e.gather(0)
alias = v[0].array[:]  # a slice taken while the view was valid
e.release(0)
raises(lambda: v[0].array, strata.StrataError, "release(0)", "a parameter view after release")
w = e.gather(1)  # stage 3: the arena hands layer 1 the address layer 0 was released from
before = w[0].array.copy()
try:
    alias[:] = 7.0
except ValueError:
    pass
check(np.array_equal(w[0].array, before), "a write through a released view's alias changed the next gathered layer")
g = e.grad_buffers(1)
g[0].array[:] = 0.5
kept = g[0].array
e.reduce_grads(1)
raises(lambda: g[0].array, strata.StrataError, "reduce_grads(1)", "a gradient view after reduce_grads")
raises(lambda: kept.__setitem__(slice(None), 9.0), ValueError, "read-only", "a write through a reduced gradient array")
e.release(1)
e.abandon_step()
e.close()
raises(lambda: e.gather(0), strata.StrataError, "closed", "a call on a closed engine")

# After close the engine's memory is unmapped: run the write in a child, where main died of SIGSEGV.
child = r"""
import strata
e = strata.Engine({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
                   "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
                   "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}})
e.register("a", [1 << 16], 0)
e.setup()
e.begin_step()
v = e.gather(0)
a = v[0].array
e.close()
try:
    v[0].array
    print("view: no error")
except strata.StrataError as err:
    print("view:", err)
try:
    a[:] = 3.0
    print("write: no error")
except ValueError as err:
    print("write:", err)
print("survived")
"""
r = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120)
check(r.returncode == 0 and "survived" in r.stdout, f"a write after close: exit {r.returncode}, {r.stdout}{r.stderr}")
check("view: " in r.stdout and "close()" in r.stdout.split("view: ")[1].splitlines()[0],
      f"a view after close names close(): {r.stdout}")
check("write: " in r.stdout and "no error" not in r.stdout.split("write: ")[1].splitlines()[0],
      f"a write through a closed view's array raises: {r.stdout}")
print("views: released, reduced and closed views raise naming why; stale aliases never reach the engine's memory")


# 2. strata.torch: failures in forward, backward and evaluation drop the step.
class PlantedFailure(Exception):
    pass


class FailInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        raise PlantedFailure("planted backward failure")


class Flaky(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.fail = None  # "forward" or "backward"
        self.kept = None

    def forward(self, x):
        if self.fail == "forward":
            raise PlantedFailure("planted forward failure")
        self.kept = (self.lin.weight.detach(), self.lin.weight.detach().clone())  # an alias and a copy
        y = torch.tanh(self.lin(x))
        return FailInBackward.apply(y) if self.fail == "backward" else y


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.blocks = torch.nn.ModuleList([Flaky() for _ in range(3)])

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x


def data(n):
    gen = torch.Generator().manual_seed(3)
    return [(torch.randn(4, 8, generator=gen), torch.randn(4, 8, generator=gen)) for _ in range(n)]


def loss(engine, x, y):
    return ((engine(x) - y) ** 2).mean()


def train(failure=None, accum=2, steps=3):
    """steps steps; with `failure`, step 2 is first attempted and fails in its last micro-batch
    ("forward", "backward" in a module; "user": the user's own code after forward, then
    abandon_step()) or is preceded by an evaluation that fails ("eval"), then runs in full."""
    net = Net()
    engine = st.initialize(net, config(3, accum))
    batches = data(steps * accum)
    result = None
    for s in range(steps):
        if failure == "eval" and s == 1:  # between steps: an evaluation
            net.blocks[1].fail = "forward"
            with torch.no_grad():
                raises(lambda: engine(batches[0][0]), PlantedFailure, "planted", "a failure in an evaluation")
            net.blocks[1].fail = None
        elif failure is not None and s == 1:
            for k in range(accum - 1):
                engine.backward(loss(engine, *batches[s * accum + k]))
            x, y = batches[s * accum + accum - 1]
            if failure == "user":
                stale = loss(engine, x, y)  # forward ran, then the user's code failed before backward
                engine.abandon_step()
                raises(lambda: engine.backward(stale), strata.StrataError, "abandoned", "backward of an abandoned step")
            else:
                net.blocks[1].fail = failure
                raises(lambda: engine.backward(loss(engine, x, y)), PlantedFailure, "planted",
                       f"a failure in {failure}")
                net.blocks[1].fail = None
        for k in range(accum):
            engine.backward(loss(engine, *batches[s * accum + k]))
        result = engine.step()
    kept = [b.kept for b in net.blocks]
    params = engine.parameters_numpy()
    engine.close()
    return params, result, kept


reference, ref_result, kept = train()
check(all(torch.equal(a, b) for a, b in kept), "a parameter alias kept from forward still holds what forward read")
for failure in ("forward", "backward", "eval", "user"):
    for accum in (1, 2):
        ref = reference if accum == 2 else train(accum=1)[0]
        got, result, _ = train(failure, accum)
        same = all(got[n].tobytes() == ref[n].tobytes() for n in ref)
        check(same and result["step"] == 3, f"after a {failure} failure (accumulation {accum}): step {result['step']}, "
                                            f"parameters {'equal' if same else 'differ'}")
print("strata.torch: failures in forward, backward, evaluation and the user's code drop the step; the next "
      "steps have the bits of a run without it")


# 3. A failed initialize undoes itself.
def hooks_of(model):
    n = 0
    for m in model.modules():
        n += len(m._forward_pre_hooks) + len(m._forward_hooks)
    for p in model.parameters():
        n += len(p._backward_hooks or {})
    return n


with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
    cfg = config(3, 1, nvme=tmp + "/nvme")
    bad = Net()
    bad.blocks[1].lin.bias.data = bad.blocks[1].lin.bias.data.double()
    values = {n: p.detach().clone() for n, p in bad.named_parameters()}
    failed = raises(lambda: st.initialize(bad, cfg), strata.StrataError, "blocks.1.lin.bias",
                    "a float64 parameter")  # kept alive: its traceback holds the half-made engine
    check(hooks_of(bad) == 0, f"a failed initialize left {hooks_of(bad)} hooks")
    check(all(torch.equal(values[n], p.detach()) for n, p in bad.named_parameters()),
          "a failed initialize changed the model's parameters")
    # A model built on the meta device fails in init_weights, after setup() took nvme_path.
    meta = torch.nn.Sequential(torch.nn.Linear(8, 8, device="meta"), torch.nn.Linear(8, 8, device="meta"))
    on_meta = raises(lambda: st.initialize(meta, cfg), strata.StrataError, "tensor '0.weight'", "a meta-device model")
    check(hooks_of(meta) == 0 and meta[0].weight.is_meta and meta[0].weight.shape == (8, 8),
          "a failed initialize left hooks or changed the parameters")
    small = raises(lambda: st.initialize(Net(), cfg, device_budget=1000), strata.StrataError, "too small",
                   "a device budget below the minimum")
    wide = raises(lambda: st.initialize(Net().double(), cfg), strata.StrataError,
                  "parameter 'blocks.0.lin.weight' is torch.float64", "a float64 parameter")
    check(st.MIN_TORCH <= st._version, "the torch version checked at import")
    again = st.initialize(Net(), cfg)  # the same nvme_path, while the failures are still referenced
    x, y = data(1)[0]
    again.backward(loss(again, x, y))
    check(again.step()["step"] == 1, "an initialize after failed ones trains")
    again.close()
    del failed, on_meta, small, wide
print("initialize: a failure removes its hooks, leaves the parameters, closes its engine and frees nvme_path")

finish()
