// What a rank trains on, alike for the CLI and the C API: the device backend it picks from
// "auto", "host" or "cuda", and the device communicator that ranks on GPUs add beside the
// host one (EngineOptions::device_comm).
#pragma once

#include <memory>
#include <string_view>

#include "runtime/comm/communicator.h"
#include "runtime/device/device.h"

namespace strata::engine {

// "auto" takes the GPUs only when there is one for every rank, so every rank chooses alike;
// other text is parsed (an unknown name is an error naming it).
device::Backend choose_backend(std::string_view name, int world_size);

// NCCL over the same rendezvous (its own run id) on GPU `ordinal`, for ranks on GPUs; null
// on the host device or for a single rank.
std::unique_ptr<comm::Communicator> create_device_comm(const comm::CommOptions& host, device::Backend backend,
                                                       int ordinal);

}  // namespace strata::engine
