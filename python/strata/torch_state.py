"""The trained state in PyTorch's terms, between steps (StateMixin of strata.torch.ModelEngine):

    parameters_numpy()          every parameter's fp32 value (the masters; a frozen parameter's
                                compute-dtype value), {name: array}
    module_state_dict()         the module's state_dict with full tensors
    gathered_parameters(modifier_rank=None)
                                a context manager (DeepSpeed's GatheredParameters): the module holds
                                its full parameters inside it; with a modifier rank, what was
                                written to them goes back to the engine on exit (masters and compute
                                copies; optimizer moments and step counters kept), else writes are
                                refused
    offload_states(), reload_states()
                                every byte the engine holds on the device to host RAM and back
                                bit for bit (DeepSpeed's names: RL trainers free the GPU for
                                generation between training phases); each returns the bytes moved
    save_pretrained(DIR)        a Hugging Face model directory of the module's parameters under
                                their names (LoRA adapters merged into their base weights, as PEFT's
                                merge_and_unload does), which transformers and `strata train --model
                                DIR` read

They read the engine a layer at a time (layer_parameters, collective: every rank calls them
in the same order): module_state_dict holds its result and one layer's fp32 values beside,
save_pretrained one unit's layers (a block's trainable and frozen ones) and rank 0 writes."""
import json

import numpy as np
import torch

from . import StrataError, write_hf_dir

_DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def _lora_parts(module):
    """(A, B, scaling) of a LoRA-wrapped Linear (PEFT's LoraLayer, its adapters in ModuleDicts
    under "default", or one with plain lora_A / lora_B Linears), else None."""
    if not all(hasattr(module, k) for k in ("base_layer", "lora_A", "lora_B", "scaling")):
        return None
    a, b, scaling = module.lora_A, module.lora_B, module.scaling
    if isinstance(a, torch.nn.ModuleDict):
        if list(a.keys()) != ["default"]:
            raise StrataError(f"save_pretrained merges one adapter per layer; this one has {list(a.keys())}")
        a, b, scaling = a["default"], b["default"], scaling["default"]
    return a, b, float(scaling)


