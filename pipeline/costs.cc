// Costs::check (see costs.h).
#include "pipeline/costs.h"

#include <cmath>

#include "runtime/core/error.h"

namespace strata::pipeline {
namespace {

void check_list(const std::vector<double>& v, int stages, const char* what) {
  STRATA_CHECK(v.size() == 1 || v.size() == static_cast<std::size_t>(stages), Errc::invalid_argument, what,
               " times: ", v.size(), " values given for ", stages, " stages; give one value or one per stage");
  for (std::size_t i = 0; i < v.size(); ++i) {
    STRATA_CHECK(std::isfinite(v[i]) && v[i] >= 0, Errc::invalid_argument, what, " time ", v[i],
                 (v.size() > 1 ? str_cat(" of stage ", i) : std::string()), " must be a finite number >= 0");
  }
}

}  // namespace

void Costs::check(int stages) const {
  check_list(forward, stages, "forward (F)");
  check_list(backward_input, stages, "backward-input (B)");
  check_list(backward_weight, stages, "backward-weight (W)");
  STRATA_CHECK(std::isfinite(comm) && comm >= 0, Errc::invalid_argument, "communication time ", comm,
               " must be a finite number >= 0");
  STRATA_CHECK(std::isfinite(optimizer) && optimizer >= 0, Errc::invalid_argument, "optimizer time ", optimizer,
               " must be a finite number >= 0");
  for (int s = 0; s < stages; ++s) {
    STRATA_CHECK(f(s) + b(s) + w(s) > 0, Errc::invalid_argument, "stage ", s,
                 " has F + B + W = 0: at least one of its times must be positive");
  }
}

}  // namespace strata::pipeline
