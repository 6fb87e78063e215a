// Logging implementation: one mutex so lines from stream workers and io threads never
// interleave mid-line.
#include "runtime/core/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>

namespace strata {
namespace {

LogLevel initial_level() {
  const char* env = std::getenv("STRATA_LOG_LEVEL");
  if (env == nullptr || *env == '\0') return LogLevel::info;
  try {
    return parse_log_level(env);
  } catch (const Error&) {
    std::fprintf(stderr, "strata: warning: STRATA_LOG_LEVEL='%s' is not error|warn|info|debug; using info\n", env);
    return LogLevel::info;
  }
}

std::atomic<int>& level_ref() {
  static std::atomic<int> level{static_cast<int>(initial_level())};
  return level;
}

std::mutex& log_mutex() {
  static std::mutex m;
  return m;
}

}  // namespace

LogLevel log_level() noexcept { return static_cast<LogLevel>(level_ref().load(std::memory_order_relaxed)); }
void set_log_level(LogLevel level) noexcept { level_ref().store(static_cast<int>(level)); }

LogLevel parse_log_level(std::string_view text) {
  if (text == "error") return LogLevel::error;
  if (text == "warn" || text == "warning") return LogLevel::warn;
  if (text == "info") return LogLevel::info;
  if (text == "debug") return LogLevel::debug;
  STRATA_THROW(Errc::invalid_argument, "log level '", text, "' is not one of error, warn, info, debug");
}

void log_message(LogLevel level, std::string_view message) {
  static const char* const prefix[] = {"error: ", "warning: ", "", "debug: "};
  std::lock_guard<std::mutex> lock(log_mutex());
  std::fprintf(stderr, "strata: %s%.*s\n", prefix[static_cast<int>(level)], static_cast<int>(message.size()),
               message.data());
}

bool warn_once(const std::string& key, std::string_view message) {
  static std::mutex m;
  static std::set<std::string> seen;
  {
    std::lock_guard<std::mutex> lock(m);
    if (!seen.insert(key).second) return false;
  }
  if (log_level() >= LogLevel::warn) log_message(LogLevel::warn, message);
  return true;
}

}  // namespace strata
