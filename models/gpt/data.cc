// Token files, the split and the batch sampler (formats and order: data.h).
#include "models/gpt/data.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>

#include "runtime/core/error.h"
#include "runtime/core/log.h"
#include "runtime/core/random.h"

namespace strata::model {
namespace {

namespace fs = std::filesystem;
constexpr std::int32_t kLlmcMagic = 20240520;
constexpr std::size_t kLlmcHeader = 256 * 4;

// One --data file opened without blocking (O_NONBLOCK: a FIFO with no writer would wait
// forever in open) and identified by fstat on the open descriptor, so the file checked is
// the file read. Only a regular file is read, and only its size at open: a FIFO, a device
// such as /dev/zero or a socket could block or never end.
class DataFile {
 public:
  explicit DataFile(const fs::path& p) : path_(p.string()) {
    fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd_ < 0) {
      error_ = errno;
      // A socket, or a device without a driver, cannot be opened at all: stat says which.
      if ((error_ == ENXIO || error_ == ENODEV) && ::stat(path_.c_str(), &st_) == 0) error_ = 0;
      return;
    }
    STRATA_CHECK(::fstat(fd_, &st_) == 0, Errc::io, "--data '", path_, "' cannot be examined: ", errno_text(errno));
  }
  ~DataFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  DataFile(const DataFile&) = delete;
  DataFile& operator=(const DataFile&) = delete;

  int open_error() const noexcept { return error_; }
  bool is_regular() const noexcept { return fd_ >= 0 && S_ISREG(st_.st_mode); }
  bool is_directory() const noexcept { return fd_ >= 0 && S_ISDIR(st_.st_mode); }
  std::pair<dev_t, ino_t> id() const noexcept { return {st_.st_dev, st_.st_ino}; }
  const char* kind() const noexcept {
    return S_ISDIR(st_.st_mode)    ? "a directory"
           : S_ISFIFO(st_.st_mode) ? "a FIFO"
           : S_ISCHR(st_.st_mode)  ? "a character device"
           : S_ISBLK(st_.st_mode)  ? "a block device"
           : S_ISSOCK(st_.st_mode) ? "a socket"
                                   : "not a regular file";
  }

  // The st_size bytes the file had when opened (a regular file only).
  std::string read_all() const {
    std::string b(static_cast<std::size_t>(st_.st_size), '\0');
    std::size_t at = 0;
    while (at < b.size()) {
      const ssize_t n = ::pread(fd_, b.data() + at, b.size() - at, static_cast<off_t>(at));
      if (n < 0 && errno == EINTR) continue;
      STRATA_CHECK(n >= 0, Errc::io, "--data '", path_, "': read failed at byte ", at, ": ", errno_text(errno));
      STRATA_CHECK(n > 0, Errc::io, "--data '", path_, "' shrank to ", at, " bytes while being read (it had ", b.size(),
                   "): keep the data unchanged while a run loads it");
      at += static_cast<std::size_t>(n);
    }
    return b;
  }

