/* gpu_blas.h -- dense GEMMs through cuBLASLt, loaded at run time (libcublasLt.so.13/.12).
 * Matrices are row-major, as everywhere in moec; fp32 accumulation. */
#ifndef MOEC_GPU_BLAS_H
#define MOEC_GPU_BLAS_H

#include <stddef.h>
#include <stdint.h>

#include "codegen/cg_kernels.h"
#include "gpu_loader.h"

typedef struct gpu_blas gpu_blas;

/* Loads cuBLASLt, creates a handle on g's stream and a 32 MiB workspace. NULL with a message
 * ("libcublasLt.so.13 not found; install the CUDA 13 runtime or use --device cpu"). */
gpu_blas *gpu_blas_new(gpu_ctx *g, char *err, size_t errlen);
void gpu_blas_free(gpu_blas *b);

/* One operand of a (strided-batched) row-major GEMM: data of `dtype`, leading dimension ld
 * (elements between rows), stride (elements between batch entries), transposed or not. */
typedef struct {
  cg_dtype dtype;
  gpu_ptr p;
  int64_t ld, stride;
  int trans;
} gpu_mat;

/* C (m, n) = alpha * op(A) (m, k) · op(B) (k, n) + beta * C, for `batch` entries. A and B
 * share a dtype (bf16 or f32); C is f32 or A's dtype. 0, or -1 with a message in err. */
int gpu_gemm(gpu_blas *b, int64_t m, int64_t n, int64_t k, float alpha, const gpu_mat *A, const gpu_mat *B,
             float beta, const gpu_mat *C, int batch, char *err, size_t errlen);

#endif
