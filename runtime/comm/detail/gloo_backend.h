// Backend factories behind Communicator::create. Private to comm.
#pragma once

#include <memory>

#include "runtime/comm/communicator.h"

namespace strata::comm::detail {
std::unique_ptr<Communicator> create_gloo(const CommOptions& options);
std::unique_ptr<Communicator> create_nccl(const CommOptions& options);  // or its stub
}  // namespace strata::comm::detail
