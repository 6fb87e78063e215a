// Causal attention for one head of one sequence on the host, tiled in the flash manner (the
// GPT's and the Llama's host attention are both made of it): query tiles of kFlashTile rows
// walk the key tiles at or before them (the tiles above the diagonal are never computed) with
// an online softmax, a running maximum and sum per row, so no T x T buffer exists; forward
// keeps each row's log-sum-exp and a copy of the output for backward, which recomputes each
// tile's probabilities from the log-sum-exp and subtracts D = rowsum(dY o Y). Products are
// single-threaded fp32 SGEMMs on tiles (gemm_serial) and the exponentials xsimd batches: a
// call is one task's serial work, so its bits do not depend on the thread count.
#pragma once

namespace strata::model::ops {

inline constexpr int kFlashTile = 64;

// One head: q, k and v rows (T of them, hd wide) at row strides ldq and ldkv; the scores are
// scale q.k.
struct AttentionHead {
  const float *q, *k, *v;
  int T, hd, ldq, ldkv;
  float scale;
};

// y (rows at stride ldy) = the head's output; lse[T] = each row's log-sum-exp of its scores;
// y_copy (same layout as y) = a copy of y, for backward.
void flash_forward(const AttentionHead& x, float* y, int ldy, float* lse, float* y_copy);
// From dy and forward's y (rows at stride ldy) and lse: dq written (stride ldq); dk and dv
// (stride ldkv) written, or added to with accumulate_kv (grouped-query heads sharing them).
void flash_backward(const AttentionHead& x, const float* dy, const float* y, int ldy, const float* lse, float* dq,
                    float* dk, float* dv, bool accumulate_kv);

}  // namespace strata::model::ops
