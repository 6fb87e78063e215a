// DirLock (see dir_lock.h).
#include "offload/dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>

#include "offload/detail/swap_files.h"
#include "runtime/core/error.h"
#include "runtime/core/host_memory.h"
#include "runtime/core/log.h"
#include "runtime/core/units.h"

namespace strata::offload {
namespace {

// "pid 4242 on host", from the lock file; this process itself when it holds the lock twice.
std::string holder_of(const std::string& path) {
  std::ifstream in(path);
  std::string holder;
  std::getline(in, holder);
  if (holder.empty()) return "an unknown process";
  if (holder.rfind(str_cat("pid ", ::getpid(), " "), 0) == 0)
    return "another Engine of this process (" + holder +
           "): close that one first (engine.close() in Python, strata_engine_destroy in C, its destructor in C++)";
  return holder;
}

// Whether `name` is one of a run's swap-file generations ("layer_3.sg0.a.swap"), or a
// replacement being made for one ("layer_3.sg0.a.new.swap"): a
// checkpoint's copies carry a rank prefix ("rank00000.layer_3.sg0.a.swap") and live in
// step directories, which are never looked into.
bool is_run_swap_file(const std::string& name) {
  auto ends_with = [&](const char* tail) {
    const std::size_t n = std::char_traits<char>::length(tail);
    return name.size() > n && name.compare(name.size() - n, n, tail) == 0;
  };
  return (ends_with(".a.swap") || ends_with(".b.swap") || ends_with(".new.swap")) && name.rfind("rank", 0) != 0;
}

// Removes the swap files a dead run left in the places a run keeps them: `dir` itself and
// the parameter stores' subdirectories (`params`, `params.1`), by their names; then those
// subdirectories if empty. Nothing else is touched: a checkpoint or any other directory
// under `dir` keeps its files, whatever they are called. Returns the bytes removed.
std::uint64_t remove_leftovers(const std::string& dir) {
  namespace fs = std::filesystem;
  std::uint64_t bytes = 0;
  for (const std::string& place : {dir, dir + "/params", dir + "/params.1"}) {
    std::error_code ec;
    for (auto it = fs::directory_iterator(place, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
      std::error_code fe;
      if (!it->is_regular_file(fe) || !is_run_swap_file(it->path().filename().string())) continue;
      const auto size = it->file_size(fe);
      if (::unlink(it->path().c_str()) == 0) bytes += fe ? 0 : size;
    }
    if (place != dir) ::rmdir(place.c_str());  // only if empty
  }
  return bytes;
}

}  // namespace

DirLock::DirLock(const std::string& dir, const char* key) : dir_(dir) {
  created_ = detail::create_swap_dir(dir, key);
  const std::string path = dir + "/" + kFileName;
  // A lock file nobody holds was left by a run that died: the directory is Strata's (made
  // by that run), so it goes when this run ends, as if this run had made it.
  const bool stale = created_.empty() && ::access(path.c_str(), F_OK) == 0;
  try {
    acquire(path, key);
  } catch (...) {
    detail::remove_swap_dirs(created_);  // what this constructor made, now empty again
    throw;
  }
  if (stale) created_.push_back(dir);
  const std::uint64_t removed = remove_leftovers(dir);
  if (removed > 0) {
    STRATA_LOG(warn, key, ": removed ", format_bytes(removed), " of swap files in '", dir,
               "' left by an earlier run that ended without cleaning up");
  }
  const std::string me = str_cat("pid ", ::getpid(), " on ", host_name(), "\n");
  // The holder's name is a courtesy for a refusal message; the lock itself is the flock.
  const bool named = ::ftruncate(fd_, 0) == 0 && ::pwrite(fd_, me.data(), me.size(), 0) >= 0;
  (void)named;
}

void DirLock::acquire(const std::string& path, const char* key) {
  for (;;) {
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    STRATA_CHECK(fd_ >= 0, Errc::io, key, ": cannot create the lock file '", path, "': ", errno_text(errno));
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      ::close(fd_);
      fd_ = -1;
      STRATA_CHECK(err == EWOULDBLOCK, Errc::io, key, ": cannot lock '", path, "': ", errno_text(err));
      STRATA_THROW(Errc::invalid_argument, key, ": '", dir_, "' is in use by ", holder_of(path),
                   ". Two runs on one swap directory would overwrite each other's files: give this run another ", key,
                   ", or stop the other run");
    }
    // The previous holder may have unlinked the file between our open and flock: then
    // we hold a lock on a file nobody else will see. Retry on the current file.
    struct stat held {
    }, now{};
    if (::fstat(fd_, &held) == 0 && ::stat(path.c_str(), &now) == 0 && held.st_ino == now.st_ino &&
        held.st_dev == now.st_dev)
      return;
    ::close(fd_);
    fd_ = -1;
  }
}

DirLock::DirLock(DirLock&& other) noexcept
    : dir_(std::move(other.dir_)), fd_(other.fd_), created_(std::move(other.created_)) {
  other.fd_ = -1;
}

DirLock::~DirLock() {
  if (fd_ < 0) return;
  ::unlink((dir_ + "/" + kFileName).c_str());  // before unlocking: a waiter retries on a new file
  ::close(fd_);
  detail::remove_swap_dirs(created_);
}

}  // namespace strata::offload
