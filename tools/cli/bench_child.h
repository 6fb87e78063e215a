// Runs this very executable as a child (`strata bench io --json ...`), so a bench that
// compares against another bench's figure uses exactly that command's code, in the same run.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace strata::cli {

std::string shell_quote(const std::string& s);
// Runs `strata <args>` (args already shell-quoted where needed) and returns its stdout; a
// failure throws naming `who`, the command and what it printed.
std::string run_self(const std::string& args, const char* who);
// run_self() with stdout parsed as JSON.
nlohmann::json run_self_json(const std::string& args, const char* who);

}  // namespace strata::cli
