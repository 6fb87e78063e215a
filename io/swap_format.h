// On-disk layout of a swap file (the NVMe tier's unit of storage), independent of I/O:
//
//   [0, 4096)                 header: magic "STRATASW", version, dtype code, element size
//                             and count, block size, derived offsets, XXH3-64 of the header
//   [4096, data_offset)       checksum table: one little-endian XXH3-64 per data block,
//                             seeded with the block index (a block written to the wrong
//                             place fails too); 0 means "never written"
//   [data_offset, file end)   payload in blocks of block_bytes; the last block is padded
//                             with zeros to a whole block, so every transfer stays O_DIRECT
//
// Decoding refuses, with a message naming the file, anything that is not exactly such a
// file: short, foreign magic, other version, corrupted header, inconsistent fields, wrong
// size. All failures are -EBADMSG (corrupt or foreign data).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "io/status.h"

namespace strata::io {

inline constexpr char kSwapMagic[8] = {'S', 'T', 'R', 'A', 'T', 'A', 'S', 'W'};
inline constexpr std::uint32_t kSwapVersion = 1;
inline constexpr std::uint32_t kSwapHeaderBytes = 4096;

struct SwapSpec {
  std::uint32_t dtype_code = 0;  // the caller's dtype id; io/ only stores it
  std::uint32_t element_bytes = 4;
  std::uint64_t element_count = 0;
  std::uint32_t block_bytes = 1u << 20;  // checksum and transfer unit: a multiple of 4 KiB
};

struct SwapLayout {
  SwapSpec spec;
  std::uint64_t payload_bytes = 0;  // element_count * element_bytes
  std::uint64_t block_count = 0;
  std::uint64_t table_offset = kSwapHeaderBytes;
  std::uint64_t table_bytes = 0;  // block_count * 8 rounded up to 4 KiB
  std::uint64_t data_offset = 0;
  std::uint64_t file_bytes = 0;  // data_offset + block_count * block_bytes

  // Payload bytes in block i (block_bytes except, possibly, the last).
  std::uint64_t block_length(std::uint64_t i) const noexcept;
  std::uint64_t block_offset(std::uint64_t i) const noexcept { return data_offset + i * spec.block_bytes; }
};

// Validates the spec (element_bytes > 0, block_bytes a positive multiple of 4 KiB, no
// overflow); -EINVAL naming the field otherwise.
Result<SwapLayout> swap_layout(const SwapSpec& spec);

// Writes the 4096-byte header for `layout` to out.
void encode_swap_header(const SwapLayout& layout, std::byte* out);

// Checks `header` (the first min(file_bytes, 4096) bytes of the file at `path`) and the
// file's size against each other.
Result<SwapLayout> decode_swap_header(const std::byte* header, std::uint64_t file_bytes, const std::string& path);

// XXH3-64 of one block, seeded with its index; never 0 (0 marks an unwritten block).
std::uint64_t block_checksum(const void* data, std::size_t bytes, std::uint64_t block_index) noexcept;

}  // namespace strata::io
