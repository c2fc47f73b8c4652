/* gpu_attention.h -- causal attention with grouped KV heads on the GPU, as the CPU reference
 * ck_attention_fwd/bwd computes it: scores by cuBLASLt strided-batched GEMMs (one batch per
 * query head of a KV group), a row softmax kernel (NVRTC), then P·V. The backward recomputes
 * the scores rather than keeping them alive through the step.
 *
 * Memory: scores f32 (nh, seq, seq) plus P (nh, seq, seq) in the activation dtype, per
 * sequence; 6.4 GiB at seq 8192 with 16 heads. A fused flash-attention kernel (or cuDNN's
 * SDPA) replaces this in the performance issue. */
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

#endif
