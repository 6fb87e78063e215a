// The BPE merge loop over bytes (bpe.h): a linked list of symbols and a heap of candidate
// pairs, so a long word costs O(n log n) rather than GPT-2's O(n^2) rescans.
#include "tokenizer/bpe.h"

#include <queue>

#include "runtime/core/error.h"

namespace strata::tokenizer {

BytePairModel::BytePairModel(std::unordered_map<std::string, std::uint32_t> vocab,
                             const std::vector<std::pair<std::string, std::string>>& merges, bool ignore_merges,
                             const std::string& where)
    : vocab_(std::move(vocab)), ignore_merges_(ignore_merges) {
  for (int b = 0; b < 256; ++b) {
    const auto it = vocab_.find(std::string(1, static_cast<char>(b)));
    STRATA_CHECK(it != vocab_.end(), Errc::corrupt, where, ": model.vocab has no entry for byte ", b,
                 ": a byte-level BPE vocabulary holds all 256 bytes (is this a byte-level tokenizer?)");
    byte_id_[static_cast<std::size_t>(b)] = it->second;
  }
  merges_.reserve(merges.size());
  for (std::size_t r = 0; r < merges.size(); ++r) {
    const auto& [a, b] = merges[r];
    const auto ia = vocab_.find(a), ib = vocab_.find(b), ic = vocab_.find(a + b);
    const char* missing = ia == vocab_.end() ? "left part" : ib == vocab_.end() ? "right part" : "joined result";
    STRATA_CHECK(ia != vocab_.end() && ib != vocab_.end() && ic != vocab_.end(), Errc::corrupt, where,
                 ": model.merges[", r, "]'s ", missing,
                 " is not in model.vocab: the merges do not belong to this vocabulary");
    // A repeated pair keeps its last rank, as Hugging Face's map insertion does.
    merges_[key(ia->second, ib->second)] = Merge{static_cast<std::uint32_t>(r), ic->second};
  }
}

void BytePairModel::encode(std::string_view word, std::vector<std::uint32_t>& out) const {
  if (ignore_merges_) {
    const auto it = vocab_.find(std::string(word));
    if (it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  const int n = static_cast<int>(word.size());
  if (n == 1) {
    out.push_back(byte_id_[static_cast<unsigned char>(word[0])]);
    return;
  }
  struct Symbol {
    std::uint32_t id;
    int prev, next;
    bool alive;
  };
  std::vector<Symbol> sym(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    sym[static_cast<std::size_t>(i)] = {byte_id_[static_cast<unsigned char>(word[static_cast<std::size_t>(i)])], i - 1,
                                        i + 1 < n ? i + 1 : -1, true};
  }
  // (rank, position of the left symbol): the lowest rank first, then the leftmost.
  using Candidate = std::pair<std::uint32_t, int>;
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  const auto offer = [&](int left) {
    if (left < 0) return;
    const int right = sym[static_cast<std::size_t>(left)].next;
    if (right < 0) return;
    const auto it = merges_.find(key(sym[static_cast<std::size_t>(left)].id, sym[static_cast<std::size_t>(right)].id));
    if (it != merges_.end()) heap.emplace(it->second.rank, left);
  };
  for (int i = 0; i + 1 < n; ++i) offer(i);
  while (!heap.empty()) {
    const auto [rank, left] = heap.top();
    heap.pop();
    auto& l = sym[static_cast<std::size_t>(left)];
    if (!l.alive || l.next < 0) continue;
    auto& r = sym[static_cast<std::size_t>(l.next)];
    // A stale candidate: the pair at `left` changed since it was offered.
    const auto it = merges_.find(key(l.id, r.id));
    if (it == merges_.end() || it->second.rank != rank) continue;
    l.id = it->second.id;
    r.alive = false;
    l.next = r.next;
    if (l.next >= 0) sym[static_cast<std::size_t>(l.next)].prev = left;
    offer(l.prev);
    offer(left);
  }
  for (int i = 0; i >= 0; i = sym[static_cast<std::size_t>(i)].next) out.push_back(sym[static_cast<std::size_t>(i)].id);
}

}  // namespace strata::tokenizer
