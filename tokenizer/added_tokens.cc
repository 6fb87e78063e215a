// Matching added tokens in raw text (added_tokens.h).
#include "tokenizer/added_tokens.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "runtime/core/error.h"

namespace strata::tokenizer {

AddedTokens::AddedTokens(const nlohmann::json& list, const std::string& where) {
  STRATA_CHECK(list.is_array(), Errc::corrupt, where, ": added_tokens is not an array");
  for (std::size_t i = 0; i < list.size(); ++i) {
    const auto& t = list[i];
    const std::string key = str_cat("added_tokens[", i, "]");
    STRATA_CHECK(t.is_object() && t.contains("id") && t["id"].is_number_unsigned() && t.contains("content") &&
                     t["content"].is_string(),
                 Errc::corrupt, where, ": ", key, " has no unsigned \"id\" and string \"content\"");
    for (const char* f : {"lstrip", "rstrip", "single_word"}) {
      STRATA_CHECK(!t.value(f, false), Errc::invalid_argument, where, ": ", key, ".", f, " is true for \"",
                   t["content"].get<std::string>(), "\": not implemented (Strata matches added tokens verbatim)");
    }
    STRATA_CHECK(t["id"].get<std::uint64_t>() < kMaxTokenId, Errc::corrupt, where, ": ", key, ".id ",
                 t["id"].get<std::uint64_t>(), " is not below ", kMaxTokenId, ": not a real vocabulary");
    Entry e{t["content"].get<std::string>(), t["id"].get<std::uint32_t>()};
    STRATA_CHECK(!e.content.empty(), Errc::corrupt, where, ": ", key, ".content is empty");
    by_content_[e.content] = e.id;
    by_first_[static_cast<unsigned char>(e.content[0])].push_back(std::move(e));
  }
  for (auto& v : by_first_) {
    std::stable_sort(v.begin(), v.end(),
                     [](const Entry& a, const Entry& b) { return a.content.size() > b.content.size(); });
  }
}

void AddedTokens::split(std::string_view input, const std::function<void(std::string_view)>& text,
                        const std::function<void(std::uint32_t)>& token) const {
  std::size_t start = 0;
  for (std::size_t i = 0; i < input.size(); ++i) {
    for (const Entry& e : by_first_[static_cast<unsigned char>(input[i])]) {
      if (input.compare(i, e.content.size(), e.content) != 0) continue;
      if (i > start) text(input.substr(start, i - start));
      token(e.id);
      start = i + e.content.size();
      i = start - 1;
      break;
    }
  }
  if (start < input.size()) text(input.substr(start));
}

}  // namespace strata::tokenizer
