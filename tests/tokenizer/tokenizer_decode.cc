// Test helper: `tokenizer_decode TOKENIZER TOKEN_FILE OUT` writes Tokenizer::decode of the ids
// in TOKEN_FILE (read with models/gpt/data.h's reader, as --data reads it) to OUT, so the
// reference tests can check decode against their own decoder and against the original text.
#include <cstdio>
#include <fstream>

#include "models/gpt/data.h"
#include "tokenizer/tokenizer.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: tokenizer_decode TOKENIZER TOKEN_FILE OUT\n");
    return 2;
  }
  try {
    const auto tok = strata::tokenizer::Tokenizer::open(argv[1]);
    std::vector<std::uint32_t> ids;
    std::ifstream probe(argv[2], std::ios::binary | std::ios::ate);
    if (probe.tellg() > 1024) {  // an empty token file is one --data refuses; it decodes to ""
      const auto data = strata::model::TokenData::load(argv[2], static_cast<int>(tok->vocab_size()), "tokens", true);
      ids.resize(data.size());
      for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = data[i];
    }
    std::ofstream(argv[3], std::ios::binary) << tok->decode(ids);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tokenizer_decode: %s\n", e.what());
    return 1;
  }
  return 0;
}
