// File: an open file of an Engine. Opened with O_DIRECT where the filesystem allows it
// (else buffered, with one warning naming the path) and registered in the engine's
// fixed-file table when a slot is free.
//
// O_DIRECT needs the buffer address, the file offset and the length to be multiples of
// 4 KiB (kAlignment). A request with an aligned offset and buffer runs its aligned part
// O_DIRECT in block-size pieces and its tail (length % 4 KiB) through a second, buffered
// descriptor of the same file; a request with an unaligned offset or buffer runs wholly
// through that descriptor. So any region works and no byte outside it is ever written
// (a padded last block would overwrite the bytes after the region); Linux keeps the page
// cache coherent with direct I/O on the same range (it writes back and invalidates the
// range before a direct transfer). Swap files pad their data to whole blocks and stay on
// the direct path.
//
// A File is a move-only handle; requests in flight keep the descriptors open, so closing
// (or destroying) a File while its I/O runs is safe. A File may outlive its Engine.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>

#include "io/status.h"

namespace strata::io {

namespace detail {
struct FileState;
}

enum class Access { read, write, read_write };

struct OpenOptions {
  Access access = Access::read_write;
  bool create = false;    // O_CREAT
  bool truncate = false;  // O_TRUNC
  bool direct = true;     // ask for O_DIRECT (falls back to buffered where refused)
  mode_t mode = 0644;
};

class File {
 public:
  File() = default;
  explicit File(std::shared_ptr<detail::FileState> state) : state_(std::move(state)) {}
  bool valid() const noexcept { return state_ != nullptr; }
  const std::string& path() const;
  bool direct() const noexcept;      // O_DIRECT in use
  bool registered() const noexcept;  // in the engine's fixed-file table
  Result<std::uint64_t> size() const;
  Status truncate(std::uint64_t bytes) const;  // ftruncate
  Status allocate(std::uint64_t bytes) const;  // fallocate (reserve blocks up to bytes)
  void close() noexcept { state_.reset(); }
  const std::shared_ptr<detail::FileState>& state() const noexcept { return state_; }

 private:
  std::shared_ptr<detail::FileState> state_;
};

}  // namespace strata::io
