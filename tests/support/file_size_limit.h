// A full device on demand: lowers RLIMIT_FSIZE for the process (writes past the limit fail
// with EFBIG, like ENOSPC for the code under test) and ignores SIGXFSZ while alive.
#pragma once

#include <signal.h>
#include <sys/resource.h>

#include <catch2/catch.hpp>

namespace strata::test {

class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    REQUIRE(getrlimit(RLIMIT_FSIZE, &old_) == 0);
    old_handler_ = signal(SIGXFSZ, SIG_IGN);
    rlimit lim = old_;
    lim.rlim_cur = bytes;
    REQUIRE(setrlimit(RLIMIT_FSIZE, &lim) == 0);
  }
  ~FileSizeLimit() {
    setrlimit(RLIMIT_FSIZE, &old_);
    signal(SIGXFSZ, old_handler_);
  }
  FileSizeLimit(const FileSizeLimit&) = delete;
  FileSizeLimit& operator=(const FileSizeLimit&) = delete;

 private:
  rlimit old_{};
  sighandler_t old_handler_ = SIG_DFL;
};

}  // namespace strata::test
