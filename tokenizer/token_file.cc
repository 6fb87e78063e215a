// The token file writer (token_file.h).
#include "tokenizer/token_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>

#include "runtime/core/error.h"

namespace strata::tokenizer {
namespace {

void write_all(int fd, const void* data, std::size_t bytes, const std::string& path) {
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = STRATA_SYS_CHECK(::write(fd, p, bytes), "writing token file '", path, "'");
    p += n;
    bytes -= static_cast<std::size_t>(n);
  }
}

}  // namespace

int write_token_file(const std::string& path, const std::vector<std::uint32_t>& ids, std::uint32_t vocab_size) {
  STRATA_CHECK(ids.size() <= static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max()), Errc::invalid_argument,
               "token file '", path, "': ", ids.size(),
               " tokens do not fit the header's int32 count: split the text into several files (--data reads a "
               "directory)");
  const bool narrow =
      vocab_size <= 65536 && std::all_of(ids.begin(), ids.end(), [](std::uint32_t t) { return t < 65536; });
  const int version = narrow ? 1 : 2;
  std::vector<std::int32_t> header(256, 0);
  header[0] = kTokenFileMagic;
  header[1] = version;
  header[2] = static_cast<std::int32_t>(ids.size());

  const std::string tmp = path + ".tmp";
  const int fd = STRATA_SYS_CHECK(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644),
                                  "creating token file '", tmp, "'");
  // Until the rename, an error leaves no partial file behind.
  struct Cleanup {
    int fd;
    const std::string& tmp;
    bool done = false;
    ~Cleanup() {
      if (fd >= 0) ::close(fd);
      if (!done) ::unlink(tmp.c_str());
    }
  } cleanup{fd, tmp};
  write_all(fd, header.data(), header.size() * 4, tmp);
  if (narrow) {
    constexpr std::size_t kBlock = 1 << 16;
    std::vector<std::uint16_t> block;
    for (std::size_t at = 0; at < ids.size(); at += kBlock) {
      const std::size_t n = std::min(kBlock, ids.size() - at);
      block.assign(ids.begin() + static_cast<std::ptrdiff_t>(at), ids.begin() + static_cast<std::ptrdiff_t>(at + n));
      write_all(fd, block.data(), n * 2, tmp);
    }
  } else {
    write_all(fd, ids.data(), ids.size() * 4, tmp);
  }
  STRATA_SYS_CHECK(::fsync(fd), "syncing token file '", tmp, "'");
  const int closing = cleanup.fd;
  cleanup.fd = -1;
  STRATA_SYS_CHECK(::close(closing), "closing token file '", tmp, "'");
  STRATA_SYS_CHECK(::rename(tmp.c_str(), path.c_str()), "renaming '", tmp, "' to '", path, "'");
  cleanup.done = true;
  return version;
}

}  // namespace strata::tokenizer
