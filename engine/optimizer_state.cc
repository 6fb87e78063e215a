// Each layer's fp32 optimizer state (the protocol in optimizer_state.h).
#include "engine/optimizer_state.h"

#include <utility>

#include "engine/tier_copy.h"
#include "runtime/core/error.h"

namespace strata::engine {

OptimizerState::~OptimizerState() {
  for (auto& o : layers_) {
    for (const Arrays* a : {&o.arrays, &o.spare}) {
      c_.ledger.free(a->master);
      c_.ledger.free(a->m);
      c_.ledger.free(a->v);
    }
  }
}

OptimizerState::Arrays OptimizerState::allocate(int li, Tier tier, const char* what) {
  const std::size_t bytes = elems(li) * 4;
  const std::string name = str_cat("layer ", c_.layout.layers()[li].id, what);
  Arrays a;
  try {
    a.master = static_cast<float*>(c_.ledger.allocate(tier, Kind::optimizer, bytes, name + " master"));
    a.m = static_cast<float*>(c_.ledger.allocate(tier, Kind::optimizer, bytes, name + " exp_avg"));
    a.v = static_cast<float*>(c_.ledger.allocate(tier, Kind::optimizer, bytes, name + " exp_avg_sq"));
  } catch (...) {
    c_.ledger.free(a.master);
    c_.ledger.free(a.m);
    throw;
  }
  return a;
}

void OptimizerState::add_layer(int li, Tier tier) {
  auto& o = layers_[li];
  o.tier = tier;
  if (tier == Tier::nvme) return;  // in the swapper's files
  o.arrays = allocate(li, tier, "");
}

const OptimizerState::Arrays& OptimizerState::spare(int li) {
  auto& o = layers_[li];
  STRATA_CHECK(o.tier != Tier::nvme, Errc::internal, "OptimizerState::spare: layer ", li, " lives on NVMe");
  if (o.spare.master == nullptr) o.spare = allocate(li, o.tier, " (overlapped step)");
  return o.spare;
}

void OptimizerState::swap_spare(int li) {
  auto& o = layers_[li];
  STRATA_CHECK(o.spare.master != nullptr, Errc::internal, "OptimizerState::swap_spare: layer ", li, " has no spare");
  std::swap(o.arrays, o.spare);
}

void OptimizerState::read(int li, float* master, float* m, float* v) {
  const auto& o = layers_[li];
  const std::size_t n = elems(li);
  if (o.tier == Tier::nvme) {
    c_.nvme.swapper()->read_state(static_cast<std::size_t>(c_.nvme.swap_index(li)), 0, n, master, m, v);
    return;
  }
  for (auto [dst, src] : {std::pair{master, o.arrays.master}, std::pair{m, o.arrays.m}, std::pair{v, o.arrays.v}}) {
    if (dst != nullptr) copy_between(c_.dev_stream, dst, Tier::host, src, o.tier, n * 4);
  }
  c_.dev_stream.synchronize();
}

void OptimizerState::write(int li, const float* master, const float* m, const float* v) {
  const auto& o = layers_[li];
  const std::size_t n = elems(li);
  if (o.tier == Tier::nvme) {
    c_.nvme.swapper()->write_state(static_cast<std::size_t>(c_.nvme.swap_index(li)), master, m, v);
    return;
  }
  for (auto [dst, src] : {std::pair{o.arrays.master, master}, std::pair{o.arrays.m, m}, std::pair{o.arrays.v, v}}) {
    if (src != nullptr)
      copy_between(c_.dev_stream, dst, o.tier, src, Tier::host, n * 4);
    else
      fill_zero(c_.dev_stream, dst, n * 4, o.tier);
  }
  c_.dev_stream.synchronize();
}

void OptimizerState::device_memory(const DeviceSwap::Fn& fn) {
  for (std::size_t li = 0; li < layers_.size(); ++li) {
    auto& o = layers_[li];
    if (o.tier != Tier::device || o.arrays.master == nullptr) continue;  // elsewhere, or a frozen layer's
    const std::size_t bytes = elems(static_cast<int>(li)) * 4;
    const std::string name = str_cat("layer ", c_.layout.layers()[li].id);
    o.arrays.master = static_cast<float*>(fn(o.arrays.master, bytes, Kind::optimizer, name + " master"));
    o.arrays.m = static_cast<float*>(fn(o.arrays.m, bytes, Kind::optimizer, name + " exp_avg"));
    o.arrays.v = static_cast<float*>(fn(o.arrays.v, bytes, Kind::optimizer, name + " exp_avg_sq"));
  }
}

void OptimizerState::commit_writes() {
  if (auto* sw = c_.nvme.swapper()) sw->commit_written();
}

void OptimizerState::discard_writes() noexcept {
  if (auto* sw = c_.nvme.swapper()) sw->discard_written();
}

}  // namespace strata::engine
