// Warnings from io/ (no O_DIRECT on a path, memlock refused, registration refused). io/
// cannot use runtime/core's logger, so it prints to stderr unless the layer above installs
// a sink. warn_once() prints the first time its key is seen, for conditions that hold for
// a whole run.
#pragma once

#include <functional>
#include <string>
#include <string_view>

namespace strata::io {

using WarningSink = std::function<void(std::string_view message)>;

// Replaces the sink (nullptr restores stderr); returns the previous one. Thread-safe.
WarningSink set_warning_sink(WarningSink sink);
void warn(std::string_view message);
// Returns true if this call printed (the key was new).
bool warn_once(const std::string& key, std::string_view message);

}  // namespace strata::io
