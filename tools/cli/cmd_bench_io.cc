// `strata bench io`: NVMe bandwidth through the io_uring engine, as the swapper uses it:
// a sequential write then read of one O_DIRECT file, and a mixed run with reads (first
// half) and writes (second half) in flight together. Requests of --request bytes come from
// registered pool buffers, two outstanding per stream (double buffering); the engine keeps
// --qd blocks of --block bytes in flight. Medians over --iters. The file is removed
// afterwards, also on error or Ctrl-C. scripts/bench-io-vs-fio.sh compares with fio.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <nlohmann/json.hpp>
#include <random>

#include "io/buffer_pool.h"
#include "io/engine.h"
#include "runtime/core/error.h"
#include "runtime/core/stats.h"
#include "runtime/core/units.h"
#include "tools/cli/command.h"
#include "tools/cli/io_boundary.h"
#include "train/output_check.h"

namespace strata::cli {

using namespace strata::train;  // the library these commands parse flags for
namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::string dir;
  std::string size = "4GiB";
  std::string block = "1MiB";
  std::string request;  // default: block * qd
  unsigned qd = 32;
  unsigned batch = 8;
  int iters = 3;
  bool sqpoll = false;
  bool json = false;
};

// The bench file's path for the signal handler (async-signal-safe: a fixed buffer).
char g_bench_path[4096];

extern "C" void remove_bench_file_and_die(int sig) {
  if (g_bench_path[0] != '\0') ::unlink(g_bench_path);
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

// Removes the file when the command ends by any path; Ctrl-C, SIGTERM and SIGHUP unlink
// it before the process dies.
class BenchFile {
 public:
  explicit BenchFile(std::string path) : path_(std::move(path)) {
    STRATA_CHECK(path_.size() < sizeof g_bench_path, Errc::invalid_argument, "--dir path too long: ", path_);
    std::memcpy(g_bench_path, path_.c_str(), path_.size() + 1);
    struct sigaction sa {};
    sa.sa_handler = remove_bench_file_and_die;
    sigemptyset(&sa.sa_mask);
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaction(sig, &sa, &old_[sig]);
    // A file size limit (ulimit -f) should end in an EFBIG error and cleanup, not SIGXFSZ.
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    sigaction(SIGXFSZ, &ignore, &old_[SIGXFSZ]);
  }
  ~BenchFile() {
    ::unlink(path_.c_str());
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGXFSZ}) sigaction(sig, &old_[sig], nullptr);
    g_bench_path[0] = '\0';
  }
  BenchFile(const BenchFile&) = delete;
  BenchFile& operator=(const BenchFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  struct sigaction old_[NSIG] {};
};

enum class Dir { read, write };

// One sequential stream over [begin, end) in requests of `request` bytes, two outstanding.
struct Stream {
  Dir dir;
  std::uint64_t next, end;
  std::deque<io::IoFuture> pending;
  std::vector<io::PoolBuffer> buffers;
};

