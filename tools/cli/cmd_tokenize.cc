// `strata tokenize --tokenizer PATH IN OUT` turns a text file into a token file for --data:
// PATH is a Hugging Face tokenizer.json (byte-level BPE), a SentencePiece tokenizer.model or
// a directory holding one (tokenizer/tokenizer.h). OUT is llm.c's uint16 format when every
// id fits, else Strata's uint32 version 2 (models/gpt/data.h), written whole or not at all.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "runtime/core/error.h"
#include "tokenizer/token_file.h"
#include "tokenizer/tokenizer.h"
#include "tools/cli/command.h"

namespace strata::cli {
namespace {

struct TokenizeOptions {
  std::string tokenizer, in, out;
  bool bos = false, no_bos = false;
};

std::string read_text(const std::string& path) {
  std::error_code ec;
  STRATA_CHECK(std::filesystem::is_regular_file(path, ec), Errc::invalid_argument, "tokenize: input '", path,
               "' is not a regular file (missing, a directory or a device): give a text file");
  std::ifstream in(path, std::ios::binary);
  STRATA_CHECK(in, Errc::invalid_argument, "tokenize: input '", path, "' cannot be opened: ", errno_text(errno));
  std::stringstream text;
  text << in.rdbuf();
  STRATA_CHECK(!in.bad(), Errc::io, "tokenize: reading '", path, "' failed");
  return text.str();
}

Action tokenize_setup(CLI::App& cmd) {
  auto o = std::make_shared<TokenizeOptions>();
  cmd.add_option("--tokenizer", o->tokenizer,
                 "A Hugging Face tokenizer.json (byte-level BPE: GPT-2, Llama 3, Qwen2), a SentencePiece "
                 "tokenizer.model (Llama 2, Mistral), or a directory holding one")
      ->required();
  cmd.add_option("in", o->in, "The text to tokenize (UTF-8)")->required();
  cmd.add_option("out", o->out, "The token file to write (for strata train --data)")->required();
  auto* bos_flag =
      cmd.add_flag("--bos", o->bos, "Prepend the tokenizer's BOS token (default: what the tokenizer does)");
  cmd.add_flag("--no-bos", o->no_bos, "Do not prepend a BOS token")->excludes(bos_flag);
  cmd.footer(
      "The token file is llm.c's format (header magic 20240520, version 1, uint16 tokens) when every id is below "
      "65,536, else version 2 with uint32 tokens (models/gpt/data.h). By default a BOS is prepended when the "
      "tokenizer's own pipeline adds one: a tokenizer.json whose post_processor prepends a token (Llama 3's "
      "<|begin_of_text|>), and SentencePiece models (as Llama 2's tokenizer does).");
  return [o] {
    const auto t0 = std::chrono::steady_clock::now();
    const auto tok = tokenizer::Tokenizer::open(o->tokenizer);
    const std::string text = read_text(o->in);
    const auto t1 = std::chrono::steady_clock::now();
    std::vector<std::uint32_t> ids;
    const auto bos = tok->bos_id();
    STRATA_CHECK(!o->bos || bos, Errc::invalid_argument, "tokenize --bos: tokenizer '", o->tokenizer,
                 "' has no BOS token (its post_processor prepends none): drop --bos");
    if (bos && !o->no_bos) ids.push_back(*bos);
    const auto body = tok->encode(text);
    ids.insert(ids.end(), body.begin(), body.end());
    const auto t2 = std::chrono::steady_clock::now();
    const int version = tokenizer::write_token_file(o->out, ids, tok->vocab_size());
    const double load_s = std::chrono::duration<double>(t1 - t0).count();
    const double encode_s = std::chrono::duration<double>(t2 - t1).count();
    std::printf("%s: %zu tokens from %zu bytes (%s, vocabulary %u%s), %s tokens (version %d)\n", o->out.c_str(),
                ids.size(), text.size(), tok->kind().c_str(), tok->vocab_size(),
                bos && !o->no_bos ? ", BOS prepended" : "", version == 1 ? "uint16" : "uint32", version);
    std::printf("tokenizer and text loaded in %.3f s; encoded in %.3f s: %.0f tokens/s, %.2f MB/s\n", load_s, encode_s,
                encode_s > 0 ? static_cast<double>(ids.size()) / encode_s : 0.0,
                encode_s > 0 ? static_cast<double>(text.size()) / encode_s / 1e6 : 0.0);
    return 0;
  };
}

const Registration tokenize_reg("", "tokenize",
                                "Turn a text file into a token file for --data (tokenizer.json or "
                                "SentencePiece tokenizer.model)",
                                tokenize_setup);

}  // namespace
}  // namespace strata::cli
