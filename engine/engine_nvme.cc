// The engine's NVMe tier: the optimizer swapper that holds the fp32 master, exp_avg and
// exp_avg_sq shards of the layers whose optimizer state lives on NVMe (one swapper tensor
// per layer, under offload_optimizer.nvme_path/rank<R>), the parameter store that holds the
// stage-3 compute-dtype shards of the layers whose parameters live on NVMe (under
// offload_param.nvme_path/rank<R>/params), and the staging of updated shards on their way
// from the CPU optimizer to the tier they live on. Buffers are charged to the host tier,
// swap files (both generations) to the NVMe tier.
#include <chrono>
#include <string>
#include <vector>

#include "engine/detail/engine_impl.h"
#include "runtime/core/error.h"
#include "runtime/core/log.h"
#include "runtime/core/units.h"

namespace strata::engine {

// DeepSpeed's libaio knobs that io_uring makes moot are said so, once, rather than ignored.
void Engine::Impl::warn_aio_knobs() const {
  if (cfg.aio.intra_op_parallelism != 1) {
    warn_once("aio.intra_op_parallelism",
              str_cat("aio.intra_op_parallelism = ", cfg.aio.intra_op_parallelism,
                      " has no effect: Strata's io_uring engine needs no I/O threads (aio.queue_depth "
                      "keeps the drive busy)"));
  }
  if (!cfg.aio.overlap_events) {
    warn_once("aio.overlap_events",
              "aio.overlap_events = false has no effect: io_uring always overlaps submission and "
              "completion");
  }
}

std::string Engine::Impl::lock_rank_dir(const std::string& nvme_path, const char* key) {
  const std::string dir = nvme_path + "/rank" + std::to_string(rank);
  for (const auto& held : nvme_locks)
    if (held.dir() == dir) return dir;
  nvme_locks.emplace_back(dir, key);
  return dir;
}

void Engine::Impl::setup_swapper() {
  const OffloadConfig& oc = cfg.offload_optimizer;
  STRATA_CHECK(!oc.nvme_path.empty(), Errc::invalid_argument,
               "optimizer state is placed on NVMe but offload_optimizer.nvme_path is not set: give a directory on the "
               "NVMe drive");
  offload::SwapperOptions so;
  so.dir = lock_rank_dir(oc.nvme_path, "offload_optimizer.nvme_path");
  so.sub_group_elems = cfg.zero.sub_group_size;
  so.buffer_count = oc.buffer_count > 0 ? oc.buffer_count : 4;
  so.budget_bytes = ledger->available(Tier::host);
  so.queue_depth = static_cast<unsigned>(cfg.aio.queue_depth);
  so.block_bytes = static_cast<std::uint32_t>(cfg.aio.block_size);
  so.submit_batch = cfg.aio.single_submit ? 1 : 8;
  so.tracer = options.tracer;
  warn_aio_knobs();
  std::vector<offload::SwapTensor> tensors;
  for (std::size_t li = 0; li < layers.size(); ++li) {
    if (layers[li].opt_tier != Tier::nvme) continue;
    layers[li].swap_index = static_cast<int>(swap_layers.size());
    swap_layers.push_back(static_cast<int>(li));
    tensors.push_back({str_cat("layer ", layout->layers()[li].id), layers[li].shard_total});
  }
  swapper = std::make_unique<offload::OptimizerSwapper>(so, std::move(tensors));
  const std::uint64_t buffers = swapper->buffer_bytes() * static_cast<std::uint64_t>(swapper->buffer_count());
  ledger->charge(Tier::host, Kind::buffers, buffers, "the NVMe optimizer swap buffers");
  swap_buffer_bytes = buffers;
  ledger->charge(Tier::nvme, Kind::optimizer, swapper->file_bytes(),
                 str_cat("the optimizer swap files in ", so.dir, " (two generations)"));
  swap_file_bytes = swapper->file_bytes();
}

// A parameter store for the layers `tiers` puts on NVMe, under nvme_path/rank<R>/<subdir>,
// its buffers charged to the host tier and its files to the NVMe tier (both released again
// if either charge fails).
Engine::Impl::StoreBuild Engine::Impl::build_param_store(const std::vector<Tier>& tiers, const std::string& subdir) {
  const OffloadConfig& pc = cfg.offload_param;
  STRATA_CHECK(
      !pc.nvme_path.empty(), Errc::invalid_argument,
      "parameters are placed on NVMe but offload_param.nvme_path is not set: give a directory on the NVMe drive");
  offload::ParamStoreOptions po;
  po.dir = lock_rank_dir(pc.nvme_path, "offload_param.nvme_path") + "/" + subdir;
  po.chunk_bytes = (pc.buffer_size > 0 ? pc.buffer_size : 100000000) * cbytes;
  po.buffer_count = pc.buffer_count > 0 ? pc.buffer_count : 5;
  po.budget_bytes = ledger->available(Tier::host);
  po.queue_depth = static_cast<unsigned>(cfg.aio.queue_depth);
  po.block_bytes = static_cast<std::uint32_t>(cfg.aio.block_size);
  po.submit_batch = cfg.aio.single_submit ? 1 : 8;
  warn_aio_knobs();
  StoreBuild b;
  b.subdir = subdir;
  b.index.assign(layers.size(), -1);
  std::vector<offload::ParamTensor> tensors;
  for (std::size_t li = 0; li < layers.size(); ++li) {
    if (tiers[li] != Tier::nvme) continue;
    b.index[li] = static_cast<int>(tensors.size());
    tensors.push_back({str_cat("layer ", layout->layers()[li].id), layers[li].shard_total * cbytes});
  }
  b.store = std::make_unique<offload::ParamStore>(po, std::move(tensors));
  const std::uint64_t buffers = b.store->buffer_bytes() * static_cast<std::uint64_t>(b.store->buffer_count());
  ledger->charge(Tier::host, Kind::buffers, buffers, "the NVMe parameter buffers");
  try {
    ledger->charge(Tier::nvme, Kind::params, b.store->file_bytes(),
                   str_cat("the parameter swap files in ", po.dir, " (two generations)"));
  } catch (...) {
    ledger->discharge(Tier::host, Kind::buffers, buffers);
    throw;
  }
  b.buffer_bytes = buffers;
  b.file_bytes = b.store->file_bytes();
  return b;
}

void Engine::Impl::drop_param_store(StoreBuild& b) noexcept {
  b.store.reset();
  if (b.buffer_bytes) ledger->discharge(Tier::host, Kind::buffers, b.buffer_bytes);
  if (b.file_bytes) ledger->discharge(Tier::nvme, Kind::params, b.file_bytes);
  b.buffer_bytes = b.file_bytes = 0;
}

void Engine::Impl::setup_param_store() {
  std::vector<Tier> tiers;
  for (const auto& S : layers) tiers.push_back(S.param_tier);
  store = build_param_store(tiers, "params");
  for (std::size_t li = 0; li < layers.size(); ++li) layers[li].store_index = store.index[li];
}

void Engine::Impl::drain_io() {
  if (nvme_io) nvme_io->synchronize();
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
      if (e.code() != Errc::out_of_budget || nvme_io == nullptr) throw;
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
    nvme_io->submit(
        [this, buf, idx = static_cast<std::size_t>(S.store_index), id = L.id] {
          Tracer::Span span(options.tracer, "nvme write", str_cat("params L", id));
          param_store->write(idx, buf);
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
