// Error text for io/ (see status.h).
#include "io/status.h"

#include <cerrno>
#include <cstring>

namespace strata::io {

std::string errno_text(int err) {
  if (err < 0) err = -err;
  const char* name = strerrorname_np(err);
  const char* desc = strerrordesc_np(err);
  if (name == nullptr) return "errno " + std::to_string(err);
  return std::string(name) + " (" + (desc ? desc : "?") + ")";
}

std::string describe_failure(const char* op, const std::string& path, std::uint64_t offset, std::uint64_t length,
                             int err) {
  return std::string(op) + " '" + path + "' at offset " + std::to_string(offset) + ", length " +
         std::to_string(length) + ": " + errno_text(err);
}

std::string errno_hint(int err) {
  switch (err < 0 ? -err : err) {
    case ENOSPC:
      return "The device is full: free space or point the swap path at a larger device";
    case EDQUOT:
      return "The disk quota is exhausted: free space or raise the quota";
    case EFBIG:
      return "The file size limit was reached (ulimit -f, or the filesystem's maximum file size)";
    case EACCES:
    case EPERM:
      return "Permission denied: use a directory this user can write (check its mode, owner and attributes)";
    case EROFS:
      return "The filesystem is mounted read-only: use a writable directory";
    case ENOENT:
      return "Check the path: its directory must exist";
    case EMFILE:
    case ENFILE:
      return "Too many open files: raise the open-file limit (ulimit -n), or use fewer, larger files";
    case EIO:
      return "The device reported an I/O error: check the kernel log (dmesg) and the drive's health";
    default:
      return "";
  }
}

}  // namespace strata::io
