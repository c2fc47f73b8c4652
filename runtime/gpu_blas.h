/* gpu_blas.h -- cuBLASLt, loaded at run time (libcublasLt.so.13, .so.12; MOEC_LIBCUBLASLT
 * overrides; else $CUDA_HOME/lib64, /usr/local/cuda/lib64), and the dense row-major GEMMs moec
 * runs through it (fp32 accumulation). Types are redeclared from CUDA 13.0's cublasLt.h:
 * handles are void *, enums int. */
#ifndef MOEC_GPU_BLAS_H
#define MOEC_GPU_BLAS_H

#include <stddef.h>
#include <stdint.h>

typedef int cublasStatus_t; /* CUBLAS_STATUS_SUCCESS = 0 */
typedef struct {
  uint64_t data[8];
} gpu_blas_algo; /* cublasLtMatmulAlgo_t */
typedef struct {
  gpu_blas_algo algo;
  size_t workspaceSize;
  cublasStatus_t state;
  float wavesCount;
  int reserved[4];
} gpu_blas_heuristic; /* cublasLtMatmulHeuristicResult_t */

typedef struct {
  size_t (*GetVersion)(void);
  cublasStatus_t (*Create)(void **handle);
  cublasStatus_t (*Destroy)(void *handle);
  cublasStatus_t (*MatmulDescCreate)(void **desc, int compute_type, int scale_type);
  cublasStatus_t (*MatmulDescDestroy)(void *desc);
  cublasStatus_t (*MatmulDescSetAttribute)(void *desc, int attr, const void *buf, size_t size);
  cublasStatus_t (*MatrixLayoutCreate)(void **layout, int type, uint64_t rows, uint64_t cols, int64_t ld);
  cublasStatus_t (*MatrixLayoutDestroy)(void *layout);
  cublasStatus_t (*MatrixLayoutSetAttribute)(void *layout, int attr, const void *buf, size_t size);
  cublasStatus_t (*MatmulPreferenceCreate)(void **pref);
  cublasStatus_t (*MatmulPreferenceDestroy)(void *pref);
  cublasStatus_t (*MatmulPreferenceSetAttribute)(void *pref, int attr, const void *buf, size_t size);
  cublasStatus_t (*MatmulAlgoGetHeuristic)(void *handle, void *desc, void *a, void *b, void *c, void *d, void *pref,
                                           int requested, gpu_blas_heuristic *results, int *returned);
  cublasStatus_t (*Matmul)(void *handle, void *desc, const void *alpha, const void *A, void *adesc, const void *B,
                           void *bdesc, const void *beta, const void *C, void *cdesc, void *D, void *ddesc,
                           const gpu_blas_algo *algo, void *workspace, size_t workspace_bytes, void *stream);
  const char *(*GetStatusString)(cublasStatus_t);
} gpu_blas_api;

/* Loads cuBLASLt once per process: the entry points, or NULL and the reason in err. */
const gpu_blas_api *gpu_blas_load(char *err, size_t errlen);

/* ---- GEMMs on one GPU ---- */
#include "codegen/cg_kernels.h"
#include "gpu_loader.h"

typedef struct gpu_blas gpu_blas;

/* Creates a handle on g's stream and a 32 MiB workspace. NULL with a message. */
gpu_blas *gpu_blas_new(gpu_ctx *g, char *err, size_t errlen);
void gpu_blas_free(gpu_blas *b);

/* Lanes: the GEMMs issued between gpu_blas_fork and gpu_blas_join may run at once, spread
 * over MOEC_GEMM_STREAMS streams (default 1 = g's stream only, at most 4) that start after
 * the work queued before the fork and that g's stream waits for at the join. gpu_blas_next_lane
 * moves the next GEMM to the next stream. Only for GEMMs whose outputs are disjoint (an expert's
 * weight gradient each; bf16 rows of exact counts -- not the FP8 row GEMMs, whose padded rows
 * spill into the next expert's): one expert's tail and the next one's start overlap.
 * A call that must choose its algorithm (a new shape class) runs on g's stream. Always join
 * after a fork, also after a failed GEMM: join returns rc, the loop's result (0, or -1 with
 * its message in err), or -1 with its own message when it fails after a clean loop.
 * (MOEC_PROFILE=kernels times work on g's stream: set MOEC_GEMM_STREAMS=1 for its per-kernel
 * times.) */
int gpu_blas_fork(gpu_blas *b, char *err, size_t errlen);
void gpu_blas_next_lane(gpu_blas *b);
int gpu_blas_join(gpu_blas *b, int rc, char *err, size_t errlen);

/* One operand of a (strided-batched) row-major GEMM: data of `dtype`, leading dimension ld
 * (elements between rows), stride (elements between batch entries), transposed or not. */
typedef struct {
  cg_dtype dtype;
  gpu_ptr p;
  int64_t ld, stride;
  int trans;
} gpu_mat;

/* C (m, n) = alpha * op(A) (m, k) . op(B) (k, n) + beta * C, for `batch` entries. A and B
 * share a dtype (bf16 or f32); C is f32 or A's dtype. 0, or -1 with a message in err. */
int gpu_gemm(gpu_blas *b, int64_t m, int64_t n, int64_t k, float alpha, const gpu_mat *A, const gpu_mat *B,
             float beta, const gpu_mat *C, int batch, char *err, size_t errlen);
/* C (m, n) = op(A) . op(B) + addend, the sum in f32 rounded once to C's dtype; addend a buffer
 * of C's dtype and layout, not C's (fuse-gemm-add's accumulating matmul). */
int gpu_gemm_add(gpu_blas *b, int64_t m, int64_t n, int64_t k, const gpu_mat *A, const gpu_mat *B, gpu_ptr addend,
                 const gpu_mat *C, char *err, size_t errlen);
/* FP8 with one f32 scale per 128 of k (cuBLASLt VEC128_32F, Hopper and newer): C (m, n),
 * bf16 or f32 row-major = A (m, k) . B (n, k)^T, A and B E4M3 row-major (k-major, as
 * rt_cuda_mxfp8_quantize writes them), sa (k/128, m) and sb (k/128, n) f32 with m and n
 * fastest (rt_cuda_mxfp8_scales_vec128), 16-byte aligned. k a multiple of 128, m and n of 16
 * (cuBLASLt has no algorithm for other m on the H200: an expert's rows are padded, gpu_fp8.h). */
int gpu_gemm_fp8(gpu_blas *b, int64_t m, int64_t n, int64_t k, gpu_ptr A, gpu_ptr sa, gpu_ptr B, gpu_ptr sb,
                 const gpu_mat *C, char *err, size_t errlen);
/* The same with b_blocks: B's scales one per 128 x 128 block (cuBLASLt BLK128x128_32F; sb
 * (k/128, n/128), n/128 fastest), the weight-block recipe's layout (the grouped-GEMM bench times it). */
int gpu_gemm_fp8_blocks(gpu_blas *b, int64_t m, int64_t n, int64_t k, gpu_ptr A, gpu_ptr sa, gpu_ptr B, gpu_ptr sb,
                        int b_blocks, const gpu_mat *C, char *err, size_t errlen);
/* Heuristic queries so far: each shape class costs one (tests check that a step's shapes
 * stay cached; MOEC_GEMM_TUNE times the candidates of each query, MOEC_GEMM_LOG=1 prints them). */
long gpu_blas_queries(const gpu_blas *b);

#endif
