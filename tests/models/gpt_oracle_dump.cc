// Writes what the PyTorch oracle (gpt_oracle_test.py) compares against: the engine's initial
// weights for a seed (the same values `strata train --seed S` starts from), the batches of
// the first steps as the Batcher draws them, and the loss and every parameter's gradient of
// one micro-batch computed by the GPT's host pass (GptPass) from given weights.
//   gpt_oracle_dump OUT_DIR DATA LAYERS HEADS D_MODEL SEQ VOCAB MICRO STEPS SEED [WEIGHTS] [--unit-scaled]
// writes OUT_DIR/init.safetensors, OUT_DIR/grads.safetensors, OUT_DIR/oracle.json
// ({"loss", "batches": [[inputs, targets] per step]}); grads are of step 0's batch, at
// WEIGHTS (a safetensors file) when given, else at the initial weights; --unit-scaled: the
// unit-scaled model's initial weights and pass.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "models/gpt/array_access.h"
#include "models/gpt/data.h"
#include "models/gpt/pass.h"
#include "models/safetensors.h"
#include "runtime/device/device.h"

using namespace strata;

int main(int argc, char** argv) {
  const bool unit = argc > 1 && std::string(argv[argc - 1]) == "--unit-scaled";
  if (unit) --argc;
  if (argc < 11) {
    std::fprintf(stderr, "usage: %s OUT DATA LAYERS HEADS D_MODEL SEQ VOCAB MICRO STEPS SEED [WEIGHTS]\n", argv[0]);
    return 2;
  }
  try {
    const std::string out = argv[1], data_path = argv[2];
    model::GptShape s{std::atoi(argv[3]), std::atoi(argv[4]), std::atoi(argv[5]), std::atoi(argv[6]),
                      std::atoi(argv[7])};
    const int micro = std::atoi(argv[8]), steps = std::atoi(argv[9]);
    const std::uint64_t seed = std::strtoull(argv[10], nullptr, 10);
    const int T = s.positions;
    // Initial values exactly as the engine makes them (keyed by name), or the given weights.
    std::vector<model::NamedTensor> init = model::gpt_initial_params(s, seed, unit);
    model::write_safetensors(out + "/init.safetensors", init);
    if (argc > 11) {
      std::map<std::string, std::vector<float>> given;
      for (auto& t : model::read_safetensors(argv[11])) given[t.name] = std::move(t.data);
      for (auto& t : init) t.data = given.at(t.name);
    }
    auto params = model::ArrayAccess::by_layer(s, std::move(init));
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
    model::GptPass pass(s, micro, T, model::Remat::never, *dev, model::ops::Products::fp32, {}, unit);
    model::ArrayAccess access(params);
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
