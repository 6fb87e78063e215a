"""One rank of a two-rank strata.torch run (under `strata launch -n 2`): a 3-layer MLP at
the ZeRO stage given, each rank on its own batches; prints the rank and a hash of the final
fp32 parameters, which two_ranks_test.sh compares across ranks and stages."""
import hashlib
import sys

import torch
import strata.torch

stage = int(sys.argv[1])
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(3)])
config = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
          "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0}}
engine = strata.torch.initialize(model, config)
g = torch.Generator().manual_seed(1 + engine.engine.rank)
for step in range(5):
    for micro in range(2):
        engine.backward((engine(torch.randn(4, 16, generator=g)) ** 2).mean())
    engine.step()
params = engine.parameters_numpy()
digest = hashlib.sha256(b"".join(params[n].tobytes() for n in sorted(params))).hexdigest()
print(f"rank {engine.engine.rank} of {engine.engine.world_size}: {digest}")
