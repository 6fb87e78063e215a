// Each layer's optimizer state (the protocol in optimizer_state.h).
#include "engine/optimizer_state.h"

#include <algorithm>
#include <cstddef>
#include <iterator>
#include <tuple>
#include <utility>
#include <vector>

#include "engine/detail/muon_runs.h"
#include "engine/tier_copy.h"
#include "runtime/core/dtype.h"
#include "runtime/core/error.h"

namespace strata::engine {

OptimizerState::~OptimizerState() {
  swapper_.reset();
  if (swap_buffer_bytes_) c_.ledger.discharge(Tier::host, Kind::buffers, swap_buffer_bytes_);
  if (swap_file_bytes_) c_.ledger.discharge(Tier::nvme, Kind::optimizer, swap_file_bytes_);
  for (auto& o : layers_) {
    for (const Arrays* a : {&o.arrays, &o.spare}) {
      c_.ledger.free(a->master);
      c_.ledger.free(a->m);
      c_.ledger.free(a->v);
    }
  }
}

OptimizerState::Arrays OptimizerState::allocate(int li, const char* what) {
  const Tier where = tier(li);
  const std::size_t bytes = elems(li) * 4, mbytes = moment_bytes(moment_format(), elems(li));
  const std::size_t vbytes = moment_bytes(moment_format(), v_elems(li));
  const std::string name = str_cat("layer ", c_.layout.layers()[li].id, what);
  Arrays a;
  try {
    a.master = static_cast<float*>(c_.ledger.allocate(where, Kind::optimizer, bytes, name + " master"));
    a.m = c_.ledger.allocate(where, Kind::optimizer, mbytes, name + " exp_avg");
    a.v = c_.ledger.allocate(where, Kind::optimizer, vbytes, name + " exp_avg_sq");
  } catch (...) {
    c_.ledger.free(a.master);
    c_.ledger.free(a.m);
    throw;
  }
  return a;
}

void OptimizerState::add_layer(int li) {
  if (tier(li) == Tier::nvme) return;  // in the swapper's files
  if (c_.cfg.optimizer.type == OptimizerType::muon && detail::holds_muon_matrix(c_.layout, li)) {
    STRATA_CHECK(moment_format() == MomentFormat::fp32, Errc::internal, "Muon keeps fp32 moments");
    auto& runs = layers_[li].v_runs;
    std::size_t v = 0;
    for (const auto& r : detail::state_runs(c_.layout, c_.cfg.zero.stage, c_.rank, li)) {
      if (r.matrix) continue;
      runs.push_back({r.at, r.n, v});
      v += r.n;
    }
    if (runs.empty()) runs.push_back({0, 0, 0});  // every element a matrix's: an empty v
  }
  layers_[li].arrays = allocate(li, "");
}

std::size_t OptimizerState::v_elems(int li) const {
  const auto& runs = layers_[li].v_runs;
  return runs.empty() ? elems(li) : runs.back().v + runs.back().n;
}

void* OptimizerState::v_at(int li, void* v, std::size_t at) const {
  const auto& runs = layers_[li].v_runs;
  if (runs.empty()) return moment_at(v, at);
  auto it =
      std::upper_bound(runs.begin(), runs.end(), at, [](std::size_t e, const LayerOpt::VRun& r) { return e < r.at; });
  STRATA_CHECK(it != runs.begin() && at < std::prev(it)->at + std::prev(it)->n, Errc::internal, "layer ", li,
               ": element ", at, " of its state keeps no exp_avg_sq (a hidden matrix's, under Muon)");
  --it;
  return static_cast<float*>(v) + it->v + (at - it->at);
}

void OptimizerState::expand_v(int li, const float* compact, float* full) const {
  std::fill(full, full + elems(li), 0.0f);
  for (const auto& r : layers_[li].v_runs) std::copy(compact + r.v, compact + r.v + r.n, full + r.at);
}

void OptimizerState::compact_v(int li, const float* full, float* compact) const {
  for (const auto& r : layers_[li].v_runs) std::copy(full + r.at, full + r.at + r.n, compact + r.v);
}

const OptimizerState::Arrays& OptimizerState::spare(int li) {
  auto& o = layers_[li];
  STRATA_CHECK(tier(li) != Tier::nvme, Errc::internal, "OptimizerState::spare: layer ", li, " lives on NVMe");
  if (o.spare.master == nullptr) o.spare = allocate(li, " (overlapped step)");
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
  if (tier(li) == Tier::nvme) {
    swapper_->read_state(static_cast<std::size_t>(swap_index(li)), 0, n, master, m, v);
    return;
  }
  if (master != nullptr) copy_between(c_.dev_stream, master, Tier::host, o.arrays.master, tier(li), n * 4);
  if (!o.v_runs.empty()) {  // Muon's compact v (fp32)
    std::vector<float> compact(v_elems(li));
    if (m != nullptr) copy_between(c_.dev_stream, m, Tier::host, o.arrays.m, tier(li), n * 4);
    if (v != nullptr && !compact.empty())  // a shard of matrix elements alone keeps none
      copy_between(c_.dev_stream, compact.data(), Tier::host, o.arrays.v, tier(li), compact.size() * 4);
    c_.dev_stream.synchronize();
    if (v != nullptr) expand_v(li, compact.data(), v);
    return;
  }
  const MomentFormat f = moment_format();
  const std::size_t mb = moment_bytes(f, n);
  std::vector<std::byte> narrow(f == MomentFormat::fp32 ? 0 : 2 * mb);
  for (auto [dst, src, k] : {std::tuple{m, o.arrays.m, 0}, std::tuple{v, o.arrays.v, 1}}) {
    if (dst == nullptr) continue;
    void* into = narrow.empty() ? static_cast<void*>(dst) : narrow.data() + k * mb;
    copy_between(c_.dev_stream, into, Tier::host, src, tier(li), mb);
  }
  c_.dev_stream.synchronize();
  if (narrow.empty()) return;
  if (m != nullptr) moments_to_fp32(narrow.data(), f, Moment::first, m, n);
  if (v != nullptr) moments_to_fp32(narrow.data() + mb, f, Moment::second, v, n);
}

void OptimizerState::read_held(int li, float* master, void* m, void* v) {
  const std::size_t n = elems(li);
  const MomentFormat f = moment_format();
  if (tier(li) == Tier::nvme) {
    std::vector<float> mf(n), vf(n);
    swapper_->read_state(static_cast<std::size_t>(swap_index(li)), 0, n, master, mf.data(), vf.data());
    moments_from_fp32(mf.data(), m, f, Moment::first, n);
    moments_from_fp32(vf.data(), v, f, Moment::second, n);
    return;
  }
  const auto& o = layers_[li];
  if (!o.v_runs.empty()) {  // Muon's compact v (fp32): held as every element's
    read(li, master, static_cast<float*>(m), static_cast<float*>(v));
    return;
  }
  copy_between(c_.dev_stream, master, Tier::host, o.arrays.master, tier(li), n * 4);
  copy_between(c_.dev_stream, m, Tier::host, o.arrays.m, tier(li), moment_bytes(f, n));
  copy_between(c_.dev_stream, v, Tier::host, o.arrays.v, tier(li), moment_bytes(f, n));
  c_.dev_stream.synchronize();
}

void OptimizerState::write(int li, const float* master, const float* m, const float* v) {
  const auto& o = layers_[li];
  const std::size_t n = elems(li);
  if (tier(li) == Tier::nvme) {
    swapper_->write_state(static_cast<std::size_t>(swap_index(li)), master, m, v);
    return;
  }
  if (master != nullptr)
    copy_between(c_.dev_stream, o.arrays.master, tier(li), master, Tier::host, n * 4);
  else
    fill_zero(c_.dev_stream, o.arrays.master, n * 4, tier(li));
  const MomentFormat f = moment_format();
  const std::size_t mb = moment_bytes(f, n);
  std::vector<float> compact;  // Muon's compact v (fp32)
  if (!o.v_runs.empty()) {
    compact.resize(v_elems(li));
    if (v != nullptr) compact_v(li, v, compact.data());
    if (!compact.empty())  // a shard of matrix elements alone keeps none
      copy_between(c_.dev_stream, o.arrays.v, tier(li), compact.data(), Tier::host, compact.size() * 4);
  }
  std::vector<std::byte> narrow(f == MomentFormat::fp32 ? 0 : 2 * mb);
  for (auto [dst, src, k] : {std::tuple{o.arrays.m, m, 0}, std::tuple{o.arrays.v, v, 1}}) {
    if (k == 1 && !o.v_runs.empty()) continue;
    if (src == nullptr) {
      fill_zero(c_.dev_stream, dst, mb, tier(li));  // zero codes: zero moments in every format
      continue;
    }
    const void* from = src;
    if (!narrow.empty()) {
      moments_from_fp32(src, narrow.data() + k * mb, f, k == 0 ? Moment::first : Moment::second, n);
      from = narrow.data() + k * mb;
    }
    copy_between(c_.dev_stream, dst, tier(li), from, Tier::host, mb);
  }
  c_.dev_stream.synchronize();
}

void OptimizerState::device_memory(const DeviceSwap::Fn& fn) {
  for (std::size_t li = 0; li < layers_.size(); ++li) {
    auto& o = layers_[li];
    if (tier(static_cast<int>(li)) != Tier::device || o.arrays.master == nullptr)
      continue;  // elsewhere, or a frozen layer's
    const std::size_t n = elems(static_cast<int>(li)), mbytes = moment_bytes(moment_format(), n);
    const std::string name = str_cat("layer ", c_.layout.layers()[li].id);
    o.arrays.master = static_cast<float*>(fn(o.arrays.master, n * 4, Kind::optimizer, name + " master"));
    o.arrays.m = fn(o.arrays.m, mbytes, Kind::optimizer, name + " exp_avg");
    o.arrays.v = fn(o.arrays.v, moment_bytes(moment_format(), v_elems(static_cast<int>(li))), Kind::optimizer,
                    name + " exp_avg_sq");
  }
}

}  // namespace strata::engine
