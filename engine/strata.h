/* Strata's C API: the host-trainer contract of docs/design.md for C and for other languages'
   foreign-function interfaces (Python ctypes/cffi). Every call returns a strata_status;
   on failure strata_last_error() gives the message of the calling thread's last error
   (valid until that thread's next failing call). Views returned by strata_gather and
   strata_grad_buffers stay valid until strata_release / strata_reduce_grads.
   Ranks: when STRATA_WORLD_SIZE (or an MPI/Slurm/torchrun equivalent) is set, the engine
   joins the other ranks through STRATA_RENDEZVOUS, as `strata launch` sets up. */
#ifndef STRATA_H
#define STRATA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct strata_engine strata_engine;

typedef enum {
  STRATA_OK = 0,
  STRATA_ERR_INVALID = 1, /* bad argument, config key or call order */
  STRATA_ERR_BUDGET = 2,  /* a tier's budget would be exceeded */
  STRATA_ERR_IO = 3,
  STRATA_ERR_COMM = 4, /* a peer rank failed or timed out */
  STRATA_ERR_UNSUPPORTED = 5,
  STRATA_ERR_INTERNAL = 9
} strata_status;

typedef enum { STRATA_FP32 = 0, STRATA_BF16 = 1, STRATA_FP16 = 2 } strata_dtype;
typedef enum {
  STRATA_INIT_NORMAL = 0,
  STRATA_INIT_UNIFORM = 1,
  STRATA_INIT_ZEROS = 2,
  STRATA_INIT_ONES = 3,
  STRATA_INIT_CONSTANT = 4
} strata_init;

typedef struct {
  void* data;
  strata_dtype dtype;
  size_t numel;
  const char* name;
} strata_tensor;

typedef struct {
  int64_t step;
  int skipped;
  double grad_norm;
  double loss_scale;
  float lr;
} strata_step_result;

typedef struct {
  uint64_t used_bytes, peak_bytes, budget_bytes;
  /* used_bytes by what holds them: compute-dtype parameters, gradient accumulators, optimizer
     state (fp32 masters and moments; a frozen layer has none), staging and scratch buffers. */
  uint64_t params_bytes, grads_bytes, optimizer_bytes, buffers_bytes;
} strata_tier_usage;

typedef struct {
  strata_tier_usage device, host, nvme;
} strata_memory_report;

/* The last completed step's traffic between tiers and the time it waited on it. */
typedef struct {
  uint64_t h2d_bytes, d2h_bytes, nvme_read_bytes, nvme_write_bytes;
  double io_wait_seconds, step_seconds;
} strata_io_report;

const char* strata_last_error(void);

/* config_path: a DeepSpeed-style JSON file. device_budget_bytes: the emulated device's
   memory (0: the config's memory_budget.device, else 1 GiB). */
strata_status strata_engine_create(const char* config_path, uint64_t device_budget_bytes, uint64_t seed,
                                   strata_engine** out);
/* The same on a chosen device: "host" (the emulated device), "cuda" (GPU local_rank; with
   several ranks an NCCL communicator joins the Gloo one), or "auto" (cuda when there is a
   GPU for every rank, else host). On
   cuda, views are device pointers: the trainer's kernels on a view must be complete before
   it calls strata_release or strata_reduce_grads on it. */
strata_status strata_engine_create_on(const char* config_path, const char* device, uint64_t device_budget_bytes,
                                      uint64_t seed, strata_engine** out);
/* The same with what a config's "auto" values are derived from, as the Hugging Face trainer
   fills them: the model's hidden size (zero_optimization's bucket sizes) and the run's
   optimizer steps (the scheduler's total_num_steps); 0 for either: not known (an "auto" that
   needs it is refused naming the key). */
strata_status strata_engine_create_for_model(const char* config_path, const char* device, uint64_t device_budget_bytes,
                                             uint64_t seed, uint64_t hidden_size, int64_t total_steps,
                                             strata_engine** out);
void strata_engine_destroy(strata_engine* engine);

strata_status strata_register_param(strata_engine* e, const char* name, const int64_t* shape, int ndim, int layer,
                                    strata_init init, float scale);
/* Before strata_setup: the layer takes no gradient and holds no optimizer state (a frozen
   base under LoRA adapters); it is gathered and released as any layer (Engine::freeze_layer). */
strata_status strata_freeze_layer(strata_engine* e, int layer);
strata_status strata_setup(strata_engine* e);
/* Between steps: every byte the engine holds on the device to host RAM (Engine::offload_states)
   and back; *bytes (may be NULL) gets the bytes moved. */
