// SaveLock (see save_lock.h).
#include "checkpoint/save_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>

#include "runtime/core/error.h"
#include "runtime/core/host_memory.h"

namespace strata::checkpoint {

SaveLock::SaveLock(const std::string& root) : root_(root) {
  std::error_code ec;
  std::filesystem::create_directories(root, ec);
  STRATA_CHECK(!ec && std::filesystem::is_directory(root, ec), Errc::io, "checkpoint: save directory '", root,
               "' cannot be created: ", ec ? ec.message() : "a file of that name exists",
               " (give --save-dir a writable directory)");
  const std::string path = root + "/" + kFileName;
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  STRATA_CHECK(fd_ >= 0, Errc::io, "checkpoint: cannot create the lock file '", path, "': ", errno_text(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char buf[256] = {};
    const ssize_t n = ::pread(fd_, buf, sizeof buf - 1, 0);
    ::close(fd_);
    fd_ = -1;
    STRATA_CHECK(err == EWOULDBLOCK, Errc::io, "checkpoint: cannot lock '", path, "': ", errno_text(err));
    std::string holder(buf, n > 0 ? static_cast<std::size_t>(n) : 0);
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == '\0')) holder.pop_back();
    if (holder.empty()) holder = "an unknown process";
    if (holder.rfind(str_cat("pid ", ::getpid(), " "), 0) == 0) holder = "another engine of this process";
    STRATA_THROW(Errc::invalid_argument, "checkpoint directory '", root, "' is in use by ", holder,
                 ", which saves there: two runs saving to one directory would remove each other's unfinished saves. "
                 "Give this run another --save-dir (checkpoint.save_dir), or stop the other run");
  }
  const std::string me = str_cat("pid ", ::getpid(), " on ", host_name(), "\n");
  // The holder's name is a courtesy for the refusal above; the lock itself is the flock.
  const bool named = ::ftruncate(fd_, 0) == 0 && ::pwrite(fd_, me.data(), me.size(), 0) >= 0;
  (void)named;
}

SaveLock::~SaveLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the flock
}

}  // namespace strata::checkpoint
