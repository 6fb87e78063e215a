// GPT-2's byte-to-unicode map, which byte-level BPE vocabularies (tokenizer.json with a
// ByteLevel pre-tokenizer) are written in: each of the 256 bytes is one printable code point
// (printable Latin-1 bytes map to themselves, the other 68 to U+0100..U+0143), so a
// vocabulary entry is a JSON string even when its bytes are not UTF-8.
//
// Protocol: pure functions over UTF-8; Strata's BPE runs on raw bytes, so the map is used
// only to turn a file's vocabulary and merges into bytes when the tokenizer is opened.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace strata::tokenizer {

// The code point byte b is written as.
const std::array<char32_t, 256>& byte_to_char() noexcept;
// `bytes` written in the map's code points, as UTF-8.
std::string bytes_to_unicode(std::string_view bytes);
// The bytes a vocabulary entry stands for; false (and `out` unspecified) when `text` is not
// UTF-8 or holds a code point outside the map.
bool unicode_to_bytes(std::string_view text, std::string& out);

// UTF-8 helpers: appends code point `cp`; reads the code point at `i` and advances `i`
// (false on a malformed sequence, leaving `i`).
void append_utf8(char32_t cp, std::string& out);
bool next_utf8(std::string_view s, std::size_t& i, char32_t& cp) noexcept;

}  // namespace strata::tokenizer
