// File and Engine::open: O_DIRECT with a buffered fallback, the second (buffered)
// descriptor for unaligned tails, and fixed-file registration (see file.h).
#include "io/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "io/detail/file_state.h"
#include "io/detail/reactor.h"
#include "io/engine.h"
#include "io/warn.h"

namespace strata::io {
namespace detail {

FileState::~FileState() {
  if (slot >= 0 && registry) {
    std::lock_guard<std::mutex> lock(registry->mutex);
    if (registry->reactor != nullptr) registry->reactor->unregister_file(slot);
  }
  if (buffered_fd >= 0 && buffered_fd != fd) ::close(buffered_fd);
  if (fd >= 0) ::close(fd);
}

}  // namespace detail

namespace {

int open_retry(const std::string& path, int flags, mode_t mode) {
  for (;;) {
    const int fd = ::open(path.c_str(), flags, mode);
    if (fd >= 0 || errno != EINTR) return fd;
  }
}

int access_flags(Access a) {
  switch (a) {
    case Access::read:
      return O_RDONLY;
    case Access::write:
      return O_WRONLY;
    case Access::read_write:
      return O_RDWR;
  }
  return O_RDONLY;
}

std::string describe_open(const OpenOptions& o) {
  std::string s = o.access == Access::read ? "read" : o.access == Access::write ? "write" : "read-write";
  if (o.create) s += ", create";
  if (o.truncate) s += ", truncate";
  return s;
}

Status open_failure(const std::string& path, const OpenOptions& o, int err) {
  std::string m = "open '" + path + "' (" + describe_open(o) + "): " + errno_text(err);
  const std::string hint = errno_hint(err);
  if (!hint.empty()) m += ". " + hint;
  return {-err, m};
}

const std::string& empty_path() {
  static const std::string s;
  return s;
}

template <class Fn> Status sys_status(const char* what, const std::string& path, Fn fn) {
  for (;;) {
    if (fn() == 0) return {};
    const int err = errno;
    if (err == EINTR) continue;
    std::string m = std::string(what) + " '" + path + "': " + errno_text(err);
    const std::string hint = errno_hint(err);
    if (!hint.empty()) m += ". " + hint;
    return {-err, m};
  }
}

Status not_open(const char* what) {
  return {-EBADF, std::string(what) + ": the File is not open (default-constructed, moved from or closed)"};
}

}  // namespace

const std::string& File::path() const { return state_ ? state_->path : empty_path(); }
bool File::direct() const noexcept { return state_ && state_->direct; }
bool File::registered() const noexcept { return state_ && state_->slot >= 0; }

Result<std::uint64_t> File::size() const {
  if (!state_) return not_open("fstat");
  struct stat st {};
  if (Status s = sys_status("fstat", state_->path, [&] { return ::fstat(state_->fd, &st); }); !s) return s;
  return static_cast<std::uint64_t>(st.st_size);
}

Status File::truncate(std::uint64_t bytes) const {
  if (!state_) return not_open("ftruncate");
  return sys_status("ftruncate", state_->path, [&] { return ::ftruncate(state_->fd, static_cast<off_t>(bytes)); });
}

Status File::allocate(std::uint64_t bytes) const {
  if (!state_) return not_open("fallocate");
  return sys_status("fallocate", state_->path,
                    [&] { return ::fallocate(state_->fd, 0, 0, static_cast<off_t>(bytes)); });
}

Result<File> Engine::open(const std::string& path, const OpenOptions& o) {
  if (!reactor_) return Status(-EINVAL, "open '" + path + "': the Engine was moved from");
  int flags = O_CLOEXEC | access_flags(o.access);
  if (o.create) flags |= O_CREAT;
  if (o.truncate) flags |= O_TRUNC;
  auto st = std::make_shared<detail::FileState>();
  st->path = path;
  st->registry = registry_;
  int fd = -1;
  if (o.direct) {
    fd = open_retry(path, flags | O_DIRECT, o.mode);
    if (fd >= 0) {
      st->direct = true;
    } else if (errno == EINVAL) {
      fd = open_retry(path, flags, o.mode);
      if (fd >= 0) {
        warn_once("odirect:" + path, "'" + path +
                                         "': the filesystem refuses O_DIRECT (EINVAL); using buffered I/O through "
                                         "the page cache for this file (slower, and its pages are written back "
                                         "later). Put swap files on a disk filesystem (ext4, xfs) for direct I/O");
      }
    }
  } else {
    fd = open_retry(path, flags, o.mode);
  }
  if (fd < 0) return open_failure(path, o, errno);
  st->fd = fd;
  if (st->direct) {
    // The same file without O_DIRECT, for tails and unaligned requests. The file exists
    // now, so create/truncate are not repeated.
    st->buffered_fd = open_retry(path, O_CLOEXEC | access_flags(o.access), 0);
    if (st->buffered_fd < 0) return open_failure(path, o, errno);
  } else {
    st->buffered_fd = fd;
  }
  const int slot = reactor_->register_file(fd);
  if (slot >= 0) {
    st->slot = slot;
  } else if (slot == -ENOBUFS) {
    warn_once("uring-file-slots", "io engine: all " + std::to_string(reactor_->options().max_files) +
                                      " fixed-file slots are in use; further files use plain descriptors "
                                      "(raise EngineOptions::max_files)");
  }
  return File(std::move(st));
}

}  // namespace strata::io
