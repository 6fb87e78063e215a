// See swap_files.h.
#include "offload/detail/swap_files.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <filesystem>

#include "io/aligned.h"
#include "io/status.h"
#include "offload/io_error.h"
#include "runtime/core/error.h"
#include "runtime/core/units.h"

namespace strata::offload::detail {

std::string file_stem(const std::string& name) {
  std::string s;
  for (char c : name) s += (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.') ? c : '_';
  return s.empty() ? std::string("tensor") : s;
}

void reserve_blocks(const std::string& path, std::uint64_t bytes, const char* tier) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) STRATA_IO_CHECK(io::Status(-errno, "open '" + path + "': " + io::errno_text(errno)), tier);
  int err;
  do {
    err = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  } while (err == EINTR);
  ::close(fd);
  if (err != 0 && err != EOPNOTSUPP) {
    STRATA_IO_CHECK(io::Status(-err, "reserving " + std::to_string(bytes) + " bytes for swap file '" + path +
                                         "': " + io::errno_text(err) + ". " + io::errno_hint(err)),
                    tier);
  }
}

std::vector<std::string> create_swap_dir(const std::string& dir, const char* key) {
  std::error_code ec;
  std::vector<std::string> created;
  for (std::filesystem::path p = std::filesystem::path(dir).lexically_normal(); !p.empty() && p != p.root_path();
       p = p.parent_path()) {
    if (std::filesystem::exists(p, ec)) break;
    created.insert(created.begin(), p.string());
    if (p.parent_path() == p) break;
  }
  std::filesystem::create_directories(dir, ec);
  if (ec || !std::filesystem::is_directory(dir, ec)) {
    STRATA_THROW(Errc::io, key, ": cannot create the swap directory '", dir, "' (",
                 ec ? ec.message() : std::string("not a directory"), "): point ", key,
                 " at a writable directory on the NVMe device");
  }
  return created;
}

namespace {

io::SwapSpec pair_spec(std::uint32_t element_bytes, std::uint64_t payload_bytes, std::uint32_t block_bytes) {
  io::SwapSpec spec;
  spec.element_bytes = element_bytes;
  spec.element_count = payload_bytes / element_bytes;
  spec.block_bytes =
      static_cast<std::uint32_t>(std::min<std::uint64_t>(io::align_up(block_bytes), io::align_up(payload_bytes)));
  return spec;
}

// Both generations of one chunk's swap file, `base` + ".a.swap" and ".b.swap", with their
// blocks reserved. Each path goes into `created` before its file is made, so that a failure
// can remove it. Returns the bytes of both files.
std::uint64_t create_swap_pair(io::Engine& engine, const std::string& base, const io::SwapSpec& spec, SwapChunk& c,
                               std::vector<std::string>& created, const SwapChunks::Where& where, const char* tier) {
  std::uint64_t total = 0;
  for (int g = 0; g < 2; ++g) {
    c.path[g] = base + (g == 0 ? ".a.swap" : ".b.swap");
    created.push_back(c.path[g]);
    // A file of this name is a dead run's that its cleanup could not remove; it may share
    // its inode with a checkpoint, so it is unlinked, never truncated in place.
    if (::unlink(c.path[g].c_str()) != 0 && errno != ENOENT) {
      STRATA_IO_CHECK(
          io::Status(-errno, str_cat("unlink '", c.path[g], "' (a dead run's file): ", io::errno_text(errno))),
          where(c, g));
    }
    auto f = io::SwapFile::create(engine, c.path[g], spec);
    STRATA_IO_CHECK(f.status(), where(c, g));
    reserve_blocks(c.path[g], f->layout().file_bytes, tier);
    total += f->layout().file_bytes;
    c.file[g] = std::make_unique<io::SwapFile>(std::move(f).value());
  }
  return total;
}

// Calls fn(index, offset, length) for each chunk of a tensor of `size` units.
template <class Fn> void for_each_chunk(std::uint64_t size, std::uint64_t chunk_units, Fn&& fn) {
  for (std::uint64_t off = 0, k = 0; off < size; off += chunk_units, ++k) fn(k, off, std::min(chunk_units, size - off));
}

}  // namespace

void count_swap_files(SwapFootprint& f, const std::vector<std::uint64_t>& sizes, const SwapLayout& layout) {
  for (const std::uint64_t size : sizes) {
    for_each_chunk(size, layout.chunk_units, [&](std::uint64_t, std::uint64_t, std::uint64_t length) {
      auto l = io::swap_layout(pair_spec(layout.element_bytes, layout.payload(length), layout.block_bytes));
      STRATA_IO_CHECK(l.status(), "swap file layout");
      f.file_bytes += 2 * l->file_bytes;
      f.file_count += 2;
      f.host_bytes += 2 * io::SwapFile::host_bytes(*l);
    });
  }
}

