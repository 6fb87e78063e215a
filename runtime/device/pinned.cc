// mmap + mlock pinned memory with a one-time warning on refusal (see pinned.h).
#include "runtime/device/pinned.h"

#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <limits>

#include "runtime/core/error.h"
#include "runtime/core/log.h"
#include "runtime/core/units.h"

namespace strata::device {

std::uint64_t memlock_limit_bytes() noexcept {
  rlimit lim{};
  if (getrlimit(RLIMIT_MEMLOCK, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY) {
    return std::numeric_limits<std::uint64_t>::max();
  }
  return lim.rlim_cur;
}

PinnedAllocation pinned_map(std::size_t bytes) {
  const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  const std::size_t size = (bytes == 0 ? 1 : bytes + page - 1) / page * page;
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    STRATA_THROW(Errc::out_of_budget, "pinned host tier: mmap of ", format_bytes(size), " failed: ", errno_text(err),
                 ". Lower the host budget or free host memory");
  }
  madvise(p, size, MADV_HUGEPAGE);  // mlock below faults it in: 2 MiB at a time (advisory)
  PinnedAllocation a{p, size, false};
  if (mlock(p, size) == 0) {
    a.locked = true;
  } else {
    const int err = errno;
    const std::uint64_t lim = memlock_limit_bytes();
    warn_once("pinned-mlock",
              str_cat("pinned host memory: mlock of ", format_bytes(size), " refused (", errno_text(err),
                      "; RLIMIT_MEMLOCK = ",
                      lim == std::numeric_limits<std::uint64_t>::max() ? std::string("unlimited") : format_bytes(lim),
                      "). Continuing with pageable memory: copies may be slower and pages may be swapped. "
                      "Raise the limit with `ulimit -l unlimited` (or memlock in /etc/security/limits.conf)."));
  }
  return a;
}

void pinned_unmap(const PinnedAllocation& a) noexcept {
  if (a.ptr == nullptr) return;
  if (a.locked) munlock(a.ptr, a.bytes);
  munmap(a.ptr, a.bytes);
}

}  // namespace strata::device
