/* gpu_attention.h -- causal attention with grouped KV heads on the GPU, as the CPU reference
 * ck_attention_fwd/bwd computes it. Three implementations:
 *
 * - flash (gpu_flash.h): fused FlashAttention-2-style kernels, forward and backward, for bf16
 *   storage and head dims 64 and 128 on sm_80 and later. Nothing of size seq x seq exists;
 *   the forward keeps the row logsumexp for the backward (cached by buffer, see gpu_flash.h).
 * - cudnn (gpu_cudnn_attn.h): cuDNN's fused flash attention through its backend API, cuDNN
 *   loaded at run time; bf16, head dims 64 and 128. The forward keeps cuDNN's softmax stats
 *   for the backward in the same kind of cache. The default where the library loads.
 * - gemm: scores by cuBLASLt strided-batched GEMMs (one batch per query head of a KV group), a
 *   row softmax kernel (NVRTC), then P·V; the backward recomputes the scores. Memory: scores
 *   f32 (nh, seq, seq) plus P (nh, seq, seq) per sequence, 6.4 GiB at seq 8192 with 16 heads.
 *
 * MOEC_ATTENTION (read when gpu_attention_new runs) = cudnn (the default), flash or gemm.
 * gpu_attention_fwd/bwd take cudnn where it was not refused, its library loaded and it applies
 * (bf16, hd 64 or 128, pointers 16-byte aligned), else flash where it applies, else gemm:
 * f32 storage, other head dims, unaligned pointers, a device older than sm_80, or
 * MOEC_ATTENTION=gemm. MOEC_DETERMINISTIC=1 never takes cudnn (its backward need not be
 * deterministic), even when asked for. Any backward is correct after any forward (gemm
 * recomputes everything; flash and cudnn recompute the row statistics they have not cached). */
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

/* 1 when the flash kernels apply to d and these pointers (they run unless cudnn does). */
int gpu_attention_uses_flash(const gpu_attention *a, const gpu_attn_dims *d, gpu_ptr q, gpu_ptr k, gpu_ptr v,
                             gpu_ptr out);
/* 1 when gpu_attention_fwd/bwd take cuDNN's fused attention for d and these pointers. */
int gpu_attention_uses_cudnn(const gpu_attention *a, const gpu_attn_dims *d, gpu_ptr q, gpu_ptr k, gpu_ptr v,
                             gpu_ptr out);
/* A run of a graph begins (the flash and cudnn row-statistics caches then reuse stale buffers
 * first). */
void gpu_attention_new_run(gpu_attention *a);
/* The flash kernel in use for head dim hd, forward (bwd 0) or backward; -1 when none. */
int gpu_attention_flash_variant(const gpu_attention *a, int64_t hd, int bwd, char *name, size_t len);
/* The GEMM implementation whatever the shape (tests and timing compare against it). */
int gpu_attention_fwd_gemm(gpu_attention *a, const gpu_attn_dims *d, gpu_ptr q, gpu_ptr k, gpu_ptr v, gpu_ptr out,
                           char *err, size_t errlen);
int gpu_attention_bwd_gemm(gpu_attention *a, const gpu_attn_dims *d, gpu_ptr q, gpu_ptr k, gpu_ptr v, gpu_ptr out,
                           gpu_ptr dout, gpu_ptr packed, char *err, size_t errlen);

#endif
