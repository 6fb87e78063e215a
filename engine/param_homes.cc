// Where each layer's parameters live (the protocol in param_homes.h).
#include "engine/param_homes.h"

#include <algorithm>
#include <cstring>
#include <exception>

#include "engine/tier_copy.h"
#include "runtime/core/error.h"
#include "runtime/core/log.h"

namespace strata::engine {

ParamHomes::~ParamHomes() {
  for (auto& h : layers_) {
    c_.ledger.free(h.full);
    c_.ledger.free(h.shard);
  }
}

void ParamHomes::add_layer(int li) {
  auto& h = layers_[li];
  const auto& L = c_.layout.layers()[li];
  const std::string name = str_cat("layer ", L.id);
  if (c_.stage <= 2 || c_.shards.persistent(li)) {
    h.full = c_.ledger.allocate(Tier::device, Kind::params, L.padded * cbytes_, name + " parameters");
  }
  if (c_.stage == 3 && tier(li) != Tier::nvme) {
    h.shard =
        c_.ledger.allocate(tier(li), Kind::params, c_.layout.layer_shard(li) * cbytes_, name + " parameter shards");
  }
}

void ParamHomes::write(int li, const float* full, const float* shard) {
  const auto& L = c_.layout.layers()[li];
  auto& h = layers_[li];
  std::vector<char> bytes;
  if (h.full != nullptr) {
    bytes.resize(L.padded * cbytes_);
    convert(full, DType::fp32, bytes.data(), c_.cdt, L.padded);
    copy_between(c_.dev_stream, h.full, Tier::device, bytes.data(), Tier::host, bytes.size());
    c_.dev_stream.synchronize();
  }
  if (c_.stage != 3) return;
  const std::size_t n = c_.layout.layer_shard(li);
  bytes.resize(n * cbytes_);
  convert(shard, DType::fp32, bytes.data(), c_.cdt, n);
  if (tier(li) == Tier::nvme) {
    c_.nvme.write_params(li, bytes.data());
  } else {
    copy_between(c_.dev_stream, h.shard, tier(li), bytes.data(), Tier::host, bytes.size());
    c_.dev_stream.synchronize();
  }
}

void ParamHomes::commit_writes() { c_.nvme.commit_params(); }

void ParamHomes::discard_writes() noexcept { c_.nvme.abort_params(); }

void ParamHomes::read_own(int li, float* out) {
  const auto& L = c_.layout.layers()[li];
  const auto& h = layers_[li];
  std::vector<char> bytes;
  auto take = [&](const void* src, Tier tier, std::size_t n, float* dst) {
    bytes.resize(n * cbytes_);
    copy_between(c_.dev_stream, bytes.data(), Tier::host, src, tier, n * cbytes_);
    c_.dev_stream.synchronize();
    convert(bytes.data(), c_.cdt, dst, DType::fp32, n);
  };
  if (c_.stage == 0) {
    take(h.full, Tier::device, L.padded, out);
  } else if (c_.stage == 3 && tier(li) == Tier::nvme) {
    c_.nvme.drain();  // write-backs queued on the store land first
    std::vector<char> all(L.shard * cbytes_);
    c_.nvme.read_params(
        li, [&](std::uint64_t off, const void* data, std::uint64_t len) { std::memcpy(all.data() + off, data, len); });
    c_.io.nvme_read_bytes += all.size();
    convert(all.data(), c_.cdt, out, DType::fp32, L.shard);
  } else if (c_.stage == 3) {
    take(h.shard, tier(li), L.shard, out);
  } else {
    for (std::size_t k = 0; k < L.buckets.size(); ++k) {  // this rank's part of each bucket, in bucket order
      const auto& b = c_.layout.buckets()[L.buckets[k]];
      const char* src = static_cast<const char*>(h.full) + (b.flat_offset - L.flat_offset + own_begin(b)) * cbytes_;
      take(src, Tier::device, b.shard, out + L.shard_offsets[k]);
    }
  }
}

void ParamHomes::device_memory(const DeviceSwap::Fn& fn) {
  for (std::size_t li = 0; li < layers_.size(); ++li) {
    auto& h = layers_[li];
    const auto& L = c_.layout.layers()[li];
    const std::string name = str_cat("layer ", L.id);
    h.full = fn(h.full, L.padded * cbytes_, Kind::params, name + " parameters");
    if (tier(static_cast<int>(li)) == Tier::device)
      h.shard = fn(h.shard, L.shard * cbytes_, Kind::params, name + " parameter shards");
  }
}

// Stages 1-2: every rank refreshes its replica of bucket k of layer li from the owners.
void ParamHomes::regather(int li, std::size_t k) {
  if ((c_.stage != 1 && c_.stage != 2) || c_.world == 1) return;
  const auto& L = c_.layout.layers()[li];
  const auto& b = c_.layout.buckets()[L.buckets[k]];
  char* full = static_cast<char*>(layers_[li].full) + (b.flat_offset - L.flat_offset) * cbytes_;
  if (device_collectives())
    c_.dcomm->all_gather(full + own_begin(b) * cbytes_, full, b.shard, c_.cdt, c_.dev_stream);
  else
    c_.comm->all_gather(full + own_begin(b) * cbytes_, full, b.shard, c_.cdt);
}

void ParamHomes::refresh() {
  for (std::size_t li = 0; li < layers_.size(); ++li) {
    const auto& L = c_.layout.layers()[li];
    auto& h = layers_[li];
    if (L.frozen) continue;  // the optimizer never changes it
    for (std::size_t k = 0; k < L.buckets.size(); ++k) regather(static_cast<int>(li), k);
    // Stage 3 keeps small layers gathered for good: refresh them from the new shards.
    if (c_.stage != 3 || !c_.shards.persistent(static_cast<int>(li))) continue;
    for (std::size_t k = 0; k < L.buckets.size(); ++k) {
      const auto& b = c_.layout.buckets()[L.buckets[k]];
      char* full = static_cast<char*>(h.full) + (b.flat_offset - L.flat_offset) * cbytes_;
      const char* mine = static_cast<char*>(h.shard) + L.shard_offsets[k] * cbytes_;
      if (device_collectives()) {
        // This rank's shard into its place, then all-gathered in place on the device.
        char* own = full + own_begin(b) * cbytes_;
        copy_between(c_.dev_stream, own, Tier::device, mine, tier(static_cast<int>(li)), b.shard * cbytes_);
        c_.dcomm->all_gather(own, full, b.shard, c_.cdt, c_.dev_stream);
      } else if (c_.world > 1) {
        c_.comm->all_gather(mine, full, b.shard, c_.cdt);
      } else {
        copy_between(c_.dev_stream, full, Tier::device, mine, tier(static_cast<int>(li)), b.shard * cbytes_);
      }
    }
  }
  c_.dev_stream.synchronize();
}

// A new store for every layer `in_store` puts on NVMe, filled from where each lives now,
// committed and adopted; the layers that enter it leave their old homes.
void ParamHomes::refill_store(const std::vector<Tier>& in_store) {
  const std::size_t n = layers_.size();
  std::uint64_t largest = 0;
  for (std::size_t li = 0; li < n; ++li)
    largest = std::max<std::uint64_t>(largest, c_.layout.layer_shard(static_cast<int>(li)) * cbytes_);
  NvmeHomes::ParamFiles fresh;
  void* bounce = nullptr;
  try {
    fresh = c_.nvme.build_params(in_store, c_.nvme.params_subdir() == "params" ? "params.1" : "params");
    for (std::size_t li = 0; li < n; ++li) {
      const auto& h = layers_[li];
      if (in_store[li] != Tier::nvme) continue;
      const std::uint64_t bytes = c_.layout.layer_shard(static_cast<int>(li)) * cbytes_;
      const auto idx = static_cast<std::size_t>(fresh.index[li]);
      const Tier from = tier(static_cast<int>(li));
      if (from == Tier::nvme) {
        c_.nvme.copy_params(static_cast<int>(li), fresh);
        c_.io.nvme_read_bytes += bytes;
      } else if (from == Tier::host) {
        fresh.store->write(idx, h.shard);
      } else {
        if (bounce == nullptr)
          bounce = c_.ledger.allocate(Tier::host, Kind::buffers, largest, "parameter migration bounce buffer");
        c_.dev_stream.copy_async(bounce, h.shard, bytes, device::CopyKind::device_to_host);
        c_.dev_stream.synchronize();
        fresh.store->write(idx, bounce);
      }
      c_.io.nvme_write_bytes += bytes;
    }
    fresh.store->commit();
  } catch (...) {
    c_.ledger.free(bounce);
    if (fresh.store) c_.nvme.drop(fresh);
    throw;
  }
  c_.ledger.free(bounce);
  // Switch stores: every layer in it has its bytes there now.
  c_.nvme.adopt(std::move(fresh));
  for (std::size_t li = 0; li < n; ++li) {
    auto& h = layers_[li];
    if (in_store[li] != Tier::nvme || tier(static_cast<int>(li)) == Tier::nvme) continue;
    c_.ledger.free(h.shard);
    h.shard = nullptr;
  }
}

std::vector<int> ParamHomes::migrate(const std::vector<Tier>& to) {
  c_.nvme.drain();
  const std::size_t n = layers_.size();
  bool store_changes = false;
  std::vector<Tier> in_store(n, Tier::host);
  for (std::size_t li = 0; li < n; ++li) {
    const Tier from = tier(static_cast<int>(li));
    store_changes |= from != to[li] && (from == Tier::nvme || to[li] == Tier::nvme);
    if (from == Tier::nvme || to[li] == Tier::nvme) in_store[li] = Tier::nvme;
  }
  auto kind_of = [](Tier from, Tier dst) {
    return from == Tier::device  ? device::CopyKind::device_to_host
           : dst == Tier::device ? device::CopyKind::host_to_device
                                 : device::CopyKind::host_to_host;
  };
  if (store_changes) refill_store(in_store);
  std::vector<int> stayed;
  stayed.reserve(n);  // a layer that stays is recorded without allocating
  for (std::size_t li = 0; li < n; ++li) {
    auto& h = layers_[li];
    const Tier from = tier(static_cast<int>(li));
    if (to[li] == Tier::nvme || to[li] == from) continue;
    const std::uint64_t bytes = c_.layout.layer_shard(static_cast<int>(li)) * cbytes_;
    void* home = nullptr;
    try {
      home = c_.ledger.allocate(to[li], Kind::params, bytes,
                                str_cat("layer ", c_.layout.layers()[li].id, " parameter shards"));
      if (from == Tier::nvme) {
        char* dst = static_cast<char*>(home);
        c_.nvme.read_params(static_cast<int>(li), [&](std::uint64_t off, const void* data, std::uint64_t len) {
          c_.dev_stream.copy_async(dst + off, data, len, kind_of(Tier::host, to[li]));
          c_.dev_stream.synchronize();  // `data` is the store's buffer, reused after
        });
        c_.io.nvme_read_bytes += bytes;
      } else {
        c_.dev_stream.copy_async(home, h.shard, bytes, kind_of(from, to[li]));
        c_.dev_stream.synchronize();
      }
    } catch (const std::exception& e) {  // any failure: the layer keeps its old home, as the map says
      c_.ledger.free(home);
      STRATA_LOG(warn, "rank ", c_.rank, ": layer ", c_.layout.layers()[li].id, "'s parameter shards stay on ",
                 tier_name(from), ": ", e.what());
      stayed.push_back(static_cast<int>(li));
      continue;
    }
    if (from != Tier::nvme) c_.ledger.free(h.shard);
    h.shard = home;
  }
  return stayed;
}

}  // namespace strata::engine
