// gemm() (see gemm.h) splits the product into row or column panels whose size depends only on
// the shape, and runs one single-threaded oneDNN SGEMM per panel as a TBB task: every
// element's sum runs over the whole K in the library's fixed order, so results are the same
// bits for any thread count, and the GPT's compute has one thread pool (TBB) rather than an
// OpenMP pool spinning beside it.
#include "models/gpt/gemm.h"

#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <tbb/parallel_for.h>

#include <algorithm>

#include "engine/core/error.h"

namespace strata::model::ops {
namespace {

constexpr int kMinPanel = 64;   // rows or columns per task, at least
constexpr int kMaxPanels = 16;  // tasks per product, at most

void serial(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B, int ldb,
            float beta, float* C, int ldc) {
  if (omp_get_max_threads() != 1) omp_set_num_threads(1);  // this thread's OpenMP setting only
  const dnnl_status_t st = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  STRATA_CHECK(st == dnnl_success, Errc::internal, "oneDNN sgemm ", M, "x", N, "x", K, " failed with status ",
               static_cast<int>(st));
}

}  // namespace

const char* blas_name() { return "oneDNN"; }

void gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B, int ldb,
          float beta, float* C, int ldc) {
  const bool rows = M >= N;
  const int extent = rows ? M : N;
  const int panel = std::max(kMinPanel, (extent + kMaxPanels - 1) / kMaxPanels);
  const int panels = (extent + panel - 1) / panel;
  tbb::parallel_for(0, panels, [&](int p) {
    const int i = p * panel, len = std::min(panel, extent - i);
    const auto off = [](int at, int ld, bool along_rows) { return static_cast<std::size_t>(at) * (along_rows ? ld : 1); };
    if (rows) {  // C rows i..: op(A) rows i..
      serial(ta, tb, len, N, K, alpha, A + off(i, lda, !ta), lda, B, ldb, beta, C + off(i, ldc, true), ldc);
    } else {  // C columns i..: op(B) columns i..
      serial(ta, tb, M, len, K, alpha, A, lda, B + off(i, ldb, tb), ldb, beta, C + i, ldc);
    }
  }, tbb::simple_partitioner());
}

void gemm_serial(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
                 int ldb, float beta, float* C, int ldc) {
  serial(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace strata::model::ops
