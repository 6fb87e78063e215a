// SwapFile (see swap_file.h).
#include "io/swap_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "io/aligned.h"

namespace strata::io {

SwapOp::SwapOp(IoFuture data, IoFuture table, std::function<Status()> finish)
    : data_(std::move(data)), table_(std::move(table)), finish_(std::move(finish)) {}

SwapOp::SwapOp(Status failed) : done_(true), status_(std::move(failed)) {}

bool SwapOp::ready() const noexcept {
  return done_ || ((!data_.valid() || data_.ready()) && (!table_.valid() || table_.ready()));
}

Status SwapOp::wait() {
  if (done_) return status_;
  done_ = true;
  if (data_.valid()) {
    if (const IoResult r = data_.wait(); !r.ok()) status_ = r.status();
  }
  if (table_.valid()) {
    if (const IoResult r = table_.wait(); !r.ok() && status_.ok()) status_ = r.status();
  }
  if (status_.ok() && finish_) status_ = finish_();
  finish_ = nullptr;
  return status_;
}

namespace {

std::string hex(std::uint64_t v) {
  char buf[19];
  std::snprintf(buf, sizeof buf, "0x%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// Refuses to truncate an existing non-empty file that is not a swap file.
Status check_overwrite(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {};  // missing (or unreadable: open for writing reports that)
  char magic[sizeof kSwapMagic] = {};
  ssize_t n;
  do {
    n = ::pread(fd, magic, sizeof magic, 0);
  } while (n < 0 && errno == EINTR);
  ::close(fd);
  if (n > 0 && (n != static_cast<ssize_t>(sizeof magic) || std::memcmp(magic, kSwapMagic, sizeof magic) != 0)) {
    return {-EEXIST, "swap file '" + path +
                         "' exists and is not a Strata swap file: refusing to overwrite it; "
                         "remove it or choose another path"};
  }
  return {};
}

Status verify_blocks(const SwapLayout& l, const std::string& path, const std::uint64_t* sums, std::uint64_t first,
                     std::uint64_t count, const std::byte* data) {
  std::uint64_t pos = 0;
  for (std::uint64_t i = first; i < first + count; ++i) {
    const std::uint64_t len = l.block_length(i);
    const std::string where = "block " + std::to_string(i) + " of " + std::to_string(l.block_count) + " (file offset " +
                              std::to_string(l.block_offset(i)) + ", " + std::to_string(len) + " bytes)";
    if (sums[i] == 0) {
      return {-ENODATA, "swap file '" + path + "': " + where + " was never written (swap_out before swap_in)"};
    }
    const std::uint64_t got = block_checksum(data + pos, len, i);
    if (got != sums[i]) {
      return {-EBADMSG, "swap file '" + path + "': checksum mismatch in " + where + ": stored XXH3 " + hex(sums[i]) +
                            ", computed " + hex(got) +
                            ". The data on disk is corrupted: delete the file (Strata re-creates swap files) and "
                            "check the drive"};
    }
    pos += len;
  }
  return {};
}

}  // namespace

SwapFile::SwapFile(Engine& engine, File file, const SwapLayout& layout, Table table)
    : engine_(&engine), file_(std::move(file)), layout_(layout), table_(std::move(table)) {}

std::uint64_t SwapFile::host_bytes(const SwapLayout& layout) noexcept {
  // The table shares one allocation with its reference count; the bookkeeping is the
  // SwapFile, its File's state and path, and the allocator's headers (measured: see
  // swap_file_test's "host_bytes" case).
  constexpr std::uint64_t kBookkeeping = 384;
  return align_up(layout.block_count * 8 + 16, 16) + kBookkeeping;
}

Result<SwapFile> SwapFile::create(Engine& engine, const std::string& path, const SwapSpec& spec) {
  auto layout = swap_layout(spec);
  if (!layout) return Status(layout.status().err(), "'" + path + "': " + layout.status().message());
  if (Status s = check_overwrite(path); !s) return s;
  OpenOptions oo;
  oo.create = true;
  oo.truncate = true;
  auto file = engine.open(path, oo);
  if (!file) return file.status();
  // The header; the final size leaves the table all zeros ("never written") and the data
  // region a hole until the first swap_out, padded to whole blocks.
  AlignedBuffer head(kSwapHeaderBytes);
  Table table = std::make_shared<std::uint64_t[]>(layout->block_count);  // zero-filled
  if (head.data() == nullptr) return Status(-ENOMEM, "swap file '" + path + "': out of memory");
  encode_swap_header(*layout, head.data());
  if (Status s = engine.write(*file, 0, head.data(), head.bytes()).wait().status(); !s) return s;
  if (Status s = file->truncate(layout->file_bytes); !s) return s;
  return SwapFile(engine, std::move(file).value(), *layout, std::move(table));
}

Result<SwapFile> SwapFile::open(Engine& engine, const std::string& path, Access access) {
  OpenOptions oo;
  oo.access = access;
  auto file = engine.open(path, oo);
  if (!file) return file.status();
  auto size = file->size();
  if (!size) return size.status();
  AlignedBuffer head(kSwapHeaderBytes);
  if (head.data() == nullptr) return Status(-ENOMEM, "swap file '" + path + "': out of memory");
  if (*size > 0) {
    const std::uint64_t n = std::min<std::uint64_t>(*size, kSwapHeaderBytes);
    if (Status s = engine.read(*file, 0, head.data(), n).wait().status(); !s) return s;
  }
  auto layout = decode_swap_header(head.data(), *size, path);
  if (!layout) return layout.status();
  AlignedBuffer staged(layout->table_bytes);
  if (staged.data() == nullptr) return Status(-ENOMEM, "swap file '" + path + "': out of memory");
  if (Status s = engine.read(*file, layout->table_offset, staged.data(), layout->table_bytes).wait().status(); !s) {
    return s;
  }
  Table table = std::make_shared_for_overwrite<std::uint64_t[]>(layout->block_count);
  std::memcpy(table.get(), staged.data(), layout->block_count * 8);
  return SwapFile(engine, std::move(file).value(), *layout, std::move(table));
}

namespace {

// The payload, or its 4 KiB round-up when the buffer has room: the padding lies inside the
// file's last block, and a whole-4 KiB transfer stays O_DIRECT.
std::uint64_t transfer_bytes(std::uint64_t payload, std::uint64_t buffer_bytes) {
  return buffer_bytes >= align_up(payload) ? align_up(payload) : payload;
}

}  // namespace

SwapOp SwapFile::swap_out(const void* src, std::uint64_t buffer_bytes) {
  const SwapLayout& l = layout_;
  if (src == nullptr && l.payload_bytes > 0) return SwapOp(Status(-EFAULT, "swap_out '" + path() + "': null source"));
  IoFuture data = engine_->write(file_, l.data_offset, src, transfer_bytes(l.payload_bytes, buffer_bytes));
  // Checksums are computed here while the data transfer runs, into an aligned staging
  // copy for the O_DIRECT write and a new compact table, so a reader still holding the
  // old table is never confused by a half-updated one.
  auto staged = std::make_shared<AlignedBuffer>(l.table_bytes);
  if (staged->data() == nullptr) {
    data.wait();
    return SwapOp(Status(-ENOMEM, "swap_out '" + path() + "': out of memory for the checksum table"));
  }
  auto* sums = staged->as<std::uint64_t>();
  const auto* bytes = static_cast<const std::byte*>(src);
  for (std::uint64_t i = 0; i < l.block_count; ++i) {
    sums[i] = block_checksum(bytes + i * l.spec.block_bytes, l.block_length(i), i);
  }
  IoFuture sums_io = engine_->write(file_, l.table_offset, staged->data(), l.table_bytes);
  Table table = std::make_shared_for_overwrite<std::uint64_t[]>(l.block_count);
  std::memcpy(table.get(), sums, l.block_count * 8);
  table_ = std::move(table);
  // The staging copy must outlive its write: the finish step holds it until wait().
  return SwapOp(std::move(data), std::move(sums_io), [staged] { return Status(); });
}

SwapOp SwapFile::swap_in(void* dst, std::uint64_t buffer_bytes) {
  return read_blocks(0, layout_.block_count, dst, buffer_bytes);
}

SwapOp SwapFile::read_blocks(std::uint64_t first, std::uint64_t count, void* dst, std::uint64_t buffer_bytes) {
  const SwapLayout& l = layout_;
  if (first > l.block_count || count > l.block_count - first) {
    return SwapOp(Status(-EINVAL, "read_blocks '" + path() + "': blocks [" + std::to_string(first) + ", " +
                                      std::to_string(first + count) + ") outside the file's " +
                                      std::to_string(l.block_count) + " blocks"));
  }
  if (count == 0) return SwapOp(Status());
  if (dst == nullptr) return SwapOp(Status(-EFAULT, "read_blocks '" + path() + "': null destination"));
  const std::uint64_t bytes = (first + count) * l.spec.block_bytes > l.payload_bytes
                                  ? l.payload_bytes - first * l.spec.block_bytes
                                  : count * l.spec.block_bytes;
  IoFuture data = engine_->read(file_, l.block_offset(first), dst, transfer_bytes(bytes, buffer_bytes));
  auto table = table_;
  auto finish = [l, p = path(), table, first, count, dst] {
    return verify_blocks(l, p, table.get(), first, count, static_cast<const std::byte*>(dst));
  };
  return SwapOp(std::move(data), IoFuture(), std::move(finish));
}

}  // namespace strata::io
