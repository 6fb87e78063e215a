// Shard files with a checksum per chunk (shard_file.h).
#include "checkpoint/shard_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "io/swap_format.h"
#include "runtime/core/dtype.h"
#include "runtime/core/error.h"
#include "runtime/core/moment_format.h"
#include "runtime/core/progress.h"
#include "runtime/core/q8_codec.h"
#include "runtime/core/units.h"

namespace strata::checkpoint {

ShardWriter::ShardWriter(std::string path, std::uint64_t chunk_bytes)
    : path_(std::move(path)), chunk_bytes_(chunk_bytes) {
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  STRATA_CHECK(fd_ >= 0, Errc::io, "checkpoint shard '", path_, "' cannot be created: ", errno_text(errno));
  chunk_.reserve(chunk_bytes_);
}

ShardWriter::~ShardWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void ShardWriter::flush_chunk() {
  if (chunk_.empty()) return;
  sums_.push_back(XXH3_64bits(chunk_.data(), chunk_.size()));
  std::size_t done = 0;
  while (done < chunk_.size()) {
    const ssize_t n = ::pwrite(fd_, chunk_.data() + done, chunk_.size() - done, static_cast<off_t>(written_ + done));
    if (n < 0 && errno == EINTR) continue;
    STRATA_CHECK(n > 0, Errc::io, "checkpoint shard '", path_, "': writing ", format_bytes(chunk_.size() - done),
                 " at byte ", written_ + done, " failed: ", errno_text(n < 0 ? errno : ENOSPC),
                 " (a full disk? free space or point the save directory elsewhere)");
    done += static_cast<std::size_t>(n);
  }
  written_ += chunk_.size();
  chunk_.clear();
}

std::uint64_t ShardWriter::append(const void* data, std::uint64_t bytes) {
  const std::uint64_t at = offset_;
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const std::uint64_t take = std::min<std::uint64_t>(bytes, chunk_bytes_ - chunk_.size());
    chunk_.insert(chunk_.end(), p, p + take);
    p += take;
    bytes -= take;
    offset_ += take;
    if (chunk_.size() == chunk_bytes_) flush_chunk();
  }
  return at;
}

FileEntry ShardWriter::finish(const std::string& name, int rank) {
  flush_chunk();
  STRATA_CHECK(::fsync(fd_) == 0, Errc::io, "checkpoint shard '", path_, "': fsync failed: ", errno_text(errno));
  const int fd = fd_;
  fd_ = -1;
  STRATA_CHECK(::close(fd) == 0, Errc::io, "checkpoint shard '", path_, "': close failed: ", errno_text(errno));
  return {name, rank, written_, sums_};
}