void SwapChunks::create(io::Engine& engine, const std::string& dir, const char* dir_key,
                        const std::vector<std::string>& names, const std::vector<std::uint64_t>& sizes,
                        const SwapLayout& layout, const char* infix, const Where& where, const char* tier) {
  created_dirs_ = create_swap_dir(dir, dir_key);
  std::vector<std::string> created;
  try {
    for (std::size_t t = 0; t < sizes.size(); ++t) {
      first.push_back(chunks.size());
      const std::string stem = str_cat(dir, "/", file_stem(names[t]), infix);
      for_each_chunk(sizes[t], layout.chunk_units, [&](std::uint64_t k, std::uint64_t off, std::uint64_t length) {
        SwapChunk c;
        c.tensor = t;
        c.index = k;
        c.offset = off;
        c.length = length;
        const auto spec = pair_spec(layout.element_bytes, layout.payload(length), layout.block_bytes);
        file_bytes += create_swap_pair(engine, str_cat(stem, k), spec, c, created, where, tier);
        chunks.push_back(std::move(c));
      });
    }
  } catch (...) {
    chunks.clear();
    for (const auto& p : created) ::unlink(p.c_str());
    remove_swap_dirs(created_dirs_);
    created_dirs_.clear();
    throw;
  }
  first.push_back(chunks.size());
}

SwapChunks::~SwapChunks() {
  for (auto& c : chunks) {
    for (int g = 0; g < 2; ++g) {
      c.file[g].reset();
      if (!c.path[g].empty()) ::unlink(c.path[g].c_str());
    }
  }
  remove_swap_dirs(created_dirs_);  // each only if now empty
}

void remove_swap_dirs(const std::vector<std::string>& created) noexcept {
  for (auto it = created.rbegin(); it != created.rend(); ++it) ::rmdir(it->c_str());
}

namespace {

std::uint64_t open_descriptors() {
  std::error_code ec;
  std::uint64_t n = 0;
  for (std::filesystem::directory_iterator it("/proc/self/fd", ec), end; !ec && it != end; it.increment(ec)) ++n;
  return n;
}

// Two descriptors per swap file, beside those already open, and room for the rest of the
// process (sockets, checkpoints, a second store).
void ensure_descriptors(std::uint64_t files, const char* who, const char* files_key) {
  constexpr std::uint64_t kSpare = 256;
  const std::uint64_t need = open_descriptors() + 2 * files + kSpare;
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY || lim.rlim_cur >= need) return;
  if (lim.rlim_max != RLIM_INFINITY && lim.rlim_max < need) {
    STRATA_THROW(Errc::out_of_budget, who, ": ", files, " swap files need ", need,
                 " open descriptors (two per file, and those already open), but this process may open at most ",
                 lim.rlim_max, " (ulimit -n, hard limit): raise the limit, or raise ", files_key,
                 " so that fewer, larger files hold the same bytes");
  }
  lim.rlim_cur = need;
  ::setrlimit(RLIMIT_NOFILE, &lim);  // within the hard limit: cannot fail for lack of rights
}

}  // namespace

void start_swap_io(SwapIo& out, unsigned queue_depth, unsigned submit_batch, std::uint32_t block_bytes,
                   std::uint64_t buffer_bytes, int count, bool lock_memory, const char* who, const char* buffers_what,
                   std::uint64_t files, const char* files_key) {
  ensure_descriptors(files, who, files_key);
  io::EngineOptions eo;
  eo.queue_depth = std::max(1u, queue_depth);
  eo.submit_batch = std::max(1u, submit_batch);
  eo.block_bytes = block_bytes;
  // Two slots beyond the files: a generation a checkpoint linked is replaced by making the
  // new file and reopening it while the old one is still open (OptimizerSwapper::unshare).
  eo.max_files =
      static_cast<unsigned>(std::clamp<std::uint64_t>(files + 2, 1, 1u << 15));  // older kernels cap at 32768
  auto engine = io::Engine::create(eo);
  STRATA_IO_CHECK(engine.status(), str_cat(who, ": starting the io_uring engine"));
  out.engine.emplace(std::move(engine).value());
  io::PoolOptions po;
  po.buffer_bytes = buffer_bytes;
  po.count = static_cast<std::size_t>(count);
  po.lock_memory = lock_memory;
  auto pool = io::BufferPool::create(&*out.engine, po);
  STRATA_IO_CHECK(pool.status(),
                  str_cat("host tier: allocating ", count, " ", buffers_what, " of ", format_bytes(buffer_bytes)));
  out.pool.emplace(std::move(pool).value());
  for (int i = 0; i < count; ++i) out.buffers.push_back(out.pool->acquire());
}

}  // namespace strata::offload::detail
