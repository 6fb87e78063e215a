// The CUDA Adam/AdamW kernel: the CPU kernel's arithmetic (detail/update_scalars.h) written
// with explicitly rounded intrinsics (__fmaf_rn, __fmul_rn, __fdiv_rn, __fsqrt_rn), so nvcc's
// contraction and fast-math settings cannot change it. Where every buffer is aligned to four
// elements, a kernel specialised on the dtypes moves four elements per thread with vector
// loads and stores (the step is bound by memory traffic; per-element dtype switches and 4-byte
// accesses left it at two thirds of an H200's copy bandwidth); the rest, and unaligned
// buffers, take the one-element kernel. Both run the same arithmetic per element.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "optim/detail/cuda_launch.h"
#include "runtime/core/error.h"
#include "runtime/core/q8_codec.h"
#include "runtime/device/cuda_check.h"

namespace strata::optim::detail {
namespace {

__device__ __forceinline__ float load(const void* base, DType t, std::size_t i) {
  switch (t) {
    case DType::bf16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
    case DType::fp16:
      return __half2float(static_cast<const __half*>(base)[i]);
    default:
      return static_cast<const float*>(base)[i];
  }
}

__device__ __forceinline__ void store(void* base, DType t, std::size_t i, float x) {
  switch (t) {
    case DType::bf16:
      static_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16_rn(x);
      break;
    case DType::fp16:
      static_cast<__half*>(base)[i] = __float2half_rn(x);
      break;
    default:
      static_cast<float*>(base)[i] = x;
      break;
  }
}

// One element's update: p, m and v in and out (the CPU kernel's order of operations).
__device__ __forceinline__ void update(const AdamScalars& s, float& p, float graw, float& m, float& v) {
  float g = __fmul_rn(graw, s.grad_scale);
  if (s.l2) g = __fmaf_rn(p, s.l2_decay, g);
  m = __fmaf_rn(s.beta1, m, __fmul_rn(s.one_minus_beta1, g));
  v = __fmaf_rn(s.beta2, v, __fmul_rn(s.one_minus_beta2, __fmul_rn(g, g)));
  const float d = __fmaf_rn(__fsqrt_rn(v), s.inv_sqrt_bc2, s.eps);
  p = __fmaf_rn(__fdiv_rn(m, d), s.neg_step_size, __fmul_rn(p, s.decay));
}

__global__ void adam_kernel(AdamScalars s, float* master, const void* grad, DType grad_dtype, void* m, void* v,
                            DType state_dtype, void* copy, DType copy_dtype, std::size_t n) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    float p = master[i], mm = load(m, state_dtype, i), vv = load(v, state_dtype, i);
    update(s, p, load(grad, grad_dtype, i), mm, vv);
    master[i] = p;
    store(m, state_dtype, i, mm);
    store(v, state_dtype, i, vv);
    if (copy) store(copy, copy_dtype, i, p);
  }
}

// q8 moments: one thread per 16-element block, decoded, stepped element by element with the
// same update, and coded back with the step as salt (runtime/core/q8_codec.h).
__global__ void adam_q8_kernel(AdamScalars s, float* master, const void* grad, DType grad_dtype, std::uint8_t* m,
                               std::uint8_t* v, void* copy, DType copy_dtype, std::size_t blocks, std::uint32_t salt) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t b = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; b < blocks; b += stride) {
    float mm[q8::kBlockElems], vv[q8::kBlockElems];
    q8::decode_block(m + b * q8::kBlockBytes, mm, false);
    q8::decode_block(v + b * q8::kBlockBytes, vv, true);
#pragma unroll 4
    for (int k = 0; k < q8::kBlockElems; ++k) {
      const std::size_t i = b * q8::kBlockElems + k;
      float p = master[i];
      update(s, p, load(grad, grad_dtype, i), mm[k], vv[k]);
      master[i] = p;
      if (copy) store(copy, copy_dtype, i, p);
    }
    q8::encode_block(mm, m + b * q8::kBlockBytes, false, salt);
    q8::encode_block(vv, v + b * q8::kBlockBytes, true, salt);
  }
}

// The DType of fp32 and bf16 moments (q8 has its own kernel).
DType state_type(MomentFormat f) { return f == MomentFormat::bf16 ? DType::bf16 : DType::fp32; }

template <class T> __device__ __forceinline__ float widen(T x);
template <> __device__ __forceinline__ float widen<float>(float x) { return x; }
template <> __device__ __forceinline__ float widen<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }
template <> __device__ __forceinline__ float widen<__half>(__half x) { return __half2float(x); }
template <class T> __device__ __forceinline__ T narrow(float x);
template <> __device__ __forceinline__ float narrow<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 narrow<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <> __device__ __forceinline__ __half narrow<__half>(float x) { return __float2half_rn(x); }

// Four consecutive elements, loaded and stored as one access (16 bytes of fp32, 8 of 16-bit).
template <class T> struct alignas(4 * sizeof(T)) Four { T x[4]; };

