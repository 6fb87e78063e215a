// gemm() (see gemm.h) splits the product into row or column panels whose size depends only on
// the shape and runs one single-threaded oneDNN product per panel as a TBB task: every
// element's sum runs over the whole K in the library's fixed order, so results are the same
// bits for any thread count, and the GPT's compute has one thread pool (TBB) rather than an
// OpenMP pool spinning beside it. bf16 products convert A and B once (the whole strided span,
// so panels keep their offsets) and run a oneDNN matmul primitive per panel shape, created
// once per thread and kept (primitives are not shared across threads). An operand a live
// Bf16Shadow covers is read from the shadow's codes instead of being converted.
#include "models/gpt/gemm.h"

#include <omp.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>
#include <utility>
#include <vector>

#include "runtime/core/dtype.h"
#include "runtime/core/error.h"

namespace strata::model::ops {

Products products_for(DType compute) noexcept {
  return compute == DType::bf16 ? Products::bf16 : compute == DType::fp16 ? Products::fp16 : Products::fp32;
}
namespace {

constexpr int kMinPanel = 64;                                // rows or columns per task, at least
constexpr int kMaxPanels = 16;                               // tasks per product, at most
constexpr std::size_t kConvertBlock = std::size_t{1} << 14;  // elements per task of an operand's conversion

void one_thread() {
  if (omp_get_max_threads() != 1) omp_set_num_threads(1);  // this thread's OpenMP setting only
}

void sgemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B, int ldb,
           float beta, float* C, int ldc) {
  one_thread();
  const dnnl_status_t st = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  STRATA_CHECK(st == dnnl_success, Errc::internal, "oneDNN sgemm ", M, "x", N, "x", K, " failed with status ",
               static_cast<int>(st));
}

dnnl::engine& cpu_engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

// A row-major operand op(X) of rows x cols stored with leading dimension ld (transposed: X
// holds cols x rows).
dnnl::memory::desc operand(int rows, int cols, int ld, bool trans, dnnl::memory::data_type dt) {
  return dnnl::memory::desc({rows, cols}, dt, trans ? dnnl::memory::dims{1, ld} : dnnl::memory::dims{ld, 1});
}

// One bf16 product on the calling thread: A and B already bf16, C fp32. The primitive and its
// memory objects are made once per shape and thread; each call only swaps the pointers.
void bf16_panel(bool ta, bool tb, int M, int N, int K, float alpha, const std::uint16_t* A, int lda,
                const std::uint16_t* B, int ldb, bool accumulate, float* C, int ldc) {
  struct Prepared {
    dnnl::matmul prim;
    dnnl::memory a, b, c;
  };
  using Key = std::tuple<int, int, int, bool, bool, int, int, int, bool, float>;
  thread_local std::map<Key, Prepared> prepared;
  thread_local dnnl::stream stream(cpu_engine());
  one_thread();
  const Key key{M, N, K, ta, tb, lda, ldb, ldc, accumulate, alpha};
  auto it = prepared.find(key);
  if (it == prepared.end()) {
    using dt = dnnl::memory::data_type;
    const auto ad = operand(M, K, lda, ta, dt::bf16), bd = operand(K, N, ldb, tb, dt::bf16),
               cd = operand(M, N, ldc, false, dt::f32);
    dnnl::primitive_attr attr;
    if (alpha != 1.0f) attr.set_output_scales(0, {alpha});  // C = alpha A B (+ C): the scale comes before the sum
    if (accumulate) {
      dnnl::post_ops ops;
      ops.append_sum(1.0f);
      attr.set_post_ops(ops);
    }
    dnnl::matmul prim(dnnl::matmul::primitive_desc(dnnl::matmul::desc(ad, bd, cd), attr, cpu_engine()));
    it = prepared
             .emplace(key, Prepared{prim, dnnl::memory(ad, cpu_engine(), DNNL_MEMORY_NONE),
                                    dnnl::memory(bd, cpu_engine(), DNNL_MEMORY_NONE),
                                    dnnl::memory(cd, cpu_engine(), DNNL_MEMORY_NONE)})
             .first;
  }
  Prepared& p = it->second;
  p.a.set_data_handle(const_cast<std::uint16_t*>(A));
  p.b.set_data_handle(const_cast<std::uint16_t*>(B));
  p.c.set_data_handle(C);
  p.prim.execute(stream, {{DNNL_ARG_SRC, p.a}, {DNNL_ARG_WEIGHTS, p.b}, {DNNL_ARG_DST, p.c}});
  stream.wait();
}

// The live Bf16Shadows of this thread, newest last.
struct Shadow {
  const Bf16Shadow* owner;
  const float* values;
  const std::uint16_t* codes;
  std::size_t n;
};
thread_local std::vector<Shadow> shadows;

// The rounding shadows' buffers of this thread, kept between shadows.
struct CodeBuffer {
  std::vector<std::uint16_t> codes;
  bool busy = false;
};
thread_local std::vector<std::unique_ptr<CodeBuffer>> code_buffers;

// The span of op(X) (rows x cols, leading dimension ld) in X's storage, in elements.
std::size_t stored_span(bool trans, int rows, int cols, int ld) {
  if (trans) std::swap(rows, cols);
  return static_cast<std::size_t>(rows - 1) * static_cast<std::size_t>(ld) + static_cast<std::size_t>(cols);
}

// The codes of a live shadow covering [x, x + span), or null.
const std::uint16_t* shadowed(const float* x, std::size_t span) {
  for (auto it = shadows.rbegin(); it != shadows.rend(); ++it) {
    if (std::less_equal<const float*>()(it->values, x) && std::less_equal<const float*>()(x + span, it->values + it->n))
      return it->codes + (x - it->values);
  }
  return nullptr;
}

// Writes the stored span of an operand, op(X) of rows x cols with leading dimension ld (X
// transposed when trans), into buf converted by f(src, n, dst), in parallel blocks (the
// conversion streams memory as long as a small product computes).
template <class T, class F>
const T* converted(std::vector<T>& buf, const float* x, bool trans, int rows, int cols, int ld, F&& f) {
  const std::size_t span = stored_span(trans, rows, cols, ld);
  if (buf.size() < span) buf.resize(span);
  T* out = buf.data();
  tbb::parallel_for(std::size_t{0}, (span + kConvertBlock - 1) / kConvertBlock, [&](std::size_t k) {
    const std::size_t at = k * kConvertBlock;
    f(x + at, std::min(kConvertBlock, span - at), out + at);
  });
  return out;
}

void to_bf16(const float* x, std::size_t n, std::uint16_t* out) { convert(x, DType::fp32, out, DType::bf16, n); }

// Rounded to fp16 and back (fp16 products).
void to_fp16_values(const float* x, std::size_t n, float* out) {
  std::uint16_t h[kConvertBlock];
  convert(x, DType::fp32, h, DType::fp16, n);
  convert(h, DType::fp16, out, DType::fp32, n);
}

}  // namespace

