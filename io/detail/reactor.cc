// The io thread (see reactor.h). Life of a request: submit() pushes it to the inbox and
// rings the doorbell; the io thread moves it to the round-robin queue, issues block-size
// pieces while fewer than queue_depth are in flight, and on each completion either
// resubmits the piece (EINTR/EAGAIN, short transfer), records the failure, or
// counts the bytes. A request finishes when nothing of it is left to issue or in flight.
#include "io/detail/reactor.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <system_error>

#include "io/aligned.h"
#include "io/detail/file_state.h"
#include "io/warn.h"

namespace strata::io::detail {
namespace {

constexpr std::uint64_t kDoorbellTag = ~std::uint64_t{0};
constexpr unsigned kMaxRetries = 1000;
constexpr unsigned kReapBatch = 64;

void bump_max(std::atomic<std::uint64_t>& max, std::uint64_t v) {
  std::uint64_t cur = max.load(std::memory_order_relaxed);
  while (v > cur && !max.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
  }
}

Status check_options(const EngineOptions& o) {
  if (o.queue_depth < 1 || o.queue_depth > 4096) {
    return {-EINVAL, "io engine: queue_depth " + std::to_string(o.queue_depth) + " is outside 1..4096"};
  }
  if (o.block_bytes == 0 || !is_aligned(o.block_bytes) || o.block_bytes > (1u << 30)) {
    return {-EINVAL, "io engine: block_bytes " + std::to_string(o.block_bytes) +
                         " must be a positive multiple of 4096 and at most 1 GiB"};
  }
  if (o.submit_batch < 1) return {-EINVAL, "io engine: submit_batch must be at least 1"};
  return {};
}

}  // namespace

Reactor::Reactor(const EngineOptions& options) : options_(options) {}

Result<std::unique_ptr<Reactor>> Reactor::create(const EngineOptions& options) {
  if (Status s = check_options(options); !s) return s;
  std::unique_ptr<Reactor> r(new Reactor(options));
  // Room for queue_depth pieces plus the doorbell read; the CQ is twice as large.
  const unsigned entries = options.queue_depth + 2;
  io_uring_params params{};
  if (options.sqpoll) {
    params.flags |= IORING_SETUP_SQPOLL;
    params.sq_thread_idle = options.sqpoll_idle_ms;
  }
  int rc = io_uring_queue_init_params(entries, &r->ring_, &params);
  if (rc < 0 && options.sqpoll) {
    warn_once("uring-sqpoll", "io engine: SQPOLL refused (" + errno_text(rc) +
                                  "); continuing without it (submissions cost a system call)");
    params = io_uring_params{};
    rc = io_uring_queue_init_params(entries, &r->ring_, &params);
  }
  if (rc < 0) {
    return Status(rc, "io engine: io_uring_queue_init(" + std::to_string(entries) +
                          " entries) failed: " + errno_text(rc) +
                          ". io_uring is unavailable here (old kernel, kernel.io_uring_disabled sysctl, or a "
                          "seccomp filter such as a container's); `strata info` shows what the kernel offers");
  }
  r->ring_ready_ = true;
  r->sqpoll_ = (params.flags & IORING_SETUP_SQPOLL) != 0;
  if (options.max_files > 0) {
    rc = io_uring_register_files_sparse(&r->ring_, options.max_files);
    r->files_table_ = rc >= 0;
    if (rc < 0)
      warn_once("uring-files", "io engine: no fixed-file table (" + errno_text(rc) + "); using plain descriptors");
    r->file_slots_.assign(r->files_table_ ? options.max_files : 0, false);
  }
  if (options.max_buffers > 0) {
    rc = io_uring_register_buffers_sparse(&r->ring_, options.max_buffers);
    r->buffers_table_ = rc >= 0;
    if (rc < 0) {
      warn_once("uring-buffers",
                "io engine: no fixed-buffer table (" + errno_text(rc) + "); using plain reads and writes");
    }
    r->buffer_slots_.assign(r->buffers_table_ ? options.max_buffers : 0, false);
  }
  r->doorbell_fd_ = eventfd(0, EFD_CLOEXEC);
  if (r->doorbell_fd_ < 0) return Status(-errno, "io engine: eventfd failed: " + errno_text(errno));
  r->pieces_.resize(options.queue_depth);
  for (std::uint32_t i = options.queue_depth; i > 0; --i) r->free_pieces_.push_back(i - 1);
  Reactor* self = r.get();
  try {
    r->thread_ = std::thread([self] { self->run(); });
  } catch (const std::system_error& e) {
    return Status(-EAGAIN, std::string("io engine: cannot start the io thread: ") + e.what());
  }
  r->thread_id_ = r->thread_.get_id();
  return r;
}

Reactor::~Reactor() {
  shutdown();
  if (ring_ready_) io_uring_queue_exit(&ring_);
  if (doorbell_fd_ >= 0) ::close(doorbell_fd_);
}

void Reactor::shutdown() noexcept {
  if (!thread_.joinable()) return;
  stopping_.store(true);
  ring_doorbell();
  thread_.join();
}

void Reactor::submit(std::unique_ptr<Request> request) {
  bool was_empty = false;
  {
    std::lock_guard<std::mutex> lock(inbox_mutex_);
    was_empty = inbox_.empty();
    inbox_.push_back(std::move(request));
  }
  // Only the empty -> non-empty transition needs a wake-up: the io thread drains the whole
  // inbox after each one. From the io thread itself (a callback) the loop sees it anyway.
  if (was_empty && std::this_thread::get_id() != thread_id_) ring_doorbell();
}

void Reactor::ring_doorbell() noexcept {
  const std::uint64_t one = 1;
  while (::write(doorbell_fd_, &one, sizeof one) < 0 && errno == EINTR) {
  }
}

void Reactor::arm_doorbell() {
  io_uring_sqe* sqe = get_sqe();
  io_uring_prep_read(sqe, doorbell_fd_, &doorbell_value_, sizeof doorbell_value_, ~std::uint64_t{0});
  io_uring_sqe_set_data64(sqe, kDoorbellTag);
  ++prepared_;
}

void Reactor::run() noexcept {
  arm_doorbell();
  for (;;) {
    take_inbox();
    fill();
    bool more = false;
    {
      std::lock_guard<std::mutex> lock(inbox_mutex_);
      more = !inbox_.empty();
    }
    if (stopping_.load() && live_ == 0 && !more) break;
    // Requests queued from this thread (callbacks) ring no doorbell: never sleep on them.
    submit_prepared(!more);
    reap();
  }
}

void Reactor::take_inbox() {
  std::vector<std::unique_ptr<Request>> batch;
  {
    std::lock_guard<std::mutex> lock(inbox_mutex_);
    batch.swap(inbox_);
  }
  for (auto& owned : batch) {
    Request* r = owned.release();
    ++live_;
    if (r->err != 0 || r->bytes == 0) {
      finish(r);
      continue;
    }
    r->queued = true;
    queue_.push_back(r);
  }
}

void Reactor::fill() {
  while (in_flight_ < options_.queue_depth && !queue_.empty()) {
    Request* r = queue_.front();
    queue_.pop_front();
    r->queued = false;
    issue(r);
    if (r->issued < r->bytes) {
      r->queued = true;
      queue_.push_back(r);
    }
  }
}

void Reactor::issue(Request* r) {
  const std::uint32_t index = free_pieces_.back();
  free_pieces_.pop_back();
  const bool primary = r->issued < r->primary_bytes;
  const std::uint64_t limit = primary ? r->primary_bytes : r->bytes;
  const auto len = static_cast<std::uint32_t>(std::min<std::uint64_t>(options_.block_bytes, limit - r->issued));
  pieces_[index] = Piece{r, r->offset + r->issued, r->buf + r->issued, len, len, !primary, 0};
  r->issued += len;
  ++r->in_flight;
  ++in_flight_;
  bump_max(counters_.max_in_flight, in_flight_);
  prep(index);
}

io_uring_sqe* Reactor::get_sqe() {
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
  while (sqe == nullptr) {
    // The SQ holds queue_depth + 2 entries, so this only happens under SQPOLL while the
    // kernel thread has not consumed earlier entries yet.
    submit_prepared(false);
    if (sqpoll_) io_uring_sqring_wait(&ring_);
    sqe = io_uring_get_sqe(&ring_);
  }
  return sqe;
}

void Reactor::prep(std::uint32_t index) {
  const Piece& p = pieces_[index];
  const Request& r = *p.req;
  const FileState& f = *r.file;
  io_uring_sqe* sqe = get_sqe();
  const bool fixed_file = !p.buffered && f.slot >= 0;
  const int fd = fixed_file ? f.slot : (p.buffered ? f.buffered_fd : f.fd);
  if (r.buf_index >= 0) {
    if (r.op == Op::read)
      io_uring_prep_read_fixed(sqe, fd, p.buf, p.len, p.offset, r.buf_index);
    else
      io_uring_prep_write_fixed(sqe, fd, p.buf, p.len, p.offset, r.buf_index);
    counters_.fixed_buffer_pieces.fetch_add(1, std::memory_order_relaxed);
  } else {
    if (r.op == Op::read)
      io_uring_prep_read(sqe, fd, p.buf, p.len, p.offset);
    else
      io_uring_prep_write(sqe, fd, p.buf, p.len, p.offset);
  }
  if (fixed_file) {
    sqe->flags |= IOSQE_FIXED_FILE;
    counters_.fixed_file_pieces.fetch_add(1, std::memory_order_relaxed);
  }
  if (p.buffered || !f.direct) counters_.buffered_pieces.fetch_add(1, std::memory_order_relaxed);
  io_uring_sqe_set_data64(sqe, std::uint64_t{index} + 1);
  counters_.pieces.fetch_add(1, std::memory_order_relaxed);
  if (++prepared_ >= options_.submit_batch) submit_prepared(false);
}

void Reactor::submit_prepared(bool wait) {
  const int rc = wait ? io_uring_submit_and_wait(&ring_, 1) : io_uring_submit(&ring_);
  counters_.submit_calls.fetch_add(1, std::memory_order_relaxed);
  if (rc >= 0) {
    prepared_ = 0;
    return;
  }
  // Unsubmitted SQEs stay in the ring and go with the next call. EINTR: a signal ended the
  // wait; EBUSY/EAGAIN: completions must be reaped or the kernel is short of memory first.
  if (rc != -EINTR && rc != -EBUSY && rc != -EAGAIN) {
    warn_once("uring-submit", "io engine: io_uring_submit failed: " + errno_text(rc) + "; retrying");
  }
  if (rc == -EINTR)
    counters_.interrupted_calls.fetch_add(1, std::memory_order_relaxed);
  else
    std::this_thread::sleep_for(std::chrono::microseconds(100));
}

void Reactor::reap() {
  io_uring_cqe* cqes[kReapBatch];
  for (;;) {
    const unsigned n = io_uring_peek_batch_cqe(&ring_, cqes, kReapBatch);
    if (n == 0) return;
    // Copy out and advance first: handlers prepare new SQEs and may submit.
    std::pair<std::uint64_t, int> done[kReapBatch];
    for (unsigned i = 0; i < n; ++i) done[i] = {io_uring_cqe_get_data64(cqes[i]), cqes[i]->res};
    io_uring_cq_advance(&ring_, n);
    for (unsigned i = 0; i < n; ++i) {
      if (done[i].first == kDoorbellTag) {
        if (!stopping_.load()) arm_doorbell();
      } else {
        on_piece(static_cast<std::uint32_t>(done[i].first - 1), done[i].second);
      }
    }
  }
}

void Reactor::on_piece(std::uint32_t index, int res) {
  Piece& p = pieces_[index];
  Request* r = p.req;
  if ((res == -EINTR || res == -EAGAIN) && r->err == 0 && p.retries < kMaxRetries) {
    ++p.retries;
    counters_.retries.fetch_add(1, std::memory_order_relaxed);
    prep(index);
    return;
  }
  if (res < 0) {
    fail(r, p, res, "");
  } else if (res == 0) {
    if (r->op == Op::read) {
      fail(r, p, -ENODATA, "end of file inside the region (the file is shorter than expected: truncated?)");
    } else {
      fail(r, p, -EIO, "the kernel wrote 0 bytes");
    }
  } else if (static_cast<std::uint32_t>(res) < p.len) {
    counters_.short_transfers.fetch_add(1, std::memory_order_relaxed);
    p.offset += static_cast<std::uint32_t>(res);
    p.buf += res;
    p.len -= static_cast<std::uint32_t>(res);
    p.retries = 0;
    // The remainder is resubmitted even when another piece has failed: each piece runs to
    // success or its own error, so the failure reported is exactly the lowest offset not
    // transferred. An unaligned remainder cannot go O_DIRECT; the buffered descriptor
    // takes any.
    if (!p.buffered && r->file->direct && !(is_aligned(p.offset) && is_aligned(p.len) && is_aligned(p.buf))) {
      p.buffered = true;
    }
    prep(index);
    return;
  } else {
    r->done += p.total;
    (r->op == Op::read ? counters_.bytes_read : counters_.bytes_written).fetch_add(p.total, std::memory_order_relaxed);
  }
  release_piece(index);
}

void Reactor::fail(Request* r, const Piece& p, int err, const std::string& what) {
  // Pieces run concurrently, so several may fail; the one at the lowest offset is reported:
  // everything before it was transferred (or failed later in the file).
  if (r->err != 0 && p.offset >= r->fail_offset) return;
  r->err = err;
  r->fail_offset = p.offset;
  const char* op = r->op == Op::read ? "read" : "write";
  r->message = describe_failure(op, r->file->path, p.offset, p.len, err);
  if (!what.empty()) r->message += ": " + what;
  r->message += " [request: " + std::to_string(r->bytes) + " bytes at offset " + std::to_string(r->offset) +
                (p.buffered || !r->file->direct ? ", buffered" : ", O_DIRECT") + "]";
  const std::string hint = errno_hint(err);
  if (!hint.empty()) r->message += ". " + hint;
  if (r->queued) {
    queue_.erase(std::find(queue_.begin(), queue_.end(), r));
    r->queued = false;
  }
}

void Reactor::release_piece(std::uint32_t index) {
  Request* r = pieces_[index].req;
  pieces_[index].req = nullptr;
  free_pieces_.push_back(index);
  --in_flight_;
  --r->in_flight;
  if (r->in_flight == 0 && !r->queued && (r->err != 0 || r->issued == r->bytes)) finish(r);
}

void Reactor::finish(Request* r) {
  std::unique_ptr<Request> owned(r);
  --live_;
  counters_.requests.fetch_add(1, std::memory_order_relaxed);
  if (r->err != 0) counters_.failed_requests.fetch_add(1, std::memory_order_relaxed);
  IoResult result{r->err, r->done, std::move(r->message)};
  if (r->callback) {
    // No exception may leave the io thread (it would end the process): a throwing callback is reported.
    try {
      r->callback(result);
    } catch (const std::exception& e) {
      warn(std::string("io engine: a completion callback threw (callbacks must not throw): ") + e.what());
    } catch (...) {
      warn("io engine: a completion callback threw a non-standard exception (callbacks must not throw)");
    }
  } else if (r->future) {
    complete(*r->future, std::move(result));
  }
}

int Reactor::register_file(int fd) {
  if (!files_table_) return -EOPNOTSUPP;
  std::lock_guard<std::mutex> lock(slot_mutex_);
  const auto it = std::find(file_slots_.begin(), file_slots_.end(), false);
  if (it == file_slots_.end()) return -ENOBUFS;
  const int slot = static_cast<int>(it - file_slots_.begin());
  const int rc = io_uring_register_files_update(&ring_, static_cast<unsigned>(slot), &fd, 1);
  if (rc < 0) return rc;
  *it = true;
  return slot;
}

void Reactor::unregister_file(int slot) noexcept {
  std::lock_guard<std::mutex> lock(slot_mutex_);
  if (slot < 0 || static_cast<std::size_t>(slot) >= file_slots_.size() || !file_slots_[slot]) return;
  int none = -1;
  (void)io_uring_register_files_update(&ring_, static_cast<unsigned>(slot), &none, 1);
  file_slots_[slot] = false;
}

int Reactor::register_buffer(void* ptr, std::size_t bytes) {
  if (!buffers_table_) return -EOPNOTSUPP;
  if (ptr == nullptr || bytes == 0 || bytes > (std::size_t{1} << 30)) return -EINVAL;
  std::lock_guard<std::mutex> lock(slot_mutex_);
  const auto it = std::find(buffer_slots_.begin(), buffer_slots_.end(), false);
  if (it == buffer_slots_.end()) return -ENOBUFS;
  const int slot = static_cast<int>(it - buffer_slots_.begin());
  iovec iov{ptr, bytes};
  __u64 tag = 0;
  const int rc = io_uring_register_buffers_update_tag(&ring_, static_cast<unsigned>(slot), &iov, &tag, 1);
  if (rc < 0) return rc;
  *it = true;
  std::unique_lock<std::shared_mutex> wlock(buffers_mutex_);
  const auto start = reinterpret_cast<std::uintptr_t>(ptr);
  buffers_[start] = {start + bytes, slot};
  return slot;
}

void Reactor::unregister_buffer(int slot) noexcept {
  std::lock_guard<std::mutex> lock(slot_mutex_);
  if (slot < 0 || static_cast<std::size_t>(slot) >= buffer_slots_.size() || !buffer_slots_[slot]) return;
  {
    std::unique_lock<std::shared_mutex> wlock(buffers_mutex_);
    for (auto it = buffers_.begin(); it != buffers_.end(); ++it) {
      if (it->second.second == slot) {
        buffers_.erase(it);
        break;
      }
    }
  }
  iovec iov{nullptr, 0};
  __u64 tag = 0;
  (void)io_uring_register_buffers_update_tag(&ring_, static_cast<unsigned>(slot), &iov, &tag, 1);
  buffer_slots_[slot] = false;
}

int Reactor::find_buffer(const void* ptr, std::uint64_t bytes) const {
  const auto p = reinterpret_cast<std::uintptr_t>(ptr);
  std::shared_lock<std::shared_mutex> lock(buffers_mutex_);
  auto it = buffers_.upper_bound(p);
  if (it == buffers_.begin()) return -1;
  --it;
  return p >= it->first && p + bytes <= it->second.first ? it->second.second : -1;
}

EngineStats Reactor::stats() const noexcept {
  auto ld = [](const std::atomic<std::uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  const Counters& c = counters_;
  return {ld(c.requests),          ld(c.failed_requests),   ld(c.pieces),        ld(c.fixed_buffer_pieces),
          ld(c.fixed_file_pieces), ld(c.buffered_pieces),   ld(c.submit_calls),  ld(c.short_transfers),
          ld(c.retries),           ld(c.interrupted_calls), ld(c.max_in_flight), ld(c.bytes_read),
          ld(c.bytes_written)};
}

}  // namespace strata::io::detail
