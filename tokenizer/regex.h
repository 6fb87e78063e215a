// A compiled Oniguruma pattern (UTF-8, Oniguruma's default syntax), the engine Hugging Face
// tokenizers compiles its pre-tokenizer patterns with, so \p{L}, \p{N}, (?!\S), possessive
// quantifiers and (?i:...) mean here what they mean there.
//
// Protocol: compile once (an error names `where` and Oniguruma's message); find_all() is
// const and safe to call from several threads (each call has its own match region).
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

namespace strata::tokenizer {

class Regex {
 public:
  Regex(const std::string& pattern, const std::string& where);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Calls `match(begin, end)` for each non-overlapping match in `text`, left to right (an
  // empty match moves the search on by one code point). Throws Errc::invalid_argument when
  // Oniguruma fails (e.g. `text` is not UTF-8), naming `where`.
  void find_all(std::string_view text, const std::function<void(std::size_t, std::size_t)>& match) const;

 private:
  void* regex_ = nullptr;  // OnigRegex: oniguruma.h stays out of this header
  std::string where_;
};

}  // namespace strata::tokenizer
