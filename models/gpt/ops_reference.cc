// The reference loops (see ops_reference.h). Deliberately naive: no BLAS, no threads,
// double accumulators, written from the definitions rather than from ops.cc.
#include "models/gpt/ops_reference.h"

#include <cmath>
#include <vector>

namespace strata::model::ops::ref {
namespace {
using Z = std::size_t;
}

void matmul_forward(float* out, const float* inp, const float* W, const float* b, int N, int IC, int OC) {
  for (int n = 0; n < N; ++n) {
    for (int o = 0; o < OC; ++o) {
      double s = b != nullptr ? b[o] : 0.0;
      for (int i = 0; i < IC; ++i) s += static_cast<double>(inp[Z(n) * IC + i]) * W[Z(i) * OC + o];
      out[Z(n) * OC + o] = static_cast<float>(s);
    }
  }
}

void matmul_backward(float* dinp, float* dW, float* db, const float* dout, const float* inp, const float* W, int N,
                     int IC, int OC, bool accumulate) {
  if (dinp != nullptr) {
    for (int n = 0; n < N; ++n) {
      for (int i = 0; i < IC; ++i) {
        double s = accumulate ? dinp[Z(n) * IC + i] : 0.0;
        for (int o = 0; o < OC; ++o) s += static_cast<double>(dout[Z(n) * OC + o]) * W[Z(i) * OC + o];
        dinp[Z(n) * IC + i] = static_cast<float>(s);
      }
    }
  }
  for (int i = 0; i < IC; ++i) {
    for (int o = 0; o < OC; ++o) {
      double s = dW[Z(i) * OC + o];
      for (int n = 0; n < N; ++n) s += static_cast<double>(inp[Z(n) * IC + i]) * dout[Z(n) * OC + o];
      dW[Z(i) * OC + o] = static_cast<float>(s);
    }
  }
  if (db != nullptr) {
    for (int o = 0; o < OC; ++o) {
      double s = db[o];
      for (int n = 0; n < N; ++n) s += dout[Z(n) * OC + o];
      db[o] = static_cast<float>(s);
    }
  }
}

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b, int N,
                       int C) {
  for (int n = 0; n < N; ++n) {
    const float* x = inp + Z(n) * C;
    double m = 0, v = 0;
    for (int c = 0; c < C; ++c) m += x[c];
    m /= C;
    for (int c = 0; c < C; ++c) v += (x[c] - m) * (x[c] - m);
    v /= C;
    const double s = 1.0 / std::sqrt(v + 1e-5);
    for (int c = 0; c < C; ++c) out[Z(n) * C + c] = static_cast<float>((x[c] - m) * s * w[c] + b[c]);
    mean[n] = static_cast<float>(m);
    rstd[n] = static_cast<float>(s);
  }
}

void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                        const float* mean, const float* rstd, int N, int C) {
  // y = xhat w + b, xhat = (x - m) s: dx = s (g - mean(g) - xhat mean(g xhat)) with g = dy w.
  std::vector<double> dwd(dw, dw + C), dbd(db, db + C);
  for (int n = 0; n < N; ++n) {
    const float* x = inp + Z(n) * C;
    const float* d = dout + Z(n) * C;
    double gm = 0, gxm = 0;
    for (int c = 0; c < C; ++c) {
      const double xhat = (x[c] - static_cast<double>(mean[n])) * rstd[n];
      gm += static_cast<double>(d[c]) * w[c];
      gxm += static_cast<double>(d[c]) * w[c] * xhat;
      dwd[Z(c)] += d[c] * xhat;
      dbd[Z(c)] += d[c];
    }
    gm /= C;
    gxm /= C;
    for (int c = 0; c < C; ++c) {
      const double xhat = (x[c] - static_cast<double>(mean[n])) * rstd[n];
      dinp[Z(n) * C + c] += static_cast<float>(rstd[n] * (static_cast<double>(d[c]) * w[c] - gm - xhat * gxm));
    }
  }
  for (int c = 0; c < C; ++c) {
    dw[c] = static_cast<float>(dwd[Z(c)]);
    db[c] = static_cast<float>(dbd[Z(c)]);
  }
}

void gelu_forward(float* out, const float* inp, std::size_t n) {
  const double k = std::sqrt(2.0 / M_PI);
  for (Z i = 0; i < n; ++i) {
    const double x = inp[i];
    out[i] = static_cast<float>(0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x))));
  }
}

void gelu_backward(float* dinp, const float* inp, const float* dout, std::size_t n) {
  const double k = std::sqrt(2.0 / M_PI);
  for (Z i = 0; i < n; ++i) {
    const double x = inp[i];
    const double t = std::tanh(k * (x + 0.044715 * x * x * x));
    const double d = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3 * 0.044715 * x * x);
    dinp[i] = static_cast<float>(d * dout[i]);
  }
}

void embedding_forward(float* out, const std::int32_t* tokens, const float* wte, const float* wpe, int B, int T,
                       int C) {
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      const int tok = tokens[b * T + t];
      for (int c = 0; c < C; ++c) {
        out[(Z(b) * T + t) * C + c] = static_cast<float>(static_cast<double>(wte[Z(tok) * C + c]) + wpe[Z(t) * C + c]);
      }
    }
  }
}

void embedding_backward(float* dwte, float* dwpe, const float* dout, const std::int32_t* tokens, int B, int T, int C) {
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      const int tok = tokens[b * T + t];
      for (int c = 0; c < C; ++c) {
        dwte[Z(tok) * C + c] += dout[(Z(b) * T + t) * C + c];
        dwpe[Z(t) * C + c] += dout[(Z(b) * T + t) * C + c];
      }
    }
  }
}

