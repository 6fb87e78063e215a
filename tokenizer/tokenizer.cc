// Tokenizer::open: which kind of tokenizer a path holds (tokenizer.h).
#include "tokenizer/tokenizer.h"

#include <filesystem>
#include <fstream>

#include "runtime/core/error.h"
#include "tokenizer/hf_tokenizer.h"
#include "tokenizer/sentencepiece_model.h"

namespace strata::tokenizer {

std::unique_ptr<Tokenizer> Tokenizer::open(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const auto st = fs::status(path, ec);
  STRATA_CHECK(fs::exists(st), Errc::invalid_argument, "tokenizer '", path,
               "' does not exist: give a tokenizer.json, a tokenizer.model or a directory holding one");
  if (fs::is_directory(st)) {
    const fs::path dir(path);
    if (fs::exists(dir / "tokenizer.json")) return HfTokenizer::open((dir / "tokenizer.json").string());
    if (fs::exists(dir / "tokenizer.model")) return SentencePieceModel::open((dir / "tokenizer.model").string());
    STRATA_THROW(Errc::invalid_argument, "tokenizer directory '", path,
                 "' holds neither tokenizer.json nor tokenizer.model");
  }
  // A JSON file by its name or its first character; anything else is a SentencePiece model
  // (a protobuf, whose first byte is never '{').
  char first = 0;
  std::ifstream(path, std::ios::binary).get(first);
  if (fs::path(path).extension() == ".json" || first == '{') return HfTokenizer::open(path);
  return SentencePieceModel::open(path);
}

}  // namespace strata::tokenizer
