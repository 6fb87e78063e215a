// The added tokens of a tokenizer.json ("added_tokens": <|endoftext|>, Llama 3's
// <|begin_of_text|> ...): matched in the raw text before anything else, verbatim, leftmost
// and then longest first (Hugging Face's Aho-Corasick LeftmostLongest), each becoming its id;
// the text between them goes through the pre-tokenizer and BPE.
//
// Protocol: built once from the JSON array (lstrip, rstrip and single_word are refused
// naming the entry: not implemented); split() is const and may run on many threads.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace strata::tokenizer {

// Ids at or above this are refused when a file is read: real vocabularies stay far below it
// (Llama 3: 128,256; Gemma: 256,000), and batches carry ids as int32.
inline constexpr std::uint64_t kMaxTokenId = std::uint64_t{1} << 24;

class AddedTokens {
 public:
  AddedTokens() = default;
  AddedTokens(const nlohmann::json& list, const std::string& where);

  // Calls `text(piece)` for each stretch without an added token and `token(id)` for each
  // added token, in order.
  void split(std::string_view input, const std::function<void(std::string_view)>& text,
             const std::function<void(std::uint32_t)>& token) const;
  // Every added token: content -> id.
  const std::unordered_map<std::string, std::uint32_t>& all() const noexcept { return by_content_; }

 private:
  struct Entry {
    std::string content;
    std::uint32_t id;
  };
  // By first byte, longest content first: the first that matches at a position wins.
  std::array<std::vector<Entry>, 256> by_first_;
  std::unordered_map<std::string, std::uint32_t> by_content_;
};

}  // namespace strata::tokenizer
