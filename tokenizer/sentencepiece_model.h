// A SentencePiece model (tokenizer.model: Llama 2, Mistral, TinyLlama) through Debian's
// libsentencepiece, whose encode and decode are the reference ones.
//
// Protocol: open() loads the model once (an error names the file and SentencePiece's
// message); encode() and decode() are const and thread-safe (SentencePieceProcessor's
// Encode/Decode are const). The whole text is one SentencePiece "sentence": a newline is a
// piece (or bytes), not a boundary. bos_id() is the model's BOS (SentencePiece tokenizers
// such as Llama 2's prepend it by default), none when the model defines none.
#pragma once

#include <memory>
#include <string>

#include "tokenizer/tokenizer.h"

namespace sentencepiece {
class SentencePieceProcessor;
}  // namespace sentencepiece

namespace strata::tokenizer {

class SentencePieceModel final : public Tokenizer {
 public:
  static std::unique_ptr<SentencePieceModel> open(const std::string& path);
  ~SentencePieceModel() override;

  std::vector<std::uint32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<std::uint32_t>& ids) const override;
  std::uint32_t vocab_size() const override;
  std::optional<std::uint32_t> bos_id() const override;
  std::string kind() const override { return "SentencePiece (tokenizer.model)"; }

 private:
  SentencePieceModel() = default;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  std::string path_;
};

}  // namespace strata::tokenizer
