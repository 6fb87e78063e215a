// Budget accounting (see budget.h).
#include "runtime/device/budget.h"

#include "runtime/core/error.h"
#include "runtime/core/units.h"

namespace strata::device {

Budget::Budget(std::string tier, std::uint64_t budget_bytes) : tier_(std::move(tier)), budget_(budget_bytes) {}

bool Budget::try_reserve(std::uint64_t bytes) noexcept {
  std::uint64_t used = used_.load(std::memory_order_relaxed);
  do {
    if (bytes > budget_ || used > budget_ - bytes) return false;
  } while (!used_.compare_exchange_weak(used, used + bytes, std::memory_order_acq_rel));
  std::uint64_t now = used + bytes;
  std::uint64_t peak = peak_.load(std::memory_order_relaxed);
  while (now > peak && !peak_.compare_exchange_weak(peak, now, std::memory_order_acq_rel)) {
  }
  return true;
}

void Budget::reserve(std::uint64_t bytes, std::string_view what, std::string_view hint) {
  if (try_reserve(bytes)) return;
  const std::uint64_t used = used_bytes();
  STRATA_THROW(Errc::out_of_budget, tier_, " tier: cannot allocate ", format_bytes(bytes), " (", bytes, " B)",
               what.empty() ? "" : " for ", what, ": ", format_bytes(used), " in use of a ", format_bytes(budget_),
               " budget (", budget_ > used ? budget_ - used : 0, " B free). ",
               hint.empty() ? "Raise the tier's budget or offload more state to the next tier" : hint);
}

void Budget::release(std::uint64_t bytes) noexcept { used_.fetch_sub(bytes, std::memory_order_acq_rel); }

}  // namespace strata::device
