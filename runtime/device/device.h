// The Device/Stream/Event contract (docs/design.md, "runtime/device") with two backends:
// `host`, an emulated GPU whose memory is a capped arena in host RAM and whose streams are
// ordered worker threads; and `cuda`, the same contract on the CUDA runtime.
//
// Protocol. A Device owns device memory (allocate/free, or stream-ordered
// allocate_async/free_async), pinned host memory (allocate_pinned/free_pinned), and makes
// Streams, Events and HostSignals. Every allocation is charged to a hard byte budget per tier; asking
// past it throws Errc::out_of_budget naming the tier, bytes asked, bytes in use and the
// budget. Work submitted to one Stream runs in submission order. Event::record captures the
// work submitted to that stream so far; Stream::wait makes later work on another stream wait
// for it, without blocking the caller; Stream::wait on a HostSignal does the same for work
// the host completes outside every stream. An error inside stream work (a throwing host task,
// a failed CUDA call) is sticky: that stream skips later data work and every synchronize()
// rethrows it. Streams, Events and HostSignals must not outlive their Device; memory must be freed
// before the Device is destroyed (leaks are reported).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace strata::device {

enum class Backend { host, cuda };
const char* backend_name(Backend b) noexcept;
Backend parse_backend(std::string_view text);  // "host" | "cuda"; throws naming the text

enum class CopyKind { host_to_device, device_to_host, device_to_device, host_to_host };

struct DeviceOptions {
  Backend backend = Backend::host;
  int ordinal = 0;                                      // CUDA device index
  std::uint64_t budget_bytes = std::uint64_t{1} << 30;  // device tier budget
  std::uint64_t pinned_budget_bytes = std::uint64_t{1} << 30;
  double link_gbps = 0;  // host backend: H2D and D2H bandwidth per direction; 0 = unthrottled
  // Host backend: device memory as out of the CPU's reach as a GPU's. An x86 memory
  // protection key lets only the device's stream work (each task on its worker thread
  // alone) and code inside a CpuAccessScope touch it; any other CPU access is a SIGSEGV.
  // Runs code written for both backends under the CUDA backend's rules on a machine without
  // a GPU. Throws Errc::unsupported where the CPU or kernel has no protection keys.
  bool guard_memory = false;
};

struct MemoryStats {
  std::uint64_t used_bytes = 0;  // bytes handed out (rounded to the allocation granule)
  std::uint64_t peak_bytes = 0;
  std::uint64_t budget_bytes = 0;
  std::uint64_t largest_free_bytes = 0;  // largest single allocation that would succeed now
  std::uint64_t allocations = 0;         // live allocations
  // 1 - largest_free / free: 0 when the free space is one block.
  double fragmentation = 0;
};

class Event {
 public:
  virtual ~Event() = default;
  // True when the work captured by the last record() has finished (or never recorded).
  virtual bool query() = 0;
  virtual void synchronize() = 0;
  // Milliseconds from this event's completion to `later`'s; both must have completed.
  virtual double elapsed_ms(Event& later) = 0;
};

// A counter that the host raises and device streams wait on: how work outside every stream
// (file I/O on a thread of its own) tells a stream that its input is ready, with no host
// function on the stream. raise(v), from any host thread, sets the value to v; values only
// grow, compared modulo 2^32 ((int32)(value - v) >= 0 means reached). Stream::wait(signal, v)
// makes work submitted later to that stream wait until the value reaches v, without blocking
// the caller. Host backend: the stream's worker blocks on it; CUDA: the stream polls a mapped
// pinned word (cuStreamWaitValue32). A signal must be raised to every value a stream waits
// for before it is destroyed.
class HostSignal {
 public:
  virtual ~HostSignal() = default;
  virtual void raise(std::uint32_t value) = 0;
  virtual std::uint32_t value() const = 0;
};

// Whether `value` has reached `target` in a HostSignal's modulo-2^32 order.
constexpr bool signal_reached(std::uint32_t value, std::uint32_t target) noexcept {
  return static_cast<std::int32_t>(value - target) >= 0;
}

class Stream {
 public:
  virtual ~Stream() = default;
  virtual void copy_async(void* dst, const void* src, std::size_t bytes, CopyKind kind) = 0;
  virtual void memset_async(void* dst, int value, std::size_t bytes) = 0;
  // Runs fn in stream order. Host backend: on the stream's worker (this is how host
  // "kernels" run). CUDA: as a host function (cudaLaunchHostFunc); fn must not call CUDA.
  // An exception thrown by fn becomes the stream's sticky error.
  virtual void launch_host(std::function<void()> fn) = 0;
  virtual void record(Event& event) = 0;
  virtual void wait(Event& event) = 0;
  virtual void wait(HostSignal& signal, std::uint32_t value) = 0;  // see HostSignal
  virtual bool query() = 0;                                        // all submitted work finished
  virtual void synchronize() = 0;                                  // blocks; rethrows the sticky error, if any
  virtual void* native_handle() noexcept = 0;                      // cudaStream_t, or nullptr on host
  virtual Backend backend() const noexcept = 0;
};

class Device {
 public:
  static std::unique_ptr<Device> create(const DeviceOptions& options);
  virtual ~Device() = default;

