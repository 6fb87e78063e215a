// The staging of updated shards on their way from the optimizer to the tier they live on:
// device shards updated by the CPU optimizer and NVMe shards collect in host staging while
// the layer is updated; the whole layer then goes to the device (H2D on the transfer stream)
// or is written back to the parameter store by the NVMe tier's I/O worker, behind the
// optimizer.
#include <chrono>
#include <string>
#include <vector>

#include "engine/detail/engine_impl.h"
#include "runtime/core/error.h"
#include "runtime/core/log.h"
#include "runtime/core/units.h"

namespace strata::engine {

void Engine::Impl::drain_io() {
  if (nvme) nvme->drain();
}

void* Engine::Impl::copy_target(int li) {
  auto& S = layers[li];
  const bool staged = S.param_tier == Tier::nvme || (acc_on_host(li) && S.param_tier == Tier::device);
  if (!staged) return nullptr;
  if (S.copy_stage == nullptr) {
    const std::string what = str_cat("layer ", layout->layers()[li].id, " updated parameter staging");
    try {
      S.copy_stage = ledger->allocate(Tier::host, Kind::buffers, copy_elems(li) * cbytes, what);
    } catch (const Error& e) {
      // Write-backs queued on the I/O worker hold their staging until written: when the
      // host tier is full, wait for them to drain (bounding them by the budget) and retry.
      if (e.code() != Errc::out_of_budget || nvme == nullptr || nvme->io() == nullptr) throw;
      {
        Tracer::Span span(options.tracer, "optimizer", "wait write-back");
        const auto t0 = std::chrono::steady_clock::now();
        drain_io();
        io.io_wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      }
      S.copy_stage = ledger->allocate(Tier::host, Kind::buffers, copy_elems(li) * cbytes, what);
    }
    S.copy_done = 0;
  }
  return S.copy_stage;
}

void Engine::Impl::copy_updated(int li, std::uint64_t elems) {
  auto& S = layers[li];
  S.copy_done += elems;
  if (S.copy_done < copy_elems(li)) return;
  const auto& L = layout->layers()[li];
  const auto t0 = std::chrono::steady_clock::now();
  if (S.param_tier == Tier::nvme) {
    // Written behind the optimizer by the I/O worker: FIFO order puts the write (and the
    // commit step() queues after the last one) before the next step's read of the layer,
    // so the next forward overlaps the write-back. A failed write is the worker's sticky
    // failure: the commit is skipped (the last good shards stay current) and the next
    // gather reports it. The staging goes back to the host tier in every case.
    void* buf = S.copy_stage;
    io.nvme_write_bytes += S.shard_total * cbytes;
    S.copy_stage = nullptr;
    S.copy_done = 0;
    nvme->io()->submit(
        [this, buf, store = param_store(), idx = static_cast<std::size_t>(nvme->store_index(li)), id = L.id] {
          Tracer::Span span(options.tracer, "nvme write", str_cat("params L", id));
          store->write(idx, buf);
        },
        [this, buf] { ledger->retire(buf); });
    return;
  } else {
    Tracer::Span span(options.tracer, "copy", str_cat("H2D updated L", L.id));
    // Stage 3: the shard as it is laid out; stages 1-2: this rank's part of each bucket;
    // stage 0: the whole layer.
    const char* src = static_cast<const char*>(S.copy_stage);
    if (cfg.zero.stage == 0) {
      xfer_stream->copy_async(S.params_full, src, L.padded * cbytes, device::CopyKind::host_to_device);
    }
    for (std::size_t k = 0; k < L.buckets.size() && cfg.zero.stage > 0; ++k) {
      const auto& b = layout->buckets()[L.buckets[k]];
      char* dst = cfg.zero.stage == 3 ? static_cast<char*>(S.params_shard) + S.shard_off[k] * cbytes
                                      : static_cast<char*>(S.params_full) + (bucket_pos(b, L) + own_begin(b)) * cbytes;
      xfer_stream->copy_async(dst, src + S.shard_off[k] * cbytes, b.shard * cbytes, device::CopyKind::host_to_device);
    }
    xfer_stream->synchronize();
    io.h2d_bytes += copy_elems(li) * cbytes;
  }
  io.io_wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ledger->free(S.copy_stage);
  S.copy_stage = nullptr;
  S.copy_done = 0;
}

}  // namespace strata::engine
