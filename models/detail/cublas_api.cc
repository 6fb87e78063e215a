// cuBLAS and cuBLASLt opened on first use (the protocol in cublas_api.h).
#include "models/detail/cublas_api.h"

#include <dlfcn.h>

#include <string>

#include "runtime/core/error.h"

namespace strata::model::detail {
namespace {

void* open_library(const std::string& name) {
  void* h = ::dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    const char* why = ::dlerror();
    throw Error(Errc::cuda, str_cat("cannot load ", name, " (the cuBLAS of the CUDA toolkit Strata was built with, ",
                                    CUBLAS_VER_MAJOR, ".", CUBLAS_VER_MINOR, "): ", why != nullptr ? why : "",
                                    "; put the toolkit's library directory on LD_LIBRARY_PATH"));
  }
  return h;
}

template <class F> void resolve(F& slot, void* library, const char* symbol, const std::string& name) {
  ::dlerror();
  void* p = ::dlsym(library, symbol);
  STRATA_CHECK(p != nullptr, Errc::cuda, "cannot find ", symbol, " in ", name,
               ": the library is not the cuBLAS Strata was built with (", CUBLAS_VER_MAJOR, ".", CUBLAS_VER_MINOR, ")");
  slot = reinterpret_cast<F>(p);
}

CublasApi load() {
  const std::string blas = str_cat("libcublas.so.", CUBLAS_VER_MAJOR),
                    lt = str_cat("libcublasLt.so.", CUBLAS_VER_MAJOR);
  void* b = open_library(blas);
  void* l = open_library(lt);
  CublasApi a;
  resolve(a.create, b, "cublasCreate_v2", blas);
  resolve(a.destroy, b, "cublasDestroy_v2", blas);
  resolve(a.set_stream, b, "cublasSetStream_v2", blas);
  resolve(a.set_math_mode, b, "cublasSetMathMode", blas);
  resolve(a.status_string, b, "cublasGetStatusString", blas);
  resolve(a.sgemm, b, "cublasSgemm_v2", blas);
  resolve(a.gemm_ex, b, "cublasGemmEx", blas);
  resolve(a.gemm_strided_batched_ex, b, "cublasGemmStridedBatchedEx", blas);
  resolve(a.lt_create, l, "cublasLtCreate", lt);
  resolve(a.lt_destroy, l, "cublasLtDestroy", lt);
  resolve(a.lt_desc_create, l, "cublasLtMatmulDescCreate", lt);
  resolve(a.lt_desc_destroy, l, "cublasLtMatmulDescDestroy", lt);
  resolve(a.lt_desc_set, l, "cublasLtMatmulDescSetAttribute", lt);
  resolve(a.lt_layout_create, l, "cublasLtMatrixLayoutCreate", lt);
  resolve(a.lt_layout_destroy, l, "cublasLtMatrixLayoutDestroy", lt);
  resolve(a.lt_pref_create, l, "cublasLtMatmulPreferenceCreate", lt);
  resolve(a.lt_pref_destroy, l, "cublasLtMatmulPreferenceDestroy", lt);
  resolve(a.lt_pref_set, l, "cublasLtMatmulPreferenceSetAttribute", lt);
  resolve(a.lt_heuristic, l, "cublasLtMatmulAlgoGetHeuristic", lt);
  resolve(a.lt_matmul, l, "cublasLtMatmul", lt);
  return a;  // the libraries stay loaded for the life of the process
}

}  // namespace

const CublasApi& cublas() {
  static const CublasApi api = load();  // once; a load that threw is tried again by the next call
  return api;
}

}  // namespace strata::model::detail
