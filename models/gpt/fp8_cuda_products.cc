// The GPT's FP8 products on a CUDA device (see fp8_cuda_products.h).
#include "models/gpt/fp8_cuda_products.h"

#include "models/gpt/detail/fp8_cuda.h"
#include "models/gpt/detail/gpt_cuda.h"
#include "runtime/core/error.h"
#include "runtime/core/units.h"

namespace strata::model {
namespace {

constexpr std::size_t kWorkspace = std::size_t{4} << 20;  // cuBLASLt's, for its faster FP8 kernels
constexpr std::size_t kAlign = 256;
// Each operand's scale and inverse sit in a 256-byte slot of their own (the inverse at its
// middle), aligned as cuBLASLt's scale pointers are when they are separate allocations.
constexpr std::size_t kSlotFloats = kAlign / sizeof(float), kInverseAt = kSlotFloats / 2;

std::size_t round_up(std::size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
// Floats before the workspace: the slots, then every operand's amax and two spares.
std::size_t slot_floats(int operands) { return static_cast<std::size_t>(operands) * kSlotFloats; }
std::size_t state_floats(int operands) {
  return slot_floats(operands) + round_up((static_cast<std::size_t>(operands) + 2) * sizeof(float)) / sizeof(float);
}
bool aligned(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

}  // namespace

std::uint64_t CudaFp8Products::device_bytes(const GptShape& shape) noexcept {
  return state_floats(3 * site_count(shape)) * sizeof(float) + kWorkspace;
}

CudaFp8Products::CudaFp8Products(const fp8::Recipe& recipe, const GptShape& shape, int max_tokens, Scratch scratch,
                                 GptKernels& kernels, device::Device& dev)
    : Fp8Products(recipe, shape, scratch, kernels), operands_(operand_count()) {
  STRATA_CHECK(!recipe.block_scaling, Errc::unsupported,
               "fp8.block_scaling runs on the host device only: cuBLASLt's FP8 products on Hopper take one scale "
               "per operand; turn block_scaling off for --device cuda, or use --device host");
  STRATA_CHECK(kernels.native_stream() != nullptr, Errc::internal, "CudaFp8Products: the kernels are not CUDA's");
  const auto z = scratch_floats(shape, static_cast<std::size_t>(max_tokens));
  // Codes take a quarter of an fp32 buffer's bytes: x and g hold two sets (plain and transposed).
  x_half_ = z.x * sizeof(float) / 2 / kAlign * kAlign;
  g_half_ = z.g * sizeof(float) / 2 / kAlign * kAlign;
  w_bytes_ = z.w * sizeof(float);
  x_[0] = reinterpret_cast<std::uint8_t*>(scratch.x);
  x_[1] = x_[0] + x_half_;
  g_[0] = reinterpret_cast<std::uint8_t*>(scratch.g);
  g_[1] = g_[0] + g_half_;
  w_ = reinterpret_cast<std::uint8_t*>(scratch.w);
  aligned_ = aligned(scratch.x) && aligned(scratch.g) && aligned(scratch.w);
  state_ = device::DeviceBuffer(dev, device_bytes(shape), "gpt fp8 scales and cuBLASLt workspace");
  scale_ = state_.as<float>();
  amax_ = scale_ + slot_floats(operands_);
  spare_ = amax_ + operands_;
  workspace_ = scale_ + state_floats(operands_);
  this->kernels().zero(scale_, state_floats(operands_));
  uploaded_.assign(static_cast<std::size_t>(operands_), 0.0f);
  used_.assign(static_cast<std::size_t>(operands_), false);
  lt_ = detail::fp8_lt_create();
}

CudaFp8Products::~CudaFp8Products() {
  try {
    kernels().sync();
  } catch (...) {  // reported by the call that waited last
  }
  detail::fp8_lt_destroy(lt_);
}

const float* CudaFp8Products::scale_slot(const Operand& o, const float* src, std::size_t n) {
  float s = 1.0f;
  if (recipe().scaling != fp8::Scaling::none) {
    if (!o.h->history().empty()) {
      s = o.h->scale(recipe(), o.fmt, 0.0f);
    } else {  // current scaling: this tensor's own amax, read back
      float* slot = spare_ + 1;
      kernels().zero(slot, 1);
      detail::cuda_fp8_amax(st(), src, n, slot);
      float amax = 0.0f;
      kernels().to_host(&amax, slot, 1);
      s = fp8::scale_for(amax, o.fmt, recipe().margin);
    }
  }
  const auto i = static_cast<std::size_t>(o.index);
  float* slot = scale_ + i * kSlotFloats;
  if (uploaded_[i] != s) {
    uploaded_[i] = s;
    detail::cuda_fp8_set_scale(st(), slot, slot + kInverseAt, s);
  }
  return slot;
}

const float* CudaFp8Products::inverse(const Operand& o) const noexcept {
  return scale_ + static_cast<std::size_t>(o.index) * kSlotFloats + kInverseAt;
}

float* CudaFp8Products::amax_slot(const Operand& o) {
  if (!recording()) return spare_;
  used_[static_cast<std::size_t>(o.index)] = true;
  return amax_ + o.index;
}

void CudaFp8Products::collect_amax() {
  bool any = false;
  for (bool u : used_) any = any || u;
  if (!any) return;
  std::vector<float> amax(static_cast<std::size_t>(operands_));
  kernels().to_host(amax.data(), amax_, amax.size());
  for (int i = 0; i < operands_; ++i)
    if (used_[static_cast<std::size_t>(i)]) history(i).record(amax[static_cast<std::size_t>(i)]);
  kernels().zero(amax_, amax.size());
  used_.assign(used_.size(), false);
}

const float* CudaFp8Products::quantize(const Operand& o, const float* src, int rows, int cols, float* dst) {
  const std::size_t n = static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols);
  detail::cuda_fp8_fake_quantize(st(), src, dst, n, o.fmt, scale_slot(o, src, n), amax_slot(o));
  return dst;
}

const void* CudaFp8Products::codes(const Operand& o, const float* src, int rows, int cols, bool transposed, void* dst) {
  const std::size_t n = static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols);
  const float* scale = scale_slot(o, src, n);
  if (transposed) {
    detail::cuda_fp8_quantize_transposed(st(), src, rows, cols, dst, o.fmt, scale, amax_slot(o));
  } else {
    detail::cuda_fp8_quantize(st(), src, dst, n, o.fmt, scale, amax_slot(o));
  }
  return dst;
}

void CudaFp8Products::fits(std::size_t bytes, std::size_t room, const char* what) {
  STRATA_CHECK(bytes <= room, Errc::internal, "fp8 on cuda: ", what, " codes of ", format_bytes(bytes),
               " exceed their scratch of ", format_bytes(room));
}

bool CudaFp8Products::tensor_cores(std::initializer_list<int> dims,
                                   std::initializer_list<const void*> outs) const noexcept {
  if (!aligned_) return false;
  for (int d : dims)
    if (d <= 0 || d % 16 != 0) return false;
  for (const void* p : outs)
    if (p != nullptr && !aligned(p)) return false;
  return true;
}

void CudaFp8Products::gemm(int M, int N, int K, const void* A, const Operand& a, const void* B, const Operand& b,
                           float alpha, float beta, float* C) {
  detail::cuda_fp8_gemm(lt_, st(), M, N, K, A, a.fmt, inverse(a), B, b.fmt, inverse(b), alpha, beta, C, workspace_,
                        kWorkspace);
}

void CudaFp8Products::forward(int site, float* out, const float* inp, const float* W, const float* b, int N, int IC,
                              int OC, const ops::ProductScales& s) {
  if (!tensor_cores({N, IC, OC}, {out})) return Fp8Products::forward(site, out, inp, W, b, N, IC, OC, s);
  const auto nx = static_cast<std::size_t>(N) * IC, nw = static_cast<std::size_t>(IC) * OC;
  fits(nx, x_half_, "activation");
  fits(nw, w_bytes_, "weight");
  const Operand x = x_of(site), w = w_of(site);
  const void* qx = codes(x, inp, N, IC, false, x_[0]);  // [N, IC]
  const void* qwt = codes(w, W, IC, OC, true, w_);      // [OC, IC]
  float beta = 0.0f;
  if (b != nullptr) {
    detail::cuda_fill_rows(st(), out, b, N, OC);
    beta = 1.0f;
  }
  gemm(N, OC, IC, qx, x, qwt, w, s.fwd, beta, out);
}

void CudaFp8Products::backward(int site, float* dinp, float* dW, float* db, const float* dout, const float* inp,
                               const float* W, int N, int IC, int OC, bool accumulate, const ops::ProductScales& s) {
  if (!tensor_cores({N, IC, OC}, {dinp, dW}))
    return Fp8Products::backward(site, dinp, dW, db, dout, inp, W, N, IC, OC, accumulate, s);
  const auto nx = static_cast<std::size_t>(N) * IC, nw = static_cast<std::size_t>(IC) * OC,
             ng = static_cast<std::size_t>(N) * OC;
  fits(nx, x_half_, "activation");
  fits(nw, w_bytes_, "weight");
  fits(ng, g_half_, "gradient");
  const Operand x = x_of(site), w = w_of(site), g = g_of(site);
  const void* qg = codes(g, dout, N, OC, false, g_[0]);  // [N, OC]
  if (dinp != nullptr) {
    const void* qw = codes(w, W, IC, OC, false, w_);  // [IC, OC]
    gemm(N, IC, OC, qg, g, qw, w, s.grad_in, accumulate ? 1.0f : 0.0f, dinp);
  }
  const void* qxt = codes(x, inp, N, IC, true, x_[1]);   // [IC, N]
  const void* qgt = codes(g, dout, N, OC, true, g_[1]);  // [OC, N]
  gemm(IC, OC, N, qxt, x, qgt, g, s.grad_w, 1.0f, dW);
  if (db != nullptr) kernels().bias_backward(db, dout, N, OC);
}

void CudaFp8Products::head_forward(float* logits, const float* inp, const float* wte, int N, int C, int V,
                                   const ops::ProductScales& s) {
  if (!tensor_cores({N, C, V}, {logits})) return Fp8Products::head_forward(logits, inp, wte, N, C, V, s);
  fits(static_cast<std::size_t>(N) * C, x_half_, "activation");
  fits(static_cast<std::size_t>(V) * C, w_bytes_, "embedding");
  const Operand x = x_of(head_site()), w = w_of(head_site());
  const void* qx = codes(x, inp, N, C, false, x_[0]);  // [N, C]
  const void* qw = codes(w, wte, V, C, false, w_);     // [V, C]
  gemm(N, V, C, qx, x, qw, w, s.fwd, 0.0f, logits);
}

void CudaFp8Products::head_backward(float* dinp, float* dwte, const float* dlogits, const float* inp, const float* wte,
                                    int N, int C, int V, const ops::ProductScales& s) {
  if (!tensor_cores({N, C, V}, {dinp, dwte}))
    return Fp8Products::head_backward(dinp, dwte, dlogits, inp, wte, N, C, V, s);
  fits(static_cast<std::size_t>(N) * C, x_half_, "activation");
  fits(static_cast<std::size_t>(V) * C, w_bytes_, "embedding");
  fits(static_cast<std::size_t>(N) * V, g_half_, "logits' gradient");
  const Operand x = x_of(head_site()), w = w_of(head_site()), g = g_of(head_site());
  const void* qg = codes(g, dlogits, N, V, false, g_[0]);  // [N, V]
  const void* qwt = codes(w, wte, V, C, true, w_);         // [C, V]
  gemm(N, C, V, qg, g, qwt, w, s.grad_in, 0.0f, dinp);
  const void* qgt = codes(g, dlogits, N, V, true, g_[1]);  // [V, N]
  const void* qxt = codes(x, inp, N, C, true, x_[1]);      // [C, N]
  gemm(V, C, N, qgt, g, qxt, x, s.grad_w, 1.0f, dwte);
}

}  // namespace strata::model
