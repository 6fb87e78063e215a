// Argument checks shared by the generators (private to pipeline/).
#pragma once

#include "runtime/core/error.h"

namespace strata::pipeline::detail {

// p, m, v >= 1; with needs_m_ge_p, m >= p (the schedule's steady phase needs a full pipe).
inline void check_shape(const char* kind, int p, int m, int v, bool needs_m_ge_p) {
  STRATA_CHECK(p >= 1, Errc::invalid_argument, kind, ": stages p=", p, " must be at least 1");
  STRATA_CHECK(m >= 1, Errc::invalid_argument, kind, ": micro-batches m=", m, " must be at least 1");
  STRATA_CHECK(v >= 1, Errc::invalid_argument, kind, ": chunks v=", v, " must be at least 1");
  STRATA_CHECK(p <= 4096 && m <= (1 << 20) && v <= 64, Errc::invalid_argument, kind, ": p=", p, " m=", m, " v=", v,
               " is beyond what Strata schedules (4096 stages, 2^20 micro-batches, 64 chunks)");
  STRATA_CHECK(!needs_m_ge_p || m >= p, Errc::invalid_argument, kind, ": micro-batches m=", m, " is below stages p=", p,
               "; this schedule needs m >= p (use gpipe or 1f1b for m < p)");
}

}  // namespace strata::pipeline::detail
