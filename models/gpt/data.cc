// Token files, the split and the batch sampler (formats and order: data.h).
#include "models/gpt/data.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "runtime/core/error.h"
#include "runtime/core/random.h"

namespace strata::model {
namespace {

namespace fs = std::filesystem;
constexpr std::int32_t kLlmcMagic = 20240520;
constexpr std::size_t kLlmcHeader = 256 * 4;

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  STRATA_CHECK(in.good(), Errc::io, "--data '", p.string(), "' cannot be opened: ", errno_text(errno));
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  STRATA_CHECK(!in.bad(), Errc::io, "--data '", p.string(), "': read failed: ", errno_text(errno));
  return bytes;
}

bool has_llmc_magic(const std::string& b) {
  std::int32_t m = 0;
  if (b.size() < 4) return false;
  std::memcpy(&m, b.data(), 4);
  return m == kLlmcMagic;
}

void append_u16(const std::string& b, std::size_t begin, std::vector<std::uint16_t>& out) {
  const std::size_t n = (b.size() - begin) / 2;
  const std::size_t at = out.size();
  out.resize(at + n);
  std::memcpy(out.data() + at, b.data() + begin, n * 2);
}

void append_file(const fs::path& p, const std::string& format, bool in_dir, bool quiet,
                 std::vector<std::uint16_t>& out) {
  const std::string b = read_file(p);
  const std::string f = format == "auto" ? (has_llmc_magic(b) ? "tokens" : "bytes") : format;
  if (f == "bytes") {
    if (in_dir && std::memchr(b.data(), 0, b.size()) != nullptr) {
      if (!quiet) std::printf("strata: --data: skipping '%s' (holds NUL bytes: not text)\n", p.string().c_str());
      return;
    }
    out.insert(out.end(), reinterpret_cast<const unsigned char*>(b.data()),
               reinterpret_cast<const unsigned char*>(b.data()) + b.size());
  } else if (f == "tokens") {
    STRATA_CHECK(b.size() >= kLlmcHeader && has_llmc_magic(b), Errc::corrupt, "--data '", p.string(),
                 "' has no llm.c token header (magic ", kLlmcMagic, "): use --data-format bytes or u16");
    std::int32_t h[3];
    std::memcpy(h, b.data(), sizeof h);
    STRATA_CHECK(h[1] == 1, Errc::corrupt, "--data '", p.string(), "': llm.c header version ", h[1],
                 " is not 1 (uint16 tokens)");
    STRATA_CHECK(h[2] >= 0 && b.size() == kLlmcHeader + 2 * static_cast<std::size_t>(h[2]), Errc::corrupt, "--data '",
                 p.string(), "': the header says ", h[2], " tokens (", kLlmcHeader + 2 * static_cast<std::size_t>(h[2]),
                 " bytes) but the file has ", b.size(), " bytes: truncated or not an llm.c token file");
    append_u16(b, kLlmcHeader, out);
  } else if (f == "u16") {
    STRATA_CHECK(b.size() % 2 == 0, Errc::corrupt, "--data '", p.string(), "' has an odd size (", b.size(),
                 " bytes): not a file of uint16 tokens");
    append_u16(b, 0, out);
  } else {
    STRATA_THROW(Errc::invalid_argument, "--data-format '", format,
                 "' is not a format: use auto, bytes, tokens or u16");
  }
}

}  // namespace

TokenData TokenData::load(const std::string& path, int vocab, const std::string& format, bool quiet) {
  TokenData d;
  std::error_code ec;
  const fs::path root(path);
  STRATA_CHECK(fs::exists(root, ec), Errc::invalid_argument, "--data '", path, "' does not exist");
  std::size_t files = 0;
  if (fs::is_directory(root, ec)) {
    std::vector<fs::path> names;
    for (const auto& e : fs::directory_iterator(root, ec)) names.push_back(e.path());
    STRATA_CHECK(!ec, Errc::io, "--data '", path, "' cannot be listed: ", ec.message());
    std::sort(names.begin(), names.end());
    std::set<fs::path> seen;
    for (const auto& n : names) {
      if (!fs::is_regular_file(n, ec)) continue;
      if (!seen.insert(fs::canonical(n, ec)).second) continue;
      const auto before = d.tokens_.size();
      append_file(n, format, true, quiet, d.tokens_);
      files += d.tokens_.size() > before ? 1 : 0;
    }
  } else {
    append_file(root, format, false, quiet, d.tokens_);
    files = 1;
  }
  STRATA_CHECK(!d.tokens_.empty(), Errc::invalid_argument, "--data '", path,
               "' holds no tokens: give a non-empty text file, a directory of them, or a token file");
  for (std::size_t i = 0; i < d.tokens_.size(); ++i) {
    STRATA_CHECK(d.tokens_[i] < vocab, Errc::invalid_argument, "--data '", path, "': token ", i, " is ", d.tokens_[i],
                 ", not below the model's vocabulary of ", vocab, ": use --vocab > ", d.tokens_[i],
                 " or data made for this vocabulary");
  }
  d.description_ = str_cat(path, " (", d.tokens_.size(), " tokens from ", files, files == 1 ? " file)" : " files)");
  return d;
}