  virtual Backend backend() const noexcept = 0;
  virtual std::string name() const = 0;
  const DeviceOptions& options() const noexcept { return options_; }

  // Device memory. `what` names the allocation in budget errors ("layer 3 params").
  virtual void* allocate(std::size_t bytes, std::string_view what = {}) = 0;
  virtual void free(void* ptr) = 0;
  // Stream-ordered: usable by work on `stream` submitted after this call; the bytes return
  // to the budget when `stream` reaches the free.
  virtual void* allocate_async(std::size_t bytes, Stream& stream, std::string_view what = {}) = 0;
  virtual void free_async(void* ptr, Stream& stream) = 0;
  virtual MemoryStats memory_stats() const = 0;
  // Gives memory freed to the device's pool back to the device itself, so that other users of
  // the GPU (another process, another library) can allocate it (Engine::offload_states). The
  // host backend holds nothing beyond its budget: nothing to do.
  virtual void release_cached() {}

  // Page-locked host memory for fast, asynchronous copies; its own budget.
  virtual void* allocate_pinned(std::size_t bytes, std::string_view what = {}) = 0;
  virtual void free_pinned(void* ptr) = 0;
  virtual MemoryStats pinned_stats() const = 0;

  virtual std::unique_ptr<Stream> create_stream() = 0;
  virtual std::unique_ptr<Event> create_event() = 0;
  virtual std::unique_ptr<HostSignal> create_host_signal() = 0;
  virtual void synchronize() = 0;  // every stream of this device

  // Whether the calling thread may touch device memory from the CPU (see guard_memory):
  // sets it and returns the previous setting. Only a guarded host device changes anything;
  // use CpuAccessScope.
  virtual bool set_cpu_access(bool allow) noexcept {
    (void)allow;
    return true;
  }

 protected:
  explicit Device(const DeviceOptions& options) : options_(options) {}

 private:
  DeviceOptions options_;
};

// For the scope's life the calling thread may read and write the device's memory from the
// CPU: what a trainer on the host device does with the engine's views. A no-op unless the
// device guards its memory (DeviceOptions::guard_memory).
class CpuAccessScope {
 public:
  explicit CpuAccessScope(Device& dev) noexcept : dev_(dev), previous_(dev.set_cpu_access(true)) {}
  ~CpuAccessScope() { dev_.set_cpu_access(previous_); }
  CpuAccessScope(const CpuAccessScope&) = delete;
  CpuAccessScope& operator=(const CpuAccessScope&) = delete;

 private:
  Device& dev_;
  bool previous_;
};

// Whether the CPU may read and write `dev`'s memory outside its stream work: true for an
// unguarded host device only. Code written for every backend moves host data in and out
// with copies and stream work where this is false (CUDA, and a guarded host device, which
// holds code to the CUDA rule where it can be run).
inline bool cpu_reaches(const Device& dev) noexcept {
  return dev.backend() == Backend::host && !dev.options().guard_memory;
}

// Which of a Device's memories an Allocation holds: device memory (allocate/free) or
// pinned host memory (allocate_pinned/free_pinned).
enum class MemoryKind { device, pinned };

// RAII owner of one allocation of a Device's memory of kind K; movable, not copyable. reset()
// frees it now; a free that fails there is logged, not thrown (it runs in destructors).
template <MemoryKind K> class Allocation {
 public:
  Allocation() = default;
  Allocation(Device& dev, std::size_t bytes, std::string_view what = {})
      : dev_(&dev),
        ptr_(K == MemoryKind::device ? dev.allocate(bytes, what) : dev.allocate_pinned(bytes, what)),
        bytes_(bytes) {}
  Allocation(Allocation&& o) noexcept { swap(o); }
  Allocation& operator=(Allocation&& o) noexcept {
    reset();
    swap(o);
    return *this;
  }
  ~Allocation() { reset(); }
  void reset() noexcept;
  void* get() const noexcept { return ptr_; }
  std::size_t bytes() const noexcept { return bytes_; }
  template <class T> T* as() const noexcept { return static_cast<T*>(ptr_); }

 private:
  void swap(Allocation& o) noexcept {
    std::swap(dev_, o.dev_);
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
  }
  Device* dev_ = nullptr;
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};
extern template class Allocation<MemoryKind::device>;
extern template class Allocation<MemoryKind::pinned>;
using DeviceBuffer = Allocation<MemoryKind::device>;
using PinnedBuffer = Allocation<MemoryKind::pinned>;

// What this machine's CUDA runtime offers. count is 0 with `why` filled when there is no
// usable GPU or Strata was built without CUDA.
struct CudaDeviceInfo {
  int ordinal = 0;
  std::string name;
  std::uint64_t total_bytes = 0;
  int cc_major = 0, cc_minor = 0;
};
struct CudaInventory {
  bool built_with_cuda = false;
  int runtime_version = 0;
  int driver_version = 0;
  std::string why;  // empty when devices were found
  std::vector<CudaDeviceInfo> devices;
};
CudaInventory cuda_inventory();

}  // namespace strata::device

namespace strata::device {
// cuda when this build has CUDA and a GPU is present, else host.
Backend default_backend();
}  // namespace strata::device
