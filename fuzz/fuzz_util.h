// Shared pieces of the libFuzzer harnesses: the input as text, and the check every refusal
// passes (a strata::Error with a one-line message). Anything else a parser throws escapes
// the harness and libFuzzer reports it, as it reports crashes, sanitizer findings, leaks
// and inputs slower than -timeout.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

namespace strata::fuzz {

inline std::string text_of(const std::uint8_t* data, std::size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}

// Aborts (a finding) unless `message` is one line starting with `prefix`.
inline void expect_one_line(std::string_view message, std::string_view prefix = {}) {
  bool ok = message.substr(0, prefix.size()) == prefix;
  for (char c : message) ok = ok && static_cast<unsigned char>(c) >= 0x20;
  if (!ok) {
    std::fprintf(stderr, "fuzz: the error is not one line starting with '%.*s': %.*s\n",
                 static_cast<int>(prefix.size()), prefix.data(), static_cast<int>(message.size()), message.data());
    std::abort();
  }
}

// Aborts (a finding) when a property of the parser fails.
inline void expect(bool holds, const char* what) {
  if (!holds) {
    std::fprintf(stderr, "fuzz: %s\n", what);
    std::abort();
  }
}

}  // namespace strata::fuzz
