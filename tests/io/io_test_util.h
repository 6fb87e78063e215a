// Helpers for the io suite: deterministic data patterns (so a misplaced or stale byte is
// caught, not just a zeroed one), an engine that must start, and a warning catcher.
#pragma once

#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "io/engine.h"
#include "io/warn.h"

namespace strata::test {

// Byte at file/region position `pos` for a given seed: differs for every position and seed.
inline std::byte pattern_byte(std::uint64_t seed, std::uint64_t pos) {
  std::uint64_t x = (pos + 1) * 0x9E3779B97F4A7C15ull ^ (seed * 0xD1B54A32D192ED03ull);
  x ^= x >> 29;
  return static_cast<std::byte>(x & 0xff);
}

inline void fill_pattern(void* dst, std::uint64_t bytes, std::uint64_t seed, std::uint64_t pos0 = 0) {
  auto* p = static_cast<std::byte*>(dst);
  for (std::uint64_t i = 0; i < bytes; ++i) p[i] = pattern_byte(seed, pos0 + i);
}

// Index of the first byte that differs from the pattern, or -1.
inline std::int64_t first_mismatch(const void* src, std::uint64_t bytes, std::uint64_t seed, std::uint64_t pos0 = 0) {
  const auto* p = static_cast<const std::byte*>(src);
  for (std::uint64_t i = 0; i < bytes; ++i) {
    if (p[i] != pattern_byte(seed, pos0 + i)) return static_cast<std::int64_t>(i);
  }
  return -1;
}

inline io::Engine make_engine(const io::EngineOptions& o = {}) {
  auto e = io::Engine::create(o);
  INFO(e.status().message());
  REQUIRE(e.ok());
  return std::move(e).value();
}

inline io::File open_file(io::Engine& e, const std::string& path, bool create = true) {
  io::OpenOptions o;
  o.create = create;
  auto f = e.open(path, o);
  INFO(f.status().message());
  REQUIRE(f.ok());
  return std::move(f).value();
}

// Collects io/ warnings while alive (and keeps them off stderr).
class WarningCatcher {
 public:
  WarningCatcher() {
    previous_ = io::set_warning_sink([this](std::string_view m) {
      std::lock_guard<std::mutex> lock(mutex_);
      messages_.emplace_back(m);
    });
  }
  ~WarningCatcher() { io::set_warning_sink(std::move(previous_)); }
  std::vector<std::string> messages() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return messages_;
  }
  std::string joined() const {
    std::string all;
    for (const auto& m : messages()) all += m + "\n";
    return all;
  }

 private:
  io::WarningSink previous_;
  mutable std::mutex mutex_;
  std::vector<std::string> messages_;
};

}  // namespace strata::test
