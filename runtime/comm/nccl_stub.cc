// Built without NCCL: asking for the NCCL backend says why it cannot.
#include "runtime/comm/detail/gloo_backend.h"
#include "runtime/core/error.h"

namespace strata::comm::detail {

std::unique_ptr<Communicator> create_nccl(const CommOptions&) {
  STRATA_THROW(Errc::unsupported,
               "NCCL backend: unsupported: built without NCCL (needs the CUDA toolkit and "
               "libnccl; CPU ranks use the gloo backend)");
}

}  // namespace strata::comm::detail
