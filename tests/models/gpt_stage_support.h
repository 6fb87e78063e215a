// The small GPT the GPT stage tests (gpt_stage_test.cc) train through the pipeline-stage
// drivers of tests/engine/pipeline_stage_support.h.
#pragma once

#include <memory>
#include <string>

#include "models/gpt/config.h"
#include "models/gpt/data.h"
#include "tests/engine/pipeline_stage_support.h"

namespace strata::test::pipe {

// The GPT the GPT stage tests train: 2 blocks of width 16 (4 pipeline layers: embeddings,
// 2 blocks, head), 8-byte sequences, and a batcher over byte text it writes under `dir`;
// model_of(2) gives each replica micro-batches of 2 sequences.
struct SmallGpt {
  model::GptConfig config;
  std::shared_ptr<const model::TokenData> data;  // the batcher reads it
  std::shared_ptr<const model::Batcher> batcher;
  ModelOf model_of(int micro_batch) const;
};
SmallGpt small_gpt(const std::string& dir, bool unit_scaled);

}  // namespace strata::test::pipe