const char* blas_name() { return "oneDNN"; }

bool bf16_products_available() {
  static const bool v = [] {
    const auto isa = static_cast<unsigned>(dnnl_get_effective_cpu_isa());
    const auto want = static_cast<unsigned>(dnnl_cpu_isa_avx512_core_bf16);
    return (isa & want) == want;
  }();
  return v;
}

void gemm(Products p, bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
          int ldb, float beta, float* C, int ldc) {
  if (M <= 0 || N <= 0) return;  // an empty C: nothing to write
  if (K <= 0) {                  // no products: C = beta C
    for (int m = 0; m < M; ++m) {
      float* row = C + static_cast<std::size_t>(m) * ldc;
      for (int n = 0; n < N; ++n) row[n] = beta == 0.0f ? 0.0f : beta * row[n];
    }
    return;
  }
  const bool bf16 = p == Products::bf16 && bf16_products_available();
  const std::uint16_t *a16 = nullptr, *b16 = nullptr;
  if (bf16) {
    STRATA_CHECK(beta == 0.0f || beta == 1.0f, Errc::invalid_argument, "bf16 products take beta 0 or 1 (got ", beta,
                 ")");
    thread_local std::vector<std::uint16_t> abuf, bbuf;
    a16 = shadowed(A, stored_span(ta, M, K, lda));
    if (a16 == nullptr) a16 = converted(abuf, A, ta, M, K, lda, to_bf16);
    b16 = shadowed(B, stored_span(tb, K, N, ldb));
    if (b16 == nullptr) b16 = converted(bbuf, B, tb, K, N, ldb, to_bf16);
  } else if (p == Products::fp16) {
    thread_local std::vector<float> abuf, bbuf;
    A = converted(abuf, A, ta, M, K, lda, to_fp16_values);
    B = converted(bbuf, B, tb, K, N, ldb, to_fp16_values);
  }
  const bool rows = M >= N;
  const int extent = rows ? M : N;
  const int panel = std::max(kMinPanel, (extent + kMaxPanels - 1) / kMaxPanels);
  const int panels = (extent + panel - 1) / panel;
  // Offset of row or column `at` of op(X) in X's storage.
  const auto off = [](int at, int ld, bool trans) { return static_cast<std::size_t>(at) * (trans ? 1 : ld); };
  tbb::parallel_for(
      0, panels,
      [&](int k) {
        const int i = k * panel, len = std::min(panel, extent - i);
        const std::size_t ao = rows ? off(i, lda, ta) : 0, bo = rows ? 0 : off(i, ldb, !tb);
        const int m = rows ? len : M, n = rows ? N : len;
        float* c = C + (rows ? static_cast<std::size_t>(i) * ldc : static_cast<std::size_t>(i));
        if (bf16) {
          bf16_panel(ta, tb, m, n, K, alpha, a16 + ao, lda, b16 + bo, ldb, beta == 1.0f, c, ldc);
        } else {
          sgemm(ta, tb, m, n, K, alpha, A + ao, lda, B + bo, ldb, beta, c, ldc);
        }
      },
      tbb::simple_partitioner());
}