// Runs the streams together until all are done; returns seconds.
double run_streams(io::Engine& engine, const io::File& file, std::vector<Stream>& streams, std::uint64_t request) {
  const auto t0 = Clock::now();
  auto submit = [&](Stream& s) {
    const std::uint64_t n = std::min(request, s.end - s.next);
    std::byte* buf = s.buffers[s.pending.size() % s.buffers.size()].data();
    s.pending.push_back(s.dir == Dir::read ? engine.read(file, s.next, buf, n) : engine.write(file, s.next, buf, n));
    s.next += n;
  };
  for (Stream& s : streams) {
    while (s.pending.size() < s.buffers.size() && s.next < s.end) submit(s);
  }
  bool busy = true;
  while (busy) {
    busy = false;
    for (Stream& s : streams) {
      if (s.pending.empty()) continue;
      busy = true;
      if (!s.pending.front().ready() && streams.size() > 1) continue;
      STRATA_IO_CHECK(s.pending.front().wait().status(), "");
      // The finished request's buffer is the front one: rotate so the next submit reuses it.
      std::rotate(s.buffers.begin(), s.buffers.begin() + 1, s.buffers.end());
      s.pending.pop_front();
      if (s.next < s.end) submit(s);
    }
    if (busy && streams.size() > 1) {
      std::vector<io::IoFuture> fronts;
      for (Stream& s : streams) {
        if (!s.pending.empty()) fronts.push_back(s.pending.front());
      }
      if (!fronts.empty()) io::wait_any(fronts);
    }
  }
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

Action setup(CLI::App& cmd) {
  auto o = std::make_shared<Options>();
  cmd.add_option("--dir", o->dir, "Directory for the bench file (on the NVMe device to measure)")->required();
  cmd.add_option("--size", o->size, "File size (e.g. 4GiB)");
  cmd.add_option("--block", o->block, "Block size: the unit kept queue-depth deep (e.g. 1MiB)");
  cmd.add_option("--qd", o->qd, "Queue depth: blocks in flight")->check(CLI::Range(1, 4096));
  cmd.add_option("--batch", o->batch, "Blocks prepared per io_uring_submit")->check(CLI::Range(1, 4096));
  cmd.add_option("--request", o->request, "Bytes per engine request (default: block x qd)");
  cmd.add_option("--iters", o->iters, "Repetitions; figures are medians")->check(CLI::Range(1, 1000));
  cmd.add_flag("--sqpoll", o->sqpoll, "Kernel-side submission polling (SQPOLL)");
  cmd.add_flag("--json", o->json, "Print JSON");
  return [o] {
    forward_io_warnings();
    check_output_dir("--dir", o->dir);  // created when missing, as bench calibrate creates --nvme
    const std::uint64_t size = parse_bytes(o->size, "--size");
    const std::uint64_t block = parse_bytes(o->block, "--block");
    STRATA_CHECK(block > 0 && block % 4096 == 0 && block <= (1u << 30), Errc::invalid_argument, "--block ", o->block,
                 " must be a positive multiple of 4 KiB, at most 1 GiB");
    STRATA_CHECK(size >= block && size % 4096 == 0, Errc::invalid_argument, "--size ", o->size,
                 " must be a multiple of 4 KiB and at least one block (", o->block, ")");
    std::uint64_t request = o->request.empty() ? block * o->qd : parse_bytes(o->request, "--request");
    request = std::min(request, size / 2 >= block ? size / 2 : size);
    request = std::max<std::uint64_t>(request / 4096 * 4096, 4096);
    STRATA_CHECK(request <= (1u << 30), Errc::invalid_argument, "--request must be at most 1 GiB (pool buffer limit)");

    io::EngineOptions eo;
    eo.queue_depth = o->qd;
    eo.block_bytes = static_cast<std::uint32_t>(block);
    eo.submit_batch = o->batch;
    eo.sqpoll = o->sqpoll;
    auto engine_r = io::Engine::create(eo);
    STRATA_IO_CHECK(engine_r.status(), "");
    io::Engine& engine = engine_r.value();
    // Two buffers per stream; the mixed run has two streams.
    auto pool = io::BufferPool::create(&engine, io::PoolOptions{request, 4});
    STRATA_IO_CHECK(pool.status(), "");
    std::vector<io::PoolBuffer> buffers;
    std::mt19937_64 rng(12345);
    for (int i = 0; i < 4; ++i) {
      buffers.push_back(pool->acquire());
      // Random bytes: some virtual disks and SSDs compress or deduplicate zeros.
      auto* words = buffers.back().as<std::uint64_t>();
      for (std::size_t k = 0; k < buffers.back().bytes() / 8; ++k) words[k] = rng();
    }
    auto take = [&](int first) {
      std::vector<io::PoolBuffer> b;
      b.push_back(std::move(buffers[first]));
      b.push_back(std::move(buffers[first + 1]));
      return b;
    };
    auto give = [&](std::vector<io::PoolBuffer>& b, int first) {
      buffers[first] = std::move(b[0]);
      buffers[first + 1] = std::move(b[1]);
    };

    BenchFile bench(o->dir + "/strata-bench-io-" + std::to_string(::getpid()) + ".dat");
    std::vector<double> w, r, m;
    bool direct = false;
    for (int it = 0; it < o->iters; ++it) {
      ::unlink(bench.path().c_str());
      auto file = engine.open(bench.path(), io::OpenOptions{io::Access::read_write, true, true});
      STRATA_IO_CHECK(file.status(), "");
      direct = file->direct();
      // Reserve the blocks first, as fio does by default (fallocate=native).
      if (io::Status s = file->allocate(size); !s && s.err() != -EOPNOTSUPP) STRATA_IO_CHECK(s, "");
      std::vector<Stream> one(1);
      one[0] = Stream{Dir::write, 0, size, {}, take(0)};
      w.push_back(static_cast<double>(size) / run_streams(engine, *file, one, request) / 1e9);
      one[0].dir = Dir::read;
      one[0].next = 0;
      r.push_back(static_cast<double>(size) / run_streams(engine, *file, one, request) / 1e9);
      give(one[0].buffers, 0);
      std::vector<Stream> mixed(2);
      const std::uint64_t half = size / 2 / 4096 * 4096;
      mixed[0] = Stream{Dir::read, 0, half, {}, take(0)};
      mixed[1] = Stream{Dir::write, half, size, {}, take(2)};
      m.push_back(static_cast<double>(size) / run_streams(engine, *file, mixed, request) / 1e9);
      give(mixed[0].buffers, 0);
      give(mixed[1].buffers, 2);
    }
    const io::EngineStats st = engine.stats();
    nlohmann::json j = {{"dir", o->dir},
                        {"size_bytes", size},
                        {"block_bytes", block},
                        {"queue_depth", o->qd},
                        {"submit_batch", o->batch},
                        {"request_bytes", request},
                        {"iters", o->iters},
                        {"sqpoll", engine.sqpoll()},
                        {"direct", direct},
                        {"fixed_buffers", st.fixed_buffer_pieces > 0},
                        {"write_gbps", median(w)},
                        {"read_gbps", median(r)},
                        {"mixed_gbps", median(m)},
                        {"runs", {{"write_gbps", w}, {"read_gbps", r}, {"mixed_gbps", m}}}};
    if (o->json) {
      print_json(j.dump(2));
      return 0;
    }
    std::printf("file:        %s (%s, %s, removed afterwards)\n", bench.path().c_str(), format_bytes(size).c_str(),
                direct ? "O_DIRECT" : "buffered: the filesystem refused O_DIRECT");
    std::printf("settings:    block %s, queue depth %u, batch %u, requests of %s, %s%s\n", format_bytes(block).c_str(),
                o->qd, o->batch, format_bytes(request).c_str(),
                st.fixed_buffer_pieces > 0 ? "fixed buffers" : "unregistered buffers",
                engine.sqpoll() ? ", SQPOLL" : "");
    std::printf("write:       %8.3f GB/s (median of %d)\n", median(w), o->iters);
    std::printf("read:        %8.3f GB/s\n", median(r));
    std::printf("mixed r/w:   %8.3f GB/s (reads and writes in flight together)\n", median(m));
    return 0;
  };
}

const Registration reg("bench", "io", "NVMe bandwidth through the io_uring engine: write, read, mixed", setup);

}  // namespace
}  // namespace strata::cli
