// The process RSS of one rank of `strata train`, as `strata estimate` predicts it (the host
// RAM a run needs, beyond the engine's ledger). Its parts:
//   base     this executable with its libraries loaded, before anything is set up: measured
//            as the estimating process's own resident set at the same point (the same
//            binary and libraries; `strata train` logs its own as rss.base_bytes);
//   runtime  what the compute takes at its first use (TBB's worker threads and their
//            malloc arenas; for the GPT, its code, oneDNN's JIT kernels and thread pool),
//            measured by running it once here at a small size (a one-block GPT);
//   trainer  the trainer's own host arrays (MLP: its teacher matrix, one layer's fp32
//            weights and gradients, the activations; GPT: the token data);
//   engine   the engine's host ledger at its peak (pinned and pageable), and what its open
//            NVMe swap files keep in host RAM (checksum tables, bookkeeping);
//   device   the host-emulated device's memory at its peak (its pages are host RAM once
//            touched): the engine's device ledger and the trainer's activations.
// Not counted: the threads the engine starts (I/O reactor, Gloo), io_uring rings, and heap
// the allocator keeps after a free; they are what the comparison in
// scripts/estimate_sweep.py measures as the error.
#pragma once

#include <cstdint>
#include <string>

#include "engine/config.h"
#include "engine/memory_estimate.h"
#include "train/model.h"

namespace strata::train {

struct RssEstimate {
  std::uint64_t base = 0, runtime = 0, trainer = 0, engine = 0, device = 0;
  std::uint64_t peak() const noexcept { return base + runtime + trainer + engine + device; }
};

// Runs the compute the model of `o` uses once at a small size (for the GPT: one training
// pass of a one-block model of its shape) and returns how much the process's resident set
// grew once that is freed (the runtime part); call it once per process.
std::uint64_t measure_runtime_rss(const ModelOptions& o, const engine::EngineConfig& config);

// The trainer's host arrays (the trainer part) for `o` under `config`; the GPT's token data
// from the size of o.data (2 bytes a token; 0 when o.data is empty).
std::uint64_t trainer_host_bytes(const ModelOptions& o, const engine::EngineConfig& config);

}  // namespace strata::train
