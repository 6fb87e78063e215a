// strata::Error, the library's one error funnel (every layer throws this one
// type). Every failure names the operation, the thing (file, key, rank, tier, bytes) and
// what to do next; the throw site's file:line is kept in where() for bug reports.
// No exception may cross a CUDA host callback, an io completion thread or a TBB body:
// those catch and hand the error over (see StickyError in device/host_stream.cc).
#pragma once

#include <cerrno>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace strata {

enum class Errc {
  invalid_argument,  // bad config key/value, CLI argument, API misuse
  out_of_budget,     // a tier's byte budget would be exceeded
  io,                // a system call on a file or device failed
  corrupt,           // checksum mismatch, truncated or foreign file
  unsupported,       // feature not built in or not offered by this machine
  timeout,           // a peer or operation did not answer in time
  comm,              // a collective or rank failed
  cuda,              // the CUDA runtime reported an error
  internal,          // a broken invariant: a bug in Strata
};

const char* errc_name(Errc code) noexcept;

class Error : public std::runtime_error {
 public:
  Error(Errc code, const std::string& message, std::string where = {}, int sys_errno = 0)
      : std::runtime_error(message), code_(code), where_(std::move(where)), sys_errno_(sys_errno) {}
  Errc code() const noexcept { return code_; }
  const std::string& where() const noexcept { return where_; }
  int sys_errno() const noexcept { return sys_errno_; }

 private:
  Errc code_;
  std::string where_;
  int sys_errno_;
};

// Concatenates anything streamable: str_cat("tier ", name, " asked ", bytes, " B").
template <class... Args> std::string str_cat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

// "ENOSPC (No space left on device)" for errno values; "errno N" for unknown ones.
std::string errno_text(int err);

// Text from a file (a name, a key, a pattern), fit for a one-line message: control bytes
// become \xNN, and text longer than max_shown bytes is cut with its length said,
// so damaged input can neither break nor flood an error.
std::string printable(std::string_view text, std::size_t max_shown = 200);

namespace detail {
[[noreturn]] void throw_error(Errc code, std::string message, const char* file, int line, int sys_errno = 0);
}  // namespace detail

}  // namespace strata

#define STRATA_THROW(code, ...) \
  ::strata::detail::throw_error((code), ::strata::str_cat(__VA_ARGS__), __FILE__, __LINE__)

#define STRATA_CHECK(cond, code, ...)             \
  do {                                            \
    if (!(cond)) STRATA_THROW(code, __VA_ARGS__); \
  } while (0)

// Runs a system call that returns -1 and sets errno, retrying EINTR; throws Errc::io with
// the expression, the context message and errno's text. Evaluates to the call's result.
#define STRATA_SYS_CHECK(expr, ...)                                                                              \
  ([&]() {                                                                                                       \
    for (;;) {                                                                                                   \
      auto strata_rc_ = (expr);                                                                                  \
      if (strata_rc_ != -1) return strata_rc_;                                                                   \
      const int strata_err_ = errno;                                                                             \
      if (strata_err_ == EINTR) continue;                                                                        \
      ::strata::detail::throw_error(                                                                             \
          ::strata::Errc::io,                                                                                    \
          ::strata::str_cat(__VA_ARGS__, ": ", #expr, " failed: ", ::strata::errno_text(strata_err_)), __FILE__, \
          __LINE__, strata_err_);                                                                                \
    }                                                                                                            \
  }())
