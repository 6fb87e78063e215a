// OptimizerSwapper::Step (see optimizer_swapper.h): the read/compute/write pipeline of a step,
// handed out one sub-group at a time.
#include <algorithm>
#include <chrono>
#include <deque>

#include "offload/detail/swapper_impl.h"
#include "runtime/core/trace.h"

namespace strata::offload {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

}  // namespace

struct OptimizerSwapper::Step::State {
  struct Pending {
    std::size_t chunk;
    int buffer;
    io::SwapOp op;
    Clock::time_point issued = Clock::now();
  };
  OptimizerSwapper::Impl& I;
  bool defer_commit = false, read_only = false, first_moment_only = false;
  bool may_commit = true;  // a sub-group may commit before finish() when its length has no spare free
  bool finished = false;
  std::vector<std::size_t> seq;  // the chunks in visiting order: each tensor's sub-groups in offset order
  std::deque<Pending> reads, writes;
  std::vector<int> free_buffers;
  std::size_t next_read = 0;  // seq position of the next read to issue
  std::size_t handed = 0;     // sub-groups taken so far
  std::size_t max_reads = 1;
  std::optional<Pending> taken;  // the sub-group the caller holds
  Clock::time_point taken_at;
  bool ascending = false, open = true;
  SwapperStats st;
  Clock::time_point t0 = Clock::now();

  explicit State(OptimizerSwapper::Impl& impl) : I(impl) {}

  void trace(const char* lane, const std::string& name, Clock::time_point from) const {
    Tracer* tracer = I.options.tracer;
    if (tracer != nullptr && tracer->enabled()) tracer->record(lane, name, from, Clock::now());
  }
  std::string label(const char* what, std::size_t chunk) const {
    const Chunk& c = I.chunks[chunk];
    return str_cat(what, " ", I.tensors[c.tensor].name, " sg", c.index);
  }
  // Reads run ahead into free buffers; a buffer comes back when its write completes. At most
  // half the buffers read ahead, the rest drain writes: the engine round-robins its queue depth
  // over requests, so this keeps reads and writes about equally in flight (as bench io's mixed
  // run does); with every free buffer reading, the reads of 3-4 sub-groups finished together
  // and the first one, which the optimizer waits for, finished last.
  void pump() {
    while (next_read < seq.size() && !free_buffers.empty() && reads.size() < max_reads) {
      const int b = free_buffers.back();
      free_buffers.pop_back();
      const std::size_t ci = seq[next_read++];
      Chunk& c = I.chunks[ci];
      if (first_moment_only) {
        reads.push_back({ci, b, read_first_moment(c, I.buffers[b])});
        continue;
      }
      reads.push_back({ci, b, I.files.file(c.slot).swap_in(I.buffers[b].data(), I.buffers[b].bytes())});
      st.bytes_read += I.payload(c);  // counted when issued: a failed step's reads moved bytes too
    }
  }
  // The blocks of c's file holding exp_avg, each at its place in the buffer, so that the
  // SubGroup's exp_avg points at them.
  io::SwapOp read_first_moment(const Chunk& c, const io::PoolBuffer& buffer) {
    io::SwapFile& f = I.files.file(c.slot);
    const std::uint64_t block = f.layout().spec.block_bytes;
    const std::uint64_t from = 4 * c.length, to = from + moment_bytes(I.options.moment_format, c.length);
    const std::uint64_t first = from / block, count = (to + block - 1) / block - first;
    st.bytes_read += std::min(f.layout().payload_bytes, (first + count) * block) - first * block;
    return f.read_blocks(first, count, buffer.data() + first * block, buffer.bytes() - first * block);
  }
  void finish_write() {
    Pending w = std::move(writes.front());
    writes.pop_front();
    const auto tw = Clock::now();
    const io::Status s = w.op.wait();
    st.wait_seconds += since(tw);
    trace("nvme write", label("write", w.chunk), w.issued);
    free_buffers.push_back(w.buffer);
    const Chunk& c = I.chunks[w.chunk];
    STRATA_IO_CHECK(s, I.where(c) + ", writing " + I.files.path(c.next));
    I.uncommitted.push_back(w.chunk);
  }
  // A spare file for the taken sub-group's new state: when its length has none free, a
  // sub-group of that length whose write landed commits first (waiting for one in flight).
  void lend(std::size_t ci) {
    while (!I.lend(ci, may_commit)) {
      const std::size_t k = I.chunks[ci].klass;
      const bool in_flight =
          std::any_of(writes.begin(), writes.end(), [&](const Pending& w) { return I.chunks[w.chunk].klass == k; });
      STRATA_CHECK(may_commit && in_flight, Errc::internal, "optimizer swapper: no spare file free for ",
                   I.where(I.chunks[ci]));
      finish_write();
    }
  }
  // Nothing may still be reading or writing a buffer when a step ends unfinished: drain, and
  // drop its writes (`why` it ended, for the message when sub-groups had committed already).
  void close(const char* why = nullptr) noexcept {
    if (!open) return;
    open = false;
    for (auto& p : reads) (void)p.op.wait();
    for (auto& p : writes) (void)p.op.wait();
    if (!finished) {  // every spare the step was lent goes back
      I.uncommitted.clear();
      for (std::size_t ci = 0; ci < I.chunks.size(); ++ci) I.files.discard(ci);
      if (I.early > 0) I.tear(I.early, str_cat("a step ended before it was complete (", why ? why : "given up", ")"));
      I.early = 0;
    }
    reads.clear();
    writes.clear();
    taken.reset();
    st.step_seconds = since(t0);
    I.stats = st;  // what the step moved
    I.stepping = false;
  }
  // Runs a step of the pipeline; an error in it (I/O, checksum) ends the step. A misuse of the
  // protocol is refused before, and leaves the step as it was.
  template <class F> auto guarded(F&& f) -> decltype(f()) {
    STRATA_CHECK(open, Errc::internal, "optimizer swapper: the step has ended");
    try {
      return f();
    } catch (const std::exception& e) {
      close(e.what());
      throw;
    } catch (...) {
      close();
      throw;
    }
  }
};

