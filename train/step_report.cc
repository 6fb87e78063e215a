// The step lines of `strata train` (step_report.h).
#include "train/step_report.h"

#include <cmath>
#include <cstdio>

#include "runtime/core/units.h"

namespace strata::train {

bool StepPrinting::prints(std::int64_t s, std::int64_t steps, bool has_val, bool unusual) const {
  const bool last = s + 1 >= steps;
  if (level == Level::quiet) return has_val || last;
  const std::int64_t n = every > 1 ? every : 1;
  return s == 0 || (s + 1) % n == 0 || last || has_val || unusual;
}

std::string bytes_of(std::uint64_t used, std::uint64_t budget) {
  if (budget == 0 || budget >= (std::uint64_t{1} << 60)) return format_bytes(used);  // no budget set
  static const char* const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  const auto unit_of = [](std::uint64_t b) {
    int u = 0;
    while (u < 4 && static_cast<double>(b) >= 1024.0 * std::pow(1024.0, u)) ++u;
    return u;
  };
  const int ub = unit_of(budget), uu = used > 0 ? unit_of(used) : ub;
  const auto in = [](std::uint64_t b, int u) { return static_cast<double>(b) / std::pow(1024.0, u); };
  char text[64];
  if (uu == ub) {  // "21.3/24.0 MiB"
    std::snprintf(text, sizeof text, ub == 0 ? "%.0f/%.0f %s" : "%.1f/%.1f %s", in(used, ub), in(budget, ub),
                  units[ub]);
  } else {  // "48.8 KiB/1.0 GiB"
    std::snprintf(text, sizeof text, "%.*f %s/%.1f %s", uu == 0 ? 0 : 1, in(used, uu), units[uu], in(budget, ub),
                  units[ub]);
  }
  return text;
}

std::string compact_step_line(const StepLine& l) {
  char val[24] = "", io[24] = "", note[32] = "";
  if (!std::isnan(l.val)) std::snprintf(val, sizeof val, "  val %.4f", l.val);
  if (l.io_gbps > 0) std::snprintf(io, sizeof io, "  io %.2f GB/s", l.io_gbps);
  if (*l.note != '\0') std::snprintf(note, sizeof note, "  %s", l.note);
  char line[320];
  std::snprintf(line, sizeof line, "step %4lld/%lld  loss %.4f%s  %.*f ms  %.0f tok/s  dev %s  host %s%s%s",
                static_cast<long long>(l.step), static_cast<long long>(l.steps), l.loss, val, l.ms < 10 ? 1 : 0, l.ms,
                l.tokens_per_s, bytes_of(l.device_peak, l.device_budget).c_str(),
                bytes_of(l.host_peak, l.host_budget).c_str(), io, note);
  return line;
}

}  // namespace strata::train
