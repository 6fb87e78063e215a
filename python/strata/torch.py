"""A torch model trained by Strata's ZeRO engine, in DeepSpeed's shape:

    engine = strata.torch.initialize(model, config)
    loss = engine(batch)            # the model's forward, blocks gathered as they run
    engine.backward(loss)           # gradients handed to the engine block by block
    engine.step()                   # at the gradient-accumulation boundary: the optimizer

Each block (the elements of the model's ModuleLists and Sequentials and its other children
with parameters, looked for inside children that hold a ModuleList: find_blocks; or the
`blocks` given) is one engine layer; the parameters of no block (the model's own, a
container's) are one more layer, gathered while the model's forward runs. A block's frozen
parameters (requires_grad=False: a base under LoRA adapters) are a frozen engine layer of
their own, gathered with it, holding no gradient or optimizer state (torch_layers.py). Its parameters are
registered under their names in the model and start from the model's own values; from
then on they live in the engine: before a block's forward its layer is gathered and the
parameters' `.data` point at the gathered values (a copy Python owns: strata.View says
why), after it they are released (an empty tensor stands in). Tensors autograd saves that
are views of a gathered parameter are saved as (layer, parameter, offset, sizes, strides)
and rebuilt from the buffer the layer is gathered into again in backward (saved-tensor
hooks), so nothing holds a released layer. In backward, a hook on the block's output (or the first rebuilt tensor) gathers the
layer again, each parameter's gradient hook writes its gradient (times the loss scale) into
the engine's gradient buffer, and when the block's last gradient is in, the layer's
gradients are reduced; the layer is released (and the gradients torch accumulated dropped)
at the next block's backward or the end of backward, once torch has accumulated the last
gradient into the parameter. A parameter shared by two blocks (tied weights: an LM head that
reuses the token embedding) belongs to the first; the other block gathers that layer too
while it runs, and the parameter's gradient, summed over both uses, is handed over once.
Several backward() calls can make one micro-batch (all but the last pass micro_batch_end=False):
their gradients are summed in fp32 between the calls and reduced once, by the last.
A forward with gradients off (torch.no_grad(), outside a step: validation, generation) runs
between steps as the engine's evaluation: the same gathers, no gradients, nothing recorded.
Misuse is survived: an exception in forward or backward (a user error in a module) drops
the step in progress (gathered layers released, its gradients discarded, nothing updated:
abandon_step()) before it propagates, so the next forward starts a new step; a failed
initialize removes its hooks, gives the parameters back their tensors and closes its engine.
Between steps, module_state_dict() and gathered_parameters() give the module's parameters in
full (read-only); close() leaves the trained values in the module (frozen ones as they were
in the compute dtype: exact in fp32; under bf16 the engine holds them in bf16, as DeepSpeed's
bf16 mode holds a module's frozen parameters). Works on the host device,
where the engine's memory is host RAM.
"""
import torch

from . import Engine, StrataError
from .torch_layers import LayerMap, find_blocks, first_grad_tensor, hidden_size_of
from .torch_state import StateMixin

__all__ = ["initialize", "find_blocks", "hidden_size_of", "ModelEngine", "MIN_TORCH"]

# Saved-tensor hooks (torch.autograd.graph.saved_tensors_hooks) arrived in torch 1.10 and their
# semantics settled in 1.13, the version the tests run with (Debian 12's python3-torch).
MIN_TORCH = (1, 13)
_version = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
if _version < MIN_TORCH:
    raise StrataError(f"strata.torch needs torch >= {MIN_TORCH[0]}.{MIN_TORCH[1]} (its saved-tensor hooks); this is "
                      f"torch {torch.__version__}: upgrade it (Debian 12: apt-get install python3-torch)")

_TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def initialize(model, config, blocks=None, device="host", device_budget=0, seed=0, total_steps=0):
    """Returns a ModelEngine training `model` with the DeepSpeed-style `config` (dict or path).
    A config written for the Hugging Face trainer runs as it does from the CLI: its "auto"
    values are filled from the model (hidden_size_of) and total_steps (the scheduler's
    total_num_steps; 0: not known, and an "auto" that needs it is refused naming the key)."""
    if device != "host":
        raise StrataError(f"strata.torch runs on the host device for now (device='{device}' asked): its parameter "
                          f"views are host memory; train on GPUs with the C++ API or strata train --device cuda")
    return ModelEngine(model, config, blocks if blocks is not None else find_blocks(model), device, device_budget, seed,
                       total_steps)


def _as_tensor(view, shape):
    t = torch.from_numpy(view.array)
    if view.dtype == "bf16":
        t = t.view(torch.bfloat16)
    return t.view(shape)


class ModelEngine(StateMixin):
    def __init__(self, model, config, blocks, device, device_budget, seed, total_steps=0):
        self.module = model
        self.engine = None
        self._hooks = []
        originals = {id(p): p.data for p in model.parameters()}
        try:
            self._build(model, config, blocks, device, device_budget, seed, total_steps)
        except BaseException:
            # A failed initialize undoes itself: no hook stays on the model, every parameter holds
            # its own tensor again, and the engine goes now (its memory, its lock on nvme_path),
            # not when a traceback that references this half-made object is dropped.
            for h in self._hooks:
                h.remove()
            self._hooks = []
            for p in model.parameters():
                if id(p) in originals:
                    p.data = originals[id(p)]
            if self.engine is not None:
                self.engine.close()
            raise

    def _build(self, model, config, blocks, device, device_budget, seed, total_steps):
        for n, p in model.named_parameters():
            if p.device.type not in ("cpu", "meta"):
                raise StrataError(f"parameter '{n}' is on {p.device}: strata.torch runs on the host device and takes "
                                  f"the model's values from CPU memory; call model.cpu() before initialize")
            if p.dtype not in _TORCH_DTYPES.values():
                raise StrataError(f"parameter '{n}' is {p.dtype}: the engine trains fp32, bf16 and fp16 parameters; "
                                  f"convert the model (model.float()) before initialize")
        self.engine = Engine(config, device=device, device_budget=device_budget, seed=seed,
                             hidden_size=hidden_size_of(model), total_steps=total_steps)
        layers = LayerMap(model, blocks)
        self._blocks = layers.units  # the modules whose forward gathers, one per unit
        self._params = layers.params  # per engine layer: [(name, parameter)]
        self._frozen = layers.frozen  # frozen engine layers: gathered, never given a gradient
        self._unit_of = layers.unit_of
        self._together = layers.together  # per unit: the other layers its forward gathers
        self._shapes = {id(p): tuple(p.shape) for p in model.parameters()}
        self._dtypes = {n: p.dtype for n, p in model.named_parameters()}
        for layer, mine in enumerate(self._params):
            for name, p in mine:
                self.engine.register(name, list(p.shape) or [1], layer)  # a 0-d parameter is one element
            if layer in self._frozen:
                self.engine.freeze(layer)
        self.engine.setup()
        start = {n: p.detach().to(torch.float32).reshape(-1).contiguous() for ps in self._params for n, p in ps}
        self.engine.init_weights(lambda name, elem, count: start[name][elem:elem + count].numpy())
        self._empty = None
        self._grads = {}     # layer -> {parameter id: gradient view} while its backward runs
        self._waiting = {}   # layer -> parameters whose gradient has not arrived
        self._in_step = False
        self._eval = False
        self._lent = False  # inside gathered_parameters()
        self._micro = 0
        self._generation = 0  # steps begun; what a step recorded for backward names its own
        self._storage = {}  # storage address of a gathered parameter -> (layer, index)
        self._reduced = []  # layers whose gradients are in, released at the next block's backward
        self._handed = set()  # layers whose gradients this backward reduced
        self._frozen_live = set()  # frozen layers backward gathered (for saved views), released at another unit's
        self._summing = False  # this backward adds into _pending instead of reducing (several per micro-batch)
        self._pending = {}  # layer -> {parameter id: fp32 sum of its gradients} over the micro-batch's backwards
        self._open = False  # a backward(micro_batch_end=False) ran: the micro-batch's gradients are in _pending
        self.accumulation = self.engine.accumulation_steps
        self.compute_dtype = _TORCH_DTYPES[self.engine.compute_dtype]
        for layer, block in enumerate(self._blocks):
            self._hooks.append(block.register_forward_pre_hook(self._pre_forward(layer)))
            self._hooks.append(block.register_forward_hook(self._post_forward(layer)))
            for _, p in self._params[layer]:
                self._hooks.append(p.register_hook(self._on_grad(layer, p)))
        for layer in range(len(self._params)):
            self._point(layer, None)

    # Parameters point at the engine's buffers while their layer is gathered, else at an empty tensor.
    def _point(self, layer, views):
        for i, (_, p) in enumerate(self._params[layer]):
            self._storage.pop(p.data.storage().data_ptr(), None)
            if views is None:
                p.data = torch.empty(0, dtype=p.dtype)
            else:
                p.data = _as_tensor(views[i], self._shapes[id(p)])
                self._storage[p.data.storage().data_ptr()] = (layer, i)

    # Saved-tensor hooks: a view of a gathered parameter is saved by where it lies in it.
    def _pack(self, t):
        where = self._storage.get(t.storage().data_ptr()) if t.numel() else None
        if where is None:
            return t
        return ("strata", self._generation, where[0], where[1], t.storage_offset(), tuple(t.size()),
                tuple(t.stride()))

    def _check_generation(self, generation):
        if generation != self._generation or not self._in_step:
            raise StrataError("backward of a forward from an abandoned step (an exception in forward or backward, or "
                              "abandon_step(), dropped it): run the micro-batch's forward again")

    def _unpack(self, packed):
        if not isinstance(packed, tuple):
            return packed
        _, generation, layer, index, offset, size, stride = packed
        self._check_generation(generation)
        self._backward_gather(layer)
        base = self._params[layer][index][1].data
        return torch.as_strided(base, size, stride, offset)

    def _pre_forward(self, layer):
        def hook(_block, _inputs):
            if self._lent:  # gathered_parameters(): the module runs as plain torch
                return
            if not self._in_step and not self._eval:
                self.engine.begin_step()
                self._in_step = True
                self._generation += 1
            if self._params[layer]:  # a block whose parameters are all shared is no layer of its own
                self._point(layer, self.engine.gather(layer))
            for other in self._together[layer]:
                self._point(other, self.engine.gather(other))
        return hook

    def _post_forward(self, layer):
        def hook(_block, _inputs, output):
            if self._lent:
                return
            if torch.is_grad_enabled() and self._params[layer]:
                first = first_grad_tensor(output)
                if first is not None:
                    first.register_hook(self._pre_backward(layer, self._generation))
            if self._params[layer]:
                self.engine.release(layer)
                self._point(layer, None)
            for other in self._together[layer]:
                self.engine.release(other)
                self._point(other, None)
        return hook

    def _release_reduced(self):
        for layer in self._reduced:
            self.engine.release(layer)
            self._point(layer, None)
            for _, p in self._params[layer]:
                p.grad = None  # the engine holds the gradients
        self._reduced = []

    def _release_frozen(self, keep_unit=None):
        """Frozen layers gathered in backward, but those of keep_unit: their saved views were
        rebuilt as copies Python owns, so releasing them early costs at most a second gather."""
        for layer in sorted(self._frozen_live):
            if self._unit_of[layer] != keep_unit:
                self._frozen_live.discard(layer)
                self.engine.release(layer)
                self._point(layer, None)

    def _backward_gather(self, layer):
        if layer in self._waiting or layer in self._frozen_live:
            return
        self._release_reduced()
        self._release_frozen(keep_unit=self._unit_of[layer])
        self._point(layer, self.engine.gather(layer))
        if layer in self._frozen:  # no gradient to wait for
            self._frozen_live.add(layer)
            return
        if not self._summing:
            buffers = self.engine.grad_buffers(layer)
            self._grads[layer] = {id(p): _as_tensor(buffers[i], self._shapes[id(p)])
                                  for i, (_, p) in enumerate(self._params[layer])}
        self._waiting[layer] = {id(p) for _, p in self._params[layer]}

    def _pre_backward(self, layer, generation):
        def hook(grad):
            self._check_generation(generation)
            self._backward_gather(layer)
            return grad
        return hook

    def _on_grad(self, layer, p):
        def hook(grad):
            if self._lent:
                return grad
            if self._summing:  # summed over the micro-batch's backward calls in fp32, reduced at its end
                pending = self._pending.setdefault(layer, {})
                if id(p) in pending:
                    pending[id(p)].add_(grad.to(torch.float32))
                else:
                    pending[id(p)] = grad.to(torch.float32, copy=True)
                waiting = self._waiting.get(layer)
                if waiting is not None:
                    waiting.discard(id(p))
                    if not waiting:
                        del self._waiting[layer]
                        self._reduced.append(layer)
                return grad
            waiting = self._waiting.get(layer)
            if waiting is None and layer not in self._handed:  # no saved tensor or output hook gathered it
                self._backward_gather(layer)
                waiting = self._waiting[layer]
            if waiting is None or id(p) not in waiting:
                raise StrataError(f"a gradient of layer {layer} arrived outside its backward (a parameter used "
                                  f"outside its block, or twice in one micro-batch)")
            self._grads[layer][id(p)].copy_(grad)
            waiting.discard(id(p))
            if not waiting:
                del self._waiting[layer], self._grads[layer]
                self.engine.reduce_grads(layer)
                self._handed.add(layer)
                self._reduced.append(layer)
            return grad
        return hook

    def __call__(self, *args, **kwargs):
        """The model's forward; floating-point tensor arguments are cast to the compute dtype.
        An exception inside it (a user error in a module) drops the step in progress
        (abandon_step()) before it propagates, so the next forward starts a new step; an
        evaluation's drops only the evaluation."""
        cast = lambda a: a.to(self.compute_dtype) if isinstance(a, torch.Tensor) and a.is_floating_point() else a  # noqa
        args = tuple(cast(a) for a in args)
        kwargs = {k: cast(v) for k, v in kwargs.items()}
        if not torch.is_grad_enabled() and not self._in_step:
            self.engine.begin_eval()
            self._eval = True
            try:
                out = self.module(*args, **kwargs)
            except BaseException:
                self._abandon()
                raise
            self._eval = False
            self.engine.end_eval()
            return out
        try:
            with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
                return self.module(*args, **kwargs)
        except BaseException:
            self._abandon()
            raise

    def backward(self, loss, retain_graph=False, micro_batch_end=True):
        """loss.backward() with the engine's loss scale; every block's gradients reduced. An
        exception inside it drops the step in progress before it propagates.

        Several backward() calls make one micro-batch when all but its last pass
        micro_batch_end=False (two halves of a batch, two losses of one forward with
        retain_graph=True): their gradients are summed in fp32 (one rounding to the compute
        dtype at the end, where torch's .grad rounds at each call) and reduced once, by the
        last call, so every call counts (the gradients of every call but the last were
        dropped by DeepSpeed's ZeRO-1/2 CPU offload until April 2026). The sums are held in
        Python between the calls, like torch's .grad: one fp32 copy of the gradients the
        calls reached."""
        try:
            self._summing = self._open or not micro_batch_end
            self._handed = set()  # layers whose gradients this backward reduced
            scale = self.engine.loss_scale()
            (loss * scale if scale != 1.0 else loss).backward(retain_graph=retain_graph)
            self._release_reduced()
            self._release_frozen()
            if self._summing:
                self._release_partial()
                self._open = not micro_batch_end
                if micro_batch_end:
                    self._reduce_pending()
            elif self._waiting:
                raise StrataError(f"backward left layers {sorted(self._waiting)} without all their gradients: every "
                                  f"parameter of a block must get a gradient in each micro-batch")
        except BaseException:
            self._abandon()
            raise
        finally:
            self._summing = False
        if micro_batch_end:
            self._micro += 1

    def _release_partial(self):
        """Layers a summing backward reached without giving every parameter a gradient (its loss
        does not depend on them all) are released at its end; the micro-batch's last call checks."""
        for layer in sorted(self._waiting):
            self.engine.release(layer)
            self._point(layer, None)
        for ps in self._params:
            for _, p in ps:
                p.grad = None
        self._waiting = {}

    def _reduce_pending(self):
        """The micro-batch's summed gradients into the engine, layer by layer from the last, one
        reduction each (the engine's gradient buffer is held only while it is filled)."""
        pending, self._pending = self._pending, {}
        missing = [name for layer, ps in enumerate(self._params) for name, p in ps
                   if layer not in self._frozen and id(p) not in pending.get(layer, {})]
        if missing:
            raise StrataError(f"parameters {missing} got no gradient in any backward() of the micro-batch: every "
                              f"parameter of a block must get a gradient in each micro-batch")
        for layer in reversed(range(len(self._params))):
            if not self._params[layer] or layer in self._frozen:
                continue
            buffers = self.engine.grad_buffers(layer)
            for i, (_, p) in enumerate(self._params[layer]):
                _as_tensor(buffers[i], self._shapes[id(p)]).copy_(pending[layer][id(p)])
            self.engine.reduce_grads(layer)

    def step(self):
        """The optimizer at the gradient-accumulation boundary (else nothing); returns the
        engine's step result there, None elsewhere."""
        if self._open:
            raise StrataError("step() inside a micro-batch whose last backward() is still to come: the last "
                              "backward() of a micro-batch passes micro_batch_end=True (the default)")
        if self._micro < self.accumulation:
            if self._micro == 0:
                raise StrataError("step() without backward(): run forward and backward for each micro-batch first")
            return None
        self._micro = 0
        self._in_step = False
        try:
            return self.engine.step()
        except BaseException:
            self._abandon()  # a step() refused by its checks would leave the engine inside the step
            raise

    def abandon_step(self):
        """Drops the step in progress: gathered layers released, gradients handed over so far
        (every micro-batch's) discarded, nothing updated; the next forward starts a new step.
        forward(), backward() and step() call it on an exception; call it when the training
        loop itself fails between forward and backward. A backward of the dropped step's
        forward raises StrataError. Outside a step it does nothing."""
        self._abandon()

    def _abandon(self):
        self._waiting, self._grads, self._reduced, self._storage = {}, {}, [], {}
        self._pending, self._open, self._summing, self._frozen_live = {}, False, False, set()
        for layer in range(len(self._params)):
            self._point(layer, None)
            for _, p in self._params[layer]:
                p.grad = None
        self._in_step = self._eval = False
        self._micro = 0
        self._generation += 1  # what the dropped step saved for backward is refused
        self.engine.abandon_step()

    def close(self):
        """Frees the engine now: its memory, its swap files and its lock on nvme_path (a second engine on the same
        nvme_path is refused while this one lives). The hooks hold the engine in a reference cycle, so without this
        it goes only when the garbage collector runs. The model keeps the trained values: each parameter holds its
        fp32 master in the parameter's own dtype (outside a step; a step in progress is dropped first), so
        model.state_dict(), torch.save and evaluating the module without the engine work afterwards."""
        if self.engine.closed:
            return
        trained = None
        try:
            if self._in_step or self._eval:
                self._abandon()
            if self.engine.states_offloaded:  # offload_states() without reload_states(): back first
                self.engine.reload_states()
            trained = self._full_values()
        finally:  # the engine goes even when its values cannot be read (the error propagates)
            for h in self._hooks:
                h.remove()
            self._hooks = []
            if trained is not None:
                for ps in self._params:
                    for name, p in ps:
                        p.data = trained[name]
            self.engine.close()

    def memory(self):
        return self.engine.memory()

    def io_stats(self):
        return self.engine.io_stats()

    def save(self, root, trainer_state=None, keep=0):
        self.engine.save(root, trainer_state, keep)

    def load(self, path):
        return self.engine.load(path)
