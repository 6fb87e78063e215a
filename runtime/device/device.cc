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

void DeviceBuffer::reset() noexcept {
  if (ptr_ != nullptr) {
    try {
      dev_->free(ptr_);
    } catch (const std::exception& e) {
      STRATA_LOG(error, "DeviceBuffer release failed: ", e.what());
    }
  }
  ptr_ = nullptr;
  bytes_ = 0;
}

void PinnedBuffer::reset() noexcept {
  if (ptr_ != nullptr) {
    try {
      dev_->free_pinned(ptr_);
    } catch (const std::exception& e) {
      STRATA_LOG(error, "PinnedBuffer release failed: ", e.what());
    }
  }
  ptr_ = nullptr;
  bytes_ = 0;
}

}  // namespace strata::device

namespace strata::device {
Backend default_backend() { return cuda_inventory().devices.empty() ? Backend::host : Backend::cuda; }
}  // namespace strata::device
