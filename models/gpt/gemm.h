// The one place the GPT's host compute calls a BLAS (oneDNN: scripts/bench_blas.sh measured
// it against OpenBLAS and BLIS on the GPT's products). Row-major single-precision products
// C = alpha op(A) op(B) + beta C, where op transposes when asked. gemm() runs as TBB tasks on
// the threads TBB allows (tbb::global_control); gemm_serial() runs on the calling thread
// only, for callers that are already one task of many (attention's per-head products).
// Both give the same bits for any thread count.
#pragma once

namespace strata::model::ops {

void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
          int ldb, float beta, float* C, int ldc);
void gemm_serial(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
                 const float* B, int ldb, float beta, float* C, int ldc);

// The library behind gemm(), for reports.
const char* blas_name();

}  // namespace strata::model::ops
