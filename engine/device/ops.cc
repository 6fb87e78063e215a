// Backend dispatch for device-side operations (see ops.h).
#include "engine/device/ops.h"

namespace strata::device {

void convert_async(Stream& stream, const void* src, DType from, void* dst, DType to, std::size_t count,
                   ConvertOptions options) {
  if (stream.backend() == Backend::cuda) {
    detail::cuda_convert_async(stream.native_handle(), src, from, dst, to, count, options.saturate_fp8);
    return;
  }
  stream.launch_host([=] { convert(src, from, dst, to, count, options); });
}

}  // namespace strata::device
