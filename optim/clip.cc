// Global-norm clipping coefficient (see clip.h).
#include "optim/clip.h"

#include <cmath>

namespace strata::optim {

double clip_coefficient(double total_norm, double max_norm) noexcept {
  if (!(max_norm > 0) || !std::isfinite(total_norm) || total_norm <= max_norm) return 1.0;
  return max_norm / (total_norm + 1e-6);
}

}  // namespace strata::optim
