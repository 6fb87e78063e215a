/* The C API exercised from plain C (C11): a one-layer least-squares model trained through
   the host-trainer contract, memory queries, a checkpoint saved and loaded into a second
   engine that then steps with the same bits, and the error path. Prints
   "N passed, M failed" and exits non-zero on any failure. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/strata.h"

static int passed = 0, failed = 0;
#define EXPECT(cond, what)                                                                       \
  do {                                                                                           \
    if (cond) {                                                                                  \
      ++passed;                                                                                  \
    } else {                                                                                     \
      ++failed;                                                                                  \
      fprintf(stderr, "FAILED %s:%d: %s (%s)\n", __FILE__, __LINE__, what, strata_last_error()); \
    }                                                                                            \
  } while (0)

int main(int argc, char** argv) {
  const char* dir = argc > 1 ? argv[1] : "/tmp";
  char path[512];
  snprintf(path, sizeof path, "%s/strata_c_api_test.json", dir);
  FILE* f = fopen(path, "w");
  if (!f) {
    perror(path);
    return 2;
  }
  fputs(
      "{\"train_micro_batch_size_per_gpu\": 1, \"gradient_accumulation_steps\": 2,"
      " \"zero_optimization\": {\"stage\": 3, \"stage3_param_persistence_threshold\": 0},"
      " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.05, \"weight_decay\": 0.0}}}",
      f);
  fclose(f);

  strata_engine* e = NULL;
  EXPECT(strata_engine_create(path, 64u << 20, 3, &e) == STRATA_OK, "create");
  if (!e) return 1;
  const int64_t shape[1] = {8};
  EXPECT(strata_register_param(e, "w", shape, 1, 0, STRATA_INIT_ZEROS, 0.0f) == STRATA_OK, "register");
  EXPECT(strata_setup(e) == STRATA_OK, "setup");
  EXPECT(strata_world_size(e) == 1 && strata_rank(e) == 0, "single rank");

  /* Minimise 0.5 * ||w - target||^2 with target[i] = i / 8. */
  strata_tensor view[2], grad[2];
  size_t n = 0;
  for (int step = 0; step < 200; ++step) {
    EXPECT(strata_begin_step(e) == STRATA_OK, "begin_step");
    for (int mb = 0; mb < 2; ++mb) {
      EXPECT(strata_gather(e, 0, view, 2, &n) == STRATA_OK && n == 1, "gather");
      EXPECT(strata_grad_buffers(e, 0, grad, 2, &n) == STRATA_OK && n == 1, "grad_buffers");
      const float* w = (const float*)view[0].data;
      float* g = (float*)grad[0].data;
      for (size_t i = 0; i < 8; ++i) g[i] = (w[i] - (float)i / 8.0f) * strata_loss_scale(e);
      EXPECT(strata_reduce_grads(e, 0) == STRATA_OK, "reduce_grads");
      EXPECT(strata_release(e, 0) == STRATA_OK, "release");
    }
    strata_step_result r;
    EXPECT(strata_step(e, &r) == STRATA_OK && r.skipped == 0, "step");
  }
  float out[8];
  EXPECT(strata_full_parameters(e, out, 8, &n) == STRATA_OK && n == 8, "full_parameters");
  double worst = 0;
  for (int i = 0; i < 8; ++i) worst = fmax(worst, fabs(out[i] - i / 8.0));
  EXPECT(worst < 0.02, "converged to the target");

  strata_memory_report m;
  EXPECT(strata_memory(e, &m) == STRATA_OK && m.device.used_bytes > 0 && m.device.peak_bytes <= m.device.budget_bytes,
         "memory report");
  EXPECT(m.nvme.used_bytes == 0, "nothing on NVMe without offload");
  strata_io_report io;
  EXPECT(strata_io_stats(e, &io) == STRATA_OK && io.step_seconds > 0 && io.nvme_read_bytes == 0, "io stats");
  EXPECT(strata_synchronize(e) == STRATA_OK, "synchronize");

  /* A checkpoint: a second engine loads it and both take the same next step bit for bit. */
  char root[512], state[64];
  snprintf(root, sizeof root, "%s/strata_c_api_ckpt", dir);
  EXPECT(strata_save(e, root, "{\"next_step\": 200}", 1) == STRATA_OK, "save");
  strata_engine* e2 = NULL;
  EXPECT(strata_engine_create(path, 64u << 20, 99, &e2) == STRATA_OK, "create a second engine");
  if (!e2) return 1;
  EXPECT(strata_register_param(e2, "w", shape, 1, 0, STRATA_INIT_ONES, 0.0f) == STRATA_OK, "register (2)");
  EXPECT(strata_setup(e2) == STRATA_OK, "setup (2)");
  EXPECT(strata_load(e2, root, state, 4) == STRATA_ERR_INVALID && strstr(strata_last_error(), "capacity 4"),
         "a trainer state larger than the buffer is refused");
  EXPECT(strata_load(e2, root, state, sizeof state) == STRATA_OK && strcmp(state, "{\"next_step\":200}") == 0,
         "load returns the trainer state");
  float out2[8];
  EXPECT(strata_full_parameters(e2, out2, 8, &n) == STRATA_OK && memcmp(out, out2, sizeof out) == 0,
         "loaded parameters are the saved ones");
  /* A step that fails midway (a layer gathered, a gradient written and not reduced) is dropped:
     without strata_abandon_step the next begin_step is refused; after it, e2's next step has
     e's bits, as if the dropped step had never begun. */
  EXPECT(strata_abandon_step(e2) == STRATA_OK, "abandon outside a step does nothing");
  EXPECT(strata_begin_step(e2) == STRATA_OK, "begin_step (dropped)");
  EXPECT(strata_gather(e2, 0, view, 2, &n) == STRATA_OK, "gather (dropped)");
  EXPECT(strata_grad_buffers(e2, 0, grad, 2, &n) == STRATA_OK, "grad_buffers (dropped)");
  for (size_t i = 0; i < 8; ++i) ((float*)grad[0].data)[i] = 1000.0f;
  EXPECT(strata_reduce_grads(e2, 0) == STRATA_OK, "reduce_grads (dropped)");
  EXPECT(strata_grad_buffers(e2, 0, grad, 2, &n) == STRATA_OK, "grad_buffers again (dropped)");
  for (size_t i = 0; i < 8; ++i) ((float*)grad[0].data)[i] = -1000.0f;
  EXPECT(strata_begin_step(e2) == STRATA_ERR_INVALID && strstr(strata_last_error(), "twice") != NULL,
         "a step left midway blocks the next begin_step");
  EXPECT(strata_abandon_step(e2) == STRATA_OK, "abandon the step");
  EXPECT(strata_full_parameters(e2, out2, 8, &n) == STRATA_OK && memcmp(out, out2, sizeof out) == 0,
         "the dropped step changed no parameter");
  strata_engine* both[2] = {e, e2};
  for (int k = 0; k < 2; ++k) {
    strata_engine* x = both[k];
    EXPECT(strata_begin_step(x) == STRATA_OK, "begin_step (checkpoint)");
    for (int mb = 0; mb < 2; ++mb) {
      EXPECT(strata_gather(x, 0, view, 2, &n) == STRATA_OK, "gather (checkpoint)");
      EXPECT(strata_grad_buffers(x, 0, grad, 2, &n) == STRATA_OK, "grad_buffers (checkpoint)");
      for (size_t i = 0; i < 8; ++i) ((float*)grad[0].data)[i] = ((const float*)view[0].data)[i] - (float)i / 8.0f;
      EXPECT(strata_reduce_grads(x, 0) == STRATA_OK && strata_release(x, 0) == STRATA_OK, "reduce (checkpoint)");
    }
    strata_step_result r;
    EXPECT(strata_step(x, &r) == STRATA_OK && r.step == 201, "step 201 on both");
  }
  EXPECT(strata_full_parameters(e, out, 8, &n) == STRATA_OK && strata_full_parameters(e2, out2, 8, &n) == STRATA_OK &&
             memcmp(out, out2, sizeof out) == 0,
         "the step after loading has the same bits (moments and step counter restored)");
  EXPECT(strata_load(e2, "/nonexistent/ckpt", NULL, 0) == STRATA_ERR_INVALID &&
             strstr(strata_last_error(), "/nonexistent/ckpt") != NULL,
         "a missing checkpoint is named");
  strata_engine_destroy(e2);
  {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    EXPECT(system(cmd) == 0, "remove the checkpoint");
  }

  /* Errors come back as codes with a message naming the problem. */
  EXPECT(strata_gather(e, 42, view, 2, &n) == STRATA_ERR_INVALID, "unknown layer is refused");
  EXPECT(strstr(strata_last_error(), "layer 42") != NULL, "message names the layer");
  EXPECT(strata_full_parameters(e, out, 4, &n) == STRATA_ERR_INVALID && n == 8, "small capacity is refused");
  strata_engine_destroy(e);

  strata_engine* bad = NULL;
  EXPECT(strata_engine_create("/nonexistent/ds.json", 0, 0, &bad) != STRATA_OK && bad == NULL, "missing config");
  EXPECT(strstr(strata_last_error(), "/nonexistent/ds.json") != NULL, "message names the file");
  EXPECT(strata_engine_create_on(path, "tpu", 0, 0, &bad) != STRATA_OK && bad == NULL &&
             strstr(strata_last_error(), "'tpu'") != NULL,
         "unknown device named");
  /* "host" is what strata_engine_create uses; "auto" takes a GPU only where one is present. */
  EXPECT(strata_engine_create_on(path, "host", 0, 0, &bad) == STRATA_OK && bad != NULL, "create on host");
  strata_engine_destroy(bad);
  bad = NULL;
  remove(path);
  printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
