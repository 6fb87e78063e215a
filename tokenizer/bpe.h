// Byte-pair encoding of one pre-token over raw bytes: the model half of a byte-level BPE
// tokenizer.json ("model": {"type": "BPE", "vocab", "merges"}), its entries already turned
// from GPT-2's byte-to-unicode spelling into bytes (byte_level.h).
//
// Protocol: built once from the vocabulary (bytes -> id) and the merges in rank order;
// encode() is const and may run on many threads. A word starts as its single bytes and the
// adjacent pair with the lowest merge rank is merged until none is left (leftmost first among
// equal ranks), which is GPT-2's bpe() and Hugging Face's merge loop. With ignore_merges
// (Llama 3) a word that is a whole vocabulary entry is that entry without merging.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace strata::tokenizer {

class BytePairModel {
 public:
  // Throws Errc::corrupt naming `where` ("FILE: model.merges[7]") when a merge names a part
  // or a result that is not in the vocabulary, or a single byte has no entry.
  BytePairModel(std::unordered_map<std::string, std::uint32_t> vocab,
                const std::vector<std::pair<std::string, std::string>>& merges, bool ignore_merges,
                const std::string& where);

  // Appends the ids of `word` (non-empty bytes) to `out`.
  void encode(std::string_view word, std::vector<std::uint32_t>& out) const;
  const std::unordered_map<std::string, std::uint32_t>& vocab() const noexcept { return vocab_; }

 private:
  struct Merge {
    std::uint32_t rank;
    std::uint32_t id;
  };
  static std::uint64_t key(std::uint32_t a, std::uint32_t b) noexcept { return (std::uint64_t{a} << 32) | b; }
  std::unordered_map<std::string, std::uint32_t> vocab_;
  std::unordered_map<std::uint64_t, Merge> merges_;
  std::array<std::uint32_t, 256> byte_id_{};
  bool ignore_merges_;
};

}  // namespace strata::tokenizer
