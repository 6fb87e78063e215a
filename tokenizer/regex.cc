// Oniguruma behind regex.h: one-time library initialisation, compile, and the match loop.
#include "tokenizer/regex.h"

#include <oniguruma.h>

#include <memory>
#include <mutex>

#include "runtime/core/error.h"

namespace strata::tokenizer {
namespace {

std::string onig_message(int code, OnigErrorInfo* info) {
  OnigUChar buf[ONIG_MAX_ERROR_MESSAGE_LEN];
  const int n = info != nullptr ? onig_error_code_to_str(buf, code, info) : onig_error_code_to_str(buf, code);
  return std::string(reinterpret_cast<const char*>(buf), static_cast<std::size_t>(n > 0 ? n : 0));
}

}  // namespace

Regex::Regex(const std::string& pattern, const std::string& where) : where_(where) {
  static std::once_flag init;
  std::call_once(init, [] {
    OnigEncoding utf8[] = {ONIG_ENCODING_UTF8};
    onig_initialize(utf8, 1);
  });
  OnigRegex re = nullptr;
  OnigErrorInfo info{};
  const auto* p = reinterpret_cast<const OnigUChar*>(pattern.data());
  const int rc = onig_new(&re, p, p + pattern.size(), ONIG_OPTION_NONE, ONIG_ENCODING_UTF8, ONIG_SYNTAX_DEFAULT, &info);
  STRATA_CHECK(rc == ONIG_NORMAL, Errc::invalid_argument, where,
               ": the pattern does not compile (Oniguruma: ", onig_message(rc, &info), "): ", pattern);
  regex_ = re;
}

Regex::~Regex() { onig_free(static_cast<OnigRegex>(regex_)); }

void Regex::find_all(std::string_view text, const std::function<void(std::size_t, std::size_t)>& match) const {
  const std::unique_ptr<OnigRegion, void (*)(OnigRegion*)> region(onig_region_new(),
                                                                  [](OnigRegion* r) { onig_region_free(r, 1); });
  const auto* str = reinterpret_cast<const OnigUChar*>(text.data());
  const auto* end = str + text.size();
  std::size_t at = 0;
  while (at <= text.size()) {
    const int rc = onig_search(static_cast<OnigRegex>(regex_), str, end, str + at, end, region.get(), ONIG_OPTION_NONE);
    if (rc == ONIG_MISMATCH) return;
    STRATA_CHECK(rc >= 0, Errc::invalid_argument, where_, ": matching failed (Oniguruma: ", onig_message(rc, nullptr),
                 "): is the text UTF-8?");
    const auto b = static_cast<std::size_t>(region->beg[0]), e = static_cast<std::size_t>(region->end[0]);
    if (e > b) {
      match(b, e);
      at = e;
    } else {
      if (b >= text.size()) return;
      // Past one code point: its lead byte says how long it is.
      const auto c = static_cast<unsigned char>(text[b]);
      at = b + (c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2);
    }
  }
}

}  // namespace strata::tokenizer
