// Linked instead of cuda_device.cc when Strata is built without CUDA, so call sites need no
// #ifdef: creating a CUDA device says why it cannot.
#include "runtime/core/error.h"
#include "runtime/device/device.h"

namespace strata::device {

std::unique_ptr<Device> create_cuda_device(const DeviceOptions&) {
  STRATA_THROW(Errc::unsupported,
               "cuda backend: unsupported: built without CUDA (reconfigure with -DSTRATA_WITH_CUDA=ON "
               "on a machine with the CUDA toolkit, or use --device host)");
}

CudaInventory cuda_inventory() {
  CudaInventory inv;
  inv.why = "built without CUDA";
  return inv;
}

}  // namespace strata::device
