// Updated compute copies on their way to the parameters' tier (the protocol in
// update_staging.h).
#include "engine/update_staging.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "engine/optimizer_state.h"
#include "engine/tier_copy.h"
#include "runtime/core/error.h"
#include "runtime/core/log.h"

namespace strata::engine {

UpdateStaging::UpdateStaging(const Context& ctx)
    : c_(ctx), cbytes_(dtype_size(ctx.cdt)), layers_(ctx.layout.layers().size()) {
  if (c_.shards.any_acc_on_host()) xfer_ = c_.dev.create_stream();
}

UpdateStaging::~UpdateStaging() { drop(); }

std::size_t UpdateStaging::copy_elems(int li) const { return OptimizerState::elems(c_.layout, c_.stage, li); }

void* UpdateStaging::staging(int li) {
  auto& s = layers_[li];
  const Home h = home(li);
  const bool staged = h.param_tier == Tier::nvme || (h.opt_tier != Tier::device && h.param_tier == Tier::device);
  if (!staged) return nullptr;
  if (s.stage == nullptr) {
    const std::string what = str_cat("layer ", c_.layout.layers()[li].id, " updated parameter staging");
    try {
      s.stage = c_.ledger.allocate(Tier::host, Kind::buffers, copy_elems(li) * cbytes_, what);
    } catch (const Error& e) {
      // Write-backs queued on the parameter store hold their staging until written: when the
      // host tier is full, wait for them to drain (bounding them by the budget) and retry.
      if (e.code() != Errc::out_of_budget || !c_.nvme.has_params()) throw;
      {
        Tracer::Span span(c_.tracer, "optimizer", "wait write-back");
        const auto t0 = std::chrono::steady_clock::now();
        c_.nvme.drain();
        io().io_wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      }
      s.stage = c_.ledger.allocate(Tier::host, Kind::buffers, copy_elems(li) * cbytes_, what);
    }
    s.done = 0;
  }
  return s.stage;
}

UpdateStaging::Target UpdateStaging::target(int li, std::size_t k, std::size_t e0) {
  auto& s = layers_[li];
  const Home h = home(li);
  const auto& L = c_.layout.layers()[li];
  const auto& b = c_.layout.buckets()[L.buckets[k]];
  if (h.opt_tier == Tier::device && c_.stage == 3 && h.param_tier != Tier::device) {
    if (s.device_copy == nullptr) {
      s.device_copy = c_.ledger.allocate(Tier::device, Kind::buffers, c_.layout.layer_shard(li) * cbytes_,
                                         str_cat("layer ", L.id, " updated parameters (device)"));
    }
    return {static_cast<char*>(s.device_copy) + (c_.layout.layers()[li].shard_offsets[k] + e0) * cbytes_, false};
  }
  void* staged = staging(li);
  void* base = staged != nullptr ? staged : c_.stage == 3 ? h.shard : h.full;
  const std::size_t pos = b.flat_offset - L.flat_offset;
  const std::size_t off = (staged != nullptr ? OptimizerState::offset(c_.layout, c_.stage, li, k)
                           : c_.stage == 3   ? c_.layout.layers()[li].shard_offsets[k]
                                             : pos + (c_.stage == 0 ? 0 : own_begin(b))) +
                          e0;
  return {static_cast<char*>(base) + off * cbytes_, staged != nullptr};
}

void UpdateStaging::written(int li, std::uint64_t elems) {
  auto& s = layers_[li];
  s.done += elems;
  if (s.done < copy_elems(li)) return;
  const Home h = home(li);
  const auto& L = c_.layout.layers()[li];
  const auto t0 = std::chrono::steady_clock::now();
  if (h.param_tier == Tier::nvme) {
    // Written behind the optimizer on the parameter store's queue: its order puts the write (and
    // the commit the step queues after the last one) before the next step's read of the layer,
    // so the next forward overlaps the write-back. A failed write is the store's sticky
    // failure: the commit is skipped (the last good shards stay current, or are rebuilt from the
    // masters where the store had begun to commit: ShardUpdate::rebuild_stale_shards) and the
    // next gather reports it. The store hands the staging back to the host tier in every case.
    void* buf = s.stage;
    io().nvme_write_bytes += c_.layout.layer_shard(li) * cbytes_;
    s.stage = nullptr;
    s.done = 0;
    const NvmeHomes::ParamRequest request = c_.nvme.write_params_async(li, buf);
    // Paced by the NVMe: with the layer's optimizer state there too, at most this write-back
    // and the next layer's filling hold staging (what the estimate counts), however far the
    // store's queue falls behind: wait for the write-back before this one. The step then ends
    // with one write-back queued, which the next step's first gathers stage beside.
    if (h.opt_tier == Tier::nvme && last_write_.ticket != 0) {
      Tracer::Span span(c_.tracer, "optimizer", "wait write-back");
      c_.nvme.wait(last_write_);
    }
    last_write_ = request;
    io().io_wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return;
  }
  {
    Tracer::Span span(c_.tracer, "copy", str_cat("H2D updated L", L.id));
    // Stage 3: the shard as it is laid out; stages 1-2: this rank's part of each bucket;
    // stage 0: the whole layer.
    const char* src = static_cast<const char*>(s.stage);
    if (c_.stage == 0) xfer_->copy_async(h.full, src, L.padded * cbytes_, device::CopyKind::host_to_device);
    for (std::size_t k = 0; k < L.buckets.size() && c_.stage > 0; ++k) {
      const auto& b = c_.layout.buckets()[L.buckets[k]];
      const std::size_t so = c_.layout.layers()[li].shard_offsets[k];
      char* dst = c_.stage == 3 ? static_cast<char*>(h.shard) + so * cbytes_
                                : static_cast<char*>(h.full) + (b.flat_offset - L.flat_offset + own_begin(b)) * cbytes_;
      xfer_->copy_async(dst, src + so * cbytes_, b.shard * cbytes_, device::CopyKind::host_to_device);
    }
    xfer_->synchronize();
    io().h2d_bytes += copy_elems(li) * cbytes_;
  }
  io().io_wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  c_.ledger.free(s.stage);
  s.stage = nullptr;
  s.done = 0;
}

// The device optimizer wrote the layer's updated compute copies to its device buffer (its
// shards live on the host or NVMe): they go to the host shards, or through the staging to NVMe.
void UpdateStaging::flush_device(int li) {
  auto& s = layers_[li];
  if (s.device_copy == nullptr) return;
  void* staged = staging(li);
  const std::size_t shard = c_.layout.layer_shard(li);
  const std::size_t bytes = shard * cbytes_;
  {
    Tracer::Span span(c_.tracer, "copy", str_cat("D2H updated L", c_.layout.layers()[li].id));
    c_.dev_stream.copy_async(staged != nullptr ? staged : home(li).shard, s.device_copy, bytes,
                             device::CopyKind::device_to_host);
    c_.dev_stream.synchronize();
  }
  io().d2h_bytes += bytes;
  c_.ledger.free(s.device_copy);
  s.device_copy = nullptr;
  if (staged != nullptr) written(li, shard);
}

void UpdateStaging::commit_params() { c_.nvme.commit_params_async(); }

void UpdateStaging::commit_params(int li) {
  if (home(li).param_tier == Tier::nvme) c_.nvme.commit_params_async(li);
}

void UpdateStaging::abort_params() noexcept { c_.nvme.abort_params(); }

void UpdateStaging::restore_copies(int li, std::size_t first, std::size_t count, const float* master) {
  const auto& L = c_.layout.layers()[li];
  const Home h = home(li);
  constexpr std::size_t kPiece = std::size_t{1} << 20;  // elements converted at a time
  std::vector<char> bytes(std::min(count, kPiece) * cbytes_);
  // Elements [lo, hi) of the optimizer's, which lie contiguously at dst (in element units).
  auto put = [&](char* dst, Tier tier, std::size_t lo, std::size_t hi) {
    for (std::size_t e = lo; e < hi; e += kPiece) {
      const std::size_t n = std::min(kPiece, hi - e);
      convert(master + (e - first), DType::fp32, bytes.data(), c_.cdt, n);
      copy_between(c_.dev_stream, dst + (e - lo) * cbytes_, tier, bytes.data(), Tier::host, n * cbytes_);
      c_.dev_stream.synchronize();
    }
  };
  const std::size_t end = first + count;
  if (c_.stage == 0) {
    put(static_cast<char*>(h.full) + first * cbytes_, Tier::device, first, end);
  } else if (c_.stage == 3) {
    if (h.param_tier != Tier::nvme) put(static_cast<char*>(h.shard) + first * cbytes_, h.param_tier, first, end);
  } else {
    for (std::size_t k = 0; k < L.buckets.size(); ++k) {  // this rank's part of each bucket, in bucket order
      const auto& b = c_.layout.buckets()[L.buckets[k]];
      const std::size_t b0 = L.shard_offsets[k], lo = std::max(first, b0), hi = std::min(end, b0 + b.shard);
      if (lo >= hi) continue;
      char* dst = static_cast<char*>(h.full) + (b.flat_offset - L.flat_offset + own_begin(b) + (lo - b0)) * cbytes_;
      put(dst, Tier::device, lo, hi);
    }
  }
}

void UpdateStaging::drop() noexcept {
  if (xfer_) {
    try {
      xfer_->synchronize();  // a copy still reading the staging
    } catch (const std::exception& e) {
      STRATA_LOG(warn, "rank ", c_.rank, ": a copy of updated parameters failed: ", e.what());
    }
  }
  for (auto& s : layers_) {
    c_.ledger.free(s.stage);
    s.stage = nullptr;
    s.done = 0;
    c_.ledger.free(s.device_copy);
    s.device_copy = nullptr;
  }
}

void UpdateStaging::synchronize() {
  if (xfer_) xfer_->synchronize();
}

}  // namespace strata::engine
