// Leveled logging to stderr. Level from STRATA_LOG_LEVEL (error|warn|info|debug; default
// info) or set_log_level(). warn_once() prints a message the first time its key is seen,
// for conditions that hold for a whole run (no O_DIRECT on a path, memlock refused).
#pragma once

#include <string>
#include <string_view>

#include "runtime/core/error.h"

namespace strata {

enum class LogLevel { error = 0, warn = 1, info = 2, debug = 3 };

LogLevel log_level() noexcept;
void set_log_level(LogLevel level) noexcept;
LogLevel parse_log_level(std::string_view text);  // throws naming the value
void log_message(LogLevel level, std::string_view message);
// Returns true if this call printed (the key was new).
bool warn_once(const std::string& key, std::string_view message);

}  // namespace strata

#define STRATA_LOG(level, ...)                                                          \
  do {                                                                                  \
    if (::strata::log_level() >= ::strata::LogLevel::level)                             \
      ::strata::log_message(::strata::LogLevel::level, ::strata::str_cat(__VA_ARGS__)); \
  } while (0)
