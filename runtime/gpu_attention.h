/* gpu_attention.h -- causal attention with grouped KV heads on the GPU, as the CPU reference
 * ck_attention_fwd/bwd computes it. Two implementations:
 *
 * - flash (gpu_flash.h): fused FlashAttention-2-style kernels, forward and backward, for bf16
 *   storage and head dims 64 and 128 on sm_80 and later. Nothing of size seq x seq exists;
 *   the forward keeps the row logsumexp for the backward (cached by buffer, see gpu_flash.h).
 * - gemm: scores by cuBLASLt strided-batched GEMMs (one batch per query head of a KV group), a
 *   row softmax kernel (NVRTC), then P·V; the backward recomputes the scores. Memory: scores
 *   f32 (nh, seq, seq) plus P (nh, seq, seq) per sequence, 6.4 GiB at seq 8192 with 16 heads.
 *
 * gpu_attention_fwd/bwd take flash where it applies and gemm otherwise: f32 storage, other
 * head dims, pointers not 16-byte aligned, a device older than sm_80, or MOEC_ATTENTION=gemm
 * in the environment when gpu_attention_new runs. Either backward is correct after either
 * forward (gemm recomputes everything; flash recomputes a logsumexp it has not cached). */
#ifndef MOEC_GPU_ATTENTION_H
#define MOEC_GPU_ATTENTION_H

#include "gpu_blas.h"
#include "gpu_kernels.h"

typedef struct {
  int64_t B, seq, nh, nkv, hd;
  int causal;
  cg_dtype dt; /* q, k, v, out dtype */
} gpu_attn_dims;

typedef struct gpu_attention gpu_attention;
gpu_attention *gpu_attention_new(rt_cuda *k, gpu_blas *b, char *err, size_t errlen);
void gpu_attention_free(gpu_attention *a);

/* out (B*seq, nh*hd) = softmax(q k^T / sqrt(hd), causal) v, per sequence and head. */
int gpu_attention_fwd(gpu_attention *a, const gpu_attn_dims *d, gpu_ptr q, gpu_ptr k, gpu_ptr v, gpu_ptr out,
                      char *err, size_t errlen);
/* packed (B*seq, (nh + 2 nkv) hd) = dq | dk | dv. */
int gpu_attention_bwd(gpu_attention *a, const gpu_attn_dims *d, gpu_ptr q, gpu_ptr k, gpu_ptr v, gpu_ptr out,
                      gpu_ptr dout, gpu_ptr packed, char *err, size_t errlen);

/* The NVRTC source of the softmax kernels (for the compile test). */
const char *gpu_attention_source(void);

/* 1 when gpu_attention_fwd/bwd take the flash kernels for d and these pointers. */
int gpu_attention_uses_flash(const gpu_attention *a, const gpu_attn_dims *d, gpu_ptr q, gpu_ptr k, gpu_ptr v,
                             gpu_ptr out);
/* A run of a graph begins (the flash logsumexp cache then reuses stale buffers first). */
void gpu_attention_new_run(gpu_attention *a);
/* The flash kernel in use for head dim hd, forward (bwd 0) or backward; -1 when none. */
int gpu_attention_flash_variant(const gpu_attention *a, int64_t hd, int bwd, char *name, size_t len);
/* The GEMM implementation whatever the shape (tests and timing compare against it). */
int gpu_attention_fwd_gemm(gpu_attention *a, const gpu_attn_dims *d, gpu_ptr q, gpu_ptr k, gpu_ptr v, gpu_ptr out,
                           char *err, size_t errlen);
int gpu_attention_bwd_gemm(gpu_attention *a, const gpu_attn_dims *d, gpu_ptr q, gpu_ptr k, gpu_ptr v, gpu_ptr out,
                           gpu_ptr dout, gpu_ptr packed, char *err, size_t errlen);

#endif
