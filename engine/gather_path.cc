// Stage-3 gathers (the protocol in gather_path.h).
#include "engine/gather_path.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "runtime/core/error.h"
#include "runtime/core/log.h"

namespace strata::engine {

GatherPath::GatherPath(const Context& ctx)
    : c_(ctx), cbytes_(dtype_size(ctx.cdt)), layers_(ctx.shards.size()), stream_(ctx.dev.create_stream()) {}

GatherPath::~GatherPath() {
  try {
    stream_->synchronize();  // gathers in flight still write their buffers
  } catch (const std::exception&) {
    // Reported by whoever synchronized first; the buffers go either way.
  }
  for (auto& G : layers_) {
    c_.ledger.free(G.staging);
    c_.ledger.free(G.full);
  }
}

void* GatherPath::gather(int li, bool eval, std::int64_t step) {
  auto& G = layers_[li];
  const auto& L = c_.layout.layers()[li];
  if (eval) {  // forward-only passes leave the recorded trace and its prefetch alone
    if (!persistent(li) && G.full == nullptr) issue(li);
    G.retained = false;
    ++G.in_use;
    if (!persistent(li)) wait(li);
    return G.full;
  }
  if (const auto expected = trace_.observe(li)) {
    STRATA_LOG(
        warn, "rank ", c_.rank, ": step ", step, ": gather #", trace_.recorded(), " is layer ", L.id,
        " but the recorded trace expects ",
        *expected >= 0 ? "layer " + std::to_string(c_.layout.layers()[*expected].id) : std::string("no more gathers"),
        "; prefetch is off for this step and the trace is recorded again");
  }
  if (!persistent(li)) {
    if (G.full == nullptr) issue(li);
    G.retained = false;
    ++G.in_use;
    wait(li);
    if (trace_.replaying()) prefetch_after(trace_.cursor());
  } else {
    ++G.in_use;
  }
  return G.full;
}

void* GatherPath::allocate_staging(std::size_t bytes, const std::string& what) {
  try {
    // Page-locked: copies read it after stream work (an NVMe read, a host copy) fills it.
    return c_.ledger.allocate(Tier::host, Kind::buffers, bytes, what, /*pinned=*/true);
  } catch (const Error& e) {
    // Write-backs queued on the parameter store hold host staging until written: wait for them.
    if (e.code() != Errc::out_of_budget || !c_.nvme.has_params()) throw;
    c_.nvme.drain();
    return c_.ledger.allocate(Tier::host, Kind::buffers, bytes, what, /*pinned=*/true);
  }
}

void GatherPath::issue(int li) {
  auto& G = layers_[li];
  const auto& L = c_.layout.layers()[li];
  const std::uint64_t need = L.padded;
  const std::uint64_t max_live = c_.zero.stage3_max_live_parameters;
  while (live_elems_ + need > max_live) {
    if (!drop_retained()) {
      STRATA_THROW(Errc::out_of_budget, "rank ", c_.rank, ": gathering layer ", L.id, " (", need,
                   " elements) would exceed zero_optimization.stage3_max_live_parameters = ", max_live, " with ",
                   live_elems_, " elements gathered and in use: release layers after use or raise the limit");
    }
  }
  const std::string what = str_cat("layer ", L.id, " gathered parameters");
  for (;;) {
    try {
      G.full = c_.ledger.allocate(Tier::device, Kind::buffers, need * cbytes_, what);
      break;
    } catch (const Error& e) {
      if (e.code() != Errc::out_of_budget || !drop_retained()) throw;
    }
  }
  try {
    G.staging = allocate_staging(need * cbytes_, str_cat("layer ", L.id, " gather staging"));
  } catch (...) {
    c_.ledger.free(G.full);
    G.full = nullptr;
    throw;
  }
  live_elems_ += need;
  peak_live_elems_ = std::max(peak_live_elems_, live_elems_);
  try {
    submit(li);
  } catch (...) {
    // Work queued before the failure may still touch the buffers: let the stream and the
    // parameter store drain (their errors are this one's consequences), then drop the half-issued
    // gather so the next gather() issues it anew rather than handing out what it left.
    try {
      stream_->synchronize();
    } catch (const std::exception&) {
    }
    try {
      c_.nvme.drain();
    } catch (const std::exception&) {
    }
    G.ready.reset();
    G.ok.reset();
    G.read = {};
    c_.ledger.free(G.staging);
    G.staging = nullptr;
    c_.ledger.free(G.full);
    G.full = nullptr;
    live_elems_ -= need;
    throw;
  }
}

// The gather's stream work (issue has allocated its buffers).
void GatherPath::submit(int li) {
  auto& G = layers_[li];
  const auto& L = c_.layout.layers()[li];
  const std::uint64_t need = L.padded;
  const Shards from{c_.shard_data(li), c_.shards.param_tier(li)};
  auto& st = *stream_;
  char* staging = static_cast<char*>(G.staging);
  auto started = std::make_shared<Tracer::Clock::time_point>();
  auto copied = std::make_shared<Tracer::Clock::time_point>();
  Tracer* tracer = c_.tracer;
  st.launch_host([started] { *started = Tracer::Clock::now(); });
  char* full = static_cast<char*>(G.full);
  const bool on_device = device_collectives();
  const std::size_t shard_total = c_.layout.layer_shard(li);
  if (on_device) {
    // This rank's shards into their places in the device buffer (only they cross the link),
    // then all-gathered there by the device communicator.
    if (from.tier == Tier::nvme) stage_in(li, from, staging);  // read into their staging places
    for (std::size_t k = 0; k < L.buckets.size(); ++k) {
      const auto& b = c_.layout.buckets()[L.buckets[k]];
      const std::size_t own = (bucket_pos(b, L) + own_begin(b)) * cbytes_;
      const char* src =
          from.tier == Tier::nvme ? staging + own : static_cast<const char*>(from.data) + L.shard_offsets[k] * cbytes_;
      st.copy_async(full + own, src, b.shard * cbytes_,
                    from.tier == Tier::device ? device::CopyKind::device_to_device : device::CopyKind::host_to_device);
    }
    if (from.tier != Tier::device) c_.io.h2d_bytes += shard_total * cbytes_;
    st.launch_host([copied] { *copied = Tracer::Clock::now(); });
    for (int bi : L.buckets) {
      const auto& b = c_.layout.buckets()[bi];
      char* region = full + bucket_pos(b, L) * cbytes_;
      c_.dcomm->all_gather(region + own_begin(b) * cbytes_, region, b.shard, c_.cdt, st);
    }
  } else if (c_.world == 1 && from.tier == Tier::host &&
             (c_.ledger.pins_host() || c_.dev.backend() == device::Backend::host)) {
    // One rank, host shards a stream copy reads in stream order: each shard is its whole
    // bucket, copied straight into the device buffer (no pass through the staging on one core).
    st.launch_host([copied] { *copied = Tracer::Clock::now(); });
    for (std::size_t k = 0; k < L.buckets.size(); ++k) {
      const auto& b = c_.layout.buckets()[L.buckets[k]];
      st.copy_async(full + bucket_pos(b, L) * cbytes_,
                    static_cast<const char*>(from.data) + L.shard_offsets[k] * cbytes_, b.shard * cbytes_,
                    device::CopyKind::host_to_device);
    }
    c_.io.h2d_bytes += need * cbytes_;
  } else {
    stage_in(li, from, staging);
    for (int bi : L.buckets) {
      const auto& b = c_.layout.buckets()[bi];
      char* region = staging + bucket_pos(b, L) * cbytes_;
      if (c_.world > 1) c_.comm->all_gather(region + own_begin(b) * cbytes_, region, b.shard, c_.cdt, st);
    }
    c_.io.h2d_bytes += need * cbytes_;
    st.launch_host([copied] { *copied = Tracer::Clock::now(); });
    st.copy_async(G.full, staging, need * cbytes_, device::CopyKind::host_to_device);
  }
  G.ok = std::make_shared<std::atomic<bool>>(false);
  // The host function reads the NVMe tier's current store: a migration adopts another only once
  // the gather stream is idle (Impl::replan_on_first_trace synchronizes it first).
  st.launch_host([ok = G.ok, nvme = &c_.nvme, read = G.read, started, copied, tracer, on_device, id = L.id] {
    if (tracer != nullptr && tracer->enabled()) {
      const auto end = Tracer::Clock::now();
      // Without device collectives: all-gather in host staging, then the layer's H2D copy;
      // with them: the shards' H2D (or D2D) copy, then the all-gather on the device.
      tracer->record(on_device ? "copy" : "gather", str_cat(on_device ? "H2D shards L" : "all_gather L", id), *started,
                     *copied);
      tracer->record(on_device ? "gather" : "copy", str_cat(on_device ? "all_gather L" : "H2D L", id), *copied, end);
    }
    ok->store(nvme->succeeded(read));
  });
  G.ready = c_.dev.create_event();
  st.record(*G.ready);
}

// This rank's shards of every bucket of layer li into their places in the staging buffer,
// as gather-stream work: a D2H copy from device shards, a host copy from host shards, or a
// read queued on the parameter store, which the stream waits for (checksums
// verified; a failed read is the store's sticky failure, which drain() rethrows).
void GatherPath::stage_in(int li, const Shards& from, char* staging) {
  auto& G = layers_[li];
  const auto& L = c_.layout.layers()[li];
  auto& st = *stream_;
  const std::size_t shard_total = c_.layout.layer_shard(li);
  if (from.tier == Tier::nvme) {
    c_.io.nvme_read_bytes += shard_total * cbytes_;
    // The store's bytes are the shards of the layer's buckets, concatenated.
    std::vector<offload::ParamStore::Piece> into;
    for (int bi : L.buckets) {
      const auto& b = c_.layout.buckets()[bi];
      into.push_back({staging + (bucket_pos(b, L) + own_begin(b)) * cbytes_, b.shard * cbytes_});
    }
    G.read = c_.nvme.read_params_async(li, std::move(into));
    c_.nvme.wait_on(st, G.read);  // raised after a failed read too: succeeded() tells
    return;
  }
  for (std::size_t k = 0; k < L.buckets.size(); ++k) {
    const auto& b = c_.layout.buckets()[L.buckets[k]];
    char* dst = staging + (bucket_pos(b, L) + own_begin(b)) * cbytes_;
    const char* src = static_cast<const char*>(from.data) + L.shard_offsets[k] * cbytes_;
    if (from.tier == Tier::device) {
      st.copy_async(dst, src, b.shard * cbytes_, device::CopyKind::device_to_host);
    } else {
      st.launch_host([dst, src, n = b.shard * cbytes_] { std::memcpy(dst, src, n); });
    }
  }
  if (from.tier == Tier::device) c_.io.d2h_bytes += shard_total * cbytes_;
}

// Drops the retained (gathered, not in use) layer whose next use in the recorded trace is
// furthest away; false when none is retained. Used to make room under max_live and under
// the device budget (gathers, prefetches, gradient buffers).
bool GatherPath::drop_retained() { return drop_retained_after(0); }

// The same, among the retained layers next used after trace position `position` only.
bool GatherPath::drop_retained_after(std::size_t position) {
  int victim = -1;
  std::size_t victim_next = 0;
  for (std::size_t j = 0; j < layers_.size(); ++j) {
    if (!layers_[j].retained) continue;
    const std::size_t next = trace_.next_use(static_cast<int>(j));
    if (next < position) continue;
    if (victim < 0 || next > victim_next) {
      victim = static_cast<int>(j);
      victim_next = next;
    }
  }
  if (victim < 0) return false;
  evict(victim);
  return true;
}

void GatherPath::wait(int li) {
  auto& G = layers_[li];
  if (!G.ready) return;
  {
    Tracer::Span span(c_.tracer, "compute", str_cat("wait L", c_.layout.layers()[li].id));
    const auto t0 = std::chrono::steady_clock::now();
    G.ready->synchronize();
    c_.io.io_wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  if (!G.ok->load()) {  // rethrow the gather's error, or the read's it waited for
    stream_->synchronize();
    c_.nvme.drain();
    STRATA_THROW(Errc::internal, "rank ", c_.rank, ": the gather of layer ", c_.layout.layers()[li].id,
                 " failed without an error");
  }
  G.read = {};
  G.ready.reset();
  c_.ledger.free(G.staging);
  G.staging = nullptr;
}

void GatherPath::release(int li, bool eval) {
  auto& G = layers_[li];
  const auto& L = c_.layout.layers()[li];
  STRATA_CHECK(G.in_use > 0, Errc::invalid_argument, "release(", L.id, ") without a matching gather(", L.id, ")");
  if (--G.in_use > 0 || persistent(li)) return;
  if (trace_.replaying() && !eval) {
    const auto& trace = trace_.trace();
    std::uint64_t distance = 0;
    for (std::size_t k = trace_.cursor(); k < trace.size(); ++k) {
      if (trace[k] == li) {
        if (distance <= c_.zero.stage3_max_reuse_distance) {
          G.retained = true;
          return;
        }
        break;
      }
      distance += c_.layout.layers()[trace[k]].padded;
    }
  }
  evict(li);
}

void GatherPath::evict(int li) {
  auto& G = layers_[li];
  if (G.ready) {
    G.ready->synchronize();
    G.ready.reset();
  }
  c_.ledger.free(G.staging);
  G.staging = nullptr;
  if (G.full != nullptr) {
    c_.ledger.free(G.full);
    G.full = nullptr;
    live_elems_ -= c_.layout.layers()[li].padded;
  }
  G.retained = false;
}

void GatherPath::evict_all() {
  for (std::size_t li = 0; li < layers_.size(); ++li) {
    if (!persistent(static_cast<int>(li))) evict(static_cast<int>(li));
  }
}

void GatherPath::abandon() {
  for (auto& G : layers_) G.in_use = 0;
  evict_all();
}

void GatherPath::prefetch_after(std::size_t position) {
  const std::uint64_t window = c_.zero.stage3_prefetch_bucket_size;
  if (window == 0) return;
  std::uint64_t issued = 0;
  const auto& trace = trace_.trace();
  for (std::size_t k = position; k < trace.size(); ++k) {
    const int li = trace[k];
    auto& G = layers_[li];
    if (persistent(li) || G.full != nullptr) continue;
    const std::uint64_t need = c_.layout.layers()[li].padded;
    if (issued + need > window || live_elems_ + need > c_.zero.stage3_max_live_parameters) break;
    // Leave the device room for the gradient buffers of backward (the current one, and the
    // one a running reduction still holds): a prefetch that a gradient buffer then evicts
    // is read twice. Retained layers due after this one make room, furthest first: the
    // gather of this layer would drop the same ones when it comes, but without the overlap.
    while (c_.ledger.available(Tier::device) < need * cbytes_ + c_.reserve()) {
      if (!drop_retained_after(k + 1)) return;
    }
    if (c_.before_read) c_.before_read(li);
    try {
      issue(li);
    } catch (const Error& e) {
      if (e.code() != Errc::out_of_budget) throw;
      break;  // no room now: the gather happens on demand
    }
    G.retained = true;  // resident but not in use until gather() claims it
    issued += need;
  }
}

bool GatherPath::end_step(std::int64_t step) {
  evict_all();  // updated shards make every gathered copy stale
  if (!trace_.needs_record()) return false;
  if (trace_.replaying()) {
    STRATA_LOG(warn, "rank ", c_.rank, ": step ", step, " made ", trace_.recorded(),
               " gathers but the recorded trace has ", trace_.trace().size(), "; the trace is recorded again");
  }
  if (c_.comm != nullptr && c_.world > 1) {
    std::uint64_t mine = trace_.fingerprint();
    std::vector<std::uint64_t> all(c_.world);
    c_.comm->all_gather(&mine, all.data(), 2, DType::fp32);
    for (int r = 0; r < c_.world; ++r) {
      STRATA_CHECK(all[r] == all[0], Errc::invalid_argument, "rank ", c_.rank,
                   ": the order of parameter gathers in step ", step, " differs between ranks (rank ", r,
                   " differs from rank 0): every rank must run the same layers in the same order");
    }
  }
  trace_.adopt();
  return true;
}

}  // namespace strata::engine
