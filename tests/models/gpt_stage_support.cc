// The small GPT of the GPT stage tests (see gpt_stage_support.h).
#include "tests/models/gpt_stage_support.h"

#include <fstream>

#include "models/gpt/pipeline_layers.h"

namespace strata::test::pipe {

SmallGpt small_gpt(const std::string& dir, bool unit_scaled) {
  SmallGpt g;
  g.config.shape = model::GptShape{2, 2, 16, 16, 256};
  g.config.seq_len = 8;
  g.config.unit_scaled = unit_scaled;
  const std::string text = dir + "/text.txt";
  {
    std::ofstream f(text);
    for (int i = 0; i < 200; ++i) f << "line " << i * 7919 % 1000 << ": the quick brown fox, " << i % 13 << "\n";
  }
  g.data = std::make_shared<const model::TokenData>(model::TokenData::load(text, 256, "bytes", true));
  g.batcher = std::make_shared<model::Batcher>(*g.data, text, g.config.seq_len, 0.1, 3);
  return g;
}

ModelOf SmallGpt::model_of(int micro_batch) const {
  return [c = config, d = data, b = batcher, micro_batch](int) {
    (void)d;  // held: the batcher reads it
    return model::gpt_pipeline_model(c, micro_batch, kMicro, b).model;
  };
}

}  // namespace strata::test::pipe
