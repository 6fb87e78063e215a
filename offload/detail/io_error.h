// offload/'s boundary with io/: a failed io::Status (0 or -errno plus a message) becomes a
// strata::Error with the caller's context in front (which tensor, which tier). Same mapping
// as the CLI's (tools/cli/io_boundary.h): corrupt data -> Errc::corrupt, else Errc::io.
#pragma once

#include <cerrno>
#include <string>

#include "engine/core/error.h"
#include "io/status.h"

namespace strata::offload::detail {

inline Errc errc_from_io(int err) {
  switch (err < 0 ? -err : err) {
    case EBADMSG:
    case ENODATA: return Errc::corrupt;
    case EINVAL: return Errc::invalid_argument;
    case EOPNOTSUPP:
    case ENOSYS: return Errc::unsupported;
    default: return Errc::io;
  }
}

[[noreturn]] inline void throw_io(const io::Status& s, const std::string& context, const char* file, int line) {
  strata::detail::throw_error(errc_from_io(s.err()), context + ": " + s.message(), file, line, s.err() < 0 ? -s.err() : s.err());
}

}  // namespace strata::offload::detail

#define STRATA_OFFLOAD_IO_CHECK(status_expr, context)                                               \
  do {                                                                                              \
    const ::strata::io::Status& strata_off_s_ = (status_expr);                                      \
    if (!strata_off_s_.ok()) ::strata::offload::detail::throw_io(strata_off_s_, (context), __FILE__, __LINE__); \
  } while (0)
