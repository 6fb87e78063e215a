// SentencePiece behind the Tokenizer interface (sentencepiece_model.h).
#include "tokenizer/sentencepiece_model.h"

#include <sentencepiece_processor.h>

#include "runtime/core/error.h"

namespace strata::tokenizer {

std::unique_ptr<SentencePieceModel> SentencePieceModel::open(const std::string& path) {
  std::unique_ptr<SentencePieceModel> m(new SentencePieceModel());
  m->sp_ = std::make_unique<sentencepiece::SentencePieceProcessor>();
  m->path_ = path;
  const auto status = m->sp_->Load(path);
  STRATA_CHECK(status.ok(), Errc::corrupt, "tokenizer '", path,
               "' is not a SentencePiece model (SentencePiece: ", status.ToString(),
               "): give a SentencePiece tokenizer.model or a Hugging Face tokenizer.json");
  return m;
}

SentencePieceModel::~SentencePieceModel() = default;

std::vector<std::uint32_t> SentencePieceModel::encode(std::string_view text) const {
  std::vector<int> ids;
  const auto status = sp_->Encode(text, &ids);
  STRATA_CHECK(status.ok(), Errc::invalid_argument, "tokenizer '", path_,
               "': SentencePiece could not encode the text: ", status.ToString());
  return {ids.begin(), ids.end()};
}

std::string SentencePieceModel::decode(const std::vector<std::uint32_t>& ids) const {
  const auto n = static_cast<std::uint32_t>(sp_->GetPieceSize());
  std::vector<int> in(ids.size());
  for (std::size_t i = 0; i < ids.size(); ++i) {
    STRATA_CHECK(ids[i] < n, Errc::invalid_argument, "decode: id ", ids[i], " (position ", i,
                 ") is not a token of tokenizer '", path_, "' (vocabulary of ", n, ")");
    in[i] = static_cast<int>(ids[i]);
  }
  std::string out;
  const auto status = sp_->Decode(in, &out);
  STRATA_CHECK(status.ok(), Errc::invalid_argument, "tokenizer '", path_,
               "': SentencePiece could not decode: ", status.ToString());
  return out;
}

std::uint32_t SentencePieceModel::vocab_size() const { return static_cast<std::uint32_t>(sp_->GetPieceSize()); }

std::optional<std::uint32_t> SentencePieceModel::bos_id() const {
  const int id = sp_->bos_id();
  return id >= 0 ? std::optional<std::uint32_t>(static_cast<std::uint32_t>(id)) : std::nullopt;
}

}  // namespace strata::tokenizer
