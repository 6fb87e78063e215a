// libFuzzer harness for the swap-file header (io/swap_format.h). Input: the file's size (8
// bytes, little-endian), then its first bytes. The header is handed over in a buffer of
// exactly min(size, 4096) bytes, as the swap file reads it, so ASan sees any read past it.
// An odd first size byte re-seals the header's XXH3, so the checks behind it are reached.
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "io/swap_format.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace strata::io;
  if (size < 8) return 0;
  std::uint64_t file_bytes = 0;
  std::memcpy(&file_bytes, data, 8);
  data += 8;
  size -= 8;
  const std::size_t header_bytes = static_cast<std::size_t>(std::min<std::uint64_t>(file_bytes, kSwapHeaderBytes));
  std::vector<std::byte> header(header_bytes);
  if (header_bytes > 0) std::memcpy(header.data(), data, std::min(size, header_bytes));
  constexpr std::size_t kHashAt = 120;  // the header's XXH3, over the bytes before it
  if ((file_bytes & 1) != 0 && header_bytes == kSwapHeaderBytes) {
    const std::uint64_t hash = XXH3_64bits(header.data(), kHashAt);
    std::memcpy(header.data() + kHashAt, &hash, sizeof hash);
  }
  auto layout = decode_swap_header(header.data(), file_bytes, "fuzz.swap");
  if (!layout) {
    strata::fuzz::expect_one_line(layout.status().message(), "swap file 'fuzz.swap' ");
    return 0;
  }
  // A header that decodes describes exactly the file: its own encoding reproduces it.
  strata::fuzz::expect(layout->file_bytes == file_bytes, "a decoded layout disagrees with the file size");
  std::vector<std::byte> again(kSwapHeaderBytes);
  encode_swap_header(*layout, again.data());
  strata::fuzz::expect(std::memcmp(again.data(), header.data(), kHashAt + 8) == 0,
                       "re-encoding a decoded header gives other bytes");
  return 0;
}
