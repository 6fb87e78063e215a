// The message of the exception `fn` throws ("" when it returns), for negative tests that
// check what an error names.
#pragma once

#include <exception>
#include <functional>
#include <string>

namespace strata::test {

inline std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace strata::test
