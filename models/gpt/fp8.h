// Simulated FP8 matrix products: each operand of a product is quantized to an FP8 format
// with a scale and dequantized back to fp32 before the product, which then sums in fp32.
// Scales are powers of two, so a dequantized value q / scale is exact in fp32 and every
// product of two of them is exact too: the result is what an FP8 tensor core computes with
// fp32 accumulation, up to the order of the sums.
//
// Recipe (the config's `fp8` block): the forward operands (activations, weights) in E4M3,
// the gradients in E5M2 ("hybrid", the default) or everything in E4M3 ("e4m3"). Per-tensor
// scales are delayed (Transformer Engine's recipe): each tensor keeps a history of its amax
// over the last amax_history_len optimizer steps, and a step quantizes with the scale its
// history gives (the history's max, or its most recent entry), scale = the largest power of
// two with amax * scale <= format max / 2^margin. A step's amax (the max over its
// micro-batches, and over the data-parallel ranks) enters the history when the step ends
// (roll()). Before any step has ended the history is empty and the tensor's own amax is
// used (current scaling), so the first step is not quantized at scale 1. With
// block_scaling, activations and gradients are scaled per 1 x 128 tile of a row and weights
// per 128 x 128 block, each by its own amax (no history). With scaling none every operand is
// cast at scale 1: for unit-scaled models (unit_scale.h), whose tensors are near unit variance
// by construction (amax is still recorded, for reports).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <utility>

#include "runtime/core/dtype.h"

namespace strata::model::fp8 {

enum class Format { hybrid, e4m3 };
enum class AmaxCompute { max, most_recent };
enum class Scaling { delayed, none };

struct Recipe {
  bool enabled = false;
  Format format = Format::hybrid;
  int amax_history_len = 16;
  AmaxCompute amax_compute = AmaxCompute::max;
  int margin = 0;
  bool block_scaling = false;
  Scaling scaling = Scaling::delayed;

  DType forward_dtype() const noexcept { return DType::fp8_e4m3; }
  DType gradient_dtype() const noexcept { return format == Format::hybrid ? DType::fp8_e5m2 : DType::fp8_e4m3; }
};

Format parse_format(const std::string& text);             // "hybrid" | "e4m3"; throws naming the text
AmaxCompute parse_amax_compute(const std::string& text);  // "max" | "most_recent"
Scaling parse_scaling(const std::string& text);           // "delayed" | "none"

// The largest power of two s with amax * s <= max_finite(fmt) / 2^margin; 1 when amax is 0
// or not finite (nothing to scale, or a NaN/Inf that the step's overflow check reports).
float scale_for(float amax, DType fmt, int margin) noexcept;

// max |in[i]| over n values (NaN when one is NaN).
float amax_of(const float* in, std::size_t n) noexcept;

// out[i] = decode(encode(in[i] * scale)) / scale, encoding to nearest even and saturating to
// the format's largest finite value; NaN stays NaN. out may alias in.
void fake_quantize(const float* in, float* out, std::size_t n, DType fmt, float scale);

// The rows x cols matrix at in (row stride ld) into out (row stride ldo), each block of
// block_rows x block_cols (clipped at the edges) scaled by scale_for(its own amax).
void fake_quantize_blocks(const float* in, int ld, float* out, int ldo, int rows, int cols, int block_rows,
                          int block_cols, DType fmt, int margin);

// One tensor's delayed-scaling state.
class AmaxHistory {
 public:
  // The scale this step quantizes with: from the history, or from `current` (the tensor's
  // own amax) while the history is empty.
  float scale(const Recipe& r, DType fmt, float current) const noexcept;
  // This step's amax: the max over its calls.
  void record(float amax) noexcept;
  float pending() const noexcept { return pending_; }  // -1: not used this step
  // The step ended: `amax` (this step's, or its max over the data-parallel ranks; below 0:
  // the tensor was not used) enters the history, which keeps the newest history_len.
  void roll(int history_len, float amax);
  void roll(int history_len) { roll(history_len, pending()); }
  const std::deque<float>& history() const noexcept { return history_; }  // newest first
  void restore(std::deque<float> history) { history_ = std::move(history); }

 private:
  std::deque<float> history_;
  float pending_ = -1.0f;
};

}  // namespace strata::model::fp8
