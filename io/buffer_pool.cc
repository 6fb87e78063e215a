// BufferPool (see buffer_pool.h): one anonymous mapping cut into 4 KiB-aligned buffers.
#include "io/buffer_pool.h"

#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <mutex>
#include <utility>
#include <vector>

#include "io/aligned.h"
#include "io/detail/file_state.h"
#include "io/detail/reactor.h"
#include "io/engine.h"
#include "io/warn.h"

namespace strata::io {
namespace {

// mlock/munlock as system calls: AddressSanitizer intercepts the libc wrappers and makes
// them succeed without locking, which would hide a refusal.
int lock_pages(void* p, std::size_t n) { return static_cast<int>(::syscall(SYS_mlock, p, n)); }
void unlock_pages(void* p, std::size_t n) { ::syscall(SYS_munlock, p, n); }

}  // namespace

namespace detail {

struct PoolState {
  std::byte* base = nullptr;
  std::size_t mapped_bytes = 0;
  std::size_t buffer_bytes = 0;
  std::size_t count = 0;
  bool locked = false;
  bool pinned = false;
  PinHooks hooks;
  std::shared_ptr<Registry> registry;  // null when not registered
  std::vector<int> slots;              // fixed-buffer slot per buffer, or -1
  mutable std::mutex mutex;
  std::condition_variable cv;
  std::vector<int> free;

  ~PoolState() {
    if (registry) {
      std::lock_guard<std::mutex> lock(registry->mutex);
      if (registry->reactor != nullptr) {
        for (int slot : slots) {
          if (slot >= 0) registry->reactor->unregister_buffer(slot);
        }
      }
    }
    if (pinned && hooks.unpin) hooks.unpin(base, mapped_bytes);
    if (base != nullptr) {
      if (locked) unlock_pages(base, mapped_bytes);
      munmap(base, mapped_bytes);
    }
  }

  void give_back(int index) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      free.push_back(index);
    }
    cv.notify_one();
  }
};

}  // namespace detail

namespace {

std::string memlock_text() {
  rlimit lim{};
  if (getrlimit(RLIMIT_MEMLOCK, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY) return "unlimited";
  return std::to_string(lim.rlim_cur) + " bytes";
}

}  // namespace

PoolBuffer::PoolBuffer(std::shared_ptr<detail::PoolState> pool, int index) : pool_(std::move(pool)), index_(index) {}

PoolBuffer::PoolBuffer(PoolBuffer&& other) noexcept
    : pool_(std::move(other.pool_)), index_(std::exchange(other.index_, -1)) {}

PoolBuffer& PoolBuffer::operator=(PoolBuffer&& other) noexcept {
  if (this != &other) {
    release();
    pool_ = std::move(other.pool_);
    index_ = std::exchange(other.index_, -1);
  }
  return *this;
}

std::byte* PoolBuffer::data() const noexcept {
  return pool_ ? pool_->base + static_cast<std::size_t>(index_) * pool_->buffer_bytes : nullptr;
}

std::size_t PoolBuffer::bytes() const noexcept { return pool_ ? pool_->buffer_bytes : 0; }

void PoolBuffer::release() noexcept {
  if (!pool_) return;
  pool_->give_back(index_);
  pool_.reset();
  index_ = -1;
}

Result<BufferPool> BufferPool::create(Engine* engine, const PoolOptions& o) {
  if (o.count == 0 || o.buffer_bytes == 0) {
    return Status(-EINVAL, "buffer pool: count and buffer_bytes must be positive (got " + std::to_string(o.count) +
                               " x " + std::to_string(o.buffer_bytes) + " bytes)");
  }
  auto st = std::make_shared<detail::PoolState>();
  st->buffer_bytes = align_up(o.buffer_bytes);
  st->count = o.count;
  st->mapped_bytes = st->buffer_bytes * o.count;
  st->hooks = o.hooks;
  void* p = mmap(nullptr, st->mapped_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    return Status(-err, "buffer pool: mmap of " + std::to_string(st->mapped_bytes) + " bytes (" +
                            std::to_string(o.count) + " x " + std::to_string(st->buffer_bytes) +
                            ") failed: " + errno_text(err) + ". Use fewer or smaller buffers");
  }
  st->base = static_cast<std::byte*>(p);
  if (o.lock_memory) {
    if (lock_pages(st->base, st->mapped_bytes) == 0) {
      st->locked = true;
    } else {
      const int err = errno;
      warn_once("pool-mlock", "buffer pool: mlock of " + std::to_string(st->mapped_bytes) + " bytes refused (" +
                                  errno_text(err) + "; RLIMIT_MEMLOCK = " + memlock_text() +
                                  "). Continuing with pageable memory: pages may be swapped out. Raise the "
                                  "limit with `ulimit -l unlimited` (or memlock in /etc/security/limits.conf)");
    }
  }
  if (o.hooks.pin) {
    const int rc = o.hooks.pin(st->base, st->mapped_bytes);
    st->pinned = rc == 0;
    if (rc != 0) {
      warn_once("pool-pin", "buffer pool: the pin hook refused " + std::to_string(st->mapped_bytes) + " bytes (" +
                                errno_text(rc) + "); device copies from these buffers go through pageable memory");
    }
  }
  st->slots.assign(o.count, -1);
  if (engine != nullptr && o.register_buffers) {
    st->registry = engine->registry();
    for (std::size_t i = 0; i < o.count; ++i) {
      const int slot = engine->register_buffer(st->base + i * st->buffer_bytes, st->buffer_bytes);
      if (slot < 0) {
        warn_once("pool-register:" + std::to_string(slot),
                  "buffer pool: registering buffers with io_uring refused (" + errno_text(slot) +
                      (slot == -ENOMEM ? "; registered buffers count against RLIMIT_MEMLOCK = " + memlock_text() : "") +
                      "); the remaining buffers use plain (unregistered) reads and writes");
        break;
      }
      st->slots[i] = slot;
    }
  }
  st->free.reserve(o.count);
  for (std::size_t i = o.count; i > 0; --i) st->free.push_back(static_cast<int>(i - 1));
  return BufferPool(std::move(st));
}

PoolBuffer BufferPool::acquire() {
  std::unique_lock<std::mutex> lock(state_->mutex);
  state_->cv.wait(lock, [&] { return !state_->free.empty(); });
  const int index = state_->free.back();
  state_->free.pop_back();
  return PoolBuffer(state_, index);
}

PoolBuffer BufferPool::try_acquire() { return acquire_for(std::chrono::milliseconds(0)); }

PoolBuffer BufferPool::acquire_for(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(state_->mutex);
  if (!state_->cv.wait_for(lock, timeout, [&] { return !state_->free.empty(); })) return {};
  const int index = state_->free.back();
  state_->free.pop_back();
  return PoolBuffer(state_, index);
}

std::size_t BufferPool::count() const noexcept { return state_->count; }
std::size_t BufferPool::buffer_bytes() const noexcept { return state_->buffer_bytes; }
std::size_t BufferPool::available() const noexcept {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->free.size();
}
bool BufferPool::locked() const noexcept { return state_->locked; }
bool BufferPool::pinned() const noexcept { return state_->pinned; }
std::size_t BufferPool::registered() const noexcept {
  std::size_t n = 0;
  for (int s : state_->slots) n += s >= 0 ? 1 : 0;
  return n;
}

}  // namespace strata::io
