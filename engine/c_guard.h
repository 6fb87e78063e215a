// The C API's error boundary (strata.h): guarded(f) runs f and turns a strata::Error into its
// status code and any exception into STRATA_ERR_INTERNAL, keeping the message for
// strata_last_error() (thread-local), so nothing throws across the C boundary. Shared by
// every translation unit of libstrata_c (engine/c_api.cc, models/hf/c_writer.cc).
#pragma once

#include <exception>

#include "engine/strata.h"
#include "runtime/core/error.h"

namespace strata::capi {

void set_last_error(const char* message);  // what strata_last_error() returns next
strata_status status_of(Errc code) noexcept;

template <class F> strata_status guarded(F&& f) noexcept {
  try {
    f();
    return STRATA_OK;
  } catch (const Error& e) {
    set_last_error(e.what());
    return status_of(e.code());
  } catch (const std::exception& e) {
    set_last_error(e.what());
    return STRATA_ERR_INTERNAL;
  } catch (...) {
    set_last_error("unknown error");
    return STRATA_ERR_INTERNAL;
  }
}

}  // namespace strata::capi
