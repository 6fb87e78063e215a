// The engine configuration the stage-3 parameter offload tests share
// (engine_param_test.cc, engine_param_fault_test.cc): a 3-layer MLP at stage 3 in bf16 whose
// every layer is gathered and released, sub-groups cutting across buckets and 400 B swap
// chunks that layers span, with optimizer state and parameter shards placed by place().
#pragma once

#include <string>

#include "runtime/core/dtype.h"
#include "tests/engine/engine_support.h"

namespace strata::test {

inline engine::EngineConfig stage3_config(int world) {
  auto c = mlp_config(3, world, DType::bf16);
  c.zero.stage3_param_persistence_threshold = 0;  // every layer is gathered and released
  c.zero.sub_group_size = 100;                    // sub-groups cut across buckets
  c.offload_param.max_in_cpu = 0;
  c.offload_param.buffer_size = 200;  // 400 B chunks: layers span several
  return c;
}

inline void place(engine::EngineConfig& c, engine::OffloadDevice opt, engine::OffloadDevice par,
                  const std::string& dir) {
  c.offload_optimizer.device = opt;
  c.offload_param.device = par;
  c.offload_optimizer.nvme_path = dir;
  c.offload_param.nvme_path = dir;
}

}  // namespace strata::test
