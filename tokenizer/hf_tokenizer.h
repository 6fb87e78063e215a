// A Hugging Face tokenizer.json with a byte-level BPE model (GPT-2, Llama 3, Qwen2 style).
//
// Protocol: open() reads the file once and checks every key Strata acts on: model (type
// BPE: vocab, merges as "a b" strings or [a, b] pairs, ignore_merges; byte_fallback, dropout
// and subword affixes refused), added_tokens, normalizer (none; others refused by name),
// pre_tokenizer (pre_tokenizer.h), post_processor (a TemplateProcessing that prepends one
// special token gives bos_id(); one that appends tokens is refused), decoder (ByteLevel),
// truncation and padding (must be null). encode(): added tokens first, then each stretch
// between them is normalized, pre-tokenized and each word byte-pair encoded (bpe.h). decode(): ids to
// bytes, added tokens as their content.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <unordered_map>

#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/tokenizer.h"

namespace strata::tokenizer {

class HfTokenizer final : public Tokenizer {
 public:
  // `path` is a tokenizer.json; errors name it and the key.
  // Every error is one line (control characters from the file escaped) starting with
  // "tokenizer 'PATH'".
  static std::unique_ptr<HfTokenizer> open(const std::string& path);

  std::vector<std::uint32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<std::uint32_t>& ids) const override;
  std::uint32_t vocab_size() const override { return vocab_size_; }
  std::optional<std::uint32_t> bos_id() const override { return bos_; }
  std::string kind() const override { return "byte-level BPE (tokenizer.json)"; }

 private:
  static std::unique_ptr<HfTokenizer> read(const std::string& path);
  HfTokenizer(BytePairModel model, Normalizer norm, PreTokenizer pre, AddedTokens added)
      : model_(std::move(model)), norm_(norm), pre_(std::move(pre)), added_(std::move(added)) {}
  BytePairModel model_;
  Normalizer norm_;
  PreTokenizer pre_;
  AddedTokens added_;
  // Each id's bytes (added tokens: their content). A map: ids may have holes (Llama 3's
  // specials sit at 128000.. after however many entries the model has).
  std::unordered_map<std::uint32_t, std::string> spelling_;
  std::uint32_t vocab_size_ = 0;
  std::optional<std::uint32_t> bos_;
  std::string path_;
};

}  // namespace strata::tokenizer
