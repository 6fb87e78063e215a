// The CUDA HostSignal. The value lives in a 4-byte word of mapped pinned memory: raise()
// stores it with release order, and the stream waits on it in the GPU's front end with
// cuStreamWaitValue32 (GEQ, which compares modulo 2^32 as HostSignal does), taken from the
// driver through the runtime's entry-point query so that Strata needs no link to libcuda.
// Where the driver does not offer stream memory operations the wait falls back to a host
// function that blocks until the value is reached (it runs no file I/O and calls no CUDA).
#include "runtime/device/detail/cuda_signal.h"

#include <cuda.h>
#include <cudaTypedefs.h>

#include <condition_variable>
#include <mutex>

#include "runtime/core/error.h"
#include "runtime/core/log.h"
#include "runtime/device/cuda_check.h"

namespace strata::device::detail {
namespace {

// The host-side copy of the value, for value() and the fallback's waiters; shared so that a
// waiting host function holds it rather than the signal.
struct SignalState {
  std::mutex mutex;
  std::condition_variable cv;
  std::uint32_t value = 0;
};

class CudaHostSignal final : public HostSignal {
 public:
  explicit CudaHostSignal(int ordinal) {
    STRATA_CUDA_CHECK(cudaSetDevice(ordinal), "host signal");
    void* p = nullptr;
    STRATA_CUDA_CHECK(cudaHostAlloc(&p, sizeof(std::uint32_t), cudaHostAllocMapped | cudaHostAllocPortable),
                      "host signal: mapped pinned word");
    word_ = static_cast<std::uint32_t*>(p);
    __atomic_store_n(word_, 0u, __ATOMIC_RELEASE);
    void* d = nullptr;
    const cudaError_t e = cudaHostGetDevicePointer(&d, p, 0);
    if (e != cudaSuccess) {
      cudaFreeHost(p);
      STRATA_CUDA_CHECK(e, "host signal: device address of the mapped word");
    }
    device_word_ = reinterpret_cast<CUdeviceptr>(d);
  }
  ~CudaHostSignal() override { cudaFreeHost(word_); }

  void raise(std::uint32_t value) override {
    {
      std::lock_guard<std::mutex> lock(state_->mutex);
      state_->value = value;
      // Everything the host wrote before raise() (the data a stream will copy) is visible
      // to the device before the word is.
      __atomic_store_n(word_, value, __ATOMIC_RELEASE);
    }
    state_->cv.notify_all();
  }
  std::uint32_t value() const override { return __atomic_load_n(word_, __ATOMIC_ACQUIRE); }

  CUdeviceptr device_word() const noexcept { return device_word_; }
  const std::shared_ptr<SignalState>& state() const noexcept { return state_; }

 private:
  std::uint32_t* word_ = nullptr;
  CUdeviceptr device_word_ = 0;
  std::shared_ptr<SignalState> state_ = std::make_shared<SignalState>();
};

PFN_cuStreamWaitValue32_v11070 stream_wait_value() {
  static const PFN_cuStreamWaitValue32_v11070 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &p, 12000, cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      STRATA_LOG(warn,
                 "this CUDA driver offers no cuStreamWaitValue32: streams wait for host signals in a blocking "
                 "host function instead");
      return static_cast<PFN_cuStreamWaitValue32_v11070>(nullptr);
    }
    return reinterpret_cast<PFN_cuStreamWaitValue32_v11070>(p);
  }();
  return fn;
}

struct FallbackWait {
  std::shared_ptr<SignalState> state;
  std::uint32_t target;
};

void CUDART_CB fallback_wait(void* data) noexcept {
  auto* w = static_cast<FallbackWait*>(data);
  {
    std::unique_lock<std::mutex> lock(w->state->mutex);
    w->state->cv.wait(lock, [&] { return signal_reached(w->state->value, w->target); });
  }
  delete w;
}

}  // namespace

std::unique_ptr<HostSignal> create_cuda_host_signal(int ordinal) { return std::make_unique<CudaHostSignal>(ordinal); }

void cuda_wait_signal(cudaStream_t stream, HostSignal& signal, std::uint32_t value) {
  auto* cs = dynamic_cast<CudaHostSignal*>(&signal);
  STRATA_CHECK(cs != nullptr, Errc::invalid_argument, "wait: signal is not a CUDA host signal");
  if (auto wait = stream_wait_value()) {
    const CUresult r = wait(stream, cs->device_word(), value, CU_STREAM_WAIT_VALUE_GEQ);
    if (r == CUDA_SUCCESS) return;
    STRATA_CHECK(r == CUDA_ERROR_NOT_SUPPORTED, Errc::cuda, "stream wait on a host signal: cuStreamWaitValue32 failed ",
                 "with CUresult ", static_cast<int>(r));
  }
  auto* w = new FallbackWait{cs->state(), value};
  const cudaError_t e = cudaLaunchHostFunc(stream, &fallback_wait, w);
  if (e != cudaSuccess) {
    delete w;
    STRATA_CUDA_CHECK(e, "stream wait on a host signal");
  }
}

}  // namespace strata::device::detail
