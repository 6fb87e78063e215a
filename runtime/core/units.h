// Parsing and printing of byte sizes and counts as users write them in configs and on the
// command line: "8GiB", "1MiB", "512MB", "256M", "5e8", "1_000_000".
// Binary suffixes (KiB, MiB, GiB, TiB) are powers of 1024; SI suffixes (K, M, G, T, with or
// without B) are powers of 1000, as DeepSpeed and disk vendors count.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace strata {

// Throws Errc::invalid_argument naming `what` (the key or flag) and the text.
std::uint64_t parse_bytes(std::string_view text, std::string_view what = "size");
std::uint64_t parse_count(std::string_view text, std::string_view what = "count");

// "1.50 GiB", "512 B".
std::string format_bytes(std::uint64_t bytes);
// A tensor shape as "[768, 2304]".
std::string format_shape(const std::vector<std::int64_t>& shape);

}  // namespace strata
