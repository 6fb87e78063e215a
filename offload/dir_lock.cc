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

// Removes the swap files (*.swap) a dead run left under `dir` and the directories they
// leave empty; other files are the user's and stay. Returns the bytes removed.
std::uint64_t remove_leftovers(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::uint64_t bytes = 0;
  std::vector<fs::path> dirs;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    if (it->is_directory(ec)) {
      dirs.push_back(it->path());
    } else if (it->path().extension() == ".swap" && it->is_regular_file(ec)) {
      const auto size = it->file_size(ec);
      if (::unlink(it->path().c_str()) == 0) bytes += ec ? 0 : size;
    }
  }
  for (auto d = dirs.rbegin(); d != dirs.rend(); ++d) ::rmdir(d->c_str());  // only if empty
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
