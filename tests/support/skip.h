// Hardware requirements of tagged tests: missing_hardware("cuda") is empty when a GPU is
// usable, else the reason ("no GPU (cudaGetDeviceCount: ...)"). Known tags: cuda, uring,
// mount (this process may mount tmpfs/ramfs in a private mount namespace: root with
// CAP_SYS_ADMIN, or unprivileged user namespaces).
#pragma once

#include <string>
#include <string_view>

namespace strata::test {

std::string missing_hardware(std::string_view tag);
inline constexpr const char* kHardwareTags[] = {"cuda", "uring", "mount", "pku"};

}  // namespace strata::test
