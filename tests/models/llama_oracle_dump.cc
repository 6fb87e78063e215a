// Writes what the Llama family's PyTorch oracle (llama_oracle_test.py) compares against: the
// batches of the first steps as the Batcher draws them, and the loss and every parameter's
// gradient of step 0's micro-batch computed by the host pass (LlamaPass) from the weights of
// a Hugging Face directory (config.json and an fp32 model.safetensors).
//   llama_oracle_dump MODEL_DIR DATA SEQ MICRO STEPS SEED OUT_DIR [REMAT]
// writes OUT_DIR/grads.safetensors (Hugging Face names) and OUT_DIR/oracle.json
// ({"loss", "batches": [[inputs, targets] per step]}); REMAT: never (default), always or
// except_last, whose gradients must be the same bits.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "models/gpt/array_access.h"
#include "models/gpt/data.h"
#include "models/llama/config.h"
#include "models/llama/pass.h"
#include "models/safetensors.h"
#include "runtime/device/device.h"

using namespace strata;

int main(int argc, char** argv) {
  if (argc < 8) {
    std::fprintf(stderr, "usage: %s MODEL_DIR DATA SEQ MICRO STEPS SEED OUT_DIR [REMAT]\n", argv[0]);
    return 2;
  }
  try {
    const std::string dir = argv[1], data_path = argv[2], out = argv[7];
    const int T = std::atoi(argv[3]), micro = std::atoi(argv[4]), steps = std::atoi(argv[5]);
    const std::uint64_t seed = std::strtoull(argv[6], nullptr, 10);
    const model::Remat remat = model::parse_remat(argc > 8 ? argv[8] : "never");
    nlohmann::json config;
    std::ifstream(dir + "/config.json") >> config;
    const model::LlamaShape s = model::parse_hf_config(config, dir + "/config.json");
    std::map<std::string, std::vector<float>> given;
    for (auto& t : model::read_safetensors(dir + "/model.safetensors")) given[t.name] = std::move(t.data);
    std::vector<std::vector<model::NamedTensor>> params(static_cast<std::size_t>(s.layers + 2));
    for (const auto& p : model::llama_params(s))
      params[static_cast<std::size_t>(p.layer)].push_back({p.name, p.shape, given.at(p.name)});
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
    dopt.budget_bytes = model::LlamaPass::device_bytes(s, micro, T, remat) + (1 << 20);
    auto dev = device::Device::create(dopt);
    model::LlamaPass pass(s, micro, T, remat, *dev);
    model::ArrayAccess access(params);
    const double loss = pass.train(access, in.data(), tg.data(), micro, T, 1.0f) / (static_cast<double>(micro) * T);
    model::write_safetensors(out + "/grads.safetensors", access.all_grads());
    j["loss"] = loss;
    std::ofstream(out + "/oracle.json") << j.dump();
    std::printf("loss %.8f\n", loss);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "llama_oracle_dump: %s\n", e.what());
    return 1;
  }
}
