// GPT presets, validation and the parameter list (see config.h).
#include "models/gpt/config.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "models/gpt/unit_scale.h"
#include "runtime/core/error.h"

namespace strata::model {

GptShape gpt_preset(const std::string& name) {
  if (name == "tiny") return {4, 4, 128, 256, 256};
  if (name == "124M") return {12, 12, 768, 1024, 50257};
  if (name == "350M") return {24, 16, 1024, 1024, 50257};
  if (name == "774M") return {36, 20, 1280, 1024, 50257};
  if (name == "1.5B") return {48, 25, 1600, 1024, 50257};
  STRATA_THROW(Errc::invalid_argument, "--preset '", name, "' is not a GPT preset: use tiny, 124M, 350M, 774M or 1.5B");
}

Remat parse_remat(const std::string& s) {
  if (s == "never") return Remat::never;
  if (s == "except_last") return Remat::except_last;
  if (s == "always") return Remat::always;
  STRATA_THROW(Errc::invalid_argument, "--remat '", s,
               "' is not a re-materialization mode: use never, except_last or always");
}

int remat_act_sets(Remat r, int layers) noexcept {
  switch (r) {
    case Remat::never:
      return layers;
    case Remat::always:
      return 1;
    case Remat::except_last:
      return std::min(layers, 2);
  }
  return layers;
}

int remat_act_set(Remat r, int block, int layers) noexcept {
  switch (r) {
    case Remat::never:
      return block;
    case Remat::always:
      return 0;
    case Remat::except_last:
      return block == layers - 1 ? remat_act_sets(r, layers) - 1 : 0;
  }
  return 0;
}

bool remat_recomputes(Remat r, int block, int layers) noexcept {
  return r == Remat::always || (r == Remat::except_last && block != layers - 1);
}

const char* remat_name(Remat r) noexcept {
  switch (r) {
    case Remat::never:
      return "never";
    case Remat::except_last:
      return "except_last";
    case Remat::always:
      return "always";
  }
  return "?";
}

void validate(const GptConfig& c) {
  const auto& s = c.shape;
  STRATA_CHECK(s.layers >= 1, Errc::invalid_argument, "--layers ", s.layers, " must be >= 1");
  STRATA_CHECK(s.heads >= 1 && s.d_model >= 1 && s.d_model % s.heads == 0, Errc::invalid_argument, "--d-model ",
               s.d_model, " must be a positive multiple of --heads ", s.heads);
  STRATA_CHECK(s.vocab >= 2 && s.vocab <= 65536, Errc::invalid_argument, "--vocab ", s.vocab,
               " must be from 2 to 65536 (this GPT's limit; token files themselves may hold uint32 ids)");
  STRATA_CHECK(s.positions >= 1, Errc::invalid_argument, "the position table (--positions) must have >= 1 row");
  STRATA_CHECK(c.seq_len >= 1, Errc::invalid_argument, "--seq-len ", c.seq_len, " must be >= 1");
  STRATA_CHECK(c.seq_len <= s.positions, Errc::invalid_argument, "--seq-len ", c.seq_len,
               " is above the model's position table (wpe.weight has ", s.positions,
               " rows): use --seq-len <= ", s.positions, " or a larger --positions");
}

std::vector<GptParam> gpt_params(const GptShape& s, bool unit_scaled, int seq_len) {
  const std::int64_t C = s.d_model, V = s.vocab, P = s.positions;
  // GPT-2 scales the residual projections by 1/sqrt(2 L) at initialisation.
  const float std_w = unit_scaled ? 1.0f : 0.02f;
  const float std_proj = unit_scaled ? 1.0f : static_cast<float>(0.02 / std::sqrt(2.0 * s.layers));
  const engine::ParamInit ones{engine::InitKind::ones, 0.0f}, zeros{engine::InitKind::zeros, 0.0f};
  const engine::ParamInit w{engine::InitKind::normal, std_w}, proj{engine::InitKind::normal, std_proj};
  std::array<float, 4> lr{1.0f, 1.0f, 1.0f, 1.0f};  // per block product
  float lr_wte = 1.0f;
  if (unit_scaled) {  // (unit_scale.h: a weight that computes as s W steps at lr / s)
    const UnitScales u(s, seq_len > 0 ? seq_len : s.positions);
    for (int k = 0; k < 4; ++k) lr[static_cast<std::size_t>(k)] = 1.0f / u.forward()[static_cast<std::size_t>(k)];
    lr[1] /= u.attention();        // the attention projection's input carries attention's output scale
    lr[3] /= UnitScales::gelu();   // and the MLP's down projection GELU's
    lr_wte = 1.0f / u.head().fwd;  // the tied head moves as the plain model's does
  }
  std::vector<GptParam> out;
  out.push_back({"wte.weight", {V, C}, 0, w, lr_wte});
  out.push_back({"wpe.weight", {P, C}, 0, w, lr_wte});  // summed with wte: they move alike
  for (int l = 0; l < s.layers; ++l) {
    const std::string h = "h." + std::to_string(l) + ".";
    const int layer = l + 1;
    out.push_back({h + "ln_1.weight", {C}, layer, ones});
    out.push_back({h + "ln_1.bias", {C}, layer, zeros});
    out.push_back({h + "attn.c_attn.weight", {C, 3 * C}, layer, w, lr[0]});
    out.push_back({h + "attn.c_attn.bias", {3 * C}, layer, zeros});
    out.push_back({h + "attn.c_proj.weight", {C, C}, layer, proj, lr[1]});
    out.push_back({h + "attn.c_proj.bias", {C}, layer, zeros});
    out.push_back({h + "ln_2.weight", {C}, layer, ones});
    out.push_back({h + "ln_2.bias", {C}, layer, zeros});
    out.push_back({h + "mlp.c_fc.weight", {C, 4 * C}, layer, w, lr[2]});
    out.push_back({h + "mlp.c_fc.bias", {4 * C}, layer, zeros});
    out.push_back({h + "mlp.c_proj.weight", {4 * C, C}, layer, proj, lr[3]});
    out.push_back({h + "mlp.c_proj.bias", {C}, layer, zeros});
  }
  out.push_back({"ln_f.weight", {C}, s.layers + 1, ones});
  out.push_back({"ln_f.bias", {C}, s.layers + 1, zeros});
  return out;
}

std::size_t head_chunk_rows(std::size_t tokens, int max_batch, int vocab, bool whole) noexcept {
  constexpr std::size_t kChunkFloats = std::size_t{1} << 22;
  if (whole) return tokens;
  return std::min(tokens,
                  std::max(kChunkFloats / static_cast<std::size_t>(vocab), static_cast<std::size_t>(max_batch)));
}

double gpt_train_flops_per_token(const GptShape& s, int seq_len) {
  const double C = s.d_model, L = s.layers;
  const double matmul_weights = L * 12.0 * C * C + static_cast<double>(s.vocab) * C;
  return 6.0 * matmul_weights + 12.0 * L * seq_len * C;
}

std::uint64_t gpt_parameter_count(const GptShape& s) {
  std::uint64_t n = 0;
  for (const auto& p : gpt_params(s)) {
    std::uint64_t e = 1;
    for (auto d : p.shape) e *= static_cast<std::uint64_t>(d);
    n += e;
  }
  return n;
}

}  // namespace strata::model
