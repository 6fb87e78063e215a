// The CUDA backend of the Device contract: device memory from a dedicated memory pool
// (cudaMallocFromPoolAsync) charged to the same Budget as the host backend, pinned memory
// from cudaHostAlloc, non-blocking streams, timing events, host functions whose exceptions
// become the stream's sticky error (no exception crosses the CUDA callback).
#include <cuda_runtime_api.h>

#include <exception>
#include <mutex>
#include <set>
#include <unordered_map>

#include "runtime/core/error.h"
#include "runtime/core/log.h"
#include "runtime/core/units.h"
#include "runtime/device/arena.h"
#include "runtime/device/budget.h"
#include "runtime/device/cuda_check.h"
#include "runtime/device/detail/cuda_signal.h"
#include "runtime/device/device.h"

namespace strata::device {

std::unique_ptr<Device> create_cuda_device(const DeviceOptions& options);

namespace {

class CudaEvent final : public Event {
 public:
  explicit CudaEvent(int ordinal) : ordinal_(ordinal) {
    STRATA_CUDA_CHECK(cudaSetDevice(ordinal_), "cuda event");
    STRATA_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDefault), "cuda event");
  }
  ~CudaEvent() override { cudaEventDestroy(event_); }
  bool query() override {
    const cudaError_t e = cudaEventQuery(event_);
    if (e == cudaErrorNotReady) return false;
    STRATA_CUDA_CHECK(e, "event query");
    return true;
  }
  void synchronize() override { STRATA_CUDA_CHECK(cudaEventSynchronize(event_), "event synchronize"); }
  double elapsed_ms(Event& later) override {
    auto* other = dynamic_cast<CudaEvent*>(&later);
    STRATA_CHECK(other != nullptr, Errc::invalid_argument, "elapsed_ms: events of different backends");
    float ms = 0;
    STRATA_CUDA_CHECK(cudaEventElapsedTime(&ms, event_, other->event_), "elapsed_ms");
    return ms;
  }
  cudaEvent_t handle() const noexcept { return event_; }

 private:
  int ordinal_;
  cudaEvent_t event_{};
};

