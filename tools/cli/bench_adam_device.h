// `strata bench adam --device host|cuda`: the Adam/AdamW step on a device stream
// (optim::adam_step_async: the CUDA kernel on a GPU, the CPU kernel on the host-emulated
// device's worker) against that device's memory roofline: on a GPU a device-to-device copy
// moving the bytes the step reads and writes, on the host device the CPU step's streaming pass
// (optim/roofline.h). Step and roofline alternate; the fraction is the median of the
// per-iteration ratios.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "optim/adam.h"
#include "optim/step_args.h"
#include "runtime/core/dtype.h"
#include "runtime/core/moment_format.h"

namespace strata::cli {

// Deterministic pseudo-random values in [lo, hi) (splitmix64 of the index), written in
// parallel so every page is first touched by the workers that will stream it.
void fill_uniform(void* dst, DType t, std::size_t n, std::uint64_t seed, float lo, float hi);
// fill_uniform's values as moments of format f (moment_bytes(f, n) bytes at dst).
void fill_moments(void* dst, MomentFormat f, Moment which, std::size_t n, std::uint64_t seed, float lo, float hi);

// `shape` gives n and the dtypes (its pointers are ignored); copy_out: a 16-bit parameter copy
// (shape.copy_dtype) is written in the same pass. Returns the figures as JSON (step_ms, gbps,
// roofline_gbps, fraction_of_roofline, ...).
nlohmann::json bench_adam_device(const std::string& device, const optim::AdamConfig& config,
                                 const optim::StepArgs& shape, bool copy_out, int iters);

}  // namespace strata::cli
