// Test helper: `tokenizer_decode TOKENIZER TOKEN_FILE OUT` writes Tokenizer::decode of the ids
// in TOKEN_FILE to OUT, so the reference tests can check decode against their own decoder and
// against the original text. The file is read by the format's description (token_file.h:
// llm.c's header of 256 int32, magic 20240520, version, count; uint16 ids in version 1,
// uint32 in version 2); that --data's reader loads the same ids is tests/models'
// (gpt_data_test.cc).
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace {

std::vector<std::uint32_t> read_token_file(const char* path) {
  std::ifstream f(path, std::ios::binary);
  std::vector<std::int32_t> header(256);
  if (!f.read(reinterpret_cast<char*>(header.data()), 1024))
    throw std::runtime_error(std::string(path) + ": no header");
  if (header[0] != 20240520 || (header[1] != 1 && header[1] != 2) || header[2] < 0)
    throw std::runtime_error(std::string(path) + ": not a token file (magic, version or count)");
  std::vector<std::uint32_t> ids(static_cast<std::size_t>(header[2]));
  for (auto& id : ids) {
    std::uint32_t v = 0;  // little-endian
    if (!f.read(reinterpret_cast<char*>(&v), header[1] == 1 ? 2 : 4))
      throw std::runtime_error(std::string(path) + ": shorter than its count");
    id = v;
  }
  return ids;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: tokenizer_decode TOKENIZER TOKEN_FILE OUT\n");
    return 2;
  }
  try {
    const auto tok = strata::tokenizer::Tokenizer::open(argv[1]);
    std::ofstream(argv[3], std::ios::binary) << tok->decode(read_token_file(argv[2]));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tokenizer_decode: %s\n", e.what());
    return 1;
  }
  return 0;
}
