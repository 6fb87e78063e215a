// A hard byte budget for one memory tier: reserve() either fits under the budget or throws
// Errc::out_of_budget naming the tier, the bytes asked, the bytes in use and the budget;
// it never over-commits, even when many threads reserve at once (compare-and-swap).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>

namespace strata::device {

class Budget {
 public:
  Budget(std::string tier, std::uint64_t budget_bytes);
  Budget(const Budget&) = delete;
  Budget& operator=(const Budget&) = delete;

  // Charges bytes; `what` names the allocation in the error. `hint` is appended to the error.
  void reserve(std::uint64_t bytes, std::string_view what = {}, std::string_view hint = {});
  bool try_reserve(std::uint64_t bytes) noexcept;
  void release(std::uint64_t bytes) noexcept;

  const std::string& tier() const noexcept { return tier_; }
  std::uint64_t budget_bytes() const noexcept { return budget_; }
  std::uint64_t used_bytes() const noexcept { return used_.load(std::memory_order_acquire); }
  std::uint64_t peak_bytes() const noexcept { return peak_.load(std::memory_order_acquire); }

 private:
  std::string tier_;
  std::uint64_t budget_;
  std::atomic<std::uint64_t> used_{0};
  std::atomic<std::uint64_t> peak_{0};
};

}  // namespace strata::device
