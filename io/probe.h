// Run-time probe of the kernel's io_uring support: can a ring be set up here (seccomp,
// io_uring_disabled sysctl and containers can refuse it), and which opcodes does it offer.
// io/ keeps the kernel's -errno convention; this probe reports text for `strata info`.
#pragma once

#include <string>
#include <vector>

namespace strata::io {

struct UringProbe {
  bool available = false;
  std::string why;                   // when not available: the setup error
  std::vector<std::string> opcodes;  // supported opcodes Strata uses (READ, WRITE, ...)
  std::string kernel;                // uname -r
};

UringProbe probe_uring();

}  // namespace strata::io
