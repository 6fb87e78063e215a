// Swap file header encoding and validation (see swap_format.h). Fields are stored
// little-endian at fixed offsets; the struct is never memcpy'd whole, so padding and
// compiler layout cannot leak into the format.
#include "io/swap_format.h"

#include <xxhash.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>

#include "io/aligned.h"

namespace strata::io {
namespace {

static_assert(std::endian::native == std::endian::little, "swap files are little-endian; add byte swaps here");

// Field offsets in the header.
constexpr std::size_t kOffMagic = 0, kOffVersion = 8, kOffHeaderBytes = 12, kOffDtype = 16, kOffElementBytes = 20,
                      kOffElementCount = 24, kOffBlockBytes = 32, kOffChecksumKind = 36, kOffBlockCount = 40,
                      kOffTableOffset = 48, kOffDataOffset = 56, kOffPayloadBytes = 64, kOffReserved = 72,
                      kOffHeaderHash = 120;
constexpr std::uint32_t kChecksumXxh3 = 1;

template <class T> void put(std::byte* out, std::size_t off, T v) { std::memcpy(out + off, &v, sizeof v); }
template <class T> T get(const std::byte* in, std::size_t off) {
  T v;
  std::memcpy(&v, in + off, sizeof v);
  return v;
}

Status bad(const std::string& path, const std::string& what) { return {-EBADMSG, "swap file '" + path + "' " + what}; }

std::string printable_magic(const std::byte* in) {
  std::string s;
  for (std::size_t i = 0; i < 8; ++i) {
    const auto c = static_cast<unsigned char>(in[i]);
    if (c >= 0x20 && c < 0x7f) {
      s += static_cast<char>(c);
    } else {
      static const char hex[] = "0123456789abcdef";
      s += "\\x";
      s += hex[c >> 4];
      s += hex[c & 15];
    }
  }
  return s;
}

}  // namespace

std::uint64_t SwapLayout::block_length(std::uint64_t i) const noexcept {
  const std::uint64_t start = i * spec.block_bytes;
  if (start >= payload_bytes) return 0;
  return std::min<std::uint64_t>(spec.block_bytes, payload_bytes - start);
}

Result<SwapLayout> swap_layout(const SwapSpec& spec) {
  if (spec.element_bytes == 0) return Status(-EINVAL, "swap file: element_bytes must be positive");
  if (spec.block_bytes == 0 || !is_aligned(spec.block_bytes)) {
    return Status(
        -EINVAL, "swap file: block_bytes " + std::to_string(spec.block_bytes) + " must be a positive multiple of 4096");
  }
  constexpr std::uint64_t kMax = std::uint64_t{1} << 60;  // far beyond any device; keeps sums exact
  if (spec.element_count > kMax / spec.element_bytes) {
    return Status(-EINVAL, "swap file: " + std::to_string(spec.element_count) + " elements of " +
                               std::to_string(spec.element_bytes) + " bytes is too large");
  }
  SwapLayout l;
  l.spec = spec;
  l.payload_bytes = spec.element_count * spec.element_bytes;
  l.block_count = (l.payload_bytes + spec.block_bytes - 1) / spec.block_bytes;
  l.table_offset = kSwapHeaderBytes;
  l.table_bytes = align_up(l.block_count * 8);
  l.data_offset = l.table_offset + l.table_bytes;
  l.file_bytes = l.data_offset + l.block_count * spec.block_bytes;
  return l;
}

void encode_swap_header(const SwapLayout& l, std::byte* out) {
  std::memset(out, 0, kSwapHeaderBytes);
  std::memcpy(out + kOffMagic, kSwapMagic, sizeof kSwapMagic);
  put<std::uint32_t>(out, kOffVersion, kSwapVersion);
  put<std::uint32_t>(out, kOffHeaderBytes, kSwapHeaderBytes);
  put<std::uint32_t>(out, kOffDtype, l.spec.dtype_code);
  put<std::uint32_t>(out, kOffElementBytes, l.spec.element_bytes);
  put<std::uint64_t>(out, kOffElementCount, l.spec.element_count);
  put<std::uint32_t>(out, kOffBlockBytes, l.spec.block_bytes);
  put<std::uint32_t>(out, kOffChecksumKind, kChecksumXxh3);
  put<std::uint64_t>(out, kOffBlockCount, l.block_count);
  put<std::uint64_t>(out, kOffTableOffset, l.table_offset);
  put<std::uint64_t>(out, kOffDataOffset, l.data_offset);
  put<std::uint64_t>(out, kOffPayloadBytes, l.payload_bytes);
  put<std::uint64_t>(out, kOffHeaderHash, XXH3_64bits(out, kOffHeaderHash));
}

Result<SwapLayout> decode_swap_header(const std::byte* in, std::uint64_t file_bytes, const std::string& path) {
  if (file_bytes < sizeof kSwapMagic || std::memcmp(in + kOffMagic, kSwapMagic, sizeof kSwapMagic) != 0) {
    if (file_bytes == 0) return bad(path, "is empty (0 bytes): not a swap file, or truncated to nothing");
    if (file_bytes >= sizeof kSwapMagic) {
      return bad(path, "is not a Strata swap file (it starts with '" + printable_magic(in) +
                           "', expected 'STRATASW'): refusing to use it");
    }
  }
  if (file_bytes < kSwapHeaderBytes) {
    return bad(path, "is truncated: " + std::to_string(file_bytes) + " bytes, shorter than its " +
                         std::to_string(kSwapHeaderBytes) + "-byte header");
  }
  const auto version = get<std::uint32_t>(in, kOffVersion);
  if (version != kSwapVersion) {
    return bad(path, "has format version " + std::to_string(version) + "; this build reads version " +
                         std::to_string(kSwapVersion) + ": re-create it");
  }
  if (get<std::uint64_t>(in, kOffHeaderHash) != XXH3_64bits(in, kOffHeaderHash)) {
    return bad(path,
               "has a corrupted header (its XXH3 checksum does not match): delete it and let Strata "
               "re-create it");
  }
  // The bytes between the fields and the hash are written as zeros: anything else is not a
  // header this build wrote (its own encoding would differ).
  const bool reserved_zero =
      std::all_of(in + kOffReserved, in + kOffHeaderHash, [](std::byte b) { return b == std::byte{0}; });
  SwapSpec spec;
  spec.dtype_code = get<std::uint32_t>(in, kOffDtype);
  spec.element_bytes = get<std::uint32_t>(in, kOffElementBytes);
  spec.element_count = get<std::uint64_t>(in, kOffElementCount);
  spec.block_bytes = get<std::uint32_t>(in, kOffBlockBytes);
  auto layout = swap_layout(spec);
  if (!layout || !reserved_zero || get<std::uint32_t>(in, kOffHeaderBytes) != kSwapHeaderBytes ||
      get<std::uint32_t>(in, kOffChecksumKind) != kChecksumXxh3 ||
      get<std::uint64_t>(in, kOffBlockCount) != layout->block_count ||
      get<std::uint64_t>(in, kOffTableOffset) != layout->table_offset ||
      get<std::uint64_t>(in, kOffDataOffset) != layout->data_offset ||
      get<std::uint64_t>(in, kOffPayloadBytes) != layout->payload_bytes) {
    return bad(path, "has an inconsistent header (fields disagree with each other" +
                         (layout ? std::string() : ": " + layout.status().message()) + ")");
  }
  if (file_bytes < layout->file_bytes) {
    return bad(path, "is truncated: " + std::to_string(file_bytes) + " bytes, its header describes " +
                         std::to_string(layout->file_bytes) + " (" + std::to_string(layout->block_count) +
                         " blocks of " + std::to_string(spec.block_bytes) + " bytes)");
  }
  if (file_bytes > layout->file_bytes) {
    return bad(path, "is " + std::to_string(file_bytes) + " bytes, longer than the " +
                         std::to_string(layout->file_bytes) +
                         " its header describes: not written by Strata; "
                         "refusing to use it");
  }
  return layout;
}

std::uint64_t block_checksum(const void* data, std::size_t bytes, std::uint64_t block_index) noexcept {
  const std::uint64_t h = XXH3_64bits_withSeed(data, bytes, block_index);
  return h == 0 ? 1 : h;
}

}  // namespace strata::io
