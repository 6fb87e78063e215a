// The CUDA backend's HostSignal (device.h): a mapped pinned word the host writes and a
// stream waits on with cuStreamWaitValue32. Private to runtime/device; CUDA builds only.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "runtime/device/device.h"

namespace strata::device::detail {

std::unique_ptr<HostSignal> create_cuda_host_signal(int ordinal);
// Work submitted to `stream` after this waits until `signal` reaches `value`.
void cuda_wait_signal(cudaStream_t stream, HostSignal& signal, std::uint32_t value);

}  // namespace strata::device::detail
