// What one of offload/'s NVMe stores (the optimizer swapper, the parameter store) takes,
// computed before it is made: the planner and the engine's budget checks size a store from
// this without creating a file.
#pragma once

#include <cstdint>

namespace strata::offload {

struct SwapFootprint {
  std::uint64_t buffer_bytes = 0;  // per pinned host buffer
  int buffer_count = 0;            // buffers the store allocates
  std::uint64_t file_bytes = 0;    // every swap file (committed and spare), headers included
  std::uint64_t file_count = 0;    // swap files (one per chunk, and the spares), each open for the store's lifetime
  std::uint64_t host_bytes = 0;    // host memory the open swap files keep: tables, bookkeeping (not in the ledger)
};

}  // namespace strata::offload
