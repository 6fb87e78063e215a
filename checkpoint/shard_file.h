// A rank's shard file, written and read with a checksum per chunk (format.h).
//
// ShardWriter: append() streams bytes into the file through one chunk-sized buffer, hashing
// each full chunk with XXH3-64 as it goes out; finish() writes the tail, fsyncs and closes,
// and returns the file's manifest entry. Any failed system call (a full disk: ENOSPC or
// EFBIG) throws Errc::io naming the file and the bytes written so far; the caller removes
// the unfinished checkpoint, so a failed save never leaves a file a manifest names.
//
// ShardReader: reads byte ranges of a checkpoint's files. Sizes are checked against the
// manifest when a file is first opened (a truncated file is named with both sizes; a swap
// file's header is decoded and its checksum table matched against the manifest), and every
// chunk (a swap file's block) a read touches is verified before any of its bytes are used:
// a mismatch throws Errc::corrupt naming the file, the chunk, its byte range and what was
// being read. It keeps the last chunk of each file, so reading a file in order reads each
// chunk once.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/format.h"

namespace strata::checkpoint {

class ShardWriter {
 public:
  // Creates (truncating) `path`.
  ShardWriter(std::string path, std::uint64_t chunk_bytes);
  ~ShardWriter();
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  // Returns the file offset the bytes start at.
  std::uint64_t append(const void* data, std::uint64_t bytes);
  FileEntry finish(const std::string& name, int rank);

 private:
  void flush_chunk();
  std::string path_;
  int fd_ = -1;
  std::uint64_t chunk_bytes_;
  std::vector<char> chunk_;
  std::uint64_t offset_ = 0;   // bytes appended
  std::uint64_t written_ = 0;  // bytes on disk
  std::vector<std::uint64_t> sums_;
};

// Copies `bytes` bytes from `in` to `out` (both from offset 0, whatever the descriptors'
// offsets), inside the kernel where it can (copy_file_range), else through a user buffer:
// copy_file_range refuses files on two filesystems (EXDEV), the usual layout of NVMe
// scratch and checkpoint volumes, and some filesystems or kernels have none (EINVAL,
// ENOSYS, EOPNOTSUPP, or nothing copied). Returns 0 or an errno; `done` says how far it got.
int copy_file_contents(int in, int out, std::uint64_t bytes, std::uint64_t& done);

// A sealed optimizer swap file of the NVMe tier taken into a checkpoint as dir/name:
// hard-linked when dir is on its filesystem (no byte moves), else copied
// (copy_file_contents). Returns its manifest entry (the
// payload size and the XXH3 of its checksum table, read from the file); *linked says which.
FileEntry adopt_swap_file(const std::string& from, const std::string& dir, const std::string& name, int rank,
                          bool* linked);

class ShardReader {
 public:
  ShardReader(std::string dir, const Manifest& manifest);
  ~ShardReader();
  ShardReader(const ShardReader&) = delete;
  ShardReader& operator=(const ShardReader&) = delete;

  // Bytes [offset, offset + bytes) of file `file`, verified; `what` names the data in errors.
  void read(int file, std::uint64_t offset, std::uint64_t bytes, void* out, const std::string& what);
  // Elements [elem, elem + count) of a tensor's state as fp32 (bf16 moments widened, q8 blocks decoded; version
  // 4's q8 exp_avg_sq squared back),
  // from whichever files hold them.
  void read_tensor(const TensorEntry& t, State s, std::uint64_t elem, std::uint64_t count, float* out);
  // Reads and verifies every chunk of every file; throws on the first bad one, naming the
  // tensors stored in it.
  void verify_all();

 private:
  struct Open {
    int fd = -1;
    std::int64_t chunk = -1;  // index of the chunk held in `data`
    std::vector<char> data;
    std::uint64_t unit = 0;         // chunk (raw) or block (swap) bytes
    std::uint64_t data_offset = 0;  // swap: where the payload starts
    std::uint64_t chunks = 0;
    std::vector<std::uint64_t> sums;  // per chunk: the manifest's (raw) or the file's table (swap)
  };
  Open& open(int file);
  const std::vector<char>& chunk(int file, std::uint64_t index, const std::string& what);
  std::string holders(int file, std::uint64_t begin, std::uint64_t end) const;
  std::string dir_;
  const Manifest& m_;
  std::map<int, Open> open_;
};

}  // namespace strata::checkpoint
