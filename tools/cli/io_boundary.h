// The CLI's side of io/: its warnings go to Strata's logger, and its failed statuses become
// strata::Error through offload/io_error.h (STRATA_IO_CHECK), the one conversion.
#pragma once

#include "io/warn.h"
#include "offload/io_error.h"
#include "runtime/core/log.h"

namespace strata::cli {

inline void forward_io_warnings() {
  io::set_warning_sink([](std::string_view m) { STRATA_LOG(warn, m); });
}

}  // namespace strata::cli
