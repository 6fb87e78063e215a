// Newton-Schulz orthogonalization for Muon (muon.h): the matrix U = A S B^T (its SVD) is
// replaced by about A B^T, every singular value moved towards 1 by a quintic iteration,
// without an SVD. With X = U / max(||U||_F, eps) (transposed first when it has more rows than
// columns, so that the Gram matrix is the smaller one), each of `steps` iterations is
//   G = X X^T;  H = b G + c G G;  X = a X + H X
// with (a, b, c) = (3.4445, -4.7750, 2.0315), the coefficients of Muon's reference and of
// torch.optim.Muon. These coefficients trade exactness for speed: the singular values end
// between about 0.7 and 1.2, not at 1 (what Muon needs, not an orthogonal matrix).
//
// Arithmetic: fp32 throughout (the references run bf16 products on a GPU); the Frobenius norm
// in double in element order. Every element of every product is one chain of fused
// multiply-adds over k in ascending order, whatever the thread count or the blocking, so the
// result's bits do not depend on the threads (TBB's arena); a build without FMA (portable
// SSE2) rounds each multiply-add twice and gets other bits.
#pragma once

#include <cstddef>
#include <vector>

namespace strata::optim {

struct NewtonSchulz {
  int steps = 5;
  float eps = 1e-7f;
  float a = 3.4445f, b = -4.7750f, c = 2.0315f;
};

// Overwrites u (rows x cols, row-major) with its orthogonalized form. `scratch` (the r x c
// working copy, r = min(rows, cols)) is resized as needed and may be kept between calls.
void newton_schulz(float* u, int rows, int cols, const NewtonSchulz& ns, std::vector<float>& scratch);

// One iteration on x, an r x c matrix with r <= c, already normalized (newton_schulz is the
// normalization, then `steps` of these). Exposed for the tests, which bound each iteration.
void newton_schulz_iteration(float* x, int r, int c, const NewtonSchulz& ns, std::vector<float>& scratch);

// C[M, N] = A[M, K] B[K, N] (row-major, leading dimensions lda, ldb, ldc), each element one
// fused multiply-add chain over k ascending: the bits of any element are independent of M, N,
// the thread count and the ISA's vector width (given FMA). Exposed for the tests.
void deterministic_matmul(int M, int N, int K, const float* A, int lda, const float* B, int ldb, float* C, int ldc);

// Floating-point operations one orthogonalization of a rows x cols matrix takes, counting a
// multiply-add as two (for benchmarks).
double newton_schulz_flops(int rows, int cols, int steps) noexcept;

}  // namespace strata::optim