 private:
  std::string path_;
  int fd_ = -1;
  int error_ = 0;
  struct stat st_ {};
};

bool has_llmc_magic(const std::string& b) {
  std::int32_t m = 0;
  if (b.size() < 4) return false;
  std::memcpy(&m, b.data(), 4);
  return m == kLlmcMagic;
}

// The little-endian tokens of `b` from byte `begin` on, `width` bytes each.
void append_tokens(const std::string& b, std::size_t begin, int width, TokenData& out) {
  const std::size_t n = (b.size() - begin) / static_cast<std::size_t>(width);
  if (width == 2) {
    std::vector<std::uint16_t> t(n);
    std::memcpy(t.data(), b.data() + begin, n * 2);
    out.append_u16(t.data(), n);
  } else {
    std::vector<std::uint32_t> t(n);
    std::memcpy(t.data(), b.data() + begin, n * 4);
    out.append_u32(t.data(), n);
  }
}

// Appends the tokens of `b` (the bytes of `p`); false when, in a directory (`in_dir`), the
// file holds NUL bytes in bytes mode and is skipped as not text.
bool append_file(const fs::path& p, const std::string& b, const std::string& format, bool in_dir, TokenData& out) {
  const std::string f = format == "auto" ? (has_llmc_magic(b) ? "tokens" : "bytes") : format;
  if (f == "bytes") {
    const bool binary = std::memchr(b.data(), 0, b.size()) != nullptr;
    if (in_dir && binary) return false;
    // Guessed, not asked for: a binary file without the llm.c magic is most likely a token
    // file whose header is damaged or of another tool, and training its bytes as text would
    // run to the end without a word.
    STRATA_CHECK(!binary || format != "auto", Errc::invalid_argument, "--data '", p.string(),
                 "' holds NUL bytes but no llm.c token header (magic ", kLlmcMagic,
                 "): it is neither text nor an llm.c token file. Give --data-format bytes to train on its bytes, "
                 "or u16 / u32 for headerless uint16 / uint32 tokens");
    std::vector<std::uint16_t> t(reinterpret_cast<const unsigned char*>(b.data()),
                                 reinterpret_cast<const unsigned char*>(b.data()) + b.size());
    out.append_u16(t.data(), t.size());
  } else if (f == "tokens") {
    STRATA_CHECK(b.size() >= kLlmcHeader && has_llmc_magic(b), Errc::corrupt, "--data '", p.string(),
                 "' has no llm.c token header (magic ", kLlmcMagic, "): use --data-format bytes, u16 or u32");
    std::int32_t h[3];
    std::memcpy(h, b.data(), sizeof h);
    STRATA_CHECK(h[1] == 1 || h[1] == 2, Errc::corrupt, "--data '", p.string(), "': llm.c header version ", h[1],
                 " is neither 1 (uint16 tokens) nor 2 (uint32 tokens)");
    const int width = h[1] == 1 ? 2 : 4;
    const std::size_t want = kLlmcHeader + static_cast<std::size_t>(width) * static_cast<std::size_t>(h[2]);
    STRATA_CHECK(h[2] >= 0 && b.size() == want, Errc::corrupt, "--data '", p.string(), "': the header (version ", h[1],
                 ", uint", width * 8, " tokens) says ", h[2], " tokens (", want, " bytes) but the file has ", b.size(),
                 " bytes: truncated or not an llm.c token file");
    append_tokens(b, kLlmcHeader, width, out);
  } else if (f == "u16" || f == "u32") {
    const int width = f == "u16" ? 2 : 4;
    STRATA_CHECK(b.size() % static_cast<std::size_t>(width) == 0, Errc::corrupt, "--data '", p.string(), "' has ",
                 b.size(), " bytes, not a multiple of ", width, ": not a file of uint", width * 8, " tokens");
    append_tokens(b, 0, width, out);
  } else {
    STRATA_THROW(Errc::invalid_argument, "--data-format '", format,
                 "' is not a format: use auto, bytes, tokens, u16 or u32");
  }
  return true;
}

// The entries of directory `root` in name order: regular files are read (each file once,
// links followed), anything else is skipped and counted, for one summary line.
std::size_t append_directory(const std::string& root, const std::string& format, bool quiet, TokenData& out) {
  std::error_code ec;
  std::vector<fs::path> names;
  for (const auto& e : fs::directory_iterator(root, ec)) names.push_back(e.path());
  STRATA_CHECK(!ec, Errc::io, "--data '", root, "' cannot be listed: ", ec.message());
  std::sort(names.begin(), names.end());
  std::set<std::pair<dev_t, ino_t>> seen;
  std::size_t files = 0, not_regular = 0, not_text = 0;
  std::string first_skipped;
  const auto skip = [&](const fs::path& n, std::size_t& count) {
    if (first_skipped.empty()) first_skipped = n.filename().string();
    ++count;
  };
  for (const auto& n : names) {
    const DataFile f(n);
    if (f.open_error() == ENOENT || f.open_error() == ELOOP) {  // a broken link
      skip(n, not_regular);
      continue;
    }
    STRATA_CHECK(f.open_error() == 0, Errc::io, "--data '", n.string(),
                 "' cannot be opened: ", errno_text(f.open_error()));
    if (!f.is_regular()) {
      skip(n, not_regular);
      continue;
    }
    if (!seen.insert(f.id()).second) continue;
    const std::size_t before = out.size();
    if (!append_file(n, f.read_all(), format, true, out)) skip(n, not_text);
    files += out.size() > before ? 1 : 0;
  }
  if (!quiet && not_regular + not_text > 0) {
    const std::string irregular =
        not_regular ? str_cat(not_regular, " not regular files (directories, FIFOs, devices, sockets, broken links)")
                    : std::string();
    const std::string binary = not_text ? str_cat(not_text, " holding NUL bytes (not text)") : std::string();
    STRATA_LOG(warn, "--data '", root, "': skipped ", not_regular + not_text, " of its ", names.size(),
               " entries: ", irregular, not_regular && not_text ? " and " : "", binary, "; the first is '",
               first_skipped, "'");
  }
  return files;
}

}  // namespace

