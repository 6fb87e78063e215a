// See output_check.h.
#include "train/output_check.h"

#include <unistd.h>

#include <cerrno>
#include <filesystem>

#include "runtime/core/error.h"

namespace strata::train {

void check_output_file(const char* flag, const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path p(path);
  STRATA_CHECK(!path.empty(), Errc::invalid_argument, flag, " is empty: give a file name");
  if (fs::exists(p, ec)) {
    STRATA_CHECK(!fs::is_directory(p, ec), Errc::invalid_argument, flag, " '", path,
                 "' is a directory: give a file name inside it");
    STRATA_CHECK(::access(path.c_str(), W_OK) == 0, Errc::io, flag, " '", path, "' cannot be written (",
                 errno_text(errno), "): fix its permissions or choose another file");
    return;
  }
  const fs::path parent = p.parent_path().empty() ? fs::path(".") : p.parent_path();
  STRATA_CHECK(fs::is_directory(parent, ec), Errc::invalid_argument, flag, " '", path, "': the directory '",
               parent.string(), "' does not exist: create it first or choose another path");
  STRATA_CHECK(::access(parent.c_str(), W_OK | X_OK) == 0, Errc::io, flag, " '", path, "': the directory '",
               parent.string(), "' is not writable (", errno_text(errno), ")");
}

void check_output_dir(const char* flag, const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  STRATA_CHECK(!path.empty(), Errc::invalid_argument, flag, " is empty: give a directory");
  fs::create_directories(path, ec);
  STRATA_CHECK(!ec && fs::is_directory(path), Errc::io, flag, " '", path, "' cannot be created as a directory",
               ec ? " (" + ec.message() + ")" : std::string(), ": choose a writable directory");
  STRATA_CHECK(::access(path.c_str(), W_OK | X_OK) == 0, Errc::io, flag, " '", path, "' is not writable (",
               errno_text(errno), ")");
}

}  // namespace strata::train
