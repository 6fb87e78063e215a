// The engine's NVMe tier (the protocol in nvme_homes.h).
#include "engine/nvme_homes.h"

#include <algorithm>

#include "runtime/core/error.h"
#include "runtime/core/log.h"
#include "runtime/core/units.h"

namespace strata::engine {

NvmeHomes::NvmeHomes(const Context& ctx) : c_(ctx) {}

NvmeHomes::~NvmeHomes() {
  drop(params_);  // finishes what is queued first: write-backs still read their staging
  drop(spill_);   // (offload_states' store goes with its DeviceSwap, before this)
}

void NvmeHomes::warn_aio_knobs() const {
  if (c_.cfg.aio.intra_op_parallelism != 1) {
    warn_once("aio.intra_op_parallelism",
              str_cat("aio.intra_op_parallelism = ", c_.cfg.aio.intra_op_parallelism,
                      " has no effect: Strata's io_uring engine needs no I/O threads (aio.queue_depth "
                      "keeps the drive busy)"));
  }
  if (!c_.cfg.aio.overlap_events) {
    warn_once("aio.overlap_events",
              "aio.overlap_events = false has no effect: io_uring always overlaps submission and "
              "completion");
  }
}

offload::ParamStoreOptions NvmeHomes::param_options(const EngineConfig& cfg, std::size_t cbytes,
                                                    std::uint64_t host_room) {
  const OffloadConfig& pc = cfg.offload_param;
  STRATA_CHECK(
      !pc.nvme_path.empty(), Errc::invalid_argument,
      "parameters are placed on NVMe but offload_param.nvme_path is not set: give a directory on the NVMe drive");
  offload::ParamStoreOptions po;
  po.chunk_bytes = (pc.buffer_size > 0 ? pc.buffer_size : 100000000) * cbytes;
  po.buffer_count = pc.buffer_count > 0 ? pc.buffer_count : 5;
  po.budget_bytes = host_room;
  po.spares = pc.spare_chunks;
  apply_aio(cfg, po);
  return po;
}

std::vector<offload::ParamTensor> NvmeHomes::param_tensors(const Layout& layout, std::size_t cbytes,
                                                           const std::vector<Tier>& param_tiers) {
  std::vector<offload::ParamTensor> tensors;
  for (std::size_t li = 0; li < param_tiers.size(); ++li) {
    if (param_tiers[li] == Tier::nvme)
      tensors.push_back({str_cat("layer ", layout.layers()[li].id), layout.layer_shard(static_cast<int>(li)) * cbytes});
  }
  return tensors;
}

std::string NvmeHomes::lock_rank_dir(const std::string& nvme_path, const char* key) {
  const std::string dir = nvme_path + "/rank" + std::to_string(c_.rank);
  for (const auto& held : locks_)
    if (held.dir() == dir) return dir;
  locks_.emplace_back(dir, key);
  return dir;
}

namespace {
std::uint64_t room_after(std::uint64_t available, std::uint64_t reserve) {
  return available > reserve ? available - reserve : 0;
}
}  // namespace

NvmeHomes::ParamFiles NvmeHomes::build_params(const std::vector<Tier>& tiers, const std::string& subdir,
                                              std::uint64_t host_reserve) {
  const OffloadConfig& pc = c_.cfg.offload_param;
  offload::ParamStoreOptions po =
      param_options(c_.cfg, c_.cbytes, room_after(c_.ledger.available(Tier::host), host_reserve));
  po.dir = lock_rank_dir(pc.nvme_path, "offload_param.nvme_path") + "/" + subdir;
  po.device = &c_.dev;
  po.tracer = c_.tracer;
  warn_aio_knobs();
  ParamFiles b;
  b.subdir = subdir;
  b.index.assign(tiers.size(), -1);
  std::vector<offload::ParamTensor> tensors = param_tensors(c_.layout, c_.cbytes, tiers);
  for (std::size_t li = 0, n = 0; li < tiers.size(); ++li) {
    if (tiers[li] == Tier::nvme) b.index[li] = static_cast<int>(n++);
  }
  b.store = std::make_unique<offload::ParamStore>(po, std::move(tensors));
  charge(b, "the NVMe parameter buffers",
         str_cat("the parameter swap files in ", po.dir,
                 po.spares == 0 ? " (two generations)" : " (the shards and their spare files)"));
  return b;
}

void NvmeHomes::charge(ParamFiles& f, const std::string& buffers, const std::string& files) {
  const std::uint64_t bytes = f.store->buffer_bytes() * static_cast<std::uint64_t>(f.store->buffer_count());
  c_.ledger.charge(Tier::host, Kind::buffers, bytes, buffers);
  try {
    c_.ledger.charge(Tier::nvme, Kind::params, f.store->file_bytes(), files);
  } catch (...) {
    c_.ledger.discharge(Tier::host, Kind::buffers, bytes);
    throw;
  }
  f.buffer_bytes = bytes;
  f.file_bytes = f.store->file_bytes();
}

void NvmeHomes::drop(ParamFiles& b) noexcept {
  b.store.reset();
  if (b.buffer_bytes) c_.ledger.discharge(Tier::host, Kind::buffers, b.buffer_bytes);
  if (b.file_bytes) c_.ledger.discharge(Tier::nvme, Kind::params, b.file_bytes);
  b.buffer_bytes = b.file_bytes = 0;
}

void NvmeHomes::open_params(const std::vector<Tier>& param_tiers, std::uint64_t host_reserve) {
  params_ = build_params(param_tiers, "params", host_reserve);
  ++params_serial_;
}

void NvmeHomes::adopt(ParamFiles&& files) {
  drain();
  drop(params_);
  params_ = std::move(files);
  ++params_serial_;
}

NvmeHomes::ParamRequest NvmeHomes::read_params_async(int li, std::vector<offload::ParamStore::Piece> into) {
  return {params_serial_, params_.store->read_async(static_cast<std::size_t>(store_index(li)), std::move(into))};
}

NvmeHomes::ParamRequest NvmeHomes::write_params_async(int li, const void* staging) {
  return {params_serial_, params_.store->write_async(static_cast<std::size_t>(store_index(li)), staging, &c_.ledger)};
}

void NvmeHomes::commit_params_async() {
  if (params_.store) params_.store->commit_async();
}

void NvmeHomes::commit_params_async(int li) {
  if (params_.store && store_index(li) >= 0) params_.store->commit_async(static_cast<std::size_t>(store_index(li)));
}

void NvmeHomes::read_params(int li, const offload::ParamStore::ChunkFn& fn) {
  params_.store->read(static_cast<std::size_t>(store_index(li)), fn);
}

void NvmeHomes::write_params(int li, const void* src) {
  params_.store->write(static_cast<std::size_t>(store_index(li)), src);
}

void NvmeHomes::commit_params() {
  if (params_.store) params_.store->commit();
}

bool NvmeHomes::params_stale(int li) const {
  return params_.store && store_index(li) >= 0 && params_.store->stale(static_cast<std::size_t>(store_index(li)));
}

void NvmeHomes::rewrite_params(int li, const void* src) {
  const auto t = static_cast<std::size_t>(store_index(li));
  params_.store->write(t, src);
  params_.store->commit(t);
}

void NvmeHomes::abort_params() noexcept {
  if (!params_.store) return;
  try {
    params_.store->abort();
  } catch (const std::exception& e) {
    STRATA_LOG(error, "rank ", c_.rank, ": dropping uncommitted parameter writes: ", e.what());
  }
}

void NvmeHomes::copy_params(int li, ParamFiles& into) {
  into.store->write_from(static_cast<std::size_t>(into.index[li]), *params_.store,
                         static_cast<std::size_t>(store_index(li)));
}

void NvmeHomes::wait_on(device::Stream& stream, ParamRequest r) {
  if (r.store == params_serial_ && r.ticket != 0) params_.store->wait_on(stream, r.ticket);
}

void NvmeHomes::wait(ParamRequest r) {
  if (r.store == params_serial_ && r.ticket != 0) params_.store->wait(r.ticket);
}

bool NvmeHomes::succeeded(ParamRequest r) const {
  return r.store != params_serial_ || r.ticket == 0 || params_.store->succeeded(r.ticket);
}

offload::ParamStore* NvmeHomes::open_spill(const std::vector<std::uint64_t>& pieces, std::uint64_t host_room) {
  const bool param_path = !c_.cfg.offload_param.nvme_path.empty();
  const std::string& path = param_path ? c_.cfg.offload_param.nvme_path : c_.cfg.offload_optimizer.nvme_path;
  if (path.empty()) return nullptr;
  offload::ParamStoreOptions po;
  po.chunk_bytes = *std::max_element(pieces.begin(), pieces.end());
  po.buffer_count = 2;
  po.budget_bytes = host_room;
  apply_aio(c_.cfg, po);
  po.dir = lock_rank_dir(path, param_path ? "offload_param.nvme_path" : "offload_optimizer.nvme_path") + "/offloaded";
  std::vector<offload::ParamTensor> tensors;
  for (std::size_t i = 0; i < pieces.size(); ++i) tensors.push_back({str_cat("offloaded piece ", i), pieces[i]});
  spill_.store = std::make_unique<offload::ParamStore>(po, std::move(tensors));
  try {
    charge(spill_, "the NVMe buffers of offload_states()", str_cat("the files of offload_states() in ", po.dir));
  } catch (...) {
    spill_ = {};
    throw;
  }
  return spill_.store.get();
}

void NvmeHomes::close_spill() noexcept { drop(spill_); }

void NvmeHomes::drain() {
  if (params_.store) params_.store->synchronize();
}

}  // namespace strata::engine
