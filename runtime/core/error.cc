// Error formatting: errno names and the throw funnel.
#include "runtime/core/error.h"

#include <cstdio>

#include <cstring>

namespace strata {

const char* errc_name(Errc code) noexcept {
  switch (code) {
    case Errc::invalid_argument:
      return "invalid argument";
    case Errc::out_of_budget:
      return "out of budget";
    case Errc::io:
      return "I/O error";
    case Errc::corrupt:
      return "corrupt data";
    case Errc::unsupported:
      return "unsupported";
    case Errc::timeout:
      return "timeout";
    case Errc::comm:
      return "communication error";
    case Errc::cuda:
      return "CUDA error";
    case Errc::internal:
      return "internal error";
  }
  return "error";
}

std::string printable(std::string_view text, std::size_t max_shown) {
  std::string out;
  for (std::size_t i = 0; i < text.size() && i < max_shown; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x20 || c == 0x7f) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  if (text.size() > max_shown) out += str_cat("... (", text.size(), " bytes)");
  return out;
}

std::string errno_text(int err) {
  const char* name = strerrorname_np(err);
  const char* desc = strerrordesc_np(err);
  if (name == nullptr) return str_cat("errno ", err);
  return str_cat(name, " (", desc ? desc : "?", ")");
}

namespace detail {
void throw_error(Errc code, std::string message, const char* file, int line, int sys_errno) {
  const char* base = std::strrchr(file, '/');
  // Keep the last two path parts: "device/host_device.cc:123".
  if (base != nullptr && base != file) {
    const char* p = base - 1;
    while (p > file && *p != '/') --p;
    base = (*p == '/') ? p + 1 : p;
  } else {
    base = file;
  }
  throw Error(code, std::move(message), str_cat(base, ":", line), sys_errno);
}
}  // namespace detail

}  // namespace strata
