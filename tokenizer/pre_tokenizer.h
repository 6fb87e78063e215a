// The pre-tokenizer of a byte-level BPE tokenizer.json: cuts text into the words BPE runs on.
// Implemented: Split (a Regex or String pattern; behavior Isolated or Removed; invert),
// ByteLevel (add_prefix_space; use_regex: GPT-2's pattern, Isolated) and a Sequence of them,
// applied in order, each to every piece the one before made (Hugging Face's semantics).
//
// Protocol: from_json() compiles the patterns once and refuses any other type or behavior
// naming the key; split() is const and may run on many threads.
#pragma once

#include <functional>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/regex.h"

namespace strata::tokenizer {

// GPT-2's pattern, which a ByteLevel pre-tokenizer with use_regex applies.
inline constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class PreTokenizer {
 public:
  // `j` is tokenizer.json's "pre_tokenizer" value; `where` names the file for errors.
  static PreTokenizer from_json(const nlohmann::json& j, const std::string& where);
  // Calls `word` for each non-empty pre-token of `text`, left to right.
  void split(std::string_view text, const std::function<void(std::string_view)>& word) const;
  // Whether a ByteLevel step is present (byte-level BPE needs one).
  bool byte_level() const noexcept { return byte_level_; }

 private:
  struct Step {
    std::shared_ptr<Regex> regex;  // or `literal`
    std::string literal;
    bool removed = false;       // behavior Removed: matches are dropped (else Isolated)
    bool invert = false;        // the pieces between matches are the matches
    bool prefix_space = false;  // ByteLevel's add_prefix_space: not a split
  };
  void add(const nlohmann::json& j, const std::string& key, const std::string& where);
  void run(std::size_t step, std::string_view text, const std::function<void(std::string_view)>& word) const;
  std::vector<Step> steps_;
  bool byte_level_ = false;
};

}  // namespace strata::tokenizer