int copy_file_contents(int in, int out, std::uint64_t bytes, std::uint64_t& done) {
  done = 0;
  while (done < bytes) {
    // Explicit offsets: the descriptors' own offsets are not where the copy stands.
    loff_t in_off = static_cast<loff_t>(done), out_off = static_cast<loff_t>(done);
    const ssize_t n = ::copy_file_range(in, &in_off, out, &out_off, static_cast<std::size_t>(bytes - done), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EXDEV || errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP)) break;
    if (n == 0) break;  // nothing copied in the kernel: the buffer copy says why, if anything
    if (n < 0) return errno;
    done += static_cast<std::uint64_t>(n);
  }
  std::vector<char> buf(std::min<std::uint64_t>(bytes - done, std::uint64_t{4} << 20));
  while (done < bytes) {
    const ssize_t r =
        ::pread(in, buf.data(), std::min<std::uint64_t>(buf.size(), bytes - done), static_cast<off_t>(done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return r < 0 ? errno : EIO;  // the source ended early
    for (ssize_t w = 0; w < r;) {
      const ssize_t n = ::pwrite(out, buf.data() + w, static_cast<std::size_t>(r - w), static_cast<off_t>(done) + w);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return n < 0 ? errno : ENOSPC;
      w += n;
    }
    done += static_cast<std::uint64_t>(r);
  }
  return 0;
}

FileEntry adopt_swap_file(const std::string& from, const std::string& dir, const std::string& name, int rank,
                          bool* linked) {
  const std::string to = dir + "/" + name;
  *linked = ::link(from.c_str(), to.c_str()) == 0;
  if (!*linked) {
    const int link_err = errno;
    STRATA_CHECK(link_err == EXDEV || link_err == EPERM || link_err == EMLINK || link_err == ENOTSUP, Errc::io,
                 "checkpoint: linking swap file '", from, "' as '", to, "' failed: ", errno_text(link_err));
    const int in = ::open(from.c_str(), O_RDONLY | O_CLOEXEC);
    STRATA_CHECK(in >= 0, Errc::io, "checkpoint: cannot open swap file '", from, "': ", errno_text(errno));
    const int out = ::open(to.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (out < 0) {
      const int err = errno;
      ::close(in);
      STRATA_THROW(Errc::io, "checkpoint: cannot create '", to, "': ", errno_text(err));
    }
    struct stat st {};
    const std::uint64_t size = ::fstat(in, &st) == 0 ? static_cast<std::uint64_t>(st.st_size) : 0;
    std::uint64_t done = 0;
    const int err = copy_file_contents(in, out, size, done);
    ::close(in);
    ::close(out);
    STRATA_CHECK(
        err == 0, Errc::io, "checkpoint: copying swap file '", from, "' to '", to, "' failed at byte ", done, ": ",
        errno_text(err),
        err == ENOSPC || err == EDQUOT || err == EFBIG ? " (the checkpoint's filesystem is full: free space)" : "",
        "; the previous checkpoint is kept");
  }
  const int fd = ::open(to.c_str(), O_RDONLY | O_CLOEXEC);
  STRATA_CHECK(fd >= 0, Errc::io, "checkpoint: cannot open '", to, "': ", errno_text(errno));
  const off_t end = ::lseek(fd, 0, SEEK_END);
  const std::uint64_t size = end < 0 ? 0 : static_cast<std::uint64_t>(end);
  std::vector<std::byte> head(io::kSwapHeaderBytes);
  const std::uint64_t want = std::min<std::uint64_t>(size, io::kSwapHeaderBytes);
  const bool head_ok = ::pread(fd, head.data(), want, 0) == static_cast<ssize_t>(want);
  auto layout = io::decode_swap_header(head.data(), head_ok ? size : 0, to);
  std::vector<std::uint64_t> table(layout.ok() ? layout->block_count : 0);
  const bool table_ok =
      layout.ok() && ::pread(fd, table.data(), table.size() * 8, static_cast<off_t>(layout->table_offset)) ==
                         static_cast<ssize_t>(table.size() * 8);
  ::close(fd);
  STRATA_CHECK(table_ok, Errc::corrupt, "checkpoint: swap file '", from, "' cannot be taken into the checkpoint: ",
               layout.ok() ? std::string("its checksum table cannot be read") : layout.status().message());
  FileEntry e;
  e.name = name;
  e.rank = rank;
  e.kind = FileKind::swap;
  e.bytes = layout->payload_bytes;
  e.table_xxh3 = XXH3_64bits(table.data(), table.size() * 8);
  return e;
}

ShardReader::ShardReader(std::string dir, const Manifest& manifest) : dir_(std::move(dir)), m_(manifest) {}

ShardReader::~ShardReader() {
  for (auto& [i, o] : open_) ::close(o.fd);
}

ShardReader::Open& ShardReader::open(int file) {
  auto it = open_.find(file);
  if (it != open_.end()) return it->second;
  const FileEntry& f = m_.files.at(static_cast<std::size_t>(file));
  const std::string path = dir_ + "/" + f.name;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  STRATA_CHECK(fd >= 0, Errc::corrupt, "checkpoint '", dir_, "': shard file ", f.name,
               " cannot be opened: ", errno_text(errno), " (the checkpoint is incomplete; load another one)");
  Open o;
  o.fd = fd;
  try {
    const off_t end = ::lseek(fd, 0, SEEK_END);
    const std::uint64_t size = end < 0 ? 0 : static_cast<std::uint64_t>(end);
    if (f.kind == FileKind::raw) {
      STRATA_CHECK(size == f.bytes, Errc::corrupt, "checkpoint '", dir_, "': shard file ", f.name, " holds ", size,
                   " bytes but the manifest says ", f.bytes, " (truncated or replaced; load another checkpoint)");
      o.unit = m_.chunk_bytes;
      o.chunks = f.xxh3.size();
      o.sums = f.xxh3;
    } else {
      std::vector<std::byte> head(io::kSwapHeaderBytes);
      const std::uint64_t want = std::min<std::uint64_t>(size, io::kSwapHeaderBytes);
      STRATA_CHECK(::pread(fd, head.data(), want, 0) == static_cast<ssize_t>(want), Errc::io, "checkpoint '", dir_,
                   "': reading the header of ", f.name, " failed: ", errno_text(errno));
      auto layout = io::decode_swap_header(head.data(), size, path);
      STRATA_CHECK(layout.ok(), Errc::corrupt, "checkpoint '", dir_, "': swap file ", f.name, ": ",
                   layout.status().message(), " (load another checkpoint)");
      STRATA_CHECK(layout->payload_bytes == f.bytes, Errc::corrupt, "checkpoint '", dir_, "': swap file ", f.name,
                   " holds ", layout->payload_bytes, " payload bytes but the manifest says ", f.bytes);
      o.sums.resize(layout->block_count);
      const ssize_t t = ::pread(fd, o.sums.data(), layout->block_count * 8, static_cast<off_t>(layout->table_offset));
      STRATA_CHECK(t == static_cast<ssize_t>(layout->block_count * 8) &&
                       XXH3_64bits(o.sums.data(), layout->block_count * 8) == f.table_xxh3,
                   Errc::corrupt, "checkpoint '", dir_, "': swap file ", f.name,
                   "'s checksum table does not match the manifest (the file was replaced or damaged; load another "
                   "checkpoint)");
      o.unit = layout->spec.block_bytes;
      o.data_offset = layout->data_offset;
      o.chunks = layout->block_count;
    }
  } catch (...) {
    ::close(fd);
    throw;
  }
  return open_[file] = std::move(o);
}

std::string ShardReader::holders(int file, std::uint64_t begin, std::uint64_t end) const {
  std::string out;
  int listed = 0;
  for (const auto& t : m_.tensors) {
    for (int s = 0; s < kStates; ++s) {
      for (const auto& g : t.states[s]) {
        if (g.file != file || g.file_offset >= end ||
            g.file_offset + m_.segment_bytes(static_cast<State>(s), g) <= begin)
          continue;
        if (listed++ < 4)
          out += str_cat(out.empty() ? "" : ", ", "'", t.name, "' (", state_name(static_cast<State>(s)), ")");
      }
    }
  }
  if (listed > 4) out += str_cat(" and ", listed - 4, " more");
  return out.empty() ? "no tensor" : out;
}

const std::vector<char>& ShardReader::chunk(int file, std::uint64_t index, const std::string& what) {
  Open& o = open(file);
  if (o.chunk == static_cast<std::int64_t>(index)) return o.data;
  const FileEntry& f = m_.files[static_cast<std::size_t>(file)];
  const std::uint64_t begin = index * o.unit, end = std::min(f.bytes, begin + o.unit);
  STRATA_CHECK(index < o.chunks && begin < end, Errc::corrupt, "checkpoint '", dir_, "': ", f.name, " has no chunk ",
               index);
  o.chunk = -1;
  o.data.resize(end - begin);
  const std::uint64_t at = o.data_offset + begin;  // raw files: data_offset is 0
  std::size_t done = 0;
  while (done < o.data.size()) {
    const ssize_t n = ::pread(o.fd, o.data.data() + done, o.data.size() - done, static_cast<off_t>(at + done));
    if (n < 0 && errno == EINTR) continue;
    STRATA_CHECK(n > 0, Errc::io, "checkpoint '", dir_, "': reading ", f.name, " at byte ", at + done,
                 " failed: ", n < 0 ? errno_text(errno) : std::string("unexpected end of file"));
    done += static_cast<std::size_t>(n);
  }
  const std::uint64_t sum = f.kind == FileKind::raw ? XXH3_64bits(o.data.data(), o.data.size())
                                                    : io::block_checksum(o.data.data(), o.data.size(), index);
  STRATA_CHECK(sum == o.sums[index], Errc::corrupt, "checkpoint '", dir_, "': ", f.name, " chunk ", index, " (bytes ",
               begin, "-", end, ") fails its XXH3 checksum while reading ", what, "; the chunk holds ",
               holders(file, begin, end), ". The file is corrupted: load an earlier checkpoint");
  o.chunk = static_cast<std::int64_t>(index);
  return o.data;
}

void ShardReader::read(int file, std::uint64_t offset, std::uint64_t bytes, void* out, const std::string& what) {
  char* dst = static_cast<char*>(out);
  while (bytes > 0) {
    const std::uint64_t unit = open(file).unit;
    const std::uint64_t index = offset / unit, within = offset % unit;
    const auto& data = chunk(file, index, what);
    STRATA_CHECK(within < data.size(), Errc::corrupt, "checkpoint '", dir_, "': reading ", what, " at byte ", offset,
                 " of ", m_.files[static_cast<std::size_t>(file)].name, ", past its end");
    const std::uint64_t take = std::min<std::uint64_t>(bytes, data.size() - within);
    std::memcpy(dst, data.data() + within, take);
    dst += take;
    offset += take;
    bytes -= take;
  }
}

void ShardReader::read_tensor(const TensorEntry& t, State s, std::uint64_t elem, std::uint64_t count, float* out) {
  const std::uint64_t end = elem + count;
  const std::string what = str_cat("tensor '", t.name, "' (", state_name(s), ")");
  STRATA_CHECK(s == State::master || t.has_moments(), Errc::invalid_argument, "checkpoint '", dir_, "': tensor '",
               t.name, "' was saved frozen: it has its values and no ", state_name(s));
  std::uint64_t covered = 0;
  const std::uint64_t eb = m_.elem_bytes(s);
  std::vector<std::uint16_t> narrow;
  std::vector<std::uint8_t> blocks;
  for (const auto& g : t.states[static_cast<int>(s)]) {
    const std::uint64_t lo = std::max(elem, g.elem), hi = std::min(end, g.elem + g.count);
    if (lo >= hi) continue;
    if (m_.blocks(s)) {  // q8 blocks: read the blocks that hold lanes [first, first + count), decode those lanes
      const std::uint64_t first = g.lane + (lo - g.elem), b0 = first / q8::kBlockElems;
      const std::uint64_t b1 = (g.lane + (hi - g.elem) + q8::kBlockElems - 1) / q8::kBlockElems;
      blocks.resize((b1 - b0) * q8::kBlockBytes);
      read(g.file, g.file_offset + b0 * q8::kBlockBytes, blocks.size(), blocks.data(), what);
      moments_range_to_fp32(blocks.data(), MomentFormat::q8, s == State::exp_avg ? Moment::first : Moment::second,
                            first - b0 * q8::kBlockElems, hi - lo, out + (lo - elem));
    } else if (eb == 4) {
      read(g.file, g.file_offset + (lo - g.elem) * 4, (hi - lo) * 4, out + (lo - elem), what);
    } else {  // bf16 moments, widened exactly (q8's exp_avg_sq: its square roots, squared back)
      narrow.resize(hi - lo);
      read(g.file, g.file_offset + (lo - g.elem) * eb, (hi - lo) * eb, narrow.data(), what);
      float* o = out + (lo - elem);
      convert(narrow.data(), DType::bf16, o, DType::fp32, hi - lo);
      if (s == State::exp_avg_sq && m_.moment_dtype == "q8")
        for (std::uint64_t i = 0; i < hi - lo; ++i) o[i] *= o[i];
    }
    covered += hi - lo;
  }
  STRATA_CHECK(covered == count, Errc::corrupt, "checkpoint '", dir_, "': ", what, " elements ", elem, "-", end,
               " are not all in the checkpoint");
}

void ShardReader::verify_all() {
  std::uint64_t total = 0;
  for (const auto& f : m_.files) total += f.bytes;
  Progress progress("verify", total);
  for (std::size_t f = 0; f < m_.files.size(); ++f) {
    const std::uint64_t chunks = open(static_cast<int>(f)).chunks;
    for (std::uint64_t c = 0; c < chunks; ++c) chunk(static_cast<int>(f), c, "the whole checkpoint (verify)");
    progress.advance(m_.files[f].bytes);
  }
}

}  // namespace strata::checkpoint
