"""How strata.torch cuts a torch module into engine layers.

Blocks (find_blocks, or the ones given) are the units a forward hook gathers. Each unit's
trainable parameters are one engine layer, numbered as the unit; the parameters of no block
(the model's own, a container's) are one more unit, the model itself. A unit's frozen
parameters (requires_grad=False: a pretrained base under LoRA adapters, frozen embeddings)
are an engine layer of their own, numbered after every unit and frozen in the engine (no
gradient, no optimizer state), gathered together with their unit. A parameter shared by two
units (tied weights) belongs to the first; the other gathers that layer too while it runs.
"""
import torch


def _has_params(module):
    return any(True for _ in module.parameters())


def _is_container(module):
    """A ModuleList (never called itself), or a module holding one below it (a Hugging Face
    causal LM's `model` with its `layers`): its children are looked into instead."""
    return isinstance(module, torch.nn.ModuleList) or any(
        isinstance(m, torch.nn.ModuleList) for m in module.modules() if m is not module)


def find_blocks(model):
    """The model's blocks, in registration order: the elements of its ModuleLists and
    Sequentials, its other children with parameters, and within a child that holds a
    ModuleList below it (nested layouts) the same, recursively. Parameters of no block (a
    model's own nn.Parameter, a container's) are the engine's last unit (LayerMap)."""
    blocks = []

    def expand(module):
        for child in module.children():
            if not _has_params(child):
                continue
            if isinstance(child, (torch.nn.ModuleList, torch.nn.Sequential)):
                for m in child:
                    if _has_params(m):
                        expand(m) if _is_container(m) else blocks.append(m)
            elif _is_container(child):
                expand(child)
            else:
                blocks.append(child)

    expand(model)
    return blocks


def first_grad_tensor(output):
    """The first tensor that requires a gradient in a module's output (a tensor, or tuples,
    lists and dicts of them, as Hugging Face's ModelOutput), else None."""
    if isinstance(output, torch.Tensor):
        return output if output.requires_grad else None
    items = output.values() if isinstance(output, dict) else output if isinstance(output, (tuple, list)) else ()
    for item in items:
        found = first_grad_tensor(item)
        if found is not None:
            return found
    return None


def hidden_size_of(model):
    """The model's hidden size for a config's "auto" values: its Hugging Face config's
    hidden_size (d_model, n_embd), else the largest dimension of any 2-D parameter, as the
    CLI derives it."""
    hf = getattr(model, "config", None)
    for key in ("hidden_size", "d_model", "n_embd"):
        if isinstance(getattr(hf, key, None), int):
            return getattr(hf, key)
    return max((max(p.shape) for p in model.parameters() if p.dim() == 2), default=0)


class LayerMap:
    """The engine layers of `model` cut at `blocks`:
    units     the modules whose forward gathers (the blocks, then the model when it has
              parameters of no block);
    params    per engine layer, [(name, parameter)] in registration order: layer u < len(units)
              holds unit u's trainable parameters (possibly none), the layers after it one
              unit's frozen parameters each;
    frozen    the frozen layers' ids;
    unit_of   per engine layer, its unit;
    together  per unit, the other layers its forward gathers (its frozen layer, the layers
              owning the tied parameters it uses), sorted."""

    def __init__(self, model, blocks):
        names = {id(p): n for n, p in model.named_parameters()}
        self.units = list(blocks)
        owner, groups, shared = {}, {}, []  # parameter id -> (frozen, unit); (frozen, unit) -> params

        def take(unit, params, uses):
            for p in params:
                if id(p) in owner:
                    if owner[id(p)][1] != unit:
                        uses.add(owner[id(p)])
                    continue
                key = (not p.requires_grad, unit)
                owner[id(p)] = key
                groups.setdefault(key, []).append((names[id(p)], p))

        for unit, block in enumerate(self.units):
            uses = set()
            take(unit, block.parameters(), uses)
            shared.append(uses)
        # The parameters of no block: one more unit, gathered around the model's whole forward.
        inside = {id(m) for block in self.units for m in block.modules()}
        root, uses = len(self.units), set()
        take(root, [p for m in model.modules() if id(m) not in inside for p in m.parameters(recurse=False)], uses)
        if uses or any(unit == root for _, unit in groups):
            self.units.append(model)
            shared.append(uses)
        n = len(self.units)
        ids = {(False, u): u for u in range(n)}
        self.params = [groups.get((False, u), []) for u in range(n)]
        self.unit_of = list(range(n))
        for u in range(n):
            if (True, u) in groups:
                ids[(True, u)] = len(self.params)
                self.params.append(groups[(True, u)])
                self.unit_of.append(u)
        self.frozen = set(range(n, len(self.params)))
        self.together = []
        for u in range(n):
            with_ = {ids[key] for key in shared[u]}
            if (True, u) in ids:
                with_.add(ids[(True, u)])
            self.together.append(sorted(with_))
