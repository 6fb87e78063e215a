// Byte and count parsing (see units.h for the accepted forms).
#include "runtime/core/units.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "runtime/core/error.h"

namespace strata {
namespace {

std::uint64_t parse_scaled(std::string_view text, std::string_view what, bool bytes) {
  std::string clean;
  for (char c : text) {
    if (c != '_' && c != ' ') clean.push_back(c);
  }
  const char* hint = bytes ? "a byte size like 4096, 512MiB, 8GiB or 1e9" : "a count like 1000, 256M, 1.5B or 5e8";
  STRATA_CHECK(!clean.empty(), Errc::invalid_argument, what, " is empty: expected ", hint);
  char* end = nullptr;
  const double value = std::strtod(clean.c_str(), &end);
  STRATA_CHECK(end != clean.c_str() && std::isfinite(value) && value >= 0, Errc::invalid_argument, what, " = '", text,
               "' is not a non-negative number: expected ", hint);
  std::string suffix(end);
  for (char& c : suffix) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  double scale = 1;
  if (bytes) {
    if (suffix.empty() || suffix == "b")
      scale = 1;
    else if (suffix == "k" || suffix == "kb")
      scale = 1e3;
    else if (suffix == "m" || suffix == "mb")
      scale = 1e6;
    else if (suffix == "g" || suffix == "gb")
      scale = 1e9;
    else if (suffix == "t" || suffix == "tb")
      scale = 1e12;
    else if (suffix == "kib")
      scale = 1024.0;
    else if (suffix == "mib")
      scale = 1024.0 * 1024;
    else if (suffix == "gib")
      scale = 1024.0 * 1024 * 1024;
    else if (suffix == "tib")
      scale = 1024.0 * 1024 * 1024 * 1024;
    else
      STRATA_THROW(Errc::invalid_argument, what, " = '", text, "' has unknown unit '", end,
                   "': use B, KiB, MiB, GiB, TiB (binary) or KB, MB, GB, TB (decimal)");
  } else {
    if (suffix.empty())
      scale = 1;
    else if (suffix == "k")
      scale = 1e3;
    else if (suffix == "m")
      scale = 1e6;
    else if (suffix == "b" || suffix == "g")
      scale = 1e9;
    else if (suffix == "t")
      scale = 1e12;
    else
      STRATA_THROW(Errc::invalid_argument, what, " = '", text, "' has unknown suffix '", end,
                   "': use K, M, B (or G) or T");
  }
  const double total = value * scale;
  STRATA_CHECK(total < 1.8e19, Errc::invalid_argument, what, " = '", text, "' is too large");
  const double rounded = std::round(total);
  STRATA_CHECK(std::fabs(total - rounded) < 1e-6 * std::max(1.0, total), Errc::invalid_argument, what, " = '", text,
               "' is not a whole number of ", bytes ? "bytes" : "items");
  return static_cast<std::uint64_t>(rounded);
}

}  // namespace

std::uint64_t parse_bytes(std::string_view text, std::string_view what) { return parse_scaled(text, what, true); }

std::uint64_t parse_count(std::string_view text, std::string_view what) { return parse_scaled(text, what, false); }

std::string format_bytes(std::uint64_t bytes) {
  static const char* const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 5) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  else
    std::snprintf(buf, sizeof buf, "%.2f %s", v, units[u]);
  return buf;
}

std::string format_shape(const std::vector<std::int64_t>& shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

}  // namespace strata
