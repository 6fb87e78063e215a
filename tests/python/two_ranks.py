"""One rank of a two-rank strata.torch run (under `strata launch -n 2`): a 3-layer MLP at
the ZeRO stage given, its middle layer frozen, each rank on its own batches; then rank 0 alone
edits a weight inside gathered_parameters(modifier_rank=0) (the engine broadcasts its values to
every rank) and saves the model with save_pretrained (rank 0 writes, both read). Prints the
rank, whether the edit reached it, and a hash of the final fp32 parameters, which
two_ranks_test.sh compares across ranks and stages. Usage: two_ranks.py STAGE OUT_DIR"""
import hashlib
import os
import sys

import torch
import strata.torch

stage = int(sys.argv[1])
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(3)])
model[1].requires_grad_(False)
config = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
          "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0}}
engine = strata.torch.initialize(model, config)
g = torch.Generator().manual_seed(1 + engine.engine.rank)
for step in range(5):
    for micro in range(2):
        engine.backward((engine(torch.randn(4, 16, generator=g)) ** 2).mean())
    engine.step()
before = engine.parameters_numpy()["0.weight"].copy()
with engine.gathered_parameters(modifier_rank=0) as module:
    if engine.engine.rank == 0:
        with torch.no_grad():
            module[0].weight.add_(1.0)
params = engine.parameters_numpy()
edited = bool((params["0.weight"] == before + 1.0).all())
engine.save_pretrained(os.path.join(sys.argv[2], f"stage{stage}"), config={"model_type": "mlp"}, dtype="fp32")
digest = hashlib.sha256(b"".join(params[n].tobytes() for n in sorted(params))).hexdigest()
print(f"rank {engine.engine.rank} edit {'reached' if edited else 'MISSING'} of {engine.engine.world_size}: {digest}")