Batcher::Batcher(const TokenData& data, const std::string& path, int seq_len, double val_fraction, std::uint64_t seed)
    : data_(data), T_(seq_len), key_(splitmix64(seed ^ 0x6770742d64617461ull)) {
  const std::size_t n = data.tokens().size();
  STRATA_CHECK(val_fraction >= 0.0 && val_fraction < 1.0, Errc::invalid_argument, "--val-fraction ", val_fraction,
               " must be in [0, 1)");
  const auto val = static_cast<std::size_t>(static_cast<double>(n) * val_fraction);
  train_end_ = n - val;
  const std::size_t need = static_cast<std::size_t>(seq_len) + 1;
  STRATA_CHECK(train_end_ >= need, Errc::invalid_argument, "--data '", path, "' is too short: its training split has ",
               train_end_, " tokens but one sequence needs ", need, " (--seq-len ", seq_len,
               " + 1): use more text or a shorter --seq-len");
  STRATA_CHECK(val == 0 || val >= need, Errc::invalid_argument, "--data '", path,
               "' is too short: its validation split (--val-fraction ", val_fraction, ") has ", val,
               " tokens but one sequence needs ", need, ": use more text, a larger --val-fraction or --val-fraction 0");
}

void Batcher::copy(std::size_t first, std::int32_t* inputs, std::int32_t* targets) const {
  const auto& t = data_.tokens();
  for (int i = 0; i < T_; ++i) {
    inputs[i] = t[first + static_cast<std::size_t>(i)];
    targets[i] = t[first + static_cast<std::size_t>(i) + 1];
  }
}

void Batcher::train_batch(std::int64_t step, std::int64_t train_batch, int k, int world, int rank, int micro,
                          std::int32_t* inputs, std::int32_t* targets) const {
  const std::size_t span = train_end_ - static_cast<std::size_t>(T_);
  for (int j = 0; j < micro; ++j) {
    const auto i =
        static_cast<std::uint64_t>(step * train_batch + (static_cast<std::int64_t>(k) * world + rank) * micro + j);
    copy(splitmix64(key_ + i) % span, inputs + static_cast<std::size_t>(j) * T_,
         targets + static_cast<std::size_t>(j) * T_);
  }
}

void Batcher::val_batch(int v, int micro, std::int32_t* inputs, std::int32_t* targets) const {
  STRATA_CHECK(val_tokens() > 0, Errc::invalid_argument, "validation needs a validation split: set --val-fraction > 0");
  const std::size_t span = val_tokens() - static_cast<std::size_t>(T_);
  for (int j = 0; j < micro; ++j) {
    const auto i = static_cast<std::uint64_t>(v) * static_cast<std::uint64_t>(micro) + static_cast<std::uint64_t>(j);
    copy(train_end_ + splitmix64((key_ ^ 0x76616cull) + i) % span, inputs + static_cast<std::size_t>(j) * T_,
         targets + static_cast<std::size_t>(j) * T_);
  }
}

std::shared_ptr<const Batcher> load_batcher(const std::string& path, int vocab, const std::string& format, int seq_len,
                                            double val_fraction, std::uint64_t seed, bool quiet) {
  struct Text {
    TokenData data;
    std::unique_ptr<Batcher> batcher;
  };
  auto text = std::make_shared<Text>();
  text->data = TokenData::load(path, vocab, format, quiet);
  text->batcher = std::make_unique<Batcher>(text->data, path, seq_len, val_fraction, seed);
  return {text, text->batcher.get()};  // shares the ownership of the text
}

}  // namespace strata::model