OptimizerSwapper::Step::Step(std::unique_ptr<State> s) : s_(std::move(s)) {}
OptimizerSwapper::Step::Step(Step&&) noexcept = default;

OptimizerSwapper::Step::~Step() {
  if (s_) s_->close();
}

// The tail's order: chunk ids run in tensor then offset order, so sorting the chunks of the
// tensors not begun yet visits them lowest tensor first, each in offset order.
void OptimizerSwapper::Step::ascending_rest() {
  State& S = *s_;
  if (S.ascending) return;
  S.ascending = true;
  std::size_t b = S.next_read;
  while (b < S.seq.size() && S.I.chunks[S.seq[b]].index != 0) ++b;
  std::sort(S.seq.begin() + static_cast<std::ptrdiff_t>(b), S.seq.end());
}

std::optional<OptimizerSwapper::Step::Upcoming> OptimizerSwapper::Step::peek() {
  State& S = *s_;
  STRATA_CHECK(!S.taken, Errc::internal, "optimizer swapper: peek() before put() of the taken sub-group");
  return S.guarded([&]() -> std::optional<Upcoming> {
    if (S.handed == S.seq.size()) return std::nullopt;
    while (!S.writes.empty() && S.writes.front().op.ready()) S.finish_write();
    S.pump();
    while (S.reads.empty()) {  // every buffer is draining: wait for the oldest write
      S.finish_write();
      S.pump();
    }
    const std::size_t ci = S.reads.front().chunk;
    const Chunk& c = S.I.chunks[ci];
    return Upcoming{c.tensor, c.index == 0, ci + 1 == S.I.first_chunk[c.tensor + 1]};
  });
}

bool OptimizerSwapper::Step::room() const {
  const State& S = *s_;
  STRATA_CHECK(!S.reads.empty() || S.taken, Errc::internal, "optimizer swapper: room() before peek()");
  return S.read_only || S.may_commit || S.I.files.has_free(S.taken ? S.taken->chunk : S.reads.front().chunk);
}

void OptimizerSwapper::Step::allow_commit() { s_->may_commit = true; }

SubGroup OptimizerSwapper::Step::take() {
  State& S = *s_;
  if (!peek()) throw Error(Errc::internal, "optimizer swapper: take() after the last sub-group");
  return S.guarded([&] {
    State::Pending r = std::move(S.reads.front());
    S.reads.pop_front();
    const Chunk& c = S.I.chunks[r.chunk];
    const auto tw = Clock::now();
    const io::Status s = r.op.wait();
    S.st.wait_seconds += since(tw);
    S.trace("nvme read", S.label("read", r.chunk), r.issued);
    if (!s.ok()) {
      S.free_buffers.push_back(r.buffer);
      STRATA_IO_CHECK(s, S.I.where(c));
    }
    const SubGroup g = S.I.view(c, S.I.buffers[r.buffer]);
    S.taken = std::move(r);
    S.taken_at = Clock::now();
    ++S.handed;
    return g;
  });
}

