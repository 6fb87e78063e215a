#!/usr/bin/python3
"""`strata estimate` for published Hugging Face configs (scripts/configs/hf/: Llama 3.2 1B,
Llama 3.1 8B and 70B, SmolLM2-135M) fine-tuned with ZeRO-3 in bf16, optimizer state and
parameters on NVMe (DeepSpeed's ZeRO-Infinity keys), re-materialization on, one rank: one
Markdown row per model with the parameters, the peak bytes per tier, the process RSS and
DeepSpeed's own estimator's figures. Nothing is allocated; config.json alone suffices.
Usage: scripts/hf_estimates.py [--strata build/bin/strata] [--seq-len 2048] [--micro-batch 1]
"""
import argparse
import json
import os
import subprocess
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = ["smollm2-135m", "llama-3.2-1b", "llama-3.1-8b", "llama-3.1-70b"]


def gib(b):
    return f"{b / 2**30:.1f} GiB"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", default=os.path.join(HERE, "..", "build", "bin", "strata"))
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--micro-batch", type=int, default=1)
    ap.add_argument("--device-budget", default="80GiB")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = os.path.join(tmp, "ds.json")
        with open(cfg, "w") as f:
            json.dump({"train_micro_batch_size_per_gpu": a.micro_batch, "gradient_accumulation_steps": 1,
                       "bf16": {"enabled": True}, "activation_checkpointing": {"partition_activations": False},
                       "optimizer": {"type": "AdamW", "params": {"lr": 2e-5}},
                       "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                                             "sub_group_size": 100000000, "reduce_bucket_size": 50000000,
                                             "stage3_max_live_parameters": 2000000000,
                                             "offload_optimizer": {"device": "nvme", "nvme_path": tmp},
                                             "offload_param": {"device": "nvme", "nvme_path": tmp,
                                                               "buffer_size": 100000000, "max_in_cpu": 0}},
                       "memory_budget": {"device": a.device_budget}}, f)
        print(f"ZeRO-3, bf16, optimizer and parameters on NVMe, micro-batch {a.micro_batch} x seq {a.seq_len}, "
              "remat always, one rank")
        print()
        print("| model | parameters | device peak | host peak | NVMe | process RSS | DeepSpeed's estimator (GPU, CPU) |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for m in MODELS:
            out = subprocess.run([a.strata, "estimate", "--model", os.path.join(HERE, "configs", "hf", m),
                                  "--config", cfg, "--seq-len", str(a.seq_len), "--json"],
                                 check=True, capture_output=True, text=True).stdout
            j = json.loads(out)
            t = j["tiers"]
            ds = j["deepspeed"]
            print(f"| {m} | {j['parameters'] / 1e9:.2f}B | {gib(j['device_total'])} | {gib(t['host']['total'])} | "
                  f"{gib(t['nvme']['total'])} | {gib(j['rss']['peak_bytes'])} | "
                  f"{gib(ds['gpu_bytes'])}, {gib(ds['cpu_bytes'])} |")


if __name__ == "__main__":
    main()
