// Training text for the GPT: tokens from a file or a directory, a train/validation split,
// and deterministic batches.
//
// Formats (--data-format, default auto):
//   bytes   any file read as bytes; each byte is a token (vocabulary 256).
//   tokens  llm.c's pre-tokenized file: a header of 256 little-endian int32 (magic 20240520,
//           version v, token count n), then n little-endian tokens. Version 1 (llm.c's own):
//           uint16 tokens, the file is exactly 1024 + 2n bytes. Version 2 (Strata's, for
//           vocabularies above 65,536 such as Llama 3's 128,256): uint32 tokens, the file is
//           exactly 1024 + 4n bytes. `strata tokenize` writes version 1 when every id fits.
//   u16     a headerless file of little-endian uint16 tokens.
//   u32     a headerless file of little-endian uint32 tokens.
//   auto    tokens where the file starts with llm.c's magic, else bytes; a single file holding
//           NUL bytes without the magic (a damaged token file) is refused, not read as text.
// Tokens are kept at the width they were read: uint16 unless some file holds uint32 tokens
// (then all are widened), so uint16 data costs 2 bytes a token in RAM.
// Only regular files are read, each only to the size it had when opened (opened with
// O_NONBLOCK and checked by fstat first): --data naming a FIFO, a device such as /dev/zero
// or a socket is refused by name rather than blocking or growing without bound. A directory
// is read as its regular files (links followed, each file once) in name order,
// concatenated; its other entries (subdirectories, FIFOs, devices, broken links) and, in
// bytes mode, files holding a NUL byte (binary indexes, not text) are skipped with one
// warning that counts them. The last `val_fraction` of the tokens is the validation split.
//
// Batches: sequence j of micro-batch k of step s on data-parallel rank r of `world` is the
// global sample i = s * train_batch + (k * world + r) * micro + j, whose first token is at
// offset splitmix64(key + i) mod (train_tokens - T) of the train split, key =
// splitmix64(seed ^ 0x6770742d64617461); inputs are T tokens from there, targets the T
// tokens one further. So ranks see different sequences, a step's global batch is the same at
// any world size, and nothing depends on the ZeRO stage or placement. Validation batch v
// sequence j starts at splitmix64(key ^ 0x76616c + v * micro + j) mod (val_tokens - T) of
// the validation split.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace strata::model {

class TokenData {
 public:
  // Throws Errc::invalid_argument / Errc::corrupt / Errc::io naming the file for empty or
  // unreadable input, a bad header, or a token id >= vocab.
  static TokenData load(const std::string& path, int vocab, const std::string& format = "auto", bool quiet = false);
  std::size_t size() const noexcept { return wide_ ? u32_.size() : u16_.size(); }
  std::uint32_t operator[](std::size_t i) const noexcept { return wide_ ? u32_[i] : u16_[i]; }
  // True when the tokens are held as uint32 (some file had uint32 tokens).
  bool wide() const noexcept { return wide_; }
  // Copies tokens [first, first + n) to `out` (the batcher's inner loop: one width test).
  void copy(std::size_t first, std::size_t n, std::int32_t* out) const noexcept;
  const std::string& description() const noexcept { return description_; }

  // Appending (used by load): uint16 tokens stay narrow until the first uint32 ones widen all.
  void append_u16(const std::uint16_t* p, std::size_t n);
  void append_u32(const std::uint32_t* p, std::size_t n);

 private:
  std::vector<std::uint16_t> u16_;
  std::vector<std::uint32_t> u32_;
  bool wide_ = false;
  std::string description_;
};

class Batcher {
 public:
  // Throws Errc::invalid_argument naming `path` when a split is shorter than seq_len + 1.
  Batcher(const TokenData& data, const std::string& path, int seq_len, double val_fraction, std::uint64_t seed);
  // inputs and targets: micro x T tokens.
  void train_batch(std::int64_t step, std::int64_t train_batch, int k, int world, int rank, int micro,
                   std::int32_t* inputs, std::int32_t* targets) const;
  void val_batch(int v, int micro, std::int32_t* inputs, std::int32_t* targets) const;
  std::size_t train_tokens() const noexcept { return train_end_; }
  std::size_t val_tokens() const noexcept { return data_.size() - train_end_; }

 private:
  void copy(std::size_t first, std::int32_t* inputs, std::int32_t* targets) const;
  const TokenData& data_;
  int T_;
  std::size_t train_end_;
  std::uint64_t key_;
};

// The text at `path` loaded (TokenData::load) and a Batcher over it, which keeps the text
// alive: for callers that hand the batcher to closures outliving them (pipeline layers).
std::shared_ptr<const Batcher> load_batcher(const std::string& path, int vocab, const std::string& format, int seq_len,
                                            double val_fraction, std::uint64_t seed, bool quiet);

}  // namespace strata::model
