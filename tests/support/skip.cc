// Hardware probes for test skipping (see skip.h).
#include "tests/support/skip.h"

#include "engine/device/device.h"
#include "io/probe.h"

namespace strata::test {

std::string missing_hardware(std::string_view tag) {
  if (tag == "cuda") {
    const auto inv = device::cuda_inventory();
    return inv.devices.empty() ? inv.why : std::string();
  }
  if (tag == "uring") {
    const auto p = io::probe_uring();
    return p.available ? std::string() : "io_uring unavailable: " + p.why;
  }
  return {};
}

}  // namespace strata::test
