// The boundary between io/ (0 or -errno plus a message) and the rest of Strata
// (strata::Error): corrupt or foreign data becomes Errc::corrupt, bad arguments
// Errc::invalid_argument, missing features Errc::unsupported, everything else Errc::io.
// io/ warnings go to Strata's logger.
#pragma once

#include <cerrno>

#include "engine/core/error.h"
#include "engine/core/log.h"
#include "io/status.h"
#include "io/warn.h"

namespace strata::cli {

inline Errc errc_from_io(int err) {
  switch (err < 0 ? -err : err) {
    case EBADMSG: return Errc::corrupt;
    case EINVAL: return Errc::invalid_argument;
    case EOPNOTSUPP:
    case ENOSYS: return Errc::unsupported;
    default: return Errc::io;
  }
}

[[noreturn]] inline void throw_io_status(const io::Status& s, const char* file, int line) {
  detail::throw_error(errc_from_io(s.err()), s.message(), file, line, s.err() < 0 ? -s.err() : s.err());
}

inline void forward_io_warnings() {
  io::set_warning_sink([](std::string_view m) { STRATA_LOG(warn, m); });
}

}  // namespace strata::cli

// Throws strata::Error for a failed io::Status (or io::Result's status).
#define STRATA_IO_CHECK(status_expr)                                              \
  do {                                                                            \
    const ::strata::io::Status& strata_io_s_ = (status_expr);                     \
    if (!strata_io_s_.ok()) ::strata::cli::throw_io_status(strata_io_s_, __FILE__, __LINE__); \
  } while (0)
