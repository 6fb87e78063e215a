"""The machine's GEMM rate as PyTorch reaches it: torch.matmul at full threads on the GPT block's
twelve weight products (forward, input gradient and weight gradient of the qkv, attention
output, MLP up and MLP down layers) at ROWS tokens and width D_MODEL, operands already in the
products' precision (bf16 tensors for bf16, so no casts are timed; fp32 otherwise, TF32 off).
Each product is timed for at least 0.3 s after two warm-up calls; prints the sum of their
FLOPs over the sum of their times, in GFLOP/s, the yardstick bench_gpt_vs_torch.sh divides a
training step's model FLOP/s by.
Usage: bench_matmul_torch.py D_MODEL ROWS THREADS [DEVICE [PRECISION]]"""
import sys
import time

import torch


def main():
    C, rows, threads = (int(a) for a in sys.argv[1:4])
    device = sys.argv[4] if len(sys.argv) > 4 else "cpu"
    dtype = torch.bfloat16 if len(sys.argv) > 5 and sys.argv[5] == "bf16" else torch.float32
    torch.set_num_threads(threads)
    torch.backends.cuda.matmul.allow_tf32 = False

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    flops = seconds = 0.0
    for ic, oc in ((C, 3 * C), (C, C), (C, 4 * C), (4 * C, C)):
        # out = x W; dx = dy W^T; dW = x^T dy, with W stored [in, out] as the GPT's weights are.
        x = torch.randn(rows, ic, device=device).to(dtype)
        w = torch.randn(ic, oc, device=device).to(dtype)
        dy = torch.randn(rows, oc, device=device).to(dtype)
        for a, b in ((x, w), (dy, w.t()), (x.t(), dy)):
            for _ in range(2):
                torch.matmul(a, b)
            sync()
            n, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < 0.3:
                torch.matmul(a, b)
                n += 1
            sync()
            seconds += (time.perf_counter() - t0) / n
            flops += 2.0 * a.shape[0] * a.shape[1] * b.shape[1]
    print(f"torch_matmul_gflops {flops / seconds / 1e9:.1f}")


if __name__ == "__main__":
    main()
