// DeviceSwap: what Engine::offload_states() moves off the device and reload_states() brings
// back (docs/design.md, "The engine's parts"). The parts that hold device memory between
// steps (ParamHomes, OptimizerState, GradReducer) name each allocation through their
// device_memory(fn), in the same order each time, and keep what fn returns.
//
// Protocol. plan(sizes) takes the sizes of that walk's allocations and decides where each
// goes: all to host RAM when the host tier has room for them, else those that fit (beside the
// NVMe path's own buffers) to host RAM and the rest to NVMe, cut into pieces of at most
// a piece's bytes (kMinPiece-kMaxPiece) in a store under the nvme_path (NvmeHomes::open_spill), when one is set;
// without one every allocation goes to host RAM and the ledger refuses what does not fit,
// naming the bytes and the budget. out() then moves the next allocation: into a new host-tier
// allocation of the same kind, or piece by piece through one pinned bounce buffer into the
// store, in whose place the part keeps a small host token; finish_out() commits the store.
// back() does the reverse for a pointer out() gave and passes any other through, so the same
// walk undoes a partial offload (after finish_out(), which makes what was written readable),
// and the store goes once nothing is left in it. The bytes are
// copied, not recomputed: a reload gives every bit back.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "offload/ledger.h"
#include "runtime/device/device.h"

namespace strata::offload {
class ParamStore;
}

namespace strata::engine {

class NvmeHomes;

class DeviceSwap {
 public:
  // Bytes per NVMe piece and of the bounce buffer: a quarter of the host room, 4 KiB to 8 MiB.
  static constexpr std::size_t kMinPiece = std::size_t{4} << 10, kMaxPiece = std::size_t{8} << 20;
  static constexpr std::size_t kToken = 64;  // host bytes standing in for an allocation on NVMe
  // fn(device or host pointer, bytes, kind, what) -> the pointer the part keeps.
  using Fn = std::function<void*(void* p, std::size_t bytes, offload::Kind kind, const std::string& what)>;

  // nvme: the engine's NVMe tier (its nvme_path holds the spill), or null.
  DeviceSwap(offload::MemoryLedger& ledger, device::Stream& stream, NvmeHomes* nvme);
  ~DeviceSwap();
  DeviceSwap(const DeviceSwap&) = delete;
  DeviceSwap& operator=(const DeviceSwap&) = delete;

  void plan(const std::vector<std::size_t>& sizes);
  void* out(void* p, std::size_t bytes, offload::Kind kind, const std::string& what);
  void finish_out();
  void* back(void* p, std::size_t bytes, offload::Kind kind, const std::string& what);

  std::uint64_t bytes_out() const noexcept { return host_bytes_ + nvme_bytes_; }  // off the device now
  std::uint64_t nvme_bytes() const noexcept { return nvme_bytes_; }
  std::size_t allocations() const noexcept { return host_.size() + spilled_.size(); }

 private:
  struct Spilled {
    std::size_t first_piece = 0;
    std::size_t bytes = 0;
  };
  void* bounce();
  void* moved(void* p, offload::Tier from, offload::Tier to, std::size_t bytes, offload::Kind kind,
              const std::string& what);
  void drop_store() noexcept;

  offload::MemoryLedger& ledger_;
  device::Stream& stream_;
  NvmeHomes* nvme_;
  std::vector<bool> to_nvme_;  // per allocation of the walk (plan)
  std::size_t next_ = 0;       // the walk's next allocation (out)
  offload::ParamStore* store_ = nullptr;
  void* bounce_ = nullptr;
  std::size_t piece_ = kMaxPiece;                // bytes per piece (plan)
  std::size_t pieces_ = 0;                       // store pieces handed out so far
  std::unordered_map<void*, std::size_t> host_;  // host copy -> bytes
  std::unordered_map<void*, Spilled> spilled_;   // token -> its pieces in the store
  std::uint64_t host_bytes_ = 0, nvme_bytes_ = 0;
};

}  // namespace strata::engine
