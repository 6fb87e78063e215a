// DeviceSwap (the protocol in device_swap.h).
#include "engine/device_swap.h"

#include <algorithm>

#include "engine/nvme_homes.h"
#include "engine/tier_copy.h"
#include "offload/param_store.h"
#include "runtime/core/error.h"

namespace strata::engine {

using offload::Kind;
using offload::Tier;

DeviceSwap::DeviceSwap(offload::MemoryLedger& ledger, device::Stream& stream, NvmeHomes* nvme)
    : ledger_(ledger), stream_(stream), nvme_(nvme) {}

DeviceSwap::~DeviceSwap() { drop_store(); }

void DeviceSwap::drop_store() noexcept {
  ledger_.free(bounce_);
  bounce_ = nullptr;
  if (store_ != nullptr && nvme_ != nullptr) nvme_->close_spill();
  store_ = nullptr;
}

void DeviceSwap::plan(const std::vector<std::size_t>& sizes) {
  to_nvme_.assign(sizes.size(), false);
  next_ = 0;
  std::uint64_t total = 0;
  for (auto b : sizes) total += b;
  const std::uint64_t room = ledger_.available(Tier::host);
  if (total <= room || nvme_ == nullptr) return;  // all to host RAM (the ledger refuses what does not fit)
  // The spill's own host memory: its two pinned buffers and the bounce buffer.
  piece_ = std::clamp<std::size_t>(room / 4 / kMinPiece * kMinPiece, kMinPiece, kMaxPiece);
  const std::uint64_t spill = 3 * std::uint64_t{piece_};
  std::uint64_t host = 0;
  std::vector<std::uint64_t> pieces;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    if (host + sizes[i] + spill <= room) {
      host += sizes[i];
      continue;
    }
    to_nvme_[i] = true;
    host += kToken;  // what stands in for it in host RAM
    for (std::size_t at = 0; at < sizes[i]; at += piece_) pieces.push_back(std::min(piece_, sizes[i] - at));
  }
  if (pieces.empty()) return;
  store_ = nvme_->open_spill(pieces, room > host + piece_ ? room - host - piece_ : 0);
  if (store_ == nullptr) to_nvme_.assign(sizes.size(), false);  // no nvme_path: host RAM refuses, naming the bytes
}

void* DeviceSwap::bounce() {
  if (bounce_ == nullptr) bounce_ = ledger_.allocate(Tier::host, Kind::buffers, piece_, "offload_states bounce buffer");
  return bounce_;
}

// A new allocation on `to` holding p's bytes, and p freed; on a failure p is kept and nothing is left.
void* DeviceSwap::moved(void* p, Tier from, Tier to, std::size_t bytes, Kind kind, const std::string& what) {
  void* dst = ledger_.allocate(to, kind, bytes, what);
  try {
    copy_between(stream_, dst, to, p, from, bytes);
    stream_.synchronize();
  } catch (...) {
    ledger_.free(dst);
    throw;
  }
  ledger_.free(p);
  return dst;
}

void* DeviceSwap::out(void* p, std::size_t bytes, Kind kind, const std::string& what) {
  if (p == nullptr) return p;
  const bool nvme = next_ < to_nvme_.size() && to_nvme_[next_];
  ++next_;
  if (!nvme) {
    void* host = moved(p, Tier::device, Tier::host, bytes, kind, what + " (offloaded)");
    host_.emplace(host, bytes);
    host_bytes_ += bytes;
    return host;
  }
  // Piece by piece through the bounce buffer into the store; a small host token stands in.
  void* token = ledger_.allocate(Tier::host, Kind::buffers, kToken, what + " (offloaded to NVMe)");
  const Spilled s{pieces_, bytes};
  try {
    char* buf = static_cast<char*>(bounce());
    for (std::size_t at = 0, k = s.first_piece; at < bytes; at += piece_, ++k) {
      const std::size_t n = std::min(piece_, bytes - at);
      copy_between(stream_, buf, Tier::host, static_cast<char*>(p) + at, Tier::device, n);
      stream_.synchronize();
      store_->write(k, buf);
    }
  } catch (...) {
    ledger_.free(token);
    throw;
  }
  pieces_ += (bytes + piece_ - 1) / piece_;
  ledger_.free(p);
  spilled_.emplace(token, s);
  nvme_bytes_ += bytes;
  return token;
}

void DeviceSwap::finish_out() {
  if (store_ != nullptr) store_->commit();
  ledger_.free(bounce_);
  bounce_ = nullptr;
}

void* DeviceSwap::back(void* p, std::size_t bytes, Kind kind, const std::string& what) {
  if (const auto it = host_.find(p); it != host_.end()) {
    void* dev = moved(p, Tier::host, Tier::device, bytes, kind, what);
    host_.erase(it);
    host_bytes_ -= bytes;
    return dev;
  }
  const auto it = spilled_.find(p);
  if (it == spilled_.end()) return p;  // never moved (a partial offload undone)
  void* dev = ledger_.allocate(Tier::device, kind, bytes, what);
  try {
    for (std::size_t at = 0, k = it->second.first_piece; at < bytes; at += piece_, ++k) {
      char* dst = static_cast<char*>(dev) + at;
      store_->read(k, [&](std::uint64_t off, const void* data, std::uint64_t len) {
        copy_between(stream_, dst + off, Tier::device, data, Tier::host, len);
        stream_.synchronize();  // `data` is the store's buffer, reused after
      });
    }
  } catch (...) {
    ledger_.free(dev);
    throw;
  }
  ledger_.free(p);
  spilled_.erase(it);
  nvme_bytes_ -= bytes;
  if (spilled_.empty()) drop_store();
  return dev;
}

}  // namespace strata::engine