class CudaStream final : public Stream {
 public:
  CudaStream(int ordinal, std::function<void(CudaStream*)> unregister)
      : ordinal_(ordinal), unregister_(std::move(unregister)) {
    STRATA_CUDA_CHECK(cudaSetDevice(ordinal_), "cuda stream");
    STRATA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cuda stream");
  }
  ~CudaStream() override {
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
    if (unregister_) unregister_(this);
  }
  void copy_async(void* dst, const void* src, std::size_t bytes, CopyKind) override {
    if (bytes == 0) return;
    // Unified addressing lets the runtime infer the direction from the pointers.
    STRATA_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_), "copy_async of ", bytes, " B");
  }
  void memset_async(void* dst, int value, std::size_t bytes) override {
    if (bytes == 0) return;
    STRATA_CUDA_CHECK(cudaMemsetAsync(dst, value, bytes, stream_), "memset_async of ", bytes, " B");
  }
  void launch_host(std::function<void()> fn) override {
    auto* call = new HostCall{std::move(fn), this};
    const cudaError_t e = cudaLaunchHostFunc(stream_, &CudaStream::trampoline, call);
    if (e != cudaSuccess) {
      delete call;
      STRATA_CUDA_CHECK(e, "launch_host");
    }
  }
  void record(Event& event) override {
    auto* ce = dynamic_cast<CudaEvent*>(&event);
    STRATA_CHECK(ce != nullptr, Errc::invalid_argument, "record: event is not a CUDA event");
    STRATA_CUDA_CHECK(cudaEventRecord(ce->handle(), stream_), "event record");
  }
  void wait(Event& event) override {
    auto* ce = dynamic_cast<CudaEvent*>(&event);
    STRATA_CHECK(ce != nullptr, Errc::invalid_argument, "wait: event is not a CUDA event");
    STRATA_CUDA_CHECK(cudaStreamWaitEvent(stream_, ce->handle(), 0), "stream wait event");
  }
  void wait(HostSignal& signal, std::uint32_t value) override { detail::cuda_wait_signal(stream_, signal, value); }
  bool query() override {
    const cudaError_t e = cudaStreamQuery(stream_);
    if (e == cudaErrorNotReady) return false;
    STRATA_CUDA_CHECK(e, "stream query");
    return true;
  }
  void synchronize() override {
    STRATA_CUDA_CHECK(cudaStreamSynchronize(stream_), "stream synchronize");
    std::lock_guard<std::mutex> lock(mutex_);
    if (error_) std::rethrow_exception(error_);
  }
  void* native_handle() noexcept override { return stream_; }
  Backend backend() const noexcept override { return Backend::cuda; }

 private:
  struct HostCall {
    std::function<void()> fn;
    CudaStream* stream;
  };
  static void CUDART_CB trampoline(void* data) noexcept {
    auto* call = static_cast<HostCall*>(data);
    CudaStream* s = call->stream;
    bool skip;
    {
      std::lock_guard<std::mutex> lock(s->mutex_);
      skip = s->error_ != nullptr;
    }
    if (!skip) {
      try {
        call->fn();
      } catch (...) {
        std::lock_guard<std::mutex> lock(s->mutex_);
        if (!s->error_) s->error_ = std::current_exception();
      }
    }
    delete call;
  }

  int ordinal_;
  std::function<void(CudaStream*)> unregister_;
  cudaStream_t stream_{};
  std::mutex mutex_;
  std::exception_ptr error_;
};

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(const DeviceOptions& o)
      : Device(o), budget_("device", o.budget_bytes), pinned_budget_("pinned host", o.pinned_budget_bytes) {
    int count = 0;
    STRATA_CUDA_CHECK(cudaGetDeviceCount(&count), "cuda device ", o.ordinal, " (is a GPU and driver present?)");
    STRATA_CHECK(o.ordinal >= 0 && o.ordinal < count, Errc::invalid_argument, "cuda device ordinal ", o.ordinal,
                 " out of range: this machine has ", count, " GPU(s)");
    STRATA_CUDA_CHECK(cudaSetDevice(o.ordinal), "cuda device ", o.ordinal);
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = o.ordinal;
    STRATA_CUDA_CHECK(cudaMemPoolCreate(&pool_, &props), "cuda device ", o.ordinal, " memory pool");
    // Keep freed memory cached in the pool up to the budget: no trips to the driver.
    std::uint64_t threshold = o.budget_bytes;
    STRATA_CUDA_CHECK(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &threshold), "pool threshold");
    STRATA_CUDA_CHECK(cudaStreamCreateWithFlags(&alloc_stream_, cudaStreamNonBlocking), "allocation stream");
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, o.ordinal) == cudaSuccess) gpu_name_ = prop.name;
  }

  ~CudaDevice() override {
    cudaSetDevice(options().ordinal);
    if (!sizes_.empty()) STRATA_LOG(warn, name(), " destroyed with ", sizes_.size(), " device allocations not freed");
    for (auto& [p, bytes] : sizes_) cudaFreeAsync(p, alloc_stream_);
    for (auto& [p, bytes] : pinned_) cudaFreeHost(p);
    cudaStreamSynchronize(alloc_stream_);
    cudaStreamDestroy(alloc_stream_);
    cudaMemPoolDestroy(pool_);
  }

  Backend backend() const noexcept override { return Backend::cuda; }
  std::string name() const override {
    return str_cat("cuda:", options().ordinal, " (", gpu_name_, "; ", format_bytes(options().budget_bytes), " budget)");
  }

  void* allocate(std::size_t bytes, std::string_view what) override {
    void* p = allocate_on(bytes, alloc_stream_, what);
    const cudaError_t e = cudaStreamSynchronize(alloc_stream_);
    if (e != cudaSuccess) {
      try {
        free_on(p, alloc_stream_);  // not handed out: back to the pool and the budget
      } catch (const std::exception&) {
      }
      STRATA_CUDA_CHECK(e, "allocate");
    }
    return p;
  }
  void free(void* ptr) override {
    if (ptr == nullptr) return;
    free_on(ptr, alloc_stream_);
    STRATA_CUDA_CHECK(cudaStreamSynchronize(alloc_stream_), "free");
  }
  void* allocate_async(std::size_t bytes, Stream& stream, std::string_view what) override {
    return allocate_on(bytes, static_cast<cudaStream_t>(stream.native_handle()), what);
  }
  void free_async(void* ptr, Stream& stream) override {
    if (ptr != nullptr) free_on(ptr, static_cast<cudaStream_t>(stream.native_handle()));
  }
  void release_cached() override {
    STRATA_CUDA_CHECK(cudaDeviceSynchronize(), "cuda device synchronize before trimming the memory pool");
    STRATA_CUDA_CHECK(cudaMemPoolTrimTo(pool_, 0), "trimming the memory pool");
  }
  MemoryStats memory_stats() const override {
    MemoryStats m;
    m.used_bytes = budget_.used_bytes();
    m.peak_bytes = budget_.peak_bytes();
    m.budget_bytes = budget_.budget_bytes();
    m.largest_free_bytes = m.budget_bytes - m.used_bytes;  // the pool maps pages on demand
    std::lock_guard<std::mutex> lock(mutex_);
    m.allocations = sizes_.size();
    return m;
  }

  void* allocate_pinned(std::size_t bytes, std::string_view what) override {
    pinned_budget_.reserve(bytes, what, "Raise the pinned host budget or use fewer/smaller buffers");
    void* p = nullptr;
    const cudaError_t e = cudaHostAlloc(&p, bytes == 0 ? 1 : bytes, cudaHostAllocPortable);
    if (e != cudaSuccess) {
      pinned_budget_.release(bytes);
      STRATA_CUDA_CHECK(e, "pinned host tier: cudaHostAlloc of ", format_bytes(bytes));
    }
    std::lock_guard<std::mutex> lock(mutex_);
    pinned_.emplace(p, bytes);
    return p;
  }
  void free_pinned(void* ptr) override {
    if (ptr == nullptr) return;
    std::size_t bytes;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = pinned_.find(ptr);
      STRATA_CHECK(it != pinned_.end(), Errc::internal,
                   "free_pinned of a pointer that is not a live pinned allocation");
      bytes = it->second;
      pinned_.erase(it);
    }
    STRATA_CUDA_CHECK(cudaFreeHost(ptr), "free_pinned");
    pinned_budget_.release(bytes);
  }
  MemoryStats pinned_stats() const override {
    MemoryStats m;
    m.used_bytes = pinned_budget_.used_bytes();
    m.peak_bytes = pinned_budget_.peak_bytes();
    m.budget_bytes = pinned_budget_.budget_bytes();
    m.largest_free_bytes = m.budget_bytes - m.used_bytes;
    std::lock_guard<std::mutex> lock(mutex_);
    m.allocations = pinned_.size();
    return m;
  }

  std::unique_ptr<Stream> create_stream() override {
    auto s = std::make_unique<CudaStream>(options().ordinal, [this](CudaStream* gone) {
      std::lock_guard<std::mutex> lock(mutex_);
      streams_.erase(gone);
    });
    std::lock_guard<std::mutex> lock(mutex_);
    streams_.insert(s.get());
    return s;
  }
  std::unique_ptr<Event> create_event() override { return std::make_unique<CudaEvent>(options().ordinal); }
  std::unique_ptr<HostSignal> create_host_signal() override {
    return detail::create_cuda_host_signal(options().ordinal);
  }
  void synchronize() override {
    STRATA_CUDA_CHECK(cudaSetDevice(options().ordinal), "synchronize");
    STRATA_CUDA_CHECK(cudaDeviceSynchronize(), "synchronize");
    std::set<CudaStream*> streams;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      streams = streams_;
    }
    for (CudaStream* s : streams) s->synchronize();  // rethrows sticky host-task errors
  }

 private:
  void* allocate_on(std::size_t bytes, cudaStream_t stream, std::string_view what) {
    const std::uint64_t size = Arena::round_up(bytes == 0 ? 1 : bytes);
    // The calling thread's current device may be another (a thread per rank, say).
    STRATA_CUDA_CHECK(cudaSetDevice(options().ordinal), "cuda device ", options().ordinal);
    budget_.reserve(size, what);
    void* p = nullptr;
    const cudaError_t e = cudaMallocFromPoolAsync(&p, size, pool_, stream);
    if (e != cudaSuccess) {
      budget_.release(size);
      cudaGetLastError();
      STRATA_THROW(Errc::out_of_budget, "device tier: cudaMallocFromPoolAsync of ", format_bytes(size),
                   what.empty() ? "" : " for ", what, " failed (", cudaGetErrorName(e), ") with ",
                   format_bytes(budget_.used_bytes()), " of a ", format_bytes(budget_.budget_bytes()),
                   " budget in use: the GPU itself is full; lower the device budget");
    }
    std::lock_guard<std::mutex> lock(mutex_);
    sizes_.emplace(p, size);
    return p;
  }
  void free_on(void* ptr, cudaStream_t stream) {
    std::uint64_t size;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = sizes_.find(ptr);
      STRATA_CHECK(it != sizes_.end(), Errc::invalid_argument, "free: pointer ", ptr, " is not device memory of ",
                   name());
      size = it->second;
      sizes_.erase(it);
    }
    const cudaError_t e = cudaFreeAsync(ptr, stream);
    budget_.release(size);  // charged back at submission: the pool reuses it in stream order
    STRATA_CUDA_CHECK(e, "free");
  }

  Budget budget_;
  Budget pinned_budget_;
  cudaMemPool_t pool_{};
  cudaStream_t alloc_stream_{};
  std::string gpu_name_ = "GPU";
  mutable std::mutex mutex_;
  std::unordered_map<void*, std::uint64_t> sizes_;
  std::unordered_map<void*, std::size_t> pinned_;
  std::set<CudaStream*> streams_;
};

}  // namespace

std::unique_ptr<Device> create_cuda_device(const DeviceOptions& options) {
  return std::make_unique<CudaDevice>(options);
}

CudaInventory cuda_inventory() {
  CudaInventory inv;
  inv.built_with_cuda = true;
  cudaRuntimeGetVersion(&inv.runtime_version);
  cudaDriverGetVersion(&inv.driver_version);
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    inv.why = str_cat("no GPU (cudaGetDeviceCount: ", cudaGetErrorName(e), ": ", cudaGetErrorString(e), ")");
    cudaGetLastError();
    return inv;
  }
  if (count == 0) inv.why = "no GPU (cudaGetDeviceCount returned 0)";
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    inv.devices.push_back({i, prop.name, prop.totalGlobalMem, prop.major, prop.minor});
  }
  return inv;
}

}  // namespace strata::device
