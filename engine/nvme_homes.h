// NvmeHomes: the engine's NVMe tier for parameters (docs/design.md, "The engine's parts"). It
// owns the locks on the rank directories under the nvme_paths in use (the optimizer state's
// swapper, optimizer_state.h, takes its directory from lock_rank_dir()), the parameter store
// (stage-3 compute-dtype shards of the layers whose parameters live there, under
// offload_param.nvme_path/rank<R>/params) with the requests queued on it, and what the store
// charges to the ledger: buffers to the host tier, files (committed and spare) to the NVMe tier.
//
// Protocol. setup() calls open_params(tiers) with every layer's parameter tier (only the NVMe
// ones get files), once. The gather path and the staging of updated parameters queue their
// reads, write-backs and commits by layer (read_params_async, write_params_async,
// commit_params_async: the store runs them in order on its own worker) and wait on the
// returned request. A migration builds a second parameter store with build_params() (filled by
// the caller, dropped with drop() on failure) and switches to it with adopt(), which drains and
// drops the current one: a request of a store that is gone has completed. The destructor drains
// the store's queue, then closes the store and the locks, and gives the store's charges back.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/config.h"
#include "engine/engine.h"
#include "engine/layout.h"
#include "offload/dir_lock.h"
#include "offload/ledger.h"
#include "offload/param_store.h"
#include "runtime/core/trace.h"
#include "runtime/device/device.h"

namespace strata::engine {

class NvmeHomes {
 public:
  struct Context {  // what the tier uses and does not own
    const EngineConfig& cfg;
    const Layout& layout;
    int rank = 0;
    std::size_t cbytes = 4;  // compute-dtype element bytes (parameter shards)
    device::Device& dev;
    MemoryLedger& ledger;
    Tracer* tracer = nullptr;
  };
  // A parameter store with its charges and the tensor index of every layer in it (-1: not).
  struct ParamFiles {
    std::unique_ptr<offload::ParamStore> store;
    std::uint64_t buffer_bytes = 0, file_bytes = 0;
    std::vector<int> index;
    std::string subdir;
  };

  explicit NvmeHomes(const Context& ctx);
  ~NvmeHomes();
  NvmeHomes(const NvmeHomes&) = delete;
  NvmeHomes& operator=(const NvmeHomes&) = delete;

  // host_reserve: bytes of the host budget the store leaves for what setup allocates after it
  // (every layer's host state, the staging buffers): its buffer count shrinks to fit what
  // remains, rather than take room a later allocation needs.
  void open_params(const std::vector<Tier>& param_tiers, std::uint64_t host_reserve = 0);
  // A store for the layers `tiers` puts on NVMe, under nvme_path/rank<R>/<subdir>, charged
  // (both charges released again if either fails).
  ParamFiles build_params(const std::vector<Tier>& tiers, const std::string& subdir, std::uint64_t host_reserve = 0);
  void drop(ParamFiles& files) noexcept;
  void adopt(ParamFiles&& files);  // the current store goes; this one is current

  bool has_params() const noexcept { return params_.store != nullptr; }
  int store_index(int li) const { return params_.index.empty() ? -1 : params_.index[li]; }
  // The parameter store's blocking calls, by layer (each waits for the requests queued before
  // it): layer li's current shard to fn in offset order, its next shard written (current once
  // committed), every such write made current or dropped (abort logs a failure, never throws),
  // and layer li copied into a store that build_params() made.
  void read_params(int li, const offload::ParamStore::ChunkFn& fn);
  void write_params(int li, const void* src);
  void commit_params();
  void abort_params() noexcept;
  void copy_params(int li, ParamFiles& into);
  // Layer li's shard files mix two states (a dropped write had begun to commit when the spare
  // files ran out: the store's stale()); rewrite_params writes it whole and commits it alone.
  bool params_stale(int li) const;
  void rewrite_params(int li, const void* src);
  const std::string& params_subdir() const noexcept { return params_.subdir; }
  // The parameter store's queued requests, by layer (the store's protocol: param_store.h).
  // A write's staging goes back to the ledger once written.
  struct ParamRequest {
    std::uint64_t store = 0;  // the store's serial (0: no request)
    offload::ParamStore::Ticket ticket = 0;
  };
  ParamRequest read_params_async(int li, std::vector<offload::ParamStore::Piece> into);
  ParamRequest write_params_async(int li, const void* staging);
  void commit_params_async();        // every layer's write since the last commit
  void commit_params_async(int li);  // layer li's
  void wait_on(device::Stream& stream, ParamRequest r);
  void wait(ParamRequest r);
  bool succeeded(ParamRequest r) const;  // completed with no failure, here or before it
  // offload_states()'s spill (device_swap.h): a store of `pieces` (bytes each) under
  // nvme_path/rank<R>/offloaded (offload_param's nvme_path, else offload_optimizer's), its
  // buffers within `host_room` and charged like the others; null where neither path is set.
  // close_spill() removes it and gives the charges back.
  offload::ParamStore* open_spill(const std::vector<std::uint64_t>& pieces, std::uint64_t host_room);
  void close_spill() noexcept;
  void drain();  // the parameter store's synchronize(): its queue completed, a failure rethrown

  // nvme_path/rank<R>, locked for this run once (the lock names `key` when another holds it).
  std::string lock_rank_dir(const std::string& nvme_path, const char* key);
  // DeepSpeed's libaio knobs that io_uring makes moot are said so, once.
  void warn_aio_knobs() const;
  // The aio block's knobs, which every store takes alike.
  template <class StoreOptions> static void apply_aio(const EngineConfig& cfg, StoreOptions& o) {
    o.queue_depth = static_cast<unsigned>(cfg.aio.queue_depth);
    o.block_bytes = static_cast<std::uint32_t>(cfg.aio.block_size);
    o.submit_batch = cfg.aio.single_submit ? 1 : 8;
  }
  // The store's options from the config (no directory: the caller adds the rank's) with
  // `host_room` host bytes for its buffers (a missing nvme_path is refused, naming the key),
  // and its tensors: the layers `tiers` puts on NVMe, in layer order. What the estimate
  // (memory_estimate.h) sizes it with, too.
  static offload::ParamStoreOptions param_options(const EngineConfig& cfg, std::size_t cbytes, std::uint64_t host_room);
  static std::vector<offload::ParamTensor> param_tensors(const Layout& layout, std::size_t cbytes,
                                                         const std::vector<Tier>& param_tiers);

 private:
  // Charges a new store's buffers (host) and files (NVMe) to the ledger, both or neither.
  void charge(ParamFiles& f, const std::string& buffers, const std::string& files);

  Context c_;
  // Declared before the files so that the locks go after them.
  std::vector<offload::DirLock> locks_;
  ParamFiles params_;
  std::uint64_t params_serial_ = 0;  // counts the stores adopted (ParamRequest::store)
  ParamFiles spill_;                 // open_spill()
};

}  // namespace strata::engine
