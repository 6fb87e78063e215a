/* The C API's Hugging Face writer (libstrata_c): a model directory that transformers,
   `strata train --model DIR` and `strata export` read, written by models/hf/dir_writer.h
   (config.json with torch_dtype, model.safetensors or shards of at most max_shard_bytes with
   model.safetensors.index.json; complete at OUT or not there at all). Used by strata.torch's
   save_pretrained. */
#ifndef STRATA_HF_C_WRITER_H
#define STRATA_HF_C_WRITER_H

#include "engine/strata.h"

#ifdef __cplusplus
extern "C" {
#endif

/* `count` tensors, tensor i named names[i] with ndims[i] dimensions shapes[i], in that order;
   `read` gives each tensor's fp32 values in pieces (elem, count) and they are written as
   `dtype` ("fp32", "bf16" or "fp16"; rounded to nearest even). config_json is the JSON object
   written as config.json. */
strata_status strata_write_hf_dir(const char* out_dir, const char* config_json, size_t count, const char* const* names,
                                  const int64_t* const* shapes, const int* ndims, const char* dtype,
                                  uint64_t max_shard_bytes, strata_weight_reader read, void* user);

#ifdef __cplusplus
}
#endif

#endif
