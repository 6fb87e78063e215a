// The plain loops of ops_reference.h: one thread, sums in double.
#include "models/llama/ops_reference.h"

#include <cmath>
#include <vector>

namespace strata::model::llama::ref {
namespace {
std::size_t at(int r, int c, int cols) { return static_cast<std::size_t>(r) * cols + c; }
}  // namespace

void linear_forward(float* out, const float* inp, const float* W, const float* b, int N, int IC, int OC) {
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) {
      double s = b != nullptr ? b[o] : 0.0;
      for (int i = 0; i < IC; ++i) s += static_cast<double>(inp[at(n, i, IC)]) * W[at(o, i, IC)];
      out[at(n, o, OC)] = static_cast<float>(s);
    }
}

void linear_backward_input(float* dinp, const float* dout, const float* W, int N, int IC, int OC, bool accumulate) {
  for (int n = 0; n < N; ++n)
    for (int i = 0; i < IC; ++i) {
      double s = accumulate ? dinp[at(n, i, IC)] : 0.0;
      for (int o = 0; o < OC; ++o) s += static_cast<double>(dout[at(n, o, OC)]) * W[at(o, i, IC)];
      dinp[at(n, i, IC)] = static_cast<float>(s);
    }
}

void linear_backward_weight(float* dW, float* db, const float* dout, const float* inp, int N, int IC, int OC) {
  for (int o = 0; o < OC; ++o) {
    for (int i = 0; i < IC; ++i) {
      double s = dW[at(o, i, IC)];
      for (int n = 0; n < N; ++n) s += static_cast<double>(dout[at(n, o, OC)]) * inp[at(n, i, IC)];
      dW[at(o, i, IC)] = static_cast<float>(s);
    }
    if (db != nullptr) {
      double s = db[o];
      for (int n = 0; n < N; ++n) s += dout[at(n, o, OC)];
      db[o] = static_cast<float>(s);
    }
  }
}

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int N, int C, float eps) {
  for (int n = 0; n < N; ++n) {
    double ss = 0.0;
    for (int c = 0; c < C; ++c) ss += static_cast<double>(inp[at(n, c, C)]) * inp[at(n, c, C)];
    const double r = 1.0 / std::sqrt(ss / C + static_cast<double>(eps));
    rstd[n] = static_cast<float>(r);
    for (int c = 0; c < C; ++c) out[at(n, c, C)] = static_cast<float>(w[c] * (inp[at(n, c, C)] * r));
  }
}

void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp, const float* w, const float* rstd,
                      int N, int C, bool accumulate) {
  std::vector<double> gw(static_cast<std::size_t>(C), 0.0);
  for (int n = 0; n < N; ++n) {
    const double r = rstd[n];
    double dot = 0.0;
    for (int c = 0; c < C; ++c) dot += static_cast<double>(w[c]) * dout[at(n, c, C)] * inp[at(n, c, C)];
    for (int c = 0; c < C; ++c) {
      const double x = inp[at(n, c, C)], d = dout[at(n, c, C)];
      const double g = r * w[c] * d - x * r * r * r * dot / C;
      dinp[at(n, c, C)] = static_cast<float>(accumulate ? dinp[at(n, c, C)] + g : g);
      gw[static_cast<std::size_t>(c)] += d * x * r;
    }
  }
  for (int c = 0; c < C; ++c) dw[c] = static_cast<float>(dw[c] + gw[static_cast<std::size_t>(c)]);
}

void rope_tables(float* cos, float* sin, const std::vector<double>& inv_freq, int T) {
  const std::size_t half = inv_freq.size();
  for (int t = 0; t < T; ++t)
    for (std::size_t i = 0; i < half; ++i) {
      cos[t * half + i] = static_cast<float>(std::cos(t * inv_freq[i]));
      sin[t * half + i] = static_cast<float>(std::sin(t * inv_freq[i]));
    }
}

namespace {
// y = x cos + rotate_half(x) sin, rotate_half(x) = (-x2, x1); the transpose uses -sin.
void rotate(float* x, const float* cos, const float* sin, int B, int T, int heads, int hd, double sign) {
  const int half = hd / 2;
  std::vector<double> y(static_cast<std::size_t>(hd));
  for (int n = 0; n < B * T; ++n) {
    const int t = n % T;
    for (int h = 0; h < heads; ++h) {
      float* v = x + (static_cast<std::size_t>(n) * heads + h) * hd;
      for (int i = 0; i < hd; ++i) {
        const int j = i % half;
        const double c = cos[at(t, j, half)], s = sign * sin[at(t, j, half)];
        const double rot = i < half ? -static_cast<double>(v[i + half]) : v[i - half];
        y[static_cast<std::size_t>(i)] = v[i] * c + rot * s;
      }
      for (int i = 0; i < hd; ++i) v[i] = static_cast<float>(y[static_cast<std::size_t>(i)]);
    }
  }
}
}  // namespace

