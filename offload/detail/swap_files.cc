// See swap_files.h.
#include "offload/detail/swap_files.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <filesystem>
#include <map>
#include <utility>

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

// One of chunk c's files, `base` + ".a.swap" (gen 0) or ".b.swap" (gen 1), with its blocks
// reserved. The path goes into `created` before the file is made, so that a failure can
// remove it. Returns the file's bytes.
std::uint64_t create_swap_file(io::Engine& engine, const std::string& base, int g, const io::SwapSpec& spec,
                               SwapChunk& c, std::vector<std::string>& created, const SwapChunks::Where& where,
                               const char* tier) {
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
  c.file[g] = std::make_unique<io::SwapFile>(std::move(f).value());
  return c.file[g]->layout().file_bytes;
}

// Calls fn(index, offset, length) for each chunk of a tensor of `size` units.
template <class Fn> void for_each_chunk(std::uint64_t size, std::uint64_t chunk_units, Fn&& fn) {
  for (std::uint64_t off = 0, k = 0; off < size; off += chunk_units, ++k) fn(k, off, std::min(chunk_units, size - off));
}

// The chunk lengths of tensors of these sizes, in chunk order, and how many files each
// chunk has: its ".a" file, and a ".b" spare for every chunk (spares 0) or for the first
// `spares` chunks of each length.
std::vector<std::pair<std::uint64_t, int>> chunk_files(const std::vector<std::uint64_t>& sizes,
                                                       const SwapLayout& layout) {
  std::vector<std::pair<std::uint64_t, int>> out;
  std::map<std::uint64_t, std::uint64_t> spares_of;  // per length: spares made so far
  for (const std::uint64_t size : sizes) {
    for_each_chunk(size, layout.chunk_units, [&](std::uint64_t, std::uint64_t, std::uint64_t length) {
      const bool spare = layout.spares == 0 || spares_of[length]++ < layout.spares;
      out.emplace_back(length, spare ? 2 : 1);
    });
  }
  return out;
}

}  // namespace

void count_swap_files(SwapFootprint& f, const std::vector<std::uint64_t>& sizes, const SwapLayout& layout) {
  for (const auto& [length, files] : chunk_files(sizes, layout)) {
    auto l = io::swap_layout(pair_spec(layout.element_bytes, layout.payload(length), layout.block_bytes));
    STRATA_IO_CHECK(l.status(), "swap file layout");
    f.file_bytes += files * l->file_bytes;
    f.file_count += static_cast<std::uint64_t>(files);
    f.host_bytes += files * io::SwapFile::host_bytes(*l);
  }
}

void SwapChunks::create(io::Engine& engine, const std::string& dir, const char* dir_key,
                        const std::vector<std::string>& names, const std::vector<std::uint64_t>& sizes,
                        const SwapLayout& layout, const char* infix, const Where& where, const char* tier) {
  created_dirs_ = create_swap_dir(dir, dir_key);
  std::vector<std::string> created;
  const auto files = chunk_files(sizes, layout);
  std::map<std::uint64_t, std::size_t> class_of;  // per length (spares > 0)
  try {
    for (std::size_t t = 0; t < sizes.size(); ++t) {
      first.push_back(chunks.size());
      const std::string stem = str_cat(dir, "/", file_stem(names[t]), infix);
      for_each_chunk(sizes[t], layout.chunk_units, [&](std::uint64_t k, std::uint64_t off, std::uint64_t length) {
        const std::size_t ci = chunks.size();
        SwapChunk c;
        c.tensor = t;
        c.index = k;
        c.offset = off;
        c.length = length;
        c.slot = {ci, 0};
        if (layout.spares == 0) {
          c.klass = free_.size();
        } else {
          c.klass = class_of.try_emplace(length, free_.size()).first->second;
        }
        if (c.klass == free_.size()) free_.emplace_back();
        const auto spec = pair_spec(layout.element_bytes, layout.payload(length), layout.block_bytes);
        for (int g = 0; g < files[ci].second; ++g)
          file_bytes += create_swap_file(engine, str_cat(stem, k), g, spec, c, created, where, tier);
        if (files[ci].second == 2) free_[c.klass].push_back({ci, 1});
        chunks.push_back(std::move(c));
      });
    }
  } catch (...) {
    chunks.clear();
    free_.clear();
    for (const auto& p : created) ::unlink(p.c_str());
    remove_swap_dirs(created_dirs_);
    created_dirs_.clear();
    throw;
  }
  first.push_back(chunks.size());
}

bool SwapChunks::acquire(std::size_t ci) {
  SwapChunk& c = chunks[ci];
  STRATA_CHECK(!c.has_next, Errc::internal, "swap files: chunk ", ci, " already holds an uncommitted write");
  auto& pool = free_[c.klass];
  if (pool.empty()) return false;
  c.next = pool.back();
  pool.pop_back();
  c.has_next = true;
  return true;
}

void SwapChunks::commit(std::size_t ci) {
  SwapChunk& c = chunks[ci];
  STRATA_CHECK(c.has_next, Errc::internal, "swap files: commit of chunk ", ci, " without a write");
  free_[c.klass].push_back(c.slot);
  c.slot = c.next;
  c.has_next = false;
}

void SwapChunks::discard(std::size_t ci) noexcept {
  SwapChunk& c = chunks[ci];
  if (!c.has_next) return;
  free_[c.klass].push_back(c.next);
  c.has_next = false;
}

std::vector<std::string> SwapChunks::all_paths() const {
  std::vector<std::string> out;
  for (const SwapChunk& c : chunks)
    for (const auto& p : c.path)
      if (!p.empty()) out.push_back(p);
  return out;
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
