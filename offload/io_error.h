// The one boundary between io/ (0 or -errno plus a message) and the rest of Strata: a failed
// io::Status becomes a strata::Error with the caller's context in front (which tensor, which
// tier, which command). Corrupt, foreign or missing data (EBADMSG; ENODATA: a truncated
// file or a block never written) -> Errc::corrupt; bad arguments -> Errc::invalid_argument;
// missing features -> Errc::unsupported; everything else -> Errc::io.
#pragma once

#include <cerrno>
#include <string>

#include "io/status.h"
#include "runtime/core/error.h"

namespace strata::offload {

inline Errc errc_from_io(int err) {
  switch (err < 0 ? -err : err) {
    case EBADMSG:
    case ENODATA:
      return Errc::corrupt;
    case EINVAL:
      return Errc::invalid_argument;
    case EOPNOTSUPP:
    case ENOSYS:
      return Errc::unsupported;
    default:
      return Errc::io;
  }
}

// context may be empty (the io message already names the file).
[[noreturn]] inline void throw_io(const io::Status& s, const std::string& context, const char* file, int line) {
  strata::detail::throw_error(errc_from_io(s.err()), context.empty() ? s.message() : context + ": " + s.message(), file,
                              line, s.err() < 0 ? -s.err() : s.err());
}

}  // namespace strata::offload

#define STRATA_IO_CHECK(status_expr, context)                                                           \
  do {                                                                                                  \
    const ::strata::io::Status& strata_off_s_ = (status_expr);                                          \
    if (!strata_off_s_.ok()) ::strata::offload::throw_io(strata_off_s_, (context), __FILE__, __LINE__); \
  } while (0)
