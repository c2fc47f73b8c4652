/* gpu_exec.h -- runs IR graphs on one NVIDIA GPU: the generated kernels (gpu_kernels.h),
 * cuBLASLt GEMMs and attention, with the parameters' fp32 masters and AdamW moments resident
 * on the device. The same interface as the CPU executor, op for op, so tests compare them.
 *
 * This first backend is correct rather than fast: each expert's GEMM is its own cuBLASLt call,
 * which needs the routed row counts on the host (one synchronisation per layer), and buffers
 * come from a size-class pool rather than a liveness plan. */
#ifndef MOEC_GPU_EXEC_H
#define MOEC_GPU_EXEC_H

#include <stddef.h>
#include <stdint.h>

#include "ir.h"
#include "gpu_loader.h"
#include "params.h"

typedef struct gpu_runtime gpu_runtime;
typedef struct gpu_exec gpu_exec;

/* Opens GPU 0, loads NVRTC, cuBLASLt, and uploads the parameters. NULL with a message that
 * says what is missing ("libcuda.so.1 not found (no NVIDIA driver); use --device cpu"). */
gpu_runtime *gpu_runtime_new(rt_params *ps, const char *dump_dir, char *err, size_t errlen);
/* The same on GPU `ordinal` (a rank's own GPU under data/expert parallelism). */
gpu_runtime *gpu_runtime_new_on(rt_params *ps, int ordinal, const char *dump_dir, char *err, size_t errlen);
void gpu_runtime_free(gpu_runtime *rt);
/* Copies the device's weights and moments into ps (host copies a test compares), or ps into the device. */
int gpu_runtime_download(gpu_runtime *rt, rt_params *ps, char *err, size_t errlen);
/* One tensor of parameter i (its index in the store) into dst: the f32 weight (which 0,
 * numel values) or the AdamW moment values the device holds (1: m, 2: v; mn values, a ZeRO
 * shard or whole; widened from bf16 where stored so). -1 with err set on a GPU error. */
int gpu_runtime_fetch(gpu_runtime *rt, int i, int which, float *dst, char *err, size_t errlen);
/* The reverse: src (the same values) into the device's tensor, its bf16 copy and FP8 squares
 * marked stale (as an upload does). */
int gpu_runtime_store(gpu_runtime *rt, int i, int which, const float *src, char *err, size_t errlen);
int gpu_runtime_upload(gpu_runtime *rt, const rt_params *ps, char *err, size_t errlen);
/* "NVIDIA H200 (sm_90a)" */
const char *gpu_runtime_device(const gpu_runtime *rt);
/* Most device bytes held at once since start (from the driver, the pool's cache included). */
size_t gpu_runtime_peak_bytes(const gpu_runtime *rt);
/* Most bytes in use by tensors at once since start: held minus the pool's cached buffers and
 * its size-class rounding (what torch.cuda.max_memory_allocated counts). */
size_t gpu_runtime_peak_used_bytes(const gpu_runtime *rt);
/* Device bytes in use by tensors now (held minus the pool's cache and rounding). */
size_t gpu_runtime_live_bytes(const gpu_runtime *rt);
gpu_host_stats gpu_runtime_host_stats(const gpu_runtime *rt); /* gpu_loader.h */
gpu_ctx *gpu_runtime_ctx(gpu_runtime *rt);

gpu_exec *gpu_exec_new(gpu_runtime *rt, const ir_graph *g, char *err, size_t errlen);
/* How many grouped GEMM ops of the graph run their GEMMs in FP8 (gpu_fp8.h). */
int gpu_exec_fp8_sites(const gpu_exec *x);
/* How many expert-weight stacks of x's graph are kept as FP8 squares that AdamW writes (the
 * weight-tile recipe on cuBLASLt; MOEC_SQUARES=0: none). */
int gpu_exec_squares(const gpu_exec *x);
/* How many nodes of x's graph are views of kind `view` (gpu_views.h): VIEW_GATHER, the expert
 * permutes whose FP8 quantizes gather their rows (MOEC_GATHER=0 turns them off); VIEW_SPLIT_Q,
 * the rows quantizes the split backwards make (MOEC_SPLIT_Q=0); VIEW_SPLIT_FP8, the expert
 * columns quantizes they make (MOEC_SPLIT_FP8=0 turns them off). */
int gpu_exec_views(const gpu_exec *x, int view);
/* The launches (each with its event) of the last AdamW update queued beside the next forward
 * (MOEC_ADAMW_OVERLAP=1, gpu_exec_update.c); 0 when it ran on the main stream (the default). */
int gpu_runtime_update_launches(const gpu_runtime *rt);
/* How many FP8 grouped_mlps quantize their saved gate_up in their act quantize's kernel
 * (only with MOEC_ACT_STORE set, and not to 0). */
int gpu_exec_act_stores(const gpu_exec *x);
/* For tests: each stack kept as squares and fresh compared, byte for byte, with the quantize of
 * its weights as they are now; the number checked, or -1 (err says which differed). Syncs. */
int gpu_exec_check_squares(gpu_exec *x, char *err, size_t errlen);
void gpu_exec_free(gpu_exec *x);
/* Data/expert parallelism: the rank's collectives (gpu_comm.h; the caller keeps c). Without
 * one, a graph with collectives fails at its first, with a message. */
struct gpu_comm;
void gpu_exec_set_comm(gpu_exec *x, struct gpu_comm *c);
/* As cpu_exec_run. */
int gpu_exec_run(gpu_exec *x, const int32_t *tokens, const int32_t *labels, int64_t step, float *outputs,
                 double *grad_norm, char *err, size_t errlen);
/* After a run with keep_all: a float value copied to the host (f32), for tests. Returns the
 * number of elements written (0 if none). */
void gpu_exec_keep_all(gpu_exec *x, int keep_all);
int64_t gpu_exec_value(gpu_exec *x, int id, float *dst, int64_t cap);

#endif