// C: the copy-out's element type, ignored unless kCopy.
template <class G, class S, class C, bool kCopy>
__global__ void adam_kernel4(AdamScalars s, float* master, const G* grad, S* m, S* v, C* copy, std::size_t groups) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < groups; i += stride) {
    Four<float> p = reinterpret_cast<const Four<float>*>(master)[i];
    const Four<G> g = reinterpret_cast<const Four<G>*>(grad)[i];
    Four<S> m4 = reinterpret_cast<const Four<S>*>(m)[i], v4 = reinterpret_cast<const Four<S>*>(v)[i];
    Four<C> c4;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      float mm = widen(m4.x[k]), vv = widen(v4.x[k]);
      update(s, p.x[k], widen(g.x[k]), mm, vv);
      m4.x[k] = narrow<S>(mm);
      v4.x[k] = narrow<S>(vv);
      if constexpr (kCopy) c4.x[k] = narrow<C>(p.x[k]);
    }
    reinterpret_cast<Four<float>*>(master)[i] = p;
    reinterpret_cast<Four<S>*>(m)[i] = m4;
    reinterpret_cast<Four<S>*>(v)[i] = v4;
    if constexpr (kCopy) reinterpret_cast<Four<C>*>(copy)[i] = c4;
  }
}

bool aligned(const void* p, std::size_t bytes) { return reinterpret_cast<std::uintptr_t>(p) % bytes == 0; }

// The CUDA type of a DType's elements, passed to f as a value of that type.
template <class F> void with_type(DType t, F&& f) {
  switch (t) {
    case DType::bf16:
      f(__nv_bfloat16{});
      break;
    case DType::fp16:
      f(__half{});
      break;
    default:
      f(float{});
      break;
  }
}

int grid_for(std::size_t n, int threads) {
  const std::size_t needed = (n + threads - 1) / threads;
  return static_cast<int>(needed < 65535 ? needed : 65535);
}

// Launches the four-element kernel over the first 4 * groups elements; false (nothing
// launched) where a buffer is not aligned to four of its elements.
bool launch_vector(cudaStream_t st, const AdamScalars& s, const StepArgs& a, std::size_t groups) {
  const std::size_t gs = dtype_size(a.grad_dtype), ss = dtype_size(state_type(a.state_format)),
                    cs = dtype_size(a.copy_dtype);
  if (!aligned(a.master, 16) || !aligned(a.grad, 4 * gs) || !aligned(a.m, 4 * ss) || !aligned(a.v, 4 * ss) ||
      (a.copy != nullptr && !aligned(a.copy, 4 * cs)))
    return false;
  constexpr int kThreads = 256;
  const int blocks = grid_for(groups, kThreads);
  with_type(a.grad_dtype, [&](auto g) {
    using G = decltype(g);
    with_type(state_type(a.state_format), [&](auto sv) {
      using S = decltype(sv);
      with_type(a.copy_dtype, [&](auto cv) {
        using C = decltype(cv);
        auto* grad = static_cast<const G*>(a.grad);
        auto *m = static_cast<S*>(a.m), *v = static_cast<S*>(a.v);
        if (a.copy != nullptr)
          adam_kernel4<G, S, C, true>
              <<<blocks, kThreads, 0, st>>>(s, a.master, grad, m, v, static_cast<C*>(a.copy), groups);
        else
          adam_kernel4<G, S, C, false><<<blocks, kThreads, 0, st>>>(s, a.master, grad, m, v, nullptr, groups);
      });
    });
  });
  return true;
}

}  // namespace

void cuda_adam_step_async(void* cuda_stream, const AdamScalars& s, const StepArgs& a) {
  if (a.n == 0) return;
  constexpr int kThreads = 256;
  const auto st = static_cast<cudaStream_t>(cuda_stream);
  if (a.state_format == MomentFormat::q8) {
    const std::size_t blocks = a.n / q8::kBlockElems;
    adam_q8_kernel<<<grid_for(blocks, kThreads), kThreads, 0, st>>>(
        s, a.master, a.grad, a.grad_dtype, static_cast<std::uint8_t*>(a.m), static_cast<std::uint8_t*>(a.v), a.copy,
        a.copy_dtype, blocks, static_cast<std::uint32_t>(a.step));
    STRATA_CUDA_CHECK(cudaGetLastError(), "adam step kernel launch (", a.n, " elements, q8 moments)");
    return;
  }
  std::size_t done = 0;
  if (a.n >= 4 && launch_vector(st, s, a, a.n / 4)) done = a.n / 4 * 4;
  if (done < a.n) {  // the tail (or everything, unaligned), one element per thread
    const std::size_t gs = dtype_size(a.grad_dtype), ss = dtype_size(state_type(a.state_format)),
                      cs = dtype_size(a.copy_dtype);
    const auto at = [done](auto* p, std::size_t size) {
      return p == nullptr
                 ? nullptr
                 : static_cast<void*>(static_cast<char*>(const_cast<void*>(static_cast<const void*>(p))) + done * size);
    };
    adam_kernel<<<grid_for(a.n - done, kThreads), kThreads, 0, st>>>(
        s, a.master + done, at(a.grad, gs), a.grad_dtype, at(a.m, ss), at(a.v, ss), state_type(a.state_format),
        at(a.copy, cs), a.copy_dtype, a.n - done);
  }
  STRATA_CUDA_CHECK(cudaGetLastError(), "adam step kernel launch (", a.n, " elements)");
}

}  // namespace strata::optim::detail
