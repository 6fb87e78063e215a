// Status and Result<T> for io/: the kernel's convention (0 or a negative errno) plus the
// message that names the operation, path, offset, length and errno text. io/ never throws;
// the layer above converts a failed Status to its own error type at the boundary.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

namespace strata::io {

// Returned by value; err is 0 on success or -errno (EBADMSG: corrupt or foreign data).
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(int err, std::string message) : err_(err), message_(std::move(message)) {}
  bool ok() const noexcept { return err_ == 0; }
  explicit operator bool() const noexcept { return ok(); }
  int err() const noexcept { return err_; }
  const std::string& message() const noexcept { return message_; }

 private:
  int err_ = 0;
  std::string message_;
};

// A value or the Status saying why there is none.
template <class T> class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}          // NOLINT: implicit, like std::expected
  Result(Status status) : status_(std::move(status)) {}  // NOLINT
  bool ok() const noexcept { return value_.has_value(); }
  explicit operator bool() const noexcept { return ok(); }
  const Status& status() const noexcept { return status_; }
  T& value() & { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  T& operator*() & { return *value_; }

 private:
  std::optional<T> value_;
  Status status_;
};

// "ENOSPC (No space left on device)"; "errno N" for values without a name. Takes either sign.
std::string errno_text(int err);

// The standard failure message: "<op> '<path>' at offset O, length L: ENOSPC (...)".
std::string describe_failure(const char* op, const std::string& path, std::uint64_t offset, std::uint64_t length,
                             int err);

// What to do next for the errors users cause ("free space on the device ..."); "" if none.
std::string errno_hint(int err);

}  // namespace strata::io