void TokenData::append_u16(const std::uint16_t* p, std::size_t n) {
  if (wide_) {
    u32_.insert(u32_.end(), p, p + n);
  } else {
    u16_.insert(u16_.end(), p, p + n);
  }
}

void TokenData::append_u32(const std::uint32_t* p, std::size_t n) {
  if (!wide_) {
    u32_.assign(u16_.begin(), u16_.end());
    std::vector<std::uint16_t>().swap(u16_);
    wide_ = true;
  }
  u32_.insert(u32_.end(), p, p + n);
}

void TokenData::copy(std::size_t first, std::size_t n, std::int32_t* out) const noexcept {
  if (wide_) {
    for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<std::int32_t>(u32_[first + i]);
  } else {
    for (std::size_t i = 0; i < n; ++i) out[i] = u16_[first + i];
  }
}

TokenData TokenData::load(const std::string& path, int vocab, const std::string& format, bool quiet) {
  TokenData d;
  const DataFile root(path);
  STRATA_CHECK(root.open_error() != ENOENT, Errc::invalid_argument, "--data '", path, "' does not exist");
  STRATA_CHECK(root.open_error() == 0, Errc::io, "--data '", path,
               "' cannot be opened: ", errno_text(root.open_error()));
  std::size_t files = 0;
  if (root.is_directory()) {
    files = append_directory(path, format, quiet, d);
  } else {
    STRATA_CHECK(root.is_regular(), Errc::invalid_argument, "--data '", path, "' is ", root.kind(),
                 ", not a regular file: give a file or a directory of files (a FIFO or device may block or never "
                 "end; copy its text to a file)");
    append_file(path, root.read_all(), format, false, d);
    files = 1;
  }
  STRATA_CHECK(d.size() > 0, Errc::invalid_argument, "--data '", path,
               "' holds no tokens: give a non-empty text file, a directory of them, or a token file");
  const auto limit = static_cast<std::uint32_t>(std::max(vocab, 0));
  std::uint32_t top = 0;
  for (std::size_t i = 0; i < d.size(); ++i) {
    STRATA_CHECK(d[i] < limit, Errc::invalid_argument, "--data '", path, "': token ", i, " is ", d[i],
                 ", not below the model's vocabulary of ", vocab, ": use --vocab > ", d[i],
                 " or data made for this vocabulary");
    top = std::max(top, d[i]);
  }
  // Bytes fed to a tokenizer's vocabulary (--preset 124M on a text file) train, but only 256 of
  // its rows ever see a token: said once, with what to do.
  if (!quiet && top < 256 && vocab > 256) {
    STRATA_LOG(warn, "--data '", path, "' was read as bytes (tokens 0-255), but the model's vocabulary is ", vocab,
               ": only 256 of its embedding rows will train. Tokenize the text for this model first (strata "
               "tokenize), or train a byte-level model with --vocab 256");
  }
  d.description_ = str_cat(path, " (", d.size(), " tokens from ", files, files == 1 ? " file)" : " files)");
  return d;
}

Batcher::Batcher(const TokenData& data, const std::string& path, int seq_len, double val_fraction, std::uint64_t seed)
    : data_(data), T_(seq_len), key_(splitmix64(seed ^ 0x6770742d64617461ull)) {
  const std::size_t n = data.size();
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
  data_.copy(first, static_cast<std::size_t>(T_), inputs);
  data_.copy(first + 1, static_cast<std::size_t>(T_), targets);
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
