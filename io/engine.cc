// Engine: the public face of the reactor (see engine.h). Requests are validated and their
// direct/buffered split and fixed-buffer slot are decided here, on the caller's thread.
#include "io/engine.h"

#include <cerrno>

#include "io/aligned.h"
#include "io/detail/file_state.h"
#include "io/detail/reactor.h"

namespace strata::io {

Engine::Engine(std::unique_ptr<detail::Reactor> reactor, std::shared_ptr<detail::Registry> registry)
    : reactor_(std::move(reactor)), registry_(std::move(registry)) {}

Result<Engine> Engine::create(const EngineOptions& options) {
  auto reactor = detail::Reactor::create(options);
  if (!reactor) return reactor.status();
  auto registry = std::make_shared<detail::Registry>();
  registry->reactor = reactor.value().get();
  return Engine(std::move(reactor).value(), std::move(registry));
}

Engine::Engine(Engine&& other) noexcept : reactor_(std::move(other.reactor_)), registry_(std::move(other.registry_)) {}

Engine& Engine::operator=(Engine&& other) noexcept {
  if (this != &other) {
    shutdown();
    reactor_ = std::move(other.reactor_);
    registry_ = std::move(other.registry_);
  }
  return *this;
}

Engine::~Engine() { shutdown(); }

void Engine::shutdown() noexcept {
  if (!reactor_) return;
  {
    // From now on Files and pools leave their slots alone: the ring is going away. This
    // must not be held while the io thread drains (it may free a File's last reference).
    std::lock_guard<std::mutex> lock(registry_->mutex);
    registry_->reactor = nullptr;
  }
  reactor_->shutdown();
  reactor_.reset();
}

const EngineOptions& Engine::options() const noexcept {
  static const EngineOptions none{};
  return reactor_ ? reactor_->options() : none;
}

bool Engine::sqpoll() const noexcept { return reactor_ && reactor_->sqpoll(); }

namespace {

std::unique_ptr<detail::Request> make_request(detail::Op op, const File& file, std::uint64_t offset, void* buf,
                                              std::uint64_t bytes, const detail::Reactor* reactor) {
  auto r = std::make_unique<detail::Request>();
  r->op = op;
  r->file = file.state();
  r->offset = offset;
  r->buf = static_cast<std::byte*>(buf);
  r->bytes = bytes;
  const char* name = op == detail::Op::read ? "read" : "write";
  if (reactor == nullptr) {
    r->err = -EINVAL;
    r->message = std::string(name) + ": the Engine was moved from";
  } else if (!r->file) {
    r->err = -EBADF;
    r->message = describe_failure(name, "", offset, bytes, EBADF) + ": the File is not open";
  } else if (bytes > 0 && buf == nullptr) {
    r->err = -EFAULT;
    r->message = describe_failure(name, r->file->path, offset, bytes, EFAULT) + ": null buffer";
  } else if (offset + bytes < offset) {
    r->err = -EINVAL;
    r->message = describe_failure(name, r->file->path, offset, bytes, EINVAL) + ": the region wraps past 2^64";
  } else {
    if (!r->file->direct) {
      r->primary_bytes = bytes;
    } else if (is_aligned(offset) && is_aligned(buf)) {
      r->primary_bytes = align_down(bytes);  // the tail goes through the buffered descriptor
    }
    r->buf_index = reactor->find_buffer(buf, bytes);
  }
  return r;
}

}  // namespace

IoFuture Engine::read(const File& file, std::uint64_t offset, void* dst, std::uint64_t bytes) {
  auto r = make_request(detail::Op::read, file, offset, dst, bytes, reactor_.get());
  auto state = detail::make_future_state();
  r->future = state;
  if (reactor_)
    reactor_->submit(std::move(r));
  else
    detail::complete(*state, IoResult{r->err, 0, r->message});
  return IoFuture(state);
}

IoFuture Engine::write(const File& file, std::uint64_t offset, const void* src, std::uint64_t bytes) {
  auto r = make_request(detail::Op::write, file, offset, const_cast<void*>(src), bytes, reactor_.get());
  auto state = detail::make_future_state();
  r->future = state;
  if (reactor_)
    reactor_->submit(std::move(r));
  else
    detail::complete(*state, IoResult{r->err, 0, r->message});
  return IoFuture(state);
}

void Engine::read(const File& file, std::uint64_t offset, void* dst, std::uint64_t bytes, Callback done) {
  auto r = make_request(detail::Op::read, file, offset, dst, bytes, reactor_.get());
  if (!reactor_) {
    done(IoResult{r->err, 0, r->message});
    return;
  }
  r->callback = std::move(done);
  reactor_->submit(std::move(r));
}

void Engine::write(const File& file, std::uint64_t offset, const void* src, std::uint64_t bytes, Callback done) {
  auto r = make_request(detail::Op::write, file, offset, const_cast<void*>(src), bytes, reactor_.get());
  if (!reactor_) {
    done(IoResult{r->err, 0, r->message});
    return;
  }
  r->callback = std::move(done);
  reactor_->submit(std::move(r));
}

int Engine::register_buffer(void* ptr, std::size_t bytes) {
  return reactor_ ? reactor_->register_buffer(ptr, bytes) : -EINVAL;
}

void Engine::unregister_buffer(int slot) noexcept {
  if (reactor_) reactor_->unregister_buffer(slot);
}

EngineStats Engine::stats() const noexcept { return reactor_ ? reactor_->stats() : EngineStats{}; }

}  // namespace strata::io
