// Hardware probes for test skipping (see skip.h).
#include "tests/support/skip.h"

#include <sys/mman.h>
#include <sys/mount.h>

#include <cerrno>
#include <cstring>

#include "io/probe.h"
#include "runtime/device/device.h"
#include "tests/support/child.h"
#include "tests/support/temp_dir.h"

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
  if (tag == "pku") {
    const int key = pkey_alloc(0, 0);
    if (key < 0) return std::string("no memory protection keys (pkey_alloc: ") + std::strerror(errno) + ")";
    pkey_free(key);
    return {};
  }
  if (tag == "mount") {
    static const std::string why = [] {
      TempDir dir("strata-mount-probe");
      const ChildResult r = run_in_child([&]() -> std::string {
        std::string w = enter_private_mount_namespace();
        if (!w.empty()) return w;
        if (::mount("strata-probe", dir.path().c_str(), "tmpfs", 0, "size=64k") != 0) {
          return std::string("mount tmpfs: ") + std::strerror(errno);
        }
        return {};
      });
      if (r.exit_code != 0) return "mount probe child failed: " + r.output;
      return r.output.empty() ? std::string() : "cannot mount in a private namespace: " + r.output;
    }();
    return why;
  }
  return {};
}

}  // namespace strata::test
