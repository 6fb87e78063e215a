/* Strata's trainers and its plan from C and other languages' foreign-function interfaces
   (libstrata_c; python/strata: strata.train, strata.plan, strata.calibrate): one call runs
   what `strata train` runs (the plain trainer,
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
   run has ended; on failure strata_last_error() names the option, file or rank at fault. One
   runs at a time in a process; like `strata train` it sets glibc's mmap threshold to 8 MiB for
   the process (so the resident set follows what is live) and handles signals while it runs. A
   signal (SIGINT, SIGTERM) during the run stops it after the current step, with a final
   checkpoint where it saves them, and fails naming the signal. */
strata_status strata_train(const char* options_json);

/* `strata plan` as a call: options_json keyed by its flags in the same way ({"model": "gpt",
   "preset": "124M", "seq_len": 1024, "budget": "device=8GiB,host=64GiB", "nvme_path": "/nvme",
   "calibration": "strata-calibration.json"}); the model's training pass is profiled in this
   process (train/pass_profile.h), the rest comes from the calibration file. On success
   *result_json is a JSON object, {"fitting", "candidates", "batch", "world", "best": every
   fitting candidate, fastest first, as `strata plan --json` prints them (its config runnable
   with strata_train)}, allocated by the library: free it with strata_free_text. A budget
   nothing fits fails with STRATA_ERR_BUDGET, naming the smallest budget per tier that would. */
strata_status strata_plan(const char* options_json, char** result_json);

/* `strata bench calibrate` as a call, options keyed by its flags ({"nvme": "/nvme/tmp", "out":
   "strata-calibration.json", "quick": true}) and "strata": the `strata` executable whose
   benches measure (each in a child process; default: bin/strata beside this library's lib/,
   as a build tree has them). Writes the calibration file strata_plan reads. */
strata_status strata_calibrate(const char* options_json);
void strata_free_text(char* text);

#ifdef __cplusplus
}
#endif

#endif
