// Runs a `strata` executable as a child (`strata bench io --json ...`): this very one by
// default, so a bench that compares against another bench's figure uses exactly that
// command's code, in the same run; or the one a library caller names (the C API's
// strata_calibrate, which has no `strata` of its own to run).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace strata::train {

std::string shell_quote(const std::string& s);
// The path of the running executable.
std::string this_executable(const char* who);
// Runs `EXE <args>` (args already shell-quoted where needed) and returns its stdout; a
// failure throws naming `who`, the command and what it printed.
std::string run_strata(const std::string& exe, const std::string& args, const char* who);
nlohmann::json run_strata_json(const std::string& exe, const std::string& args, const char* who);
// The same with this executable.
std::string run_self(const std::string& args, const char* who);
nlohmann::json run_self_json(const std::string& args, const char* who);

}  // namespace strata::train