class StateMixin:
    def _layer_values(self, layer):
        """{name: fp32 array} of engine layer `layer`'s parameters, read on its own (collective)."""
        ps = self._params[layer]
        counts = [int(np.prod(self._shapes[id(p)])) for _, p in ps]
        flat = self.engine.layer_parameters(layer, sum(counts)) if ps else None
        out, at = {}, 0
        for (name, p), n in zip(ps, counts):
            out[name] = flat[at:at + n].reshape(self._shapes[id(p)])
            at += n
        return out

    def parameters_numpy(self):
        """Every parameter's fp32 value, in registration order, as {name: array}: the fp32
        masters; a frozen parameter's value as the engine holds it (the compute dtype)."""
        out = {}
        for layer in range(len(self._params)):
            out.update(self._layer_values(layer))
        return out

    def _full_values(self):
        """{name: full tensor} of the engine's parameters in each parameter's dtype, read a layer at a time."""
        out = {}
        for layer in range(len(self._params)):
            for name, a in self._layer_values(layer).items():
                out[name] = torch.from_numpy(a.copy()).to(self._dtypes[name])
        return out

    def _between_steps(self, what):
        if self.engine.closed:
            raise StrataError(f"{what} after close(): the module already holds the trained values")
        if self._in_step or self._eval:
            raise StrataError(f"{what} inside a step or an evaluation: call it between steps (after step())")

    def module_state_dict(self):
        """The module's state_dict with full parameters (fp32 values in each parameter's dtype) where the
        engine holds placeholders; buffers as the module has them; tied parameters under each of their names.
        Between steps."""
        self._between_steps("module_state_dict()")
        full = self._full_values()
        by_id = {id(p): name for ps in self._params for name, p in ps}
        state = self.module.state_dict(keep_vars=True)
        out = type(state)()
        params = {id(p): p for p in self.module.parameters()}
        for key, t in state.items():
            owner = by_id.get(id(t)) if id(t) in params else None
            out[key] = full[owner] if owner is not None else t.detach().clone()
        return out

    def gathered_parameters(self, modifier_rank=None):
        """A context manager (DeepSpeed's GatheredParameters): inside it every parameter of the module holds its
        full value, so the module can be read, evaluated, saved or edited as plain torch; on exit the engine's
        placeholders come back. modifier_rank=None: read-only, a write is refused on exit (StrataError naming
        the parameter, nothing changed). modifier_rank=r: on exit rank r's values go to the engine, broadcast
        to every rank as DeepSpeed broadcasts them (every parameter's masters and compute copies; moments and
        step counters kept); with several ranks every rank leaves the context (a collective). Between steps."""
        if modifier_rank is not None and not 0 <= int(modifier_rank) < self.engine.world_size:
            raise StrataError(f"gathered_parameters(modifier_rank={modifier_rank}): not a rank of the "
                              f"{self.engine.world_size}")
        return _Gathered(self, modifier_rank)

    def offload_states(self):
        """Between steps: every byte the engine holds on the device (parameters, optimizer state, gradient
        accumulators) moves to host RAM within the host budget (what it cannot take to NVMe under the config's
        nvme_path), so the device is free for other work until
        reload_states(); forward, backward, step and the state calls refuse meanwhile. Returns the bytes moved."""
        self._between_steps("offload_states()")
        return self.engine.offload_states()

    def reload_states(self):
        """What offload_states() moved, back on the device bit for bit. Returns the bytes moved."""
        return self.engine.reload_states()

    def save_pretrained(self, out_dir, config=None, dtype=None, max_shard_bytes=5 * 10 ** 9):
        """Writes a Hugging Face model directory at out_dir (config.json; model.safetensors, or shards of at most
        max_shard_bytes with model.safetensors.index.json), complete or not there at all; out_dir must not exist
        or be empty. Tensors carry the module's parameter names (a tied parameter once, under its first name);
        a LoRA-wrapped Linear (base_layer, lora_A, lora_B, scaling, as PEFT makes them) is saved merged, as
        base_layer.weight + scaling * lora_B @ lora_A under the Linear's own name. config: the config.json
        object (dict); default: the module's Hugging Face config (module.config.to_dict()). dtype: "fp32",
        "bf16" or "fp16" (default: the engine's compute dtype). Returns the directory. Between steps."""
        self._between_steps("save_pretrained()")
        if config is None:
            hf = getattr(self.module, "config", None)
            if not hasattr(hf, "to_dict"):
                raise StrataError("save_pretrained() needs the model's config.json: pass config={...} (the module "
                                  "has no Hugging Face config)")
            config = hf.to_dict()
        plan = self._pretrained_plan()
        index = {name: i for i, (name, _, _) in enumerate(plan)}
        cache, current, done = {}, {}, [-1]  # layers of the unit being read; the tensor read last; its index

        def values_of(layer):
            if layer not in cache:
                unit = self._unit_of[layer]
                for other in [k for k in cache if self._unit_of[k] != unit]:
                    del cache[other]
                cache[layer] = self._layer_values(layer)
            return cache[layer]

        def catch_up(i):  # plan entries up to i, in order: the same collective reads on every rank
            while done[0] < i:
                name, scaling, parts = plan[done[0] + 1]
                arrays = [values_of(layer)[source] for layer, source in parts]
                current.clear()
                current[name] = arrays[0] if len(arrays) == 1 else (arrays[0].astype(np.float64) + scaling * (
                    arrays[2].astype(np.float64) @ arrays[1])).astype(np.float32)
                done[0] += 1

        if self.engine.rank != 0:  # the reads are collective; rank 0 writes
            catch_up(len(plan) - 1)
            return str(out_dir)

        def read(name, elem, count):
            catch_up(index[name])
            return current[name].reshape(-1)[elem:elem + count]

        shapes = {n: self._shapes[id(p)] for ps in self._params for n, p in ps}
        try:
            return write_hf_dir(out_dir, json.dumps(config), [(n, shapes[parts[0][1]]) for n, _, parts in plan],
                                read, dtype or _DTYPE_NAMES[self.compute_dtype], max_shard_bytes)
        except BaseException:
            catch_up(len(plan) - 1)  # the other ranks' reads still need this rank's part
            raise

    def _pretrained_plan(self):
        """[(name written, LoRA scaling, [(engine layer, parameter name)])] unit by unit: a parameter as it
        is, or a LoRA-wrapped Linear's weight as (base, lora_A, lora_B) to merge and its bias renamed."""
        names = {id(p): n for n, p in self.module.named_parameters()}
        layer_of = {n: layer for layer, ps in enumerate(self._params) for n, _ in ps}
        merges, renamed, consumed = {}, {}, set()
        for prefix, module in self.module.named_modules():
            parts = _lora_parts(module)
            if parts is None:
                continue
            a, b, scaling = parts
            base, an, bn = names[id(module.base_layer.weight)], names[id(a.weight)], names[id(b.weight)]
            merges[base] = (prefix + ".weight", scaling, [(layer_of[n], n) for n in (base, an, bn)])
            consumed.update((an, bn))
            if getattr(module.base_layer, "bias", None) is not None:
                renamed[names[id(module.base_layer.bias)]] = prefix + ".bias"
        plan = []
        for unit in range(len(self._blocks)):
            for layer in (k for k in range(len(self._params)) if self._unit_of[k] == unit):
                for n, _ in self._params[layer]:
                    if n in merges:
                        plan.append(merges[n])
                    elif n not in consumed:
                        plan.append((renamed.get(n, n), 1.0, [(layer, n)]))
        return plan


class _Gathered:
    def __init__(self, model_engine, modifier_rank):
        self.me = model_engine
        self.modifier_rank = modifier_rank
        self.values = None

    def __enter__(self):
        me = self.me
        me._between_steps("gathered_parameters()")
        self.values = me._full_values()
        for ps in me._params:
            for name, p in ps:
                p.data = self.values[name].clone()
        me._lent = True
        return me.module

    def __exit__(self, *exc):
        me = self.me
        me._lent = False
        written = {name: p.data for ps in me._params for name, p in ps}
        changed = [name for name, t in written.items() if not torch.equal(t, self.values[name])]
        for layer in range(len(me._params)):
            me._point(layer, None)
        if exc[0] is not None:
            return False
        if self.modifier_rank is None:
            if changed:
                raise StrataError(f"parameters {changed} were written inside gathered_parameters(): pass "
                                  f"modifier_rank=0 for the writes to reach the engine (read-only without); "
                                  f"nothing was changed")
            return False
        if not changed and me.engine.world_size == 1:
            return False
        # Collective on several ranks (each takes part whatever it wrote): the modifier rank's values, broadcast.
        flat = {n: t.detach().to(torch.float32).reshape(-1).contiguous().numpy() for n, t in written.items()}
        me.engine.write_weights(lambda name, elem, count: flat[name][elem:elem + count], int(self.modifier_rank))
        return False