void rope_forward(float* x, const float* cos, const float* sin, int B, int T, int heads, int hd) {
  rotate(x, cos, sin, B, T, heads, hd, 1.0);
}

void rope_backward(float* dx, const float* cos, const float* sin, int B, int T, int heads, int hd) {
  rotate(dx, cos, sin, B, T, heads, hd, -1.0);
}

void swiglu_forward(float* out, const float* gate, const float* up, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    const double g = gate[i];
    out[i] = static_cast<float>(g / (1.0 + std::exp(-g)) * up[i]);
  }
}

void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    const double g = gate[i], s = 1.0 / (1.0 + std::exp(-g));
    dup[i] = static_cast<float>(dout[i] * g * s);
    dgate[i] = static_cast<float>(dout[i] * up[i] * (s + g * s * (1.0 - s)));
  }
}

void attention_forward(float* out, float* att, const float* q, const float* k, const float* v, int B, int T, int NH,
                       int NKV, int hd) {
  const int group = NH / NKV, lq = NH * hd, lk = NKV * hd;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  std::vector<double> s(static_cast<std::size_t>(T));
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h) {
      const int g = h / group;
      float* p = att + (static_cast<std::size_t>(b) * NH + h) * T * T;
      for (int i = 0; i < T; ++i) {
        double mx = -1e300;
        for (int j = 0; j <= i; ++j) {
          double d = 0.0;
          for (int e = 0; e < hd; ++e)
            d += static_cast<double>(q[at(b * T + i, h * hd + e, lq)]) * k[at(b * T + j, g * hd + e, lk)];
          s[static_cast<std::size_t>(j)] = d * scale;
          mx = std::max(mx, d * scale);
        }
        double sum = 0.0;
        for (int j = 0; j <= i; ++j)
          sum += (s[static_cast<std::size_t>(j)] = std::exp(s[static_cast<std::size_t>(j)] - mx));
        for (int j = 0; j < T; ++j)
          p[at(i, j, T)] = j <= i ? static_cast<float>(s[static_cast<std::size_t>(j)] / sum) : 0.0f;
        for (int e = 0; e < hd; ++e) {
          double y = 0.0;
          for (int j = 0; j <= i; ++j) y += s[static_cast<std::size_t>(j)] / sum * v[at(b * T + j, g * hd + e, lk)];
          out[at(b * T + i, h * hd + e, lq)] = static_cast<float>(y);
        }
      }
    }
}

void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                        const float* v, const float* att, int B, int T, int NH, int NKV, int hd) {
  const int group = NH / NKV, lq = NH * hd, lk = NKV * hd;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  std::vector<double> gk(static_cast<std::size_t>(B) * T * lk, 0.0), gv(gk.size(), 0.0),
      dp(static_cast<std::size_t>(T));
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h) {
      const int g = h / group;
      const float* p = att + (static_cast<std::size_t>(b) * NH + h) * T * T;
      for (int i = 0; i < T; ++i) {
        double dot = 0.0;
        for (int j = 0; j <= i; ++j) {
          double d = 0.0;
          for (int e = 0; e < hd; ++e)
            d += static_cast<double>(dout[at(b * T + i, h * hd + e, lq)]) * v[at(b * T + j, g * hd + e, lk)];
          dp[static_cast<std::size_t>(j)] = d;
          dot += p[at(i, j, T)] * d;
        }
        for (int e = 0; e < hd; ++e) {
          double gq = 0.0;
          for (int j = 0; j <= i; ++j) {
            const double ds = p[at(i, j, T)] * (dp[static_cast<std::size_t>(j)] - dot);
            gq += ds * scale * k[at(b * T + j, g * hd + e, lk)];
            gk[at(b * T + j, g * hd + e, lk)] += ds * scale * q[at(b * T + i, h * hd + e, lq)];
            gv[at(b * T + j, g * hd + e, lk)] += p[at(i, j, T)] * dout[at(b * T + i, h * hd + e, lq)];
          }
          dq[at(b * T + i, h * hd + e, lq)] = static_cast<float>(gq);
        }
      }
    }
  for (std::size_t i = 0; i < gk.size(); ++i) {
    dk[i] = static_cast<float>(gk[i]);
    dv[i] = static_cast<float>(gv[i]);
  }
}

void embedding_forward(float* out, const std::int32_t* tokens, const float* table, int N, int C) {
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < C; ++c) out[at(n, c, C)] = table[at(tokens[n], c, C)];
}

void embedding_backward(float* dtable, const float* dout, const std::int32_t* tokens, int N, int C) {
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < C; ++c) dtable[at(tokens[n], c, C)] += dout[at(n, c, C)];
}

}  // namespace strata::model::llama::ref
