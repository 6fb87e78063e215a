// Writes what the PyTorch oracle (gpt_oracle_test.py) compares against: the engine's initial
// weights for a seed (the same values `strata train --seed S` starts from), the batches of
// the first steps as the Batcher draws them, and the loss and every parameter's gradient of
// one micro-batch computed by the GPT's host pass (GptPass) from given weights.
//   gpt_oracle_dump OUT_DIR DATA LAYERS HEADS D_MODEL SEQ VOCAB MICRO STEPS SEED [WEIGHTS]
// writes OUT_DIR/init.safetensors, OUT_DIR/grads.safetensors, OUT_DIR/oracle.json
// ({"loss", "batches": [[inputs, targets] per step]}); grads are of step 0's batch, at
// WEIGHTS (a safetensors file) when given, else at the initial weights.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "engine/device/device.h"
#include "engine/zero/layout.h"
#include "models/gpt/data.h"
#include "models/gpt/pass.h"
#include "models/safetensors.h"

using namespace strata;

namespace {

// Parameters in plain host arrays, per layer, in registration order.
class HostAccess : public model::LayerAccess {
 public:
  HostAccess(std::vector<std::vector<model::NamedTensor>>& params) : p_(params), g_(params.size()), open_(params.size()) {}
  std::vector<const float*> acquire(int layer) override {
    std::vector<const float*> out;
    for (auto& t : p_[layer]) out.push_back(t.data.data());
    return out;
  }
  void release(int) override {}
  std::vector<float*> grads(int layer) override {
    if (!open_[layer]) {
      g_[layer].clear();
      for (auto& t : p_[layer]) g_[layer].push_back({t.name, t.shape, std::vector<float>(t.data.size(), 0.0f)});
      open_[layer] = true;
    }
    std::vector<float*> out;
    for (auto& t : g_[layer]) out.push_back(t.data.data());
    return out;
  }
  void commit(int layer) override { open_[layer] = false; }
  std::vector<model::NamedTensor> all_grads() const {
    std::vector<model::NamedTensor> out;
    for (const auto& l : g_) out.insert(out.end(), l.begin(), l.end());
    return out;
  }

 private:
  std::vector<std::vector<model::NamedTensor>>& p_;
  std::vector<std::vector<model::NamedTensor>> g_;
  std::vector<bool> open_;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 11) {
    std::fprintf(stderr, "usage: %s OUT DATA LAYERS HEADS D_MODEL SEQ VOCAB MICRO STEPS SEED [WEIGHTS]\n", argv[0]);
    return 2;
  }
  try {
    const std::string out = argv[1], data_path = argv[2];
    model::GptShape s{std::atoi(argv[3]), std::atoi(argv[4]), std::atoi(argv[5]), std::atoi(argv[6]), std::atoi(argv[7])};
    const int micro = std::atoi(argv[8]), steps = std::atoi(argv[9]);
    const std::uint64_t seed = std::strtoull(argv[10], nullptr, 10);
    const int T = s.positions;
    // Initial values exactly as the engine makes them (zero::init_values, keyed by name).
    std::vector<std::vector<model::NamedTensor>> params(static_cast<std::size_t>(s.layers + 2));
    std::vector<model::NamedTensor> init;
    for (const auto& p : model::gpt_params(s)) {
      zero::ParamSpec spec{p.name, p.shape, p.layer, p.init};
      std::size_t n = 1;
      for (auto d : p.shape) n *= static_cast<std::size_t>(d);
      std::vector<float> v(n);
      zero::init_values(spec, seed, 0, n, v.data());
      init.push_back({p.name, p.shape, v});
    }
    model::write_safetensors(out + "/init.safetensors", init);
    std::map<std::string, std::vector<float>> given;
    if (argc > 11) {
      for (auto& t : model::read_safetensors(argv[11])) given[t.name] = std::move(t.data);
    }
    for (const auto& p : model::gpt_params(s)) {
      model::NamedTensor t;
      for (const auto& i : init) {
        if (i.name == p.name) t = i;
      }
      if (!given.empty()) t.data = given.at(p.name);
      params[static_cast<std::size_t>(p.layer)].push_back(t);
    }
    const auto data = model::TokenData::load(data_path, s.vocab, "auto", true);
    model::Batcher batcher(data, data_path, T, 0.1, seed);
    nlohmann::json j;
    std::vector<std::int32_t> in(static_cast<std::size_t>(micro) * T), tg(in.size());
    for (int st = 0; st < steps; ++st) {
      batcher.train_batch(st, micro, 0, 1, 0, micro, in.data(), tg.data());
      j["batches"].push_back({in, tg});
    }
    batcher.train_batch(0, micro, 0, 1, 0, micro, in.data(), tg.data());
    device::DeviceOptions dopt;
    dopt.backend = device::Backend::host;
    dopt.budget_bytes = model::GptPass::device_bytes(s, micro, T, model::Remat::never) + (1 << 20);
    auto dev = device::Device::create(dopt);
    model::GptPass pass(s, micro, T, model::Remat::never, *dev);
    HostAccess access(params);
    const double loss = pass.train(access, in.data(), tg.data(), micro, T, 1.0f) / (static_cast<double>(micro) * T);
    model::write_safetensors(out + "/grads.safetensors", access.all_grads());
    j["loss"] = loss;
    std::ofstream(out + "/oracle.json") << j.dump();
    std::printf("loss %.8f\n", loss);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpt_oracle_dump: %s\n", e.what());
    return 1;
  }
}
