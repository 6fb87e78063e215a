// Warning sink (see warn.h). One mutex keeps lines whole when the io thread also warns.
#include "io/warn.h"

#include <cstdio>
#include <mutex>
#include <set>

namespace strata::io {
namespace {

std::mutex& sink_mutex() {
  static std::mutex m;
  return m;
}

WarningSink& sink_ref() {
  static WarningSink sink;
  return sink;
}

}  // namespace

WarningSink set_warning_sink(WarningSink sink) {
  std::lock_guard<std::mutex> lock(sink_mutex());
  WarningSink old = std::move(sink_ref());
  sink_ref() = std::move(sink);
  return old;
}

void warn(std::string_view message) {
  std::lock_guard<std::mutex> lock(sink_mutex());
  if (sink_ref()) {
    sink_ref()(message);
  } else {
    std::fprintf(stderr, "strata: warning: %.*s\n", static_cast<int>(message.size()), message.data());
  }
}

bool warn_once(const std::string& key, std::string_view message) {
  static std::mutex m;
  static std::set<std::string> seen;
  {
    std::lock_guard<std::mutex> lock(m);
    if (!seen.insert(key).second) return false;
  }
  warn(message);
  return true;
}

}  // namespace strata::io
