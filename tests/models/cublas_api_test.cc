// cuBLAS opened on first use (models/detail/cublas_api.h): every function the GPU products
// call resolves from the toolkit's libraries, which runs without a GPU (nothing is called);
// the executable does not link them (ldd), and the first use maps them.
#include <unistd.h>

#include <catch2/catch.hpp>

#include <cstdio>
#include <fstream>
#include <string>

#if defined(STRATA_HAVE_CUDA) && STRATA_HAVE_CUDA
#include "models/detail/cublas_api.h"

namespace {

bool mapped(const std::string& library) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line))
    if (line.find(library) != std::string::npos) return true;
  return false;
}

// What `ldd` lists for this test executable, which links strata_models as `strata` does.
std::string needed_libraries() {
  std::string out;
  const std::string cmd = "ldd /proc/" + std::to_string(::getpid()) + "/exe 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return out;
  char buf[512];
  while (std::fgets(buf, sizeof buf, p) != nullptr) out += buf;
  ::pclose(p);
  return out;
}

}  // namespace
#endif

TEST_CASE("cuBLAS is loaded on first use and resolves every function the GPU products call", "[models][cublas]") {
#if defined(STRATA_HAVE_CUDA) && STRATA_HAVE_CUDA
  const std::string needed = needed_libraries();
  INFO(needed);
  REQUIRE(needed.find("libtbb") != std::string::npos);   // ldd ran and listed the libraries
  CHECK(needed.find("libcublas") == std::string::npos);  // linked, they cost every process 0.17 s and 210 MiB
  const auto& api = strata::model::detail::cublas();
  CHECK(api.create != nullptr);
  CHECK(api.destroy != nullptr);
  CHECK(api.set_stream != nullptr);
  CHECK(api.set_math_mode != nullptr);
  CHECK(api.status_string != nullptr);
  CHECK(api.sgemm != nullptr);
  CHECK(api.gemm_ex != nullptr);
  CHECK(api.gemm_strided_batched_ex != nullptr);
  CHECK(api.lt_create != nullptr);
  CHECK(api.lt_destroy != nullptr);
  CHECK(api.lt_desc_create != nullptr);
  CHECK(api.lt_desc_destroy != nullptr);
  CHECK(api.lt_desc_set != nullptr);
  CHECK(api.lt_layout_create != nullptr);
  CHECK(api.lt_layout_destroy != nullptr);
  CHECK(api.lt_pref_create != nullptr);
  CHECK(api.lt_pref_destroy != nullptr);
  CHECK(api.lt_pref_set != nullptr);
  CHECK(api.lt_heuristic != nullptr);
  CHECK(api.lt_matmul != nullptr);
  CHECK(mapped("libcublasLt.so"));
  CHECK(std::string(api.status_string(CUBLAS_STATUS_NOT_INITIALIZED)).find("not initialized") != std::string::npos);
  CHECK(&strata::model::detail::cublas() == &api);  // opened once
#else
  SUCCEED("built without CUDA: no cuBLAS");
#endif
}