Bf16Shadow::Bf16Shadow(const float* values, const std::uint16_t* codes, std::size_t n) { enter(values, codes, n); }

Bf16Shadow::Bf16Shadow(Products p, const float* values, std::size_t n) {
  if (p != Products::bf16 || !bf16_products_available() || n == 0) return;
  CodeBuffer* b = nullptr;
  for (auto& c : code_buffers) {
    if (!c->busy) {
      b = c.get();
      break;
    }
  }
  if (b == nullptr) b = code_buffers.emplace_back(std::make_unique<CodeBuffer>()).get();
  if (b->codes.size() < n) b->codes.resize(n);
  std::uint16_t* out = b->codes.data();
  tbb::parallel_for(std::size_t{0}, (n + kConvertBlock - 1) / kConvertBlock, [&](std::size_t k) {
    const std::size_t at = k * kConvertBlock;
    to_bf16(values + at, std::min(kConvertBlock, n - at), out + at);
  });
  b->busy = true;  // only once nothing can throw: the destructor frees it
  buffer_ = b;
  enter(values, out, n);
}

void Bf16Shadow::enter(const float* values, const std::uint16_t* codes, std::size_t n) {
  shadows.push_back(Shadow{this, values, codes, n});
  active_ = true;
}

Bf16Shadow::~Bf16Shadow() {
  if (buffer_ != nullptr) static_cast<CodeBuffer*>(buffer_)->busy = false;
  if (!active_) return;
  for (auto it = shadows.rbegin(); it != shadows.rend(); ++it) {
    if (it->owner == this) {
      shadows.erase(std::next(it).base());
      return;
    }
  }
}

double library_gemm_seconds(Products p, int M, int N, int K, int threads, int reps) {
  using dt = dnnl::memory::data_type;
  const bool bf16 = p == Products::bf16 && bf16_products_available();
  const std::size_t na = static_cast<std::size_t>(M) * K, nb = static_cast<std::size_t>(K) * N;
  std::vector<float> a(na, 0.01f), b(nb, 0.02f), c(static_cast<std::size_t>(M) * N);
  std::vector<std::uint16_t> a16(bf16 ? na : 0), b16(bf16 ? nb : 0);
  to_bf16(a.data(), a16.size(), a16.data());
  to_bf16(b.data(), b16.size(), b16.data());
  // bf16: a matmul primitive (oneDNN's bf16 GEMM); fp32: its SGEMM, the faster of its two
  // fp32 entry points here.
  const auto ad = operand(M, K, K, false, dt::bf16), bd = operand(K, N, N, false, dt::bf16),
             cd = operand(M, N, N, false, dt::f32);
  dnnl::matmul prim;
  if (bf16) prim = dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(ad, bd, cd), cpu_engine()));
  dnnl::memory am(ad, cpu_engine(), a16.data()), bm(bd, cpu_engine(), b16.data()), cm(cd, cpu_engine(), c.data());
  dnnl::stream stream(cpu_engine());
  omp_set_num_threads(threads);
  std::vector<double> times;
  for (int r = 0; r <= reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    if (bf16) {
      prim.execute(stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
      stream.wait();
    } else {
      const dnnl_status_t st = dnnl_sgemm('N', 'N', M, N, K, 1.0f, a.data(), K, b.data(), N, 0.0f, c.data(), N);
      STRATA_CHECK(st == dnnl_success, Errc::internal, "oneDNN sgemm ", M, "x", N, "x", K, " failed with status ",
                   static_cast<int>(st));
    }
    if (r > 0) times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  one_thread();
  std::nth_element(times.begin(), times.begin() + static_cast<std::ptrdiff_t>(times.size() / 2), times.end());
  return times[times.size() / 2];
}

void gemm_serial(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B, int ldb,
                 float beta, float* C, int ldc) {
  sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace strata::model::ops
