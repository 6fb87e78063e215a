// The GPT's FP8 matrix products (see fp8_products.h).
#include "models/gpt/fp8_products.h"

#include <algorithm>
#include <cmath>
#include <deque>

#include "models/gpt/ops.h"
#include "runtime/core/error.h"

namespace strata::model {

namespace {
constexpr int kTile = 128;  // block scaling: 1 x 128 activation and gradient tiles, 128 x 128 weight blocks
}

Fp8Products::ScratchFloats Fp8Products::scratch_floats(const GptShape& s, std::size_t max_tokens) noexcept {
  const auto C = static_cast<std::size_t>(s.d_model), V = static_cast<std::size_t>(s.vocab);
  // x: the MLP down-projection's input is the widest activation; w: the MLP weights or the
  // embedding; g: the MLP up-projection's or the logits' gradient.
  return {max_tokens * 4 * C, std::max(4 * C * C, V * C), max_tokens * std::max(4 * C, V)};
}

Fp8Products::Fp8Products(const fp8::Recipe& recipe, const GptShape& shape, Scratch scratch, GptKernels& kernels)
    : recipe_(recipe),
      head_site_(4 * shape.layers),
      scratch_(scratch),
      k_(kernels),
      sites_(static_cast<std::size_t>(site_count(shape))) {
  for (auto& s : sites_) operands_.insert(operands_.end(), {&s.x, &s.w, &s.g});
}

Fp8Products::Operand Fp8Products::operand(int site, int which, Kind kind, DType fmt) {
  const int index = 3 * site + which;
  return {index, operands_.at(static_cast<std::size_t>(index)), kind, fmt};
}

const float* Fp8Products::quantize(const Operand& o, const float* src, int rows, int cols, float* dst) {
  STRATA_CHECK(dst != nullptr, Errc::internal,
               "Fp8Products: no scratch to quantize into (give it to the constructor or to use_scratch())");
  const std::size_t n = static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols);
  const float amax = fp8::amax_of(src, n);
  if (recording_) o.h->record(amax);
  if (recipe_.block_scaling) {
    const int br = o.kind == Kind::weight ? kTile : 1;
    fp8::fake_quantize_blocks(src, cols, dst, cols, rows, cols, br, kTile, o.fmt, recipe_.margin);
  } else {
    const float scale = recipe_.scaling == fp8::Scaling::none ? 1.0f : o.h->scale(recipe_, o.fmt, amax);
    fp8::fake_quantize(src, dst, n, o.fmt, scale);
  }
  return dst;
}

void Fp8Products::forward(int site, float* out, const float* inp, const float* W, const float* b, int N, int IC, int OC,
                          const ops::ProductScales& sc) {
  const float* qx = quantize(x_of(site), inp, N, IC, scratch_.x);
  const float* qw = quantize(w_of(site), W, IC, OC, scratch_.w);
  k_.matmul_forward(out, qx, qw, b, N, IC, OC, ops::Products::fp32, sc);
}

void Fp8Products::backward(int site, float* dinp, float* dW, float* db, const float* dout, const float* inp,
                           const float* W, int N, int IC, int OC, bool accumulate, const ops::ProductScales& sc) {
  const float* qg = quantize(g_of(site), dout, N, OC, scratch_.g);
  const float* qx = quantize(x_of(site), inp, N, IC, scratch_.x);
  const float* qw = quantize(w_of(site), W, IC, OC, scratch_.w);
  if (dinp != nullptr) k_.matmul_backward_input(dinp, qg, qw, N, IC, OC, accumulate, ops::Products::fp32, sc);
  k_.matmul_backward_weight(dW, nullptr, qg, qx, N, IC, OC, ops::Products::fp32, sc);
  if (db != nullptr) k_.bias_backward(db, dout, N, OC);
}

void Fp8Products::backward_input(int site, float* dinp, const float* dout, const float* W, int N, int IC, int OC,
                                 bool accumulate, const ops::ProductScales& sc) {
  const float* qg = quantize(g_of(site), dout, N, OC, scratch_.g);
  const float* qw = quantize(w_of(site), W, IC, OC, scratch_.w);
  k_.matmul_backward_input(dinp, qg, qw, N, IC, OC, accumulate, ops::Products::fp32, sc);
}

void Fp8Products::backward_weight(int site, float* dW, float* db, const float* dout, const float* inp, int N, int IC,
                                  int OC, const ops::ProductScales& sc) {
  const float* qg = quantize(g_of(site), dout, N, OC, scratch_.g);
  const float* qx = quantize(x_of(site), inp, N, IC, scratch_.x);
  k_.matmul_backward_weight(dW, nullptr, qg, qx, N, IC, OC, ops::Products::fp32, sc);
  if (db != nullptr) k_.bias_backward(db, dout, N, OC);
}

void Fp8Products::head_forward(float* logits, const float* inp, const float* wte, int N, int C, int V,
                               const ops::ProductScales& sc) {
  const float* qx = quantize(x_of(head_site_), inp, N, C, scratch_.x);
  const float* qw = quantize(w_of(head_site_), wte, V, C, scratch_.w);
  k_.lm_head_forward(logits, qx, qw, N, C, V, ops::Products::fp32, sc);
}

void Fp8Products::head_backward(float* dinp, float* dwte, const float* dlogits, const float* inp, const float* wte,
                                int N, int C, int V, const ops::ProductScales& sc) {
  const float* qg = quantize(g_of(head_site_), dlogits, N, V, scratch_.g);
  const float* qx = quantize(x_of(head_site_), inp, N, C, scratch_.x);
  const float* qw = quantize(w_of(head_site_), wte, V, C, scratch_.w);
  k_.lm_head_backward(dinp, dwte, qg, qx, qw, N, C, V, ops::Products::fp32, sc);
}

std::vector<float> Fp8Products::step_amax() {
  collect_amax();
  std::vector<float> out;
  out.reserve(operands_.size());
  for (const auto* h : operands_) out.push_back(h->pending());
  return out;
}

void Fp8Products::end_step(const std::vector<float>& amax) {
  STRATA_CHECK(amax.size() == operands_.size(), Errc::internal, "Fp8Products::end_step: ", amax.size(),
               " amax values for ", operands_.size(), " operands");
  for (std::size_t i = 0; i < operands_.size(); ++i) operands_[i]->roll(recipe_.amax_history_len, amax[i]);
}

std::vector<std::vector<float>> Fp8Products::histories() const {
  std::vector<std::vector<float>> out;
  for (const auto* h : operands_) out.emplace_back(h->history().begin(), h->history().end());
  return out;
}

void Fp8Products::restore(const std::vector<std::vector<float>>& histories) {
  STRATA_CHECK(histories.size() == operands_.size(), Errc::invalid_argument, "fp8 state: ", histories.size(),
               " amax histories, but this model has ", operands_.size(),
               " (3 operands of each of its matrix products): the checkpoint is of another shape");
  for (std::size_t i = 0; i < operands_.size(); ++i) {
    const auto& v = histories[i];
    std::deque<float> d;
    for (std::size_t k = 0; k < v.size() && static_cast<int>(k) < recipe_.amax_history_len; ++k) {
      STRATA_CHECK(std::isfinite(v[k]) && v[k] >= 0.0f, Errc::corrupt, "fp8 state: amax history ", i, " holds ", v[k],
                   ": not an amax");
      d.push_back(v[k]);
    }
    operands_[i]->restore(std::move(d));
  }
}

}  // namespace strata::model
