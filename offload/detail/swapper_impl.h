// The OptimizerSwapper's state, shared by its files (optimizer_swapper.cc: layout, generations,
// reads and writes outside a step; swapper_step.cc: the step's pipeline).
#pragma once

#include <sys/stat.h>

#include <cerrno>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/buffer_pool.h"
#include "io/swap_file.h"
#include "offload/detail/swap_files.h"
#include "offload/io_error.h"
#include "offload/optimizer_swapper.h"
#include "runtime/core/dtype.h"
#include "runtime/core/error.h"
#include "runtime/core/moment_format.h"

namespace strata::offload {

// Bytes of `elems` elements' state: the fp32 master, exp_avg and exp_avg_sq.
inline std::uint64_t payload_of(const SwapperOptions& o, std::uint64_t elems) {
  return 4 * elems + 2 * moment_bytes(o.moment_format, elems);
}

// A sub-group's swap files; its length counts elements.
using Chunk = detail::SwapChunk;

struct OptimizerSwapper::Impl {
  SwapperOptions options;
  std::vector<SwapTensor> tensors;
  std::uint64_t buffer_elems = 0, buffer_bytes = 0;
  detail::SwapIo sio;        // engine and buffers: declared before the files, so destroyed after them
  detail::SwapChunks files;  // the sub-groups' swap files
  std::vector<io::PoolBuffer>& buffers = sio.buffers;
  std::vector<Chunk>& chunks = files.chunks;
  std::vector<std::size_t>& first_chunk = files.first;  // per tensor, plus the end
  bool pending = false;                                 // a deferred step's writes wait for commit or discard
  std::vector<std::size_t> uncommitted;                 // chunks whose new state landed in their `next` file
  std::size_t early = 0;      // sub-groups the pending step or the load committed before the rest (spares ran out)
  std::string torn;           // set when the committed files mix two states: why, for every refusal
  bool stepping = false;      // a Step is open
  std::vector<char> written;  // per tensor: write_state() since the last commit_written()
  SwapperStats stats;

  std::string where(const Chunk& c) const {
    return str_cat("optimizer state of ", tensors[c.tensor].name, " (sub-group ", c.index, ", elements [", c.offset,
                   ", ", c.offset + c.length, ") of its shard: master, exp_avg, exp_avg_sq) on the NVMe tier");
  }
  // A spare file that a checkpoint hard-linked (while it was a sub-group's committed file)
  // gets a new inode under its path before it is written, so the checkpoint keeps its bytes
  // (its blocks stay reserved). The new file is made and reserved under a temporary name and
  // renamed over the path, so a failure (a full filesystem) leaves the old file in place and
  // the swapper usable.
  void unshare(detail::SlotRef s) {
    Chunk& c = chunks[s.chunk];
    const std::string& path = c.path[s.gen];
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0 || st.st_nlink <= 1) return;
    const auto spec = c.file[s.gen]->layout().spec;
    const std::string tmp = path.substr(0, path.size() - 5) + ".new.swap";  // ".a.swap" -> ".a.new.swap"
    try {
      {
        auto f = io::SwapFile::create(*sio.engine, tmp, spec);
        STRATA_IO_CHECK(f.status(), where(c) + ", replacing a file a checkpoint links");
        detail::reserve_blocks(tmp, f->layout().file_bytes, "NVMe tier");
      }
      STRATA_CHECK(::rename(tmp.c_str(), path.c_str()) == 0, Errc::io, "optimizer swapper: cannot rename '", tmp,
                   "' over '", path, "' (linked by a checkpoint): ", errno_text(errno));
      auto f = io::SwapFile::open(*sio.engine, path);
      STRATA_IO_CHECK(f.status(), where(c) + ", reopening a replaced file");
      c.file[s.gen] = std::make_unique<io::SwapFile>(std::move(*f));
    } catch (const Error& e) {
      ::unlink(tmp.c_str());
      // The checkpoint keeps the old blocks, so the rewrite needs new ones on this filesystem.
      throw Error(e.code(),
                  str_cat(e.what(),
                          " (a checkpoint hard-linked this file, so rewriting it needs new space on the "
                          "filesystem of offload_optimizer.nvme_path: free space there, keep fewer "
                          "checkpoints (--keep), or save checkpoints on another filesystem)"),
                  e.where(), e.sys_errno());
    }
  }
  // Refuses to go on from files that mix two states.
  void check_whole() const { STRATA_CHECK(torn.empty(), Errc::io, torn); }
  // Records that the committed files now mix two states: `replaced` sub-groups took the new
  // one before `why` stopped the rest.
  void tear(std::size_t replaced, const std::string& why) {
    torn = str_cat("optimizer swapper: the optimizer state on the NVMe tier mixes two states: ", why, " after ",
                   replaced, " of its ", chunks.size(),
                   " sub-groups had replaced theirs (offload_optimizer.spare_sub_groups = ", options.spare_sub_groups,
                   " keeps that many spare files per sub-group size, so once they are in use a step or load commits "
                   "sub-groups as it goes): resume from the last checkpoint, whose files are intact "
                   "(spare_sub_groups 0 keeps two generations, and a failed step then changes nothing)");
  }
  // Commits (or drops) every chunk in `uncommitted`.
  void settle_uncommitted(bool keep) noexcept {
    for (std::size_t ci : uncommitted) {
      if (keep)
        files.commit(ci);
      else
        files.discard(ci);
    }
    uncommitted.clear();
  }
  // Lends chunk ci a spare file for its new state. When its class has none free, a chunk of the
  // class whose new state already landed commits first (allowed: the caller's choice).
  bool lend(std::size_t ci, bool may_commit) {
    if (files.acquire(ci)) return true;
    if (!may_commit) return false;
    for (auto it = uncommitted.begin(); it != uncommitted.end(); ++it) {
      if (chunks[*it].klass != chunks[ci].klass) continue;
      files.commit(*it);
      uncommitted.erase(it);
      ++early;
      return files.acquire(ci);
    }
    return false;
  }
  std::uint64_t payload(const Chunk& c) const { return payload_of(options, c.length); }
  // [master | exp_avg | exp_avg_sq] of the sub-group's elements, the moments in moment_format.
  SubGroup view(const Chunk& c, const io::PoolBuffer& b) const {
    std::byte* base = b.data();
    const std::uint64_t mb = moment_bytes(options.moment_format, c.length);
    return {
        c.tensor, c.offset, c.length, reinterpret_cast<float*>(base), base + 4 * c.length, base + 4 * c.length + mb};
  }
};

}  // namespace strata::offload
