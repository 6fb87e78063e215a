// Stage-3 parameter gathers. A gather moves this rank's shards of a layer device -> pinned
// staging, all-gathers them across ranks there (Gloo, stream-ordered on the gather stream),
// and copies the whole layer staging -> device: both link directions, so a throttled host
// link models PCIe. The order of gathers in the first step is recorded, checked identical
// on every rank at step(), and replayed in later steps to prefetch ahead within
// stage3_prefetch_bucket_size and stage3_max_live_parameters; a released layer whose next
// use is within stage3_max_reuse_distance elements stays gathered. A step whose gathers
// leave the recorded order turns prefetch off, warns, and is recorded anew.
#include <algorithm>
#include <chrono>
#include <cstring>

#include "engine/detail/engine_impl.h"
#include "runtime/core/error.h"
#include "runtime/core/log.h"
#include "runtime/core/random.h"

namespace strata::engine {

std::vector<TensorView> Engine::Impl::gather(int li) {
  auto& S = layers[li];
  const auto& L = layout->layers()[li];
  STRATA_CHECK(in_step || in_eval, Errc::invalid_argument, "gather(", L.id,
               ") outside begin_step()/step() and begin_eval()/end_eval()");
  if (cfg.zero.stage < 3) return views(li, S.params_full, cdt);
  if (in_eval) {  // forward-only passes leave the recorded trace and its prefetch alone
    if (!S.persistent && S.params_full == nullptr) issue_gather(li);
    S.retained = false;
    ++S.in_use;
    if (!S.persistent) wait_gather(li);
    return views(li, S.params_full, cdt);
  }
  if (const auto expected = gather_trace.observe(li)) {
    STRATA_LOG(
        warn, "rank ", rank, ": step ", step_calls + 1, ": gather #", gather_trace.recorded(), " is layer ", L.id,
        " but the recorded trace expects ",
        *expected >= 0 ? "layer " + std::to_string(layout->layers()[*expected].id) : std::string("no more gathers"),
        "; prefetch is off for this step and the trace is recorded again");
  }
  if (!S.persistent) {
    if (S.params_full == nullptr) issue_gather(li);
    S.retained = false;
    ++S.in_use;
    wait_gather(li);
    if (gather_trace.replaying()) prefetch_after(gather_trace.cursor());
  } else {
    ++S.in_use;
  }
  return views(li, S.params_full, cdt);
}

void Engine::Impl::issue_gather(int li) {
  auto& S = layers[li];
  const auto& L = layout->layers()[li];
  const std::uint64_t need = L.padded;
  const std::uint64_t max_live = cfg.zero.stage3_max_live_parameters;
  while (live_elems + need > max_live) {
    if (!drop_retained()) {
      STRATA_THROW(Errc::out_of_budget, "rank ", rank, ": gathering layer ", L.id, " (", need,
                   " elements) would exceed zero_optimization.stage3_max_live_parameters = ", max_live, " with ",
                   live_elems, " elements gathered and in use: release layers after use or raise the limit");
    }
  }
  const std::string what = str_cat("layer ", L.id, " gathered parameters");
  for (;;) {
    try {
      S.params_full = ledger->allocate(Tier::device, Kind::buffers, need * cbytes, what);
      break;
    } catch (const Error& e) {
      if (e.code() != Errc::out_of_budget || !drop_retained()) throw;
    }
  }
  try {
    const std::string staging_what = str_cat("layer ", L.id, " gather staging");
    try {
      // Page-locked: copies read it after stream work (an NVMe read, a host copy) fills it.
      S.staging = ledger->allocate(Tier::host, Kind::buffers, need * cbytes, staging_what, /*pinned=*/true);
    } catch (const Error& e) {
      // Write-backs queued on the I/O worker hold host staging until written: wait for them.
      if (e.code() != Errc::out_of_budget || nvme_io == nullptr) throw;
      drain_io();
      S.staging = ledger->allocate(Tier::host, Kind::buffers, need * cbytes, staging_what, /*pinned=*/true);
    }
  } catch (...) {
    ledger->free(S.params_full);
    S.params_full = nullptr;
    throw;
  }
  live_elems += need;
  peak_live_elems = std::max(peak_live_elems, live_elems);
  try {
    submit_gather(li);
  } catch (...) {
    // Work queued before the failure may still touch the buffers: let the streams drain
    // (their errors are this one's consequences), then drop the half-issued gather so the
    // next gather() issues it anew rather than handing out what it left.
    settle({gather_stream.get()}, "");
    S.ready.reset();
    S.gather_ok.reset();
    S.read_ticket = 0;
    ledger->free(S.staging);
    S.staging = nullptr;
    ledger->free(S.params_full);
    S.params_full = nullptr;
    live_elems -= need;
    throw;
  }
}

// The gather's stream work (issue_gather has allocated its buffers).
void Engine::Impl::submit_gather(int li) {
  auto& S = layers[li];
  const auto& L = layout->layers()[li];
  const std::uint64_t need = L.padded;

  auto& st = *gather_stream;
  char* staging = static_cast<char*>(S.staging);
  auto started = std::make_shared<Tracer::Clock::time_point>();
  auto copied = std::make_shared<Tracer::Clock::time_point>();
  Tracer* tracer = options.tracer;
  st.launch_host([started] { *started = Tracer::Clock::now(); });
  char* full = static_cast<char*>(S.params_full);
  const bool on_device = device_collectives();
  if (on_device) {
    // This rank's shards into their places in the device buffer (only they cross the link),
    // then all-gathered there by the device communicator.
    if (S.param_tier == Tier::nvme) stage_params_in(li, staging);  // read into their staging places
    for (std::size_t k = 0; k < L.buckets.size(); ++k) {
      const auto& b = layout->buckets()[L.buckets[k]];
      const std::size_t own = (bucket_pos(b, L) + own_begin(b)) * cbytes;
      const char* src = S.param_tier == Tier::nvme ? staging + own
                                                   : static_cast<const char*>(S.params_shard) + S.shard_off[k] * cbytes;
      st.copy_async(
          full + own, src, b.shard * cbytes,
          S.param_tier == Tier::device ? device::CopyKind::device_to_device : device::CopyKind::host_to_device);
    }
    if (S.param_tier != Tier::device) io.h2d_bytes += S.shard_total * cbytes;
    st.launch_host([copied] { *copied = Tracer::Clock::now(); });
    for (std::size_t k = 0; k < L.buckets.size(); ++k) {
      const auto& b = layout->buckets()[L.buckets[k]];
      char* region = full + bucket_pos(b, L) * cbytes;
      dcomm->all_gather(region + own_begin(b) * cbytes, region, b.shard, cdt, st);
    }
  } else {
    stage_params_in(li, staging);
    for (std::size_t k = 0; k < L.buckets.size(); ++k) {
      const auto& b = layout->buckets()[L.buckets[k]];
      char* region = staging + bucket_pos(b, L) * cbytes;
      if (world > 1) comm->all_gather(region + own_begin(b) * cbytes, region, b.shard, cdt, st);
    }
    io.h2d_bytes += need * cbytes;
    st.launch_host([copied] { *copied = Tracer::Clock::now(); });
    st.copy_async(S.params_full, staging, need * cbytes, device::CopyKind::host_to_device);
  }
  S.gather_ok = std::make_shared<std::atomic<bool>>(false);
  st.launch_host([ok = S.gather_ok, io = nvme_io.get(), read = S.read_ticket, started, copied, tracer, on_device,
                  id = L.id] {
    if (tracer != nullptr && tracer->enabled()) {
      const auto end = Tracer::Clock::now();
      // Without device collectives: all-gather in host staging, then the layer's H2D copy;
      // with them: the shards' H2D (or D2D) copy, then the all-gather on the device.
      tracer->record(on_device ? "copy" : "gather", str_cat(on_device ? "H2D shards L" : "all_gather L", id), *started,
                     *copied);
      tracer->record(on_device ? "gather" : "copy", str_cat(on_device ? "all_gather L" : "H2D L", id), *copied, end);
    }
    ok->store(read == 0 || io->succeeded(read));
  });
  S.ready = dev.create_event();
  st.record(*S.ready);
}

// This rank's shards of every bucket of layer li into their places in the staging buffer,
// as gather-stream work: a D2H copy from device shards, a host copy from host shards, or a
// read from the parameter store by the I/O worker, which the stream waits for (checksums
// verified; a failed read is the worker's sticky failure, which wait_gather rethrows).
void Engine::Impl::stage_params_in(int li, char* staging) {
  auto& S = layers[li];
  const auto& L = layout->layers()[li];
  auto& st = *gather_stream;
  if (S.param_tier == Tier::nvme) {
    io.nvme_read_bytes += S.shard_total * cbytes;
    // The store's bytes are the shards of the layer's buckets, concatenated.
    S.read_ticket = nvme_io->submit([this, &L, &S, staging] {
      Tracer::Span span(options.tracer, "nvme read", str_cat("params L", L.id));
      param_store->read(
          static_cast<std::size_t>(S.store_index), [&](std::uint64_t off, const void* data, std::uint64_t n) {
            const char* src = static_cast<const char*>(data);
            for (std::size_t k = 0; k < L.buckets.size(); ++k) {
              const auto& b = layout->buckets()[L.buckets[k]];
              const std::uint64_t b0 = S.shard_off[k] * cbytes, b1 = b0 + b.shard * cbytes;
              const std::uint64_t lo = std::max(b0, off), hi = std::min(b1, off + n);
              if (lo >= hi) continue;
              std::memcpy(staging + (bucket_pos(b, L) + own_begin(b)) * cbytes + (lo - b0), src + (lo - off), hi - lo);
            }
          });
    });
    nvme_io->wait_on(st, S.read_ticket);  // raised after a failed read too: succeeded() tells
    return;
  }
  for (std::size_t k = 0; k < L.buckets.size(); ++k) {
    const auto& b = layout->buckets()[L.buckets[k]];
    char* dst = staging + (bucket_pos(b, L) + own_begin(b)) * cbytes;
    const char* src = static_cast<const char*>(S.params_shard) + S.shard_off[k] * cbytes;
    if (S.param_tier == Tier::device) {
      st.copy_async(dst, src, b.shard * cbytes, device::CopyKind::device_to_host);
    } else {
      st.launch_host([dst, src, n = b.shard * cbytes] { std::memcpy(dst, src, n); });
    }
  }
  if (S.param_tier == Tier::device) io.d2h_bytes += S.shard_total * cbytes;
}

// Drops the retained (gathered, not in use) layer whose next use in the recorded trace is
// furthest away; false when none is retained. Used to make room under max_live and under
// the device budget (gathers, prefetches, gradient buffers).
bool Engine::Impl::drop_retained() {
  int victim = -1;
  std::size_t victim_next = 0;
  for (std::size_t j = 0; j < layers.size(); ++j) {
    if (!layers[j].retained) continue;
    const std::size_t next = gather_trace.next_use(static_cast<int>(j));
    if (victim < 0 || next > victim_next) {
      victim = static_cast<int>(j);
      victim_next = next;
    }
  }
  if (victim < 0) return false;
  evict(victim);
  return true;
}

void Engine::Impl::wait_gather(int li) {
  auto& S = layers[li];
  if (!S.ready) return;
  {
    Tracer::Span span(options.tracer, "compute", str_cat("wait L", layout->layers()[li].id));
    const auto t0 = std::chrono::steady_clock::now();
    S.ready->synchronize();
    io.io_wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  if (!S.gather_ok->load()) {  // rethrow the gather's error, or the read's it waited for
    gather_stream->synchronize();
    drain_io();
    STRATA_THROW(Errc::internal, "rank ", rank, ": the gather of layer ", layout->layers()[li].id,
                 " failed without an error");
  }
  S.read_ticket = 0;
  S.ready.reset();
  ledger->free(S.staging);
  S.staging = nullptr;
}

void Engine::Impl::release(int li) {
  auto& S = layers[li];
  const auto& L = layout->layers()[li];
  if (cfg.zero.stage < 3) return;
  STRATA_CHECK(S.in_use > 0, Errc::invalid_argument, "release(", L.id, ") without a matching gather(", L.id, ")");
  if (--S.in_use > 0 || S.persistent) return;
  if (gather_trace.replaying() && !in_eval) {
    const auto& trace = gather_trace.trace();
    std::uint64_t distance = 0;
    for (std::size_t k = gather_trace.cursor(); k < trace.size(); ++k) {
      if (trace[k] == li) {
        if (distance <= cfg.zero.stage3_max_reuse_distance) {
          S.retained = true;
          return;
        }
        break;
      }
      distance += padded_elems(trace[k]);
    }
  }
  evict(li);
}

void Engine::Impl::evict(int li) {
  auto& S = layers[li];
  if (S.ready) {
    S.ready->synchronize();
    S.ready.reset();
  }
  ledger->free(S.staging);
  S.staging = nullptr;
  if (S.params_full != nullptr) {
    ledger->free(S.params_full);
    S.params_full = nullptr;
    live_elems -= padded_elems(li);
  }
  S.retained = false;
}

void Engine::Impl::prefetch_after(std::size_t position) {
  const std::uint64_t window = cfg.zero.stage3_prefetch_bucket_size;
  if (window == 0) return;
  std::uint64_t issued = 0;
  const auto& trace = gather_trace.trace();
  for (std::size_t k = position; k < trace.size(); ++k) {
    const int li = trace[k];
    auto& S = layers[li];
    if (S.persistent || S.params_full != nullptr) continue;
    const std::uint64_t need = padded_elems(li);
    if (issued + need > window || live_elems + need > cfg.zero.stage3_max_live_parameters) break;
    // Leave the device room for the gradient buffers of backward (the current one, and the
    // one a running reduction still holds): a prefetch that a gradient buffer then evicts
    // is read twice.
    const std::uint64_t reserve = layout->largest_layer_padded() * cbytes * (grads->overlapped() ? 2 : 1);
    if (ledger->available(Tier::device) < need * cbytes + reserve) break;
    try {
      issue_gather(li);
    } catch (const Error& e) {
      if (e.code() != Errc::out_of_budget) throw;
      break;  // no room now: the gather happens on demand
    }
    S.retained = true;  // resident but not in use until gather() claims it
    issued += need;
  }
}

void Engine::Impl::end_step_trace() {
  if (cfg.zero.stage < 3) return;
  // Updated shards make every gathered copy stale.
  for (std::size_t li = 0; li < layers.size(); ++li) {
    if (!layers[li].persistent) evict(static_cast<int>(li));
  }
  if (!gather_trace.needs_record()) return;
  if (gather_trace.replaying()) {
    STRATA_LOG(warn, "rank ", rank, ": step ", step_calls + 1, " made ", gather_trace.recorded(),
               " gathers but the recorded trace has ", gather_trace.trace().size(), "; the trace is recorded again");
  }
  if (comm != nullptr && world > 1) {
    std::uint64_t mine = gather_trace.fingerprint();
    std::vector<std::uint64_t> all(world);
    comm->all_gather(&mine, all.data(), 2, DType::fp32);
    for (int r = 0; r < world; ++r) {
      STRATA_CHECK(all[r] == all[0], Errc::invalid_argument, "rank ", rank, ": the order of parameter gathers in step ",
                   step_calls + 1, " differs between ranks (rank ", r,
                   " differs from rank 0): every rank must run the "
                   "same layers in the same order");
    }
  }
  gather_trace.adopt();
  check_plan_against_trace();
}

}  // namespace strata::engine
