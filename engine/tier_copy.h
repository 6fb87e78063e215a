// Copies and zero fills between memory of any two tiers (device or host RAM), in `stream`
// order when device memory is involved (the caller synchronizes the stream before host
// memory it reads or writes is reused), as plain memcpy/memset otherwise. The engine never
// touches device memory from the CPU: these are how its parts write and read it.
#pragma once

#include <cstddef>
#include <cstring>

#include "offload/tier.h"
#include "runtime/device/device.h"

namespace strata::engine {

inline void fill_zero(device::Stream& stream, void* p, std::size_t bytes, offload::Tier tier) {
  if (tier == offload::Tier::device)
    stream.memset_async(p, 0, bytes);
  else
    std::memset(p, 0, bytes);
}

inline void copy_between(device::Stream& stream, void* dst, offload::Tier dst_tier, const void* src,
                         offload::Tier src_tier, std::size_t bytes) {
  using offload::Tier;
  if (dst_tier != Tier::device && src_tier != Tier::device) {
    std::memcpy(dst, src, bytes);
    return;
  }
  const auto kind = dst_tier != Tier::device   ? device::CopyKind::device_to_host
                    : src_tier != Tier::device ? device::CopyKind::host_to_device
                                               : device::CopyKind::device_to_device;
  stream.copy_async(dst, src, bytes, kind);
}

}  // namespace strata::engine
