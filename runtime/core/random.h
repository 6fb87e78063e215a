// Counter-based randomness for deterministic initialisation and synthetic data: a value
// depends only on its key, never on thread, rank or call order. splitmix64 (Steele et al.)
// mixes a counter into 64 random bits; fnv1a hashes names into keys.
#pragma once

#include <cmath>
#include <cstdint>
#include <string_view>

namespace strata {

inline constexpr std::uint64_t kFnvOffset = 1469598103934665603ull;

inline std::uint64_t splitmix64(std::uint64_t x) noexcept {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

inline std::uint64_t fnv1a(std::string_view s, std::uint64_t h = kFnvOffset) noexcept {
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// Uniform in (0, 1) from 53 random bits; never exactly 0 or 1.
inline double unit_open(std::uint64_t bits) noexcept {
  return (static_cast<double>(bits >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

// A standard normal sample from two random words (Box-Muller).
inline double box_muller(std::uint64_t a, std::uint64_t b) noexcept {
  return std::sqrt(-2.0 * std::log(unit_open(a))) * std::cos(6.283185307179586 * unit_open(b));
}

}  // namespace strata
