/* Strata's trainers from C and other languages' foreign-function interfaces (libstrata_c;
   python/strata: strata.train): one call runs what `strata train` runs (the plain trainer,
   or the pipelined one with "pipeline_stages"), as one rank of the job the environment names
   (STRATA_WORLD_SIZE and the rendezvous `strata launch` sets up; alone without it), printing
   its progress on stdout and writing what its options ask for (log, checkpoints, parameters,
   trace). */
#ifndef STRATA_TRAIN_C_H
#define STRATA_TRAIN_C_H

#include "engine/strata.h"

#ifdef __cplusplus
extern "C" {
#endif

/* options_json: one JSON object whose keys are `strata train`'s long flags without the dashes
   and with '_' for '-', e.g. {"model": "gpt", "config": "ds.json", "data": "corpus.txt",
   "steps": 100, "save_dir": "ckpt", "quiet": true} (train/options_json.h). Returns when the
   run has ended; on failure strata_last_error() names the option, file or rank at fault. A
   signal (SIGINT, SIGTERM) during the run stops it after the current step, with a final
   checkpoint where it saves them, and fails naming the signal. */
strata_status strata_train(const char* options_json);

#ifdef __cplusplus
}
#endif

#endif
