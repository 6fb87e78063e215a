// strata::tokenizer: text to token ids and back, for `strata tokenize` (token files for
// --data) and for printing generated samples.
//
// Protocol: Tokenizer::open(path) reads a tokenizer once and returns an immutable object;
// encode() and decode() may then be called from any number of threads. `path` is a Hugging
// Face tokenizer.json (byte-level BPE: GPT-2, Llama 3, Qwen2 style), a SentencePiece model
// (tokenizer.model: Llama 2, Mistral, TinyLlama), or a directory holding one of them
// (tokenizer.json first). encode() never adds a BOS: the caller prepends bos_id() when it
// wants one, so one tokenizer serves both "document" and "continuation" text. decode() keeps
// special tokens (their text verbatim), so decode(encode(t)) == t for any UTF-8 text t that
// the tokenizer does not normalize. Anything a file asks for that is not implemented is
// refused at open() with an Error naming the file and the key, never approximated.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace strata::tokenizer {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Throws Errc::invalid_argument (missing path, unsupported feature: names the key),
  // Errc::corrupt (unreadable JSON or model) or Errc::io naming the file.
  static std::unique_ptr<Tokenizer> open(const std::string& path);

  virtual std::vector<std::uint32_t> encode(std::string_view text) const = 0;
  // Throws Errc::invalid_argument for an id >= vocab_size().
  virtual std::string decode(const std::vector<std::uint32_t>& ids) const = 0;
  // One above the largest id encode() can return (ids of special tokens included).
  virtual std::uint32_t vocab_size() const = 0;
  // The beginning-of-sequence id this tokenizer's own pipeline prepends by default (the
  // tokenizer.json post-processor's, SentencePiece's bos_id), or none when it adds none.
  virtual std::optional<std::uint32_t> bos_id() const = 0;
  // "byte-level BPE (tokenizer.json)" or "SentencePiece bpe": for messages.
  virtual std::string kind() const = 0;
};

}  // namespace strata::tokenizer
