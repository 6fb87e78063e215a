// EngineAccess (see engine_access.h).
#include "models/gpt/engine_access.h"

#include <algorithm>
#include <limits>

#include "models/gpt/kernels.h"
#include "runtime/core/error.h"
#include "runtime/core/units.h"

namespace strata::model {

std::size_t layer_total(const std::vector<std::size_t>& numels) {
  std::size_t n = 0;
  for (auto x : numels) n += x;
  return n;
}

std::size_t largest_other_layer(const LayerNumels& n) {
  std::size_t m = 0;
  for (std::size_t l = 1; l < n.size(); ++l) m = std::max(m, layer_total(n[l]));
  return m;
}

std::uint64_t live_window_bytes(const LayerNumels& n, DType compute, bool head_reads_layer0) {
  const std::size_t n0 = layer_total(n[0]), nl = largest_other_layer(n);
  const std::size_t head = layer_total(n.back()) + (head_reads_layer0 ? n0 : 0);
  return (std::max(head, nl) + std::max(n0, nl)) * dtype_size(compute);
}

void require_device_room(engine::Engine& engine, std::uint64_t need, std::uint64_t activations, const char* window,
                         int micro_batch, int seq_len, Remat remat) {
  const auto stats = engine.device().memory_stats();
  const std::uint64_t room = stats.budget_bytes - std::min(stats.budget_bytes, stats.used_bytes);
  // The fix first (under 200 characters), the reason after.
  STRATA_CHECK(need <= room, Errc::out_of_budget, "device budget ", format_bytes(stats.budget_bytes),
               ": raise memory_budget.device (or --device-budget) to at least ",
               format_bytes(need + (stats.budget_bytes - room)), ", or use a smaller micro-batch or --seq-len",
               remat == Remat::always ? "" : ", or --remat always", ". Why: it is below ", window,
               ": activations and buffers ", format_bytes(activations), " (micro-batch ", micro_batch, " x seq-len ",
               seq_len, ", remat ", remat_name(remat), ") and the largest layers gathered with a gradient buffer");
}

std::uint64_t EngineAccess::bytes(const LayerNumels& n, DType compute) {
  const std::uint64_t two = (layer_total(n[0]) + largest_other_layer(n)) * sizeof(float);
  return compute == DType::fp32 ? two : 2 * two;
}

EngineAccess::EngineAccess(engine::Engine& engine, LayerNumels numels, GptKernels& kernels,
                           std::vector<std::vector<bool>> products_only)
    : engine_(engine),
      k_(kernels),
      numels_(std::move(numels)),
      open_(numels_.size(), false),
      shadow_(engine.device().backend() == device::Backend::host),
      shadows_(numels_.size()),
      products_only_(std::move(products_only)) {
  skip_widening_ = shadow_ && ops::bf16_products_available();
  auto& dev = engine.device();
  const std::size_t n0 = layer_total(numels_[0]), nl = largest_other_layer(numels_);
  convert_ = engine.compute_dtype() != DType::fp32;
  if (convert_) {
    w0_ = device::DeviceBuffer(dev, n0 * 4, "fp32 weights (embeddings)");
    wl_ = device::DeviceBuffer(dev, nl * 4, "fp32 weights");
  }
  g0_ = device::DeviceBuffer(dev, n0 * 4, "fp32 gradients (embeddings)");
  gl_ = device::DeviceBuffer(dev, nl * 4, "fp32 gradients");
}

std::vector<const float*> EngineAccess::acquire(int layer) {
  const auto views = engine_.gather(layer);
  std::vector<const float*> out;
  float* dst = layer == 0 ? w0_.as<float>() : wl_.as<float>();
  // Shadows of whatever last used this buffer end here, a pass that threw before its release
  // included (layer 0 has w0_; every other layer shares wl_).
  for (std::size_t l = 0; l < shadows_.size(); ++l)
    if ((l == 0) == (layer == 0)) shadows_[l].clear();
  auto& shadows = shadows_[static_cast<std::size_t>(layer)];
  for (const auto& v : views) {
    if (!convert_) {
      out.push_back(v.as<float>());
      continue;
    }
    const std::size_t i = out.size();
    const bool bf16 = shadow_ && v.dtype == DType::bf16;
    if (bf16 && skip_widening_ && products_only(layer, i)) {
#ifndef NDEBUG
      std::fill(dst, dst + v.numel, std::numeric_limits<float>::quiet_NaN());  // any other reader shows
#endif
    } else {
      k_.convert(v.data, v.dtype, dst, DType::fp32, v.numel);  // on the host: done on return
    }
    if (bf16)
      shadows.push_back(std::make_unique<ops::Bf16Shadow>(dst, static_cast<const std::uint16_t*>(v.data), v.numel));
    out.push_back(dst);
    dst += v.numel;
  }
  return out;
}

bool EngineAccess::products_only(int layer, std::size_t i) const noexcept {
  const auto l = static_cast<std::size_t>(layer);
  return l < products_only_.size() && i < products_only_[l].size() && products_only_[l][i];
}

void EngineAccess::release(int layer) {
  k_.sync();
  shadows_[static_cast<std::size_t>(layer)].clear();
  engine_.release(layer);
}

std::vector<float*> EngineAccess::grads(int layer) {
  float* base = layer == 0 ? g0_.as<float>() : gl_.as<float>();
  const auto& n = numels_[static_cast<std::size_t>(layer)];
  if (!open_[static_cast<std::size_t>(layer)]) {
    k_.zero(base, layer_total(n));
    open_[static_cast<std::size_t>(layer)] = true;
  }
  std::vector<float*> out;
  for (auto e : n) {
    out.push_back(base);
    base += e;
  }
  return out;
}

void EngineAccess::commit(int layer) {
  const float* src = layer == 0 ? g0_.as<float>() : gl_.as<float>();
  for (const auto& g : engine_.grad_buffers(layer)) {
    k_.convert(src, DType::fp32, g.data, g.dtype, g.numel);
    src += g.numel;
  }
  k_.sync();
  engine_.reduce_grads(layer);
  open_[static_cast<std::size_t>(layer)] = false;
}

}  // namespace strata::model