void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH, float scale) {
  const int hs = C / NH;
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      for (int i = 0; i < T; ++i) {
        const float* q = qkv + (Z(b) * T + i) * 3 * C + Z(h) * hs;
        std::vector<double> s(Z(i) + 1);
        double mx = -INFINITY;
        for (int j = 0; j <= i; ++j) {
          const float* k = qkv + (Z(b) * T + j) * 3 * C + C + Z(h) * hs;
          double dot = 0;
          for (int e = 0; e < hs; ++e) dot += static_cast<double>(q[e]) * k[e];
          s[Z(j)] = dot * scale;
          mx = std::max(mx, s[Z(j)]);
        }
        double sum = 0;
        for (int j = 0; j <= i; ++j) sum += (s[Z(j)] = std::exp(s[Z(j)] - mx));
        float* p = att + ((Z(b) * NH + h) * T + i) * T;
        for (int j = 0; j < T; ++j) p[j] = j <= i ? static_cast<float>(s[Z(j)] / sum) : 0.0f;
        for (int e = 0; e < hs; ++e) {
          double y = 0;
          for (int j = 0; j <= i; ++j) y += s[Z(j)] / sum * qkv[(Z(b) * T + j) * 3 * C + 2 * C + Z(h) * hs + e];
          out[(Z(b) * T + i) * C + Z(h) * hs + e] = static_cast<float>(y);
        }
      }
    }
  }
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B, int T, int C, int NH,
                        float scale) {
  const int hs = C / NH;
  auto at = [&](int b, int t, int part, int h, int e) { return (Z(b) * T + t) * 3 * C + Z(part) * C + Z(h) * hs + e; };
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      for (int x = 0; x < 3 * C; ++x) dqkv[(Z(b) * T + t) * 3 * C + x] = 0.0f;
    }
    for (int h = 0; h < NH; ++h) {
      std::vector<double> dq(Z(T) * hs, 0.0), dk(Z(T) * hs, 0.0), dv(Z(T) * hs, 0.0);
      for (int i = 0; i < T; ++i) {
        const float* p = att + ((Z(b) * NH + h) * T + i) * T;
        const float* dy = dout + (Z(b) * T + i) * C + Z(h) * hs;
        std::vector<double> dp(Z(i) + 1);
        double dot = 0;
        for (int j = 0; j <= i; ++j) {
          double s = 0;
          for (int e = 0; e < hs; ++e) {
            s += static_cast<double>(dy[e]) * qkv[at(b, j, 2, h, e)];
            dv[Z(j) * hs + e] += static_cast<double>(p[j]) * dy[e];
          }
          dp[Z(j)] = s;
          dot += p[j] * s;
        }
        for (int j = 0; j <= i; ++j) {
          const double ds = p[j] * (dp[Z(j)] - dot) * scale;
          for (int e = 0; e < hs; ++e) {
            dq[Z(i) * hs + e] += ds * qkv[at(b, j, 1, h, e)];
            dk[Z(j) * hs + e] += ds * qkv[at(b, i, 0, h, e)];
          }
        }
      }
      for (int t = 0; t < T; ++t) {
        for (int e = 0; e < hs; ++e) {
          dqkv[at(b, t, 0, h, e)] = static_cast<float>(dq[Z(t) * hs + e]);
          dqkv[at(b, t, 1, h, e)] = static_cast<float>(dk[Z(t) * hs + e]);
          dqkv[at(b, t, 2, h, e)] = static_cast<float>(dv[Z(t) * hs + e]);
        }
      }
    }
  }
}

double cross_entropy(float* logits, float* losses, const std::int32_t* targets, int N, int V, float grad_scale) {
  double total = 0;
  for (int n = 0; n < N; ++n) {
    float* z = logits + Z(n) * V;
    double mx = z[0];
    for (int v = 1; v < V; ++v) mx = std::max(mx, static_cast<double>(z[v]));
    double sum = 0;
    for (int v = 0; v < V; ++v) sum += std::exp(z[v] - mx);
    const double loss = std::log(sum) - (z[targets[n]] - mx);
    losses[n] = static_cast<float>(loss);
    total += loss;
    for (int v = 0; v < V; ++v) {
      const double p = std::exp(z[v] - mx) / sum;
      z[v] = static_cast<float>((p - (v == targets[n] ? 1.0 : 0.0)) * grad_scale);
    }
  }
  return total;
}

}  // namespace strata::model::ops::ref

namespace strata::model::ops::ref {

void lm_head_forward(float* logits, const float* inp, const float* wte, int N, int C, int V) {
  for (int n = 0; n < N; ++n) {
    for (int v = 0; v < V; ++v) {
      double s = 0;
      for (int c = 0; c < C; ++c) s += static_cast<double>(inp[std::size_t(n) * C + c]) * wte[std::size_t(v) * C + c];
      logits[std::size_t(n) * V + v] = static_cast<float>(s);
    }
  }
}

void lm_head_backward(float* dinp, float* dwte, const float* dlogits, const float* inp, const float* wte, int N, int C,
                      int V) {
  for (int n = 0; n < N; ++n) {
    for (int c = 0; c < C; ++c) {
      double s = 0;
      for (int v = 0; v < V; ++v)
        s += static_cast<double>(dlogits[std::size_t(n) * V + v]) * wte[std::size_t(v) * C + c];
      dinp[std::size_t(n) * C + c] = static_cast<float>(s);
    }
  }
  for (int v = 0; v < V; ++v) {
    for (int c = 0; c < C; ++c) {
      double s = dwte[std::size_t(v) * C + c];
      for (int n = 0; n < N; ++n)
        s += static_cast<double>(dlogits[std::size_t(n) * V + v]) * inp[std::size_t(n) * C + c];
      dwte[std::size_t(v) * C + c] = static_cast<float>(s);
    }
  }
}

}  // namespace strata::model::ops::ref
