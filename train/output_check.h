// Outputs are checked before the work they record starts: a run must not train for hours
// and then find that its log, trace, parameters or checkpoints cannot be written. The checks
// create nothing that the run would not create anyway (a missing checkpoint directory is
// created; files are not).
#pragma once

#include <string>

namespace strata::train {

// `path` can be written as a file: an existing regular file we may write, or a new name in
// an existing writable directory. Throws naming `flag` and the path.
void check_output_file(const char* flag, const std::string& path);
// `path` is (or is created as) a writable directory.
void check_output_dir(const char* flag, const std::string& path);

}  // namespace strata::train