void OptimizerSwapper::Step::put() {
  State& S = *s_;
  STRATA_CHECK(S.taken.has_value(), Errc::internal, "optimizer swapper: put() without a taken sub-group");
  STRATA_CHECK(S.read_only || S.may_commit || S.I.files.has_free(S.taken->chunk), Errc::internal,
               "optimizer swapper: put() of a deferred step needs an early commit: allow_commit() it when room() is "
               "false");
  S.guarded([&] {
    S.st.compute_seconds += since(S.taken_at);
    S.trace("optimizer", S.label("adam", S.taken->chunk), S.taken_at);
    const std::size_t ci = S.taken->chunk;
    const int b = S.taken->buffer;
    S.taken.reset();
    if (S.read_only) {  // a scan: the buffer reads the next sub-group
      S.free_buffers.push_back(b);
      S.pump();
      return;
    }
    Chunk& c = S.I.chunks[ci];
    S.lend(ci);
    S.I.unshare(c.next);
    S.writes.push_back({ci, b, S.I.files.file(c.next).swap_out(S.I.buffers[b].data(), S.I.buffers[b].bytes())});
    S.st.bytes_written += S.I.payload(c);
    S.pump();
  });
}

void OptimizerSwapper::Step::finish() {
  State& S = *s_;
  STRATA_CHECK(S.handed == S.seq.size() && !S.taken, Errc::internal,
               "optimizer swapper: finish() before every sub-group was put back");
  S.guarded([&] {
    while (!S.writes.empty()) S.finish_write();
  });
  S.finished = true;
  if (S.defer_commit) {
    S.I.pending = true;  // on disk, committed once the caller commits
  } else {               // every sub-group's new state is on disk (a scan has none)
    S.I.settle_uncommitted(true);
    S.I.early = 0;
  }
  S.close();
}

OptimizerSwapper::Step OptimizerSwapper::begin_step(const StepOrder& order) {
  auto& I = *impl_;
  STRATA_CHECK(!I.stepping, Errc::internal, "optimizer swapper: a step is already open");
  STRATA_CHECK(!I.pending, Errc::internal, "optimizer swapper: step() while a deferred step waits for its commit");
  STRATA_CHECK(!has_written(), Errc::internal,
               "optimizer swapper: step() after write_state() without commit_written() or discard_written()");
  auto S = std::make_unique<Step::State>(I);
  S->defer_commit = order.defer_commit && !order.read_only;
  S->read_only = order.read_only;
  STRATA_CHECK(order.read_only || !order.first_moment_only, Errc::internal,
               "optimizer swapper: first_moment_only is for a scan (read_only)");
  S->first_moment_only = order.first_moment_only;
  I.check_whole();
  S->may_commit = !S->defer_commit;
  S->seq.reserve(I.chunks.size());
  if (order.tensors.empty()) {
    for (std::size_t ci = 0; ci < I.chunks.size(); ++ci) S->seq.push_back(ci);
  } else {
    std::vector<char> seen(I.tensors.size(), 0);
    for (std::size_t t : order.tensors) {
      STRATA_CHECK(t < I.tensors.size() && !seen[t], Errc::internal, "optimizer swapper: tensor ", t,
                   " missing or listed twice in the step order");
      seen[t] = 1;
      for (std::size_t ci = I.first_chunk[t]; ci < I.first_chunk[t + 1]; ++ci) S->seq.push_back(ci);
    }
    STRATA_CHECK(order.read_only || S->seq.size() == I.chunks.size(), Errc::internal,
                 "optimizer swapper: the step order leaves tensors out");
  }
  for (int i = static_cast<int>(I.buffers.size()); i-- > 0;) S->free_buffers.push_back(i);
  S->max_reads = order.read_only ? I.buffers.size() : std::max<std::size_t>(1, I.buffers.size() / 2);
  S->t0 = Clock::now();  // the step's time: its transfers and the caller's updates
  I.stepping = true;
  return Step(std::move(S));
}

OptimizerSwapper::Step OptimizerSwapper::begin_step() { return begin_step(StepOrder{}); }

void OptimizerSwapper::step(const std::function<void(const SubGroup&)>& fn) { step(fn, StepOrder{}); }

void OptimizerSwapper::step(const std::function<void(const SubGroup&)>& fn, const StepOrder& order) {
  Step s = begin_step(order);
  while (s.peek()) {
    fn(s.take());
    s.put();
  }
  s.finish();
}

}  // namespace strata::offload
