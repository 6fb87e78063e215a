// cuBLAS and cuBLASLt, loaded when a GPU product first needs them rather than linked: loading
// libcublasLt relocates some 200 MiB of its data, which every `strata` process (a CPU run, a
// `checkpoint verify`, `--help`) paid at start-up, about 0.17 s and 210 MiB of resident
// memory, when it was linked. cublas() opens libcublas.so.<major> of the toolkit the build
// used (with libcublasLt beside it) once, resolves the functions the GPU products call and
// returns them; a library or symbol that is missing is an error naming it (Errc::cuda), and
// the next call tries again. Thread-safe.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>

namespace strata::model::detail {

// The C entry points (cublas_api.h also declares C++ overloads of the two Ex products).
using GemmEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                                  const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                                  cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
using GemmStridedBatchedEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                                                const void*, const void*, cudaDataType, int, long long, const void*,
                                                cudaDataType, int, long long, const void*, void*, cudaDataType, int,
                                                long long, int, cublasComputeType_t, cublasGemmAlgo_t);

struct CublasApi {
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasDestroy_v2) destroy = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  decltype(&cublasSetMathMode) set_math_mode = nullptr;
  decltype(&cublasGetStatusString) status_string = nullptr;
  decltype(&cublasSgemm_v2) sgemm = nullptr;
  GemmEx gemm_ex = nullptr;
  GemmStridedBatchedEx gemm_strided_batched_ex = nullptr;
  decltype(&cublasLtCreate) lt_create = nullptr;
  decltype(&cublasLtDestroy) lt_destroy = nullptr;
  decltype(&cublasLtMatmulDescCreate) lt_desc_create = nullptr;
  decltype(&cublasLtMatmulDescDestroy) lt_desc_destroy = nullptr;
  decltype(&cublasLtMatmulDescSetAttribute) lt_desc_set = nullptr;
  decltype(&cublasLtMatrixLayoutCreate) lt_layout_create = nullptr;
  decltype(&cublasLtMatrixLayoutDestroy) lt_layout_destroy = nullptr;
  decltype(&cublasLtMatmulPreferenceCreate) lt_pref_create = nullptr;
  decltype(&cublasLtMatmulPreferenceDestroy) lt_pref_destroy = nullptr;
  decltype(&cublasLtMatmulPreferenceSetAttribute) lt_pref_set = nullptr;
  decltype(&cublasLtMatmulAlgoGetHeuristic) lt_heuristic = nullptr;
  decltype(&cublasLtMatmul) lt_matmul = nullptr;
};

const CublasApi& cublas();

}  // namespace strata::model::detail
