// The model's training pass timed in this process on the host device (forward, backward,
// every gradient; no engine traffic) on the pass `strata bench gpt` and `strata bench llama`
// time: what `strata plan` predicts a step's compute from when it runs inside a library call
// (the C API's strata_plan). Unlike those benches it runs the passes back to back, with no
// GEMM yardstick between them, in the caller's process (its threads, its caches): its times,
// and so the plan's order of near-equal candidates, can differ from the command's.
#pragma once

#include <string>

#include "train/model.h"

namespace strata::train {

// Median seconds of `iters` passes after one warm-up: the GPT (m.model "gpt") or a
// Llama-family directory, at micro-batch `micro`, re-materialization `remat`
// (never|except_last|always) and `products` (fp32, or bf16 where the CPU has bf16 dot
// products), on parameters from the model's own initialization and random tokens.
double profile_pass(const ModelOptions& m, int micro, const std::string& remat, const std::string& products, int iters);

}  // namespace strata::train
