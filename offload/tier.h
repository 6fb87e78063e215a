// The three tiers model state can live on: device memory, host RAM (pinned or pageable) and
// NVMe files. One enum for the ledger that counts their bytes, the placement that chooses
// among them and the engine that moves state between them.
#pragma once

namespace strata::offload {

enum class Tier { device = 0, host = 1, nvme = 2 };
inline constexpr int kTiers = 3;

inline const char* tier_name(Tier t) noexcept {  // "device" "host" "nvme"
  switch (t) {
    case Tier::device:
      return "device";
    case Tier::host:
      return "host";
    case Tier::nvme:
      return "nvme";
  }
  return "?";
}

}  // namespace strata::offload
