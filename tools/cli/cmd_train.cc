// `strata train --model mlp|gpt|DIR --config FILE.json`: the flags of the plain and pipelined
// trainers (train/trainer.h, train/pipelined.h), which train the demo MLP, the GPT or a
// Llama-family decoder (train/model.h) through the ZeRO engine on a CUDA device (MLP) or the host device, alone or
// as one rank of `strata launch`
// (ranks on GPUs add an NCCL communicator for collectives on device memory; Gloo keeps
// those on host memory); --device auto takes GPU local_rank when there is one. Shows progress
// (step, loss, tokens/s, step time, memory per tier; the GPT's validation loss), writes one JSON object per step with
// --log-json, the final fp32 parameters as safetensors with --save-params (rank 0 writes
// the gathered whole), and a Chrome trace with --trace. --pipeline-stages P splits the GPT,
// a Hugging Face Llama-family model or the MLP over P pipeline stages on ZeRO engines instead.
#include <memory>

#include "tools/cli/command.h"
#include "tools/cli/flags.h"
#include "train/trainer.h"

namespace strata::cli {

using namespace strata::train;  // the library these commands parse flags for
namespace {

Action setup(CLI::App& cmd) {
  auto o = std::make_shared<TrainOptions>();
  auto& m = o->m;
  cmd.footer(kConfigHelpFooter);
  cmd.add_option("--config", o->config, "DeepSpeed-style JSON config")->required();
  add_model_options(cmd, m);
  cmd.add_option("--data", m.data, "GPT training text: a file, a directory of files, or an llm.c token file");
  cmd.add_option("--data-format", m.data_format, "auto|bytes|tokens|u16|u32 (see models/gpt/data.h)");
  cmd.add_option("--val-fraction", m.val_fraction, "Share of the data held out for validation (default 0.1)");
  cmd.add_option("--eval-every", m.eval_every, "GPT: validation loss every N steps (and after the last)")
      ->check(CLI::NonNegativeNumber);
  cmd.add_option("--eval-batches", m.eval_batches, "GPT: validation micro-batches per evaluation")
      ->check(CLI::Range(1, 1 << 20));
  cmd.add_option("--sample", m.sample, "GPT: print N generated tokens (bytes) at the end")
      ->check(CLI::NonNegativeNumber);
  cmd.add_option("--tokenizer", m.tokenizer,
                 "Decode --sample with this tokenizer (tokenizer.json, tokenizer.model, or a directory holding one)");
  cmd.add_option("--steps", o->steps, "Optimizer steps");
  cmd.add_option("--seed", m.seed, "Seed for initialisation and data");
  cmd.add_option("--log-json", o->log_json, "Write one JSON object per step to this file");
  cmd.add_option("--save-params", o->save_params, "Write the final fp32 parameters (safetensors)");
  cmd.add_option("--trace", o->trace, "Write a Chrome trace (Perfetto) of the run");
  cmd.add_option("--device", o->device,
                 "auto|host|cuda (auto: GPU local_rank when there is a GPU for every rank, else host)");
  cmd.add_option("--device-budget", o->device_budget,
                 "Device memory budget when the config has no memory_budget.device");
  cmd.add_option("--link-gbps", o->link_gbps, "Host device: throttle H2D/D2H to this bandwidth (GB/s)")
      ->check(CLI::NonNegativeNumber);
  add_checkpoint_options(cmd, o->ckpt);
  cmd.add_flag("--explain", o->explain, "Print the placement: what lives on which tier and why");
  add_printing_flags(cmd, o->printing);
  cmd.add_option("--layer-ms", m.layer_ms, "Simulated compute per layer forward (backward: twice)")
      ->check(CLI::NonNegativeNumber);
  CLI::Option* stages = cmd.add_option("--pipeline-stages", o->pipe.stages,
                                       "Split the layers (GPT, MLP or --model DIR) over P pipeline stages, each on a "
                                       "ZeRO engine (threads, or strata "
                                       "launch -n P*D for D data-parallel replicas)")
                            ->check(CLI::Range(1, 1024));
  // The pipeline's own flags mean nothing without it: refused rather than ignored.
  cmd.add_option("--schedule", o->pipe.schedule, "With --pipeline-stages: gpipe|1f1b|interleaved|zb-h1|zb-h2|zb-auto")
      ->needs(stages);
  cmd.add_option("--chunks", o->pipe.chunks, "With --schedule interleaved: chunks per stage")
      ->check(CLI::Range(1, 64))
      ->needs(stages);
  cmd.add_option("--measure-steps", o->pipe.measure_steps,
                 "With --schedule zb-auto: steps run as ZB-H1 whose per-stage F/B/W times zb-auto schedules from "
                 "(default 1)")
      ->check(CLI::Range(1, 1000))
      ->needs(stages);
  return [o, &cmd] {
    check_model_flags(cmd, o->m.model);
    return run_training(*o);
  };
}

const Registration reg("", "train", "Train the demo MLP or the GPT through the ZeRO engine", setup);

}  // namespace
}  // namespace strata::cli
