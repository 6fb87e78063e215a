// The measurement behind the GPT's choice of BLAS (scripts/bench_blas.sh builds and runs it):
// Debian's OpenBLAS and BLIS (each loaded with dlopen, so one binary calls both through the
// standard sgemm_ entry point) and oneDNN (dnnl_sgemm, and its bf16 matmul primitive with
// fp32 accumulation, the bf16 product a CPU with avx512_bf16 offers) on the GPT's weight
// products. Prints the median GFLOP/s over ITERS calls per shape for the library named.
// Threads come from the environment (OPENBLAS_NUM_THREADS, BLIS_NUM_THREADS, OMP_NUM_THREADS).
//   bench_blas ITERS [N IN OUT]...
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
using Sgemm = void (*)(const char*, const char*, const int*, const int*, const int*, const float*, const float*,
                       const int*, const float*, const int*, const float*, float*, const int*);

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// A Fortran-BLAS library loaded privately (RTLD_DEEPBIND: its own symbols first).
struct FortranBlas {
  std::string name;
  Sgemm sgemm = nullptr;
  FortranBlas(std::string n, const char* path) : name(std::move(n)) {
    void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    if (h == nullptr) {
      std::fprintf(stderr, "bench_blas: cannot load %s: %s\n", path, dlerror());
      std::exit(1);
    }
    sgemm = reinterpret_cast<Sgemm>(dlsym(h, "sgemm_"));
  }
  // Row-major out[N,OC] = a[N,IC] w[IC,OC], as column-major out^T = w^T a^T.
  void run(float* out, const float* a, const float* w, int N, int IC, int OC) const {
    const float one = 1.0f, zero = 0.0f;
    sgemm("N", "N", &OC, &N, &IC, &one, w, &OC, a, &IC, &zero, out, &OC);
  }
};

struct Bf16Matmul {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream strm{eng};
  dnnl::memory a, w, out;
  dnnl::matmul prim;
  Bf16Matmul(int N, int IC, int OC) {
    using dt = dnnl::memory::data_type;
    using tag = dnnl::memory::format_tag;
    dnnl::memory::desc ad({N, IC}, dt::bf16, tag::ab), wd({IC, OC}, dt::bf16, tag::ab), od({N, OC}, dt::f32, tag::ab);
    a = dnnl::memory(ad, eng);
    w = dnnl::memory(wd, eng);
    out = dnnl::memory(od, eng);
    std::memset(a.get_data_handle(), 0x3c, ad.get_size());  // small bf16 values
    std::memset(w.get_data_handle(), 0x3c, wd.get_size());
    prim = dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(ad, wd, od), eng));  // oneDNN 2.x
  }
  void run() {
    prim.execute(strm, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, w}, {DNNL_ARG_DST, out}});
    strm.wait();
  }
};

}  // namespace

// One library per process: thread pools that spin after a call (OpenBLAS's, OpenMP's) would
// otherwise steal the cores from the next library's call.
int main(int argc, char** argv) {
  if (argc < 3 || (argc - 3) % 3 != 0) {
    std::fprintf(stderr, "usage: %s openblas|blis|onednn|onednn-bf16 ITERS [N IN OUT]...\n", argv[0]);
    return 2;
  }
  const std::string lib = argv[1];
  const int iters = std::atoi(argv[2]);
  for (int i = 3; i + 2 < argc; i += 3) {
    const int N = std::atoi(argv[i]), IC = std::atoi(argv[i + 1]), OC = std::atoi(argv[i + 2]);
    std::vector<float> a(static_cast<std::size_t>(N) * IC, 0.01f), w(static_cast<std::size_t>(IC) * OC, 0.02f),
        out(static_cast<std::size_t>(N) * OC);
    std::function<void()> run;
    std::unique_ptr<FortranBlas> fortran;
    std::unique_ptr<Bf16Matmul> bf16;
    if (lib == "openblas" || lib == "blis") {
      fortran =
          std::make_unique<FortranBlas>(lib, lib == "blis" ? "/usr/lib/x86_64-linux-gnu/blis-pthread/libblas.so.3"
                                                           : "/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3");
      run = [&] { fortran->run(out.data(), a.data(), w.data(), N, IC, OC); };
    } else if (lib == "onednn") {
      run = [&] { dnnl_sgemm('N', 'N', N, OC, IC, 1.0f, a.data(), IC, w.data(), OC, 0.0f, out.data(), OC); };
    } else if (lib == "onednn-bf16") {
      bf16 = std::make_unique<Bf16Matmul>(N, IC, OC);
      run = [&] { bf16->run(); };
    } else {
      std::fprintf(stderr, "bench_blas: unknown library %s\n", lib.c_str());
      return 2;
    }
    std::vector<double> rate;
    for (int it = 0; it < iters + 3; ++it) {  // three warm-up calls
      const auto t0 = Clock::now();
      run();
      const double s = std::chrono::duration<double>(Clock::now() - t0).count();
      if (it >= 3) rate.push_back(2.0 * N * IC * OC / s / 1e9);
    }
    std::printf("%s %dx%dx%d %.1f\n", lib.c_str(), N, IC, OC, median(rate));
  }
  return 0;
}
