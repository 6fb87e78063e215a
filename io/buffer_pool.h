// BufferPool: a fixed set of 4 KiB-aligned host buffers for O_DIRECT I/O. Each buffer is
// registered with the engine's ring (fixed buffers: the kernel pins them once instead of
// on every request), locked in RAM with mlock, and optionally pinned with a device through
// PinHooks (the offload layer passes cudaHostRegister/cudaHostUnregister, so the GPU can
// copy from them directly while io/ knows nothing of CUDA).
//
// Protocol: create() allocates and prepares every buffer up front; acquire() lends one
// (blocking until one is free), the PoolBuffer lease returns it when released or
// destroyed. Leases keep the pool's memory alive, so a lease may outlive its BufferPool.
// The pool may outlive the Engine (its registrations simply end with the ring). Where the
// kernel refuses mlock or registration, the pool still works and says so once.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>

#include "io/status.h"

namespace strata::io {

class Engine;

namespace detail {
struct PoolState;
}

struct PinHooks {
  // Called once for the pool's memory after allocation; returns 0 or -errno. On failure the
  // pool continues unpinned, with a warning naming the error.
  std::function<int(void* ptr, std::size_t bytes)> pin;
  // Called before the memory is freed, only if pin succeeded.
  std::function<void(void* ptr, std::size_t bytes)> unpin;
};

struct PoolOptions {
  std::size_t buffer_bytes = 1u << 20;  // rounded up to 4 KiB
  std::size_t count = 4;
  bool lock_memory = true;       // mlock (falls back to pageable memory with a warning)
  bool register_buffers = true;  // fixed buffers in the engine's ring
  PinHooks hooks;
};

class PoolBuffer {
 public:
  PoolBuffer() = default;
  PoolBuffer(std::shared_ptr<detail::PoolState> pool, int index);
  PoolBuffer(PoolBuffer&& other) noexcept;
  PoolBuffer& operator=(PoolBuffer&& other) noexcept;
  PoolBuffer(const PoolBuffer&) = delete;
  PoolBuffer& operator=(const PoolBuffer&) = delete;
  ~PoolBuffer() { release(); }

  bool valid() const noexcept { return pool_ != nullptr; }
  std::byte* data() const noexcept;
  std::size_t bytes() const noexcept;  // the pool's buffer size (a multiple of 4 KiB)
  int index() const noexcept { return index_; }
  template <class T> T* as() const noexcept { return reinterpret_cast<T*>(data()); }
  void release() noexcept;  // gives the buffer back; the lease becomes empty

 private:
  std::shared_ptr<detail::PoolState> pool_;
  int index_ = -1;
};

class BufferPool {
 public:
  // engine may be null: then nothing is registered.
  static Result<BufferPool> create(Engine* engine, const PoolOptions& options);

  PoolBuffer acquire();                                       // blocks until a buffer is free
  PoolBuffer try_acquire();                                   // empty if none is free
  PoolBuffer acquire_for(std::chrono::milliseconds timeout);  // empty on timeout

  std::size_t count() const noexcept;
  std::size_t buffer_bytes() const noexcept;
  std::size_t available() const noexcept;
  bool locked() const noexcept;             // mlock succeeded
  bool pinned() const noexcept;             // the pin hook succeeded
  std::size_t registered() const noexcept;  // buffers registered with the ring

 private:
  explicit BufferPool(std::shared_ptr<detail::PoolState> state) : state_(std::move(state)) {}
  std::shared_ptr<detail::PoolState> state_;
};

}  // namespace strata::io