strata_status strata_offload_states(strata_engine* e, uint64_t* bytes);
strata_status strata_reload_states(strata_engine* e, uint64_t* bytes);
/* 1 between strata_offload_states and strata_reload_states, else 0. */
int strata_states_offloaded(const strata_engine* e);
strata_status strata_begin_step(strata_engine* e);
/* Fills up to `capacity` views (one per parameter of the layer); *count gets the number. */
strata_status strata_gather(strata_engine* e, int layer, strata_tensor* out, size_t capacity, size_t* count);
strata_status strata_release(strata_engine* e, int layer);
strata_status strata_grad_buffers(strata_engine* e, int layer, strata_tensor* out, size_t capacity, size_t* count);
strata_status strata_reduce_grads(strata_engine* e, int layer);
strata_status strata_step(strata_engine* e, strata_step_result* out);
/* Drops the step (or evaluation) in progress, for a trainer whose forward or backward failed
   midway: every gather not released is released, gradient buffers handed out are dropped,
   the step's reduced gradients are discarded, nothing is updated and the step counters do
   not move; the next strata_begin_step runs as if the dropped step had never begun. Views of
   the dropped step are invalid. Outside a step or evaluation it does nothing. With several
   ranks every rank drops the same step. */
strata_status strata_abandon_step(strata_engine* e);
/* Forward-only passes between steps (validation, generation): strata_gather and
   strata_release in any order, no gradients, the recorded gather order untouched. */
strata_status strata_begin_eval(strata_engine* e);
strata_status strata_end_eval(strata_engine* e);
float strata_loss_scale(const strata_engine* e);
/* The config as resolved ("auto" filled): micro-batches per step and the compute dtype. */
int64_t strata_accumulation_steps(const strata_engine* e);
strata_dtype strata_compute_dtype(const strata_engine* e);
int strata_rank(const strata_engine* e);
int strata_world_size(const strata_engine* e);
strata_status strata_memory(const strata_engine* e, strata_memory_report* out);
strata_status strata_io_stats(const strata_engine* e, strata_io_report* out);
/* Waits for background work (prefetches, reductions, NVMe write-backs); reports its failure. */
strata_status strata_synchronize(strata_engine* e);
/* The whole model's fp32 parameters in registration order; collective across ranks. */
strata_status strata_full_parameters(strata_engine* e, float* out, size_t capacity, size_t* count);
/* One layer's fp32 values, its parameters in registration order (Engine::layer_parameters):
 *count gets their number; out (capacity at least that) gets them. Collective. */
strata_status strata_layer_parameters(strata_engine* e, int layer, float* out, size_t capacity, size_t* count);

/* Checkpoints (collective, between steps). strata_save writes the engine's state (fp32
   masters, optimizer moments, step counters, loss scale) under root/step-N, commits it
   atomically, points root/latest at it and keeps the newest `keep` (0: all);
   trainer_state is a JSON object stored with it (NULL: {}). strata_load reads a checkpoint
   (a root: its latest; or a step directory) saved at any world size, stage or placement and
   copies the stored trainer state, NUL-terminated, into trainer_state_out (NULL: not
   wanted; STRATA_ERR_INVALID when it does not fit in `capacity`, with the state loaded). */
strata_status strata_save(strata_engine* e, const char* root, const char* trainer_state, int keep);
/* Starts from given weights, right after strata_setup (collective): `read` is asked for
   elements [elem, elem + count) of tensor `name` as fp32 into `out` and returns 0, or
   non-zero to fail the call (which then names the tensor). Moments start at zero. */
typedef int (*strata_weight_reader)(void* user, const char* name, uint64_t elem, uint64_t count, float* out);
strata_status strata_init_weights(strata_engine* e, strata_weight_reader read, void* user);
/* Between steps: the reader's values replace every tensor's, the optimizer moments and step
   counters kept (Engine::write_weights); source_rank >= 0: that rank's values, broadcast (the
   other ranks' readers are not called), -1: each rank's own. */
strata_status strata_write_weights(strata_engine* e, strata_weight_reader read, void* user, int source_rank);
strata_status strata_load(strata_engine* e, const char* path, char* trainer_state_out, size_t capacity);
/* The trainer state the last strata_load read ("" before one): *size is its length with
   the NUL; out (NULL: only the size) gets it when capacity holds it, so a state of any size
   is read without loading the checkpoint again. */
strata_status strata_loaded_trainer_state(strata_engine* e, char* out, size_t capacity, size_t* size);

#ifdef __cplusplus
}
#endif

#endif /* STRATA_H */
