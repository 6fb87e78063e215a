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
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace strata::tokenizer {

// Ids at or above this are refused when a file is read: decode keeps a table indexed by id,
// and real vocabularies stay far below it (Llama 3: 128,256; Gemma: 256,000).
inline constexpr std::uint64_t kMaxTokenId = std::uint64_t{1} << 24;

class AddedTokens {
 public:
  AddedTokens() = default;
  AddedTokens(const nlohmann::json& list, const std::string& where);

  // Calls `text(piece)` for each stretch without an added token and `token(id)` for each
  // added token, in order.
  void split(std::string_view input, const std::function<void(std::string_view)>& text,
             const std::function<void(std::uint32_t)>& token) const;
  // The added token `content` stands for, if any.
  std::optional<std::uint32_t> find(const std::string& content) const;
  // The content of added token `id`, or nullptr.
  const std::string* content(std::uint32_t id) const;
  std::uint32_t max_id() const noexcept { return max_id_; }
  bool empty() const noexcept { return by_id_.empty(); }

 private:
  struct Entry {
    std::string content;
    std::uint32_t id;
  };
  // By first byte, longest content first: the first that matches at a position wins.
  std::array<std::vector<Entry>, 256> by_first_;
  std::unordered_map<std::uint32_t, std::string> by_id_;
  std::uint32_t max_id_ = 0;
};

}  // namespace strata::tokenizer
