// SwapFile: one tensor's worth of NVMe storage in the swap-file format (swap_format.h),
// written and read through an Engine with per-block XXH3 checksums.
//
// Protocol: create() writes a fresh header and an empty checksum table (refusing to
// overwrite a file that is not a swap file); open() validates an existing file and loads
// its table. swap_out(src) writes the payload and, computed on the calling thread while
// the data transfer runs, the new checksum table; swap_in(dst) and read_blocks() read and
// then verify, on the thread that calls SwapOp::wait() (never on the io thread), so a
// mismatch is reported as an error naming the file, block and offset. src/dst must hold
// the payload (or the blocks asked for) and stay untouched until wait() returns. With a
// 4 KiB-aligned buffer whose size (buffer_bytes) covers the payload rounded up to 4 KiB,
// as pool buffers do, every transfer is O_DIRECT (the padding travels too, outside the
// checksums); otherwise the last partial 4 KiB goes through the page cache.
// One swap_out must not overlap other operations on the same SwapFile.
//
// Memory: an open SwapFile keeps its checksums compact (8 bytes per block, host_bytes());
// the 4 KiB-aligned copy that O_DIRECT needs exists only while a table transfer runs, so
// thousands of small swap files do not each pin a 4 KiB page of tables.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "io/aligned.h"
#include "io/engine.h"
#include "io/swap_format.h"

namespace strata::io {

// A pending swap operation. wait() waits for the I/O, then runs the checksum step once;
// later calls return the same Status.
class SwapOp {
 public:
  SwapOp() = default;
  SwapOp(IoFuture data, IoFuture table, std::function<Status()> finish);
  explicit SwapOp(Status failed);  // already failed (bad arguments)
  bool ready() const noexcept;     // the I/O is done; wait() will not block on it
  Status wait();
  const IoFuture& io() const noexcept { return data_; }  // for wait_any over many operations

 private:
  IoFuture data_, table_;
  std::function<Status()> finish_;
  bool done_ = false;
  Status status_;
};

class SwapFile {
 public:
  static Result<SwapFile> create(Engine& engine, const std::string& path, const SwapSpec& spec);
  static Result<SwapFile> open(Engine& engine, const std::string& path, Access access = Access::read_write);

  const SwapLayout& layout() const noexcept { return layout_; }
  const std::string& path() const { return file_.path(); }
  bool direct() const noexcept { return file_.direct(); }
  // Host memory this open file keeps: its checksum table and its bookkeeping.
  static std::uint64_t host_bytes(const SwapLayout& layout) noexcept;

  // buffer_bytes: the size of src/dst (0: exactly the payload).
  SwapOp swap_out(const void* src, std::uint64_t buffer_bytes = 0);
  SwapOp swap_in(void* dst, std::uint64_t buffer_bytes = 0);
  // Blocks [first, first + count): dst receives their payload bytes, contiguous.
  SwapOp read_blocks(std::uint64_t first, std::uint64_t count, void* dst, std::uint64_t buffer_bytes = 0);

 private:
  using Table = std::shared_ptr<std::uint64_t[]>;
  SwapFile(Engine& engine, File file, const SwapLayout& layout, Table table);

  Engine* engine_ = nullptr;
  File file_;
  SwapLayout layout_;
  Table table_;  // block_count checksums of the data on disk, as last written or read
};

}  // namespace strata::io
