// Simulated FP8 quantization and delayed scaling (see fp8.h).
#include "models/gpt/fp8.h"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "runtime/core/error.h"

namespace strata::model::fp8 {

Format parse_format(const std::string& text) {
  if (text == "hybrid") return Format::hybrid;
  if (text == "e4m3") return Format::e4m3;
  STRATA_THROW(Errc::invalid_argument, "fp8.format '", text,
               "': use hybrid (E4M3 forward, E5M2 gradients) or e4m3 (E4M3 everywhere)");
}

AmaxCompute parse_amax_compute(const std::string& text) {
  if (text == "max") return AmaxCompute::max;
  if (text == "most_recent") return AmaxCompute::most_recent;
  STRATA_THROW(Errc::invalid_argument, "fp8.amax_compute '", text,
               "': use max (the history's largest amax) or most_recent (the last step's)");
}

Scaling parse_scaling(const std::string& text) {
  if (text == "delayed") return Scaling::delayed;
  if (text == "none") return Scaling::none;
  STRATA_THROW(Errc::invalid_argument, "fp8.scaling '", text,
               "': use delayed (scales from the amax history) or none (scale 1, for unit-scaled models)");
}

float scale_for(float amax, DType fmt, int margin) noexcept {
  if (!(amax > 0.0f) || !std::isfinite(amax)) return 1.0f;
  const double ratio = std::ldexp(static_cast<double>(dtype_info(fmt).max_finite), -margin) / amax;
  // floor(log2(ratio)), exact for any double: frexp gives ratio = m * 2^e with m in [0.5, 1).
  int e = 0;
  std::frexp(ratio, &e);
  return static_cast<float>(std::ldexp(1.0, std::clamp(e - 1, -125, 125)));
}

float amax_of(const float* in, std::size_t n) noexcept {
  float m = 0.0f;
  for (std::size_t i = 0; i < n; ++i) {
    const float a = std::fabs(in[i]);
    if (std::isnan(a)) return a;
    m = std::max(m, a);
  }
  return m;
}

namespace {

constexpr std::size_t kChunk = 4096;

// One chunk through the format and back, with the vectorised conversions.
void quantize_chunk(const float* in, float* out, std::size_t n, DType fmt, float scale) {
  thread_local std::vector<float> scaled(kChunk);
  thread_local std::vector<std::uint8_t> bits(kChunk);
  for (std::size_t i = 0; i < n; ++i) scaled[i] = in[i] * scale;
  convert(scaled.data(), DType::fp32, bits.data(), fmt, n);
  convert(bits.data(), fmt, out, DType::fp32, n);
  const float inv = 1.0f / scale;  // exact: scale is a power of two
  for (std::size_t i = 0; i < n; ++i) out[i] *= inv;
}

}  // namespace

void fake_quantize(const float* in, float* out, std::size_t n, DType fmt, float scale) {
  STRATA_CHECK(fmt == DType::fp8_e4m3 || fmt == DType::fp8_e5m2, Errc::invalid_argument,
               "fake_quantize: ", dtype_name(fmt), " is not an fp8 format");
  const std::size_t chunks = (n + kChunk - 1) / kChunk;
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, chunks, 16), [&](const tbb::blocked_range<std::size_t>& r) {
    for (std::size_t c = r.begin(); c < r.end(); ++c) {
      const std::size_t at = c * kChunk;
      quantize_chunk(in + at, out + at, std::min(kChunk, n - at), fmt, scale);
    }
  });
}

void fake_quantize_blocks(const float* in, int ld, float* out, int ldo, int rows, int cols, int block_rows,
                          int block_cols, DType fmt, int margin) {
  STRATA_CHECK(block_rows >= 1 && block_cols >= 1 && block_cols <= static_cast<int>(kChunk), Errc::invalid_argument,
               "fake_quantize_blocks: blocks of ", block_rows, " x ", block_cols, " (columns 1..", kChunk, ")");
  const int brs = (rows + block_rows - 1) / block_rows, bcs = (cols + block_cols - 1) / block_cols;
  tbb::parallel_for(tbb::blocked_range<int>(0, brs * bcs), [&](const tbb::blocked_range<int>& r) {
    for (int b = r.begin(); b < r.end(); ++b) {
      const int r0 = b / bcs * block_rows, c0 = b % bcs * block_cols;
      const int r1 = std::min(rows, r0 + block_rows), w = std::min(cols, c0 + block_cols) - c0;
      float amax = 0.0f;
      for (int i = r0; i < r1; ++i) {
        const float a = amax_of(in + static_cast<std::size_t>(i) * ld + c0, static_cast<std::size_t>(w));
        amax = std::isnan(a) ? a : std::max(amax, a);
      }
      const float scale = scale_for(amax, fmt, margin);
      for (int i = r0; i < r1; ++i) {
        quantize_chunk(in + static_cast<std::size_t>(i) * ld + c0, out + static_cast<std::size_t>(i) * ldo + c0,
                       static_cast<std::size_t>(w), fmt, scale);
      }
    }
  });
}

float AmaxHistory::scale(const Recipe& r, DType fmt, float current) const noexcept {
  if (history_.empty()) return scale_for(current, fmt, r.margin);
  const float amax = r.amax_compute == AmaxCompute::most_recent ? history_.front()
                                                                : *std::max_element(history_.begin(), history_.end());
  return scale_for(amax, fmt, r.margin);
}

void AmaxHistory::record(float amax) noexcept {
  if (!std::isfinite(amax)) return;  // the step's overflow check skips it; keep the history clean
  pending_ = std::max(pending_, amax);
}

void AmaxHistory::roll(int history_len, float amax) {
  pending_ = -1.0f;
  if (!(amax >= 0.0f)) return;  // the tensor was not used this step
  history_.push_front(amax);
  while (static_cast<int>(history_.size()) > std::max(1, history_len)) history_.pop_back();
}

}  // namespace strata::model::fp8
