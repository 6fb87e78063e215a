// Writes token ids as a token file that --data reads (the format is stated in
// models/gpt/data.h): llm.c's header of 256 little-endian int32 (magic 20240520, version,
// count n), then n tokens: version 1 with uint16 tokens when every id and the vocabulary fit
// in 16 bits (llm.c reads these too), else version 2 with uint32 tokens.
//
// Protocol: the file appears whole or not at all: it is written to PATH.tmp, synced and
// renamed over PATH; on any error PATH.tmp is removed and PATH is left as it was.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace strata::tokenizer {

inline constexpr std::int32_t kTokenFileMagic = 20240520;

// Returns the version written (1 or 2). Throws Errc::io naming `path`, or
// Errc::invalid_argument when there are 2^31 tokens or more (the header's count is int32).
int write_token_file(const std::string& path, const std::vector<std::uint32_t>& ids, std::uint32_t vocab_size);

}  // namespace strata::tokenizer
