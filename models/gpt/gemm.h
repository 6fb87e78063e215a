// The one place the GPT's host compute calls a BLAS (oneDNN: scripts/bench_blas.sh measured
// it against OpenBLAS and BLIS on the GPT's products). Row-major products
// C = alpha op(A) op(B) + beta C on fp32 buffers, where op transposes when asked.
//
// gemm() runs as TBB tasks on the threads TBB allows (tbb::global_control), split into panels
// whose size depends only on the shape, so the same inputs give the same bits for any thread
// count. With Products::bf16 it rounds A and B to bf16 (nearest even) and sums the products
// in fp32 (oneDNN's bf16 matmul, the CPU's bf16 dot-product instructions), as PyTorch's bf16
// autocast does for linear layers; bf16 takes beta 0 or 1, and falls back to fp32 where
// bf16_products_available() is false. With Products::fp16 it rounds A and B to fp16 (nearest
// even, below 2^-24 to zero, above 65504 to infinity) and multiplies the rounded values in
// fp32: a product of two fp16 values is exact in fp32, so this is what an fp16 tensor core
// with fp32 accumulation computes, up to the order of the sums. gemm_serial() runs fp32 on the
// calling thread only, for callers that are already one task of many (attention's per-head
// products).
#pragma once

#include <cstddef>
#include <cstdint>

#include "runtime/core/dtype.h"

namespace strata::model::ops {

enum class Products { fp32, bf16, fp16 };
// The products a compute dtype takes: its operands with fp32 sums, as PyTorch's autocast
// runs linear layers.
Products products_for(DType compute) noexcept;

void gemm(Products p, bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
          const float* B, int ldb, float beta, float* C, int ldc);
void gemm_serial(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
                 int ldb, float beta, float* C, int ldc);

// Bf16Shadow protocol. A bf16 copy of fp32 values that products read more than once (a
// weight in forward and in backward, an output gradient in both halves of its backward).
// While a shadow lives, gemm() with bf16 products on the thread that made it, reading an
// operand whose stored span lies inside [values, values + n), reads the bf16 codes at the
// same offset of the shadow instead of rounding the fp32 values again. The bits are the same
// as without it, provided the codes are the values rounded to bf16 (nearest even): a bf16
// tensor widened to fp32 is such a pair, and the rounding constructor makes one. Neither
// buffer may change while the shadow lives; a newer shadow of the same memory hides an older
// one. Shadows are per thread: a product on another thread rounds the fp32 values (which
// must then hold them), and a shadow ends on the thread that made it.
class Bf16Shadow {
 public:
  // codes[i] is values[i] rounded to bf16, for i < n.
  Bf16Shadow(const float* values, const std::uint16_t* codes, std::size_t n);
  // Rounds values into a buffer of this thread's (kept for later shadows, as large as the
  // largest it held) when p's products run in bf16 here; otherwise shadows nothing.
  Bf16Shadow(Products p, const float* values, std::size_t n);
  ~Bf16Shadow();
  Bf16Shadow(const Bf16Shadow&) = delete;
  Bf16Shadow& operator=(const Bf16Shadow&) = delete;

 private:
  void enter(const float* values, const std::uint16_t* codes, std::size_t n);
  bool active_ = false;
  void* buffer_ = nullptr;  // the thread's buffer the rounding constructor took
};

// The library at its best on C[M,N] = A[M,K] B[K,N] (row-major, no transposes): one oneDNN
// call over the whole product on oneDNN's own `threads` OpenMP threads, operands already in
// p's precision (no conversion timed; fp32 where bf16 products are unavailable). Returns the
// median seconds of `reps` calls after one warm-up: the yardstick `strata bench gpt` holds
// gemm() and the training pass to (gemm() splits a product into single-threaded panels so
// that its bits do not depend on the thread count).
double library_gemm_seconds(Products p, int M, int N, int K, int threads, int reps);

// The CPU has bf16 dot products (avx512_bf16 or AMX) and oneDNN uses them.
bool bf16_products_available();
// The library behind gemm(), for reports.
const char* blas_name();

}  // namespace strata::model::ops
