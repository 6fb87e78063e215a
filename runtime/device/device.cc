// Backend selection, names, and the RAII buffer owners.
#include "runtime/device/device.h"

#include "runtime/core/error.h"
#include "runtime/core/log.h"

namespace strata::device {

std::unique_ptr<Device> create_host_device(const DeviceOptions& options);
std::unique_ptr<Device> create_cuda_device(const DeviceOptions& options);  // or its stub

const char* backend_name(Backend b) noexcept { return b == Backend::host ? "host" : "cuda"; }

Backend parse_backend(std::string_view text) {
  if (text == "host") return Backend::host;
  if (text == "cuda") return Backend::cuda;
  STRATA_THROW(Errc::invalid_argument, "device backend '", text, "' is not known: use host or cuda");
}

std::unique_ptr<Device> Device::create(const DeviceOptions& options) {
  return options.backend == Backend::host ? create_host_device(options) : create_cuda_device(options);
}

template <MemoryKind K> void Allocation<K>::reset() noexcept {
  if (ptr_ != nullptr) {
    try {
      if constexpr (K == MemoryKind::device) {
        dev_->free(ptr_);
      } else {
        dev_->free_pinned(ptr_);
      }
    } catch (const std::exception& e) {
      STRATA_LOG(error, K == MemoryKind::device ? "device" : "pinned host", " memory release failed (", bytes_,
                 " bytes): ", e.what());
    }
  }
  ptr_ = nullptr;
  bytes_ = 0;
}

template class Allocation<MemoryKind::device>;
template class Allocation<MemoryKind::pinned>;

}  // namespace strata::device

namespace strata::device {
Backend default_backend() { return cuda_inventory().devices.empty() ? Backend::host : Backend::cuda; }
}  // namespace strata::device
