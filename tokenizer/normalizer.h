// The normalizer of a tokenizer.json: none, or Unicode NFC (Qwen2's), alone or in a Sequence,
// through ICU (Debian's libicu-dev) as Hugging Face does through its Unicode tables. Any other
// normalizer (NFKC, Lowercase, Replace, Prepend, ...) is refused naming the key: tokenizing
// unnormalized text would give ids the model never saw.
//
// Protocol: from_json() once; apply() is const and thread-safe. It runs on the text between
// added tokens (those are matched in the raw text first, as Hugging Face matches tokens
// whose "normalized" is false).
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>

namespace strata::tokenizer {

class Normalizer {
 public:
  // `j` is tokenizer.json's "normalizer" value (null: none); `where` names the file.
  static Normalizer from_json(const nlohmann::json& j, const std::string& where);
  // `text` normalized: a view of `text` itself when it already is, else of `buffer`.
  std::string_view apply(std::string_view text, std::string& buffer) const;

 private:
  void add(const nlohmann::json& j, const std::string& key, const std::string& where);
  bool nfc_ = false;
};

}  // namespace strata::tokenizer
