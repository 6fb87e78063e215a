// `strata bench muon [--shape RxC ...] [--reps N]`: Muon's Newton-Schulz orthogonalization
// (optim/newton_schulz.h) on matrices of the given shapes, timed as the optimizer runs it
// (TBB's threads), beside the machine's best fp32 rate on the same products: one oneDNN call
// over each whole product on all cores (the library at its best; the orthogonalization keeps
// its bits independent of the thread count and cannot call it that way). Prints the median
// milliseconds, GFLOP/s and their ratio to the library's rate, shape by shape.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "models/gpt/gemm.h"
#include "optim/newton_schulz.h"
#include "runtime/core/error.h"
#include "tools/cli/command.h"

namespace strata::cli {
namespace {

struct Options {
  std::vector<std::string> shapes{"192x768", "768x768", "768x3072"};
  int reps = 5;
};

std::pair<int, int> parse_shape(const std::string& s) {
  int r = 0, c = 0;
  char x = 0, extra = 0;
  STRATA_CHECK(std::sscanf(s.c_str(), "%d%c%d%c", &r, &x, &c, &extra) == 3 && x == 'x' && r > 0 && c > 0,
               Errc::invalid_argument, "--shape '", s, "': give rows x cols as two positive numbers, like 768x3072");
  return {r, c};
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int run(const Options& o) {
  STRATA_CHECK(o.reps >= 1, Errc::invalid_argument, "--reps ", o.reps, ": use 1 or more");
  const int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::printf("Newton-Schulz (5 iterations, fp32) on %d threads, against oneDNN's fp32 matmul on all %d cores\n",
              threads, threads);
  std::printf("%12s %10s %10s %14s %8s\n", "shape", "ms", "GFLOP/s", "library GFLOP/s", "ratio");
  for (const auto& text : o.shapes) {
    const auto [rows, cols] = parse_shape(text);
    std::vector<float> u(static_cast<std::size_t>(rows) * cols), w;
    std::mt19937 rng(1);
    std::normal_distribution<float> d;
    for (auto& v : u) v = d(rng);
    std::vector<float> scratch;
    std::vector<double> secs;
    for (int i = 0; i <= o.reps; ++i) {  // the first call warms up
      w = u;
      const auto t0 = std::chrono::steady_clock::now();
      optim::newton_schulz(w.data(), rows, cols, {}, scratch);
      if (i > 0) secs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    const double s = median(secs), flops = optim::newton_schulz_flops(rows, cols, 5);
    // The library on the iteration's three products (r = min, c = max): X X^T, G G and H X.
    const int r = std::min(rows, cols), c = std::max(rows, cols);
    const double lib = model::ops::library_gemm_seconds(model::ops::Products::fp32, r, r, c, threads, o.reps) +
                       model::ops::library_gemm_seconds(model::ops::Products::fp32, r, r, r, threads, o.reps) +
                       model::ops::library_gemm_seconds(model::ops::Products::fp32, r, c, r, threads, o.reps);
    const double lib_rate = (2.0 * r * r * c + 2.0 * r * r * r + 2.0 * r * r * c) / lib;
    std::printf("%12s %10.2f %10.1f %14.1f %8.2f\n", text.c_str(), s * 1e3, flops / s / 1e9, lib_rate / 1e9,
                flops / s / lib_rate);
  }
  return 0;
}

Action setup(CLI::App& cmd) {
  auto o = std::make_shared<Options>();
  cmd.add_option("--shape", o->shapes, "Matrix shapes as ROWSxCOLS (default 192x768 768x768 768x3072)");
  cmd.add_option("--reps", o->reps, "Timed runs per shape; the median is reported (default 5)");
  return [o] { return run(*o); };
}

const Registration reg("bench", "muon",
                       "Time Muon's Newton-Schulz orthogonalization against the library's fp32 matmul rate", setup);

}  // namespace
}  // namespace strata::cli
