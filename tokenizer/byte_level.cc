// GPT-2's byte-to-unicode map and the UTF-8 it is written in (byte_level.h).
#include "tokenizer/byte_level.h"

namespace strata::tokenizer {

const std::array<char32_t, 256>& byte_to_char() noexcept {
  static const std::array<char32_t, 256> map = [] {
    std::array<char32_t, 256> m{};
    // Bytes that are printable Latin-1 keep their code point; the rest take 256, 257, ...
    // in byte order (GPT-2's encoder.py bytes_to_unicode).
    const auto printable = [](int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE; };
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) m[static_cast<std::size_t>(b)] = printable(b) ? static_cast<char32_t>(b) : next++;
    return m;
  }();
  return map;
}

std::string bytes_to_unicode(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (const char c : bytes) append_utf8(byte_to_char()[static_cast<unsigned char>(c)], out);
  return out;
}

bool unicode_to_bytes(std::string_view text, std::string& out) {
  // The inverse map: code points 0..0x143 only.
  static const std::array<int, 0x144> inverse = [] {
    std::array<int, 0x144> inv{};
    inv.fill(-1);
    for (int b = 0; b < 256; ++b) inv[byte_to_char()[static_cast<std::size_t>(b)]] = b;
    return inv;
  }();
  out.clear();
  std::size_t i = 0;
  char32_t cp = 0;
  while (i < text.size()) {
    if (!next_utf8(text, i, cp) || cp >= inverse.size() || inverse[cp] < 0) return false;
    out.push_back(static_cast<char>(inverse[cp]));
  }
  return true;
}

void append_utf8(char32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool next_utf8(std::string_view s, std::size_t& i, char32_t& cp) noexcept {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = byte(i);
  std::size_t n = 0;
  char32_t v = 0, min = 0;
  if (c < 0x80) {
    cp = c;
    ++i;
    return true;
  } else if ((c & 0xE0) == 0xC0) {
    n = 1, v = c & 0x1F, min = 0x80;
  } else if ((c & 0xF0) == 0xE0) {
    n = 2, v = c & 0x0F, min = 0x800;
  } else if ((c & 0xF8) == 0xF0) {
    n = 3, v = c & 0x07, min = 0x10000;
  } else {
    return false;
  }
  if (i + n >= s.size()) return false;
  for (std::size_t k = 1; k <= n; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return false;
    v = (v << 6) | (byte(i + k) & 0x3F);
  }
  if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return false;
  cp = v;
  i += n + 1;
  return true;
}

}  // namespace strata::tokenizer
