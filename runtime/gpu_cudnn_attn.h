/* gpu_cudnn_attn.h -- causal grouped-query attention through cuDNN's fused flash attention
 * (scaled dot product attention, forward and backward), for gpu_attention.c.
 *
 * cuDNN is loaded at run time (dlopen of libcudnn.so.9, then libcudnn.so; MOEC_LIBCUDNN=PATH
 * overrides; else $CUDA_HOME/lib64, /usr/local/cuda/lib64), never linked: a machine without it
 * builds and runs moec, and attention falls back to the flash kernels. Only the backend C API
 * is used (cudnnBackendCreateDescriptor / SetAttribute / Finalize / Execute): each graph is
 * spelled out as the operations cudnn-frontend's composite SDPA nodes emit, which cuDNN
 * recognises and runs as one fused flash-attention kernel (Hopper: its own wgmma kernels).
 * The enum values are redeclared in gpu_cudnn_attn_int.h from cuDNN 9's cudnn_graph.h; where
 * that header is found at build time they are checked against it (static asserts).
 *
 * Layouts, as gpu_attention.h: q, out, dout (B*seq, nh*hd) row-major bf16; k, v (B*seq,
 * nkv*hd); packed (B*seq, (nh + 2 nkv) hd) whose row is dq | dk | dv. stats: the softmax
 * logsumexp of the scaled scores, f32 (B, nh, seq), natural log (cuDNN's "Stats"), written by
 * the forward and read by the backward. Scale 1/sqrt(hd), causal mask top-left aligned (key
 * j visible to query i iff j <= i), nh a multiple of nkv; head dims 64 and 128; pointers
 * 16-byte aligned.
 *
 * Execution plans are built on first use of a shape (B, seq, nh, nkv, hd, causal) from engine
 * heuristics mode A (then the fallback mode) and cached; the workspace grows as needed. All
 * work goes on the context's stream. MOEC_CUDNN_DEBUG=1 prints each step of graph building,
 * heuristics and execution to stderr. Failures name the cuDNN call, the descriptor and the
 * attribute, with cudnnGetErrorString and cudnnGetLastErrorString. */
#ifndef MOEC_GPU_CUDNN_ATTN_H
#define MOEC_GPU_CUDNN_ATTN_H

#include <stddef.h>
#include <stdint.h>

#include "gpu_loader.h"

typedef struct {
  int64_t B, seq, nh, nkv, hd;
  int causal;
} gpu_cudnn_shape;

typedef struct gpu_cudnn_attn gpu_cudnn_attn;

/* Loads cuDNN (once per process) and creates a handle on g's stream. NULL with err "" when
 * the library is absent (the caller falls back silently); NULL with a message on a real
 * failure (symbols missing, cuDNN older than 9.0, cudnnCreate failing). */
gpu_cudnn_attn *gpu_cudnn_attn_new(gpu_ctx *g, char *err, size_t errlen);
void gpu_cudnn_attn_free(gpu_cudnn_attn *c);
/* cudnnGetVersion() of the loaded library: 91400 = 9.14.0. */
size_t gpu_cudnn_attn_version(const gpu_cudnn_attn *c);
/* 1 for head dims 64 and 128. */
int gpu_cudnn_attn_supports(const gpu_cudnn_attn *c, int64_t hd);
/* A run of a graph begins: cached stats of earlier runs are the first to be replaced. */
void gpu_cudnn_attn_new_run(gpu_cudnn_attn *c);

/* With the stats buffer given: f32 (B, nh, seq), 16-byte aligned. 0, or -1 with a message. */
int gpu_cudnn_attn_fwd(gpu_cudnn_attn *c, const gpu_cudnn_shape *s, gpu_ptr q, gpu_ptr k, gpu_ptr v, gpu_ptr out,
                       gpu_ptr stats, char *err, size_t errlen);
int gpu_cudnn_attn_bwd(gpu_cudnn_attn *c, const gpu_cudnn_shape *s, gpu_ptr q, gpu_ptr k, gpu_ptr v, gpu_ptr out,
                       gpu_ptr dout, gpu_ptr stats, gpu_ptr packed, char *err, size_t errlen);
/* With the stats kept in a cache keyed by (q, k, v, out) and the shape, as gpu_flash.h does
 * for its logsumexp: the backward of a step finds what its forward left; with no matching
 * forward it recomputes the stats (a forward into scratch). */
int gpu_cudnn_attn_fwd_cached(gpu_cudnn_attn *c, const gpu_cudnn_shape *s, gpu_ptr q, gpu_ptr k, gpu_ptr v,
                              gpu_ptr out, char *err, size_t errlen);
int gpu_cudnn_attn_bwd_cached(gpu_cudnn_attn *c, const gpu_cudnn_shape *s, gpu_ptr q, gpu_ptr k, gpu_ptr v,
                              gpu_ptr out, gpu_ptr dout, gpu_ptr packed, char *err, size_t errlen);
/* 1 when the backward plan of s runs an engine cuDNN marks non-deterministic; -1 unknown
 * (no plan built yet). */
int gpu_cudnn_attn_bwd_nondeterministic(const gpu_cudnn_attn *c, const gpu_cudnn_shape *s);

/* ---- CPU side: no library or GPU needed (tests/unit/test_cudnn_attn_graph.c) ---- */

/* cuDNN's 4-d view [b, h, s, d] of each buffer, in elements from the buffer's start. */
typedef struct {
  int64_t dim[4], stride[4], offset;
} gpu_cudnn_view;
enum { GPU_CUDNN_Q, GPU_CUDNN_K, GPU_CUDNN_V, GPU_CUDNN_O, GPU_CUDNN_DO, GPU_CUDNN_STATS, GPU_CUDNN_DQ, GPU_CUDNN_DK,
       GPU_CUDNN_DV, GPU_CUDNN_NVIEWS };
void gpu_cudnn_attn_views(const gpu_cudnn_shape *s, gpu_cudnn_view v[GPU_CUDNN_NVIEWS]);

/* The operation graph of the forward (bwd 0) or backward, for a library of version `version`,
 * checked for consistency before anything reaches cuDNN: unique UIDs, every virtual tensor
 * produced once before it is used, matmul and broadcast shapes, reductions, every buffer
 * bound. 0, or -1 with the first inconsistency in err. */
int gpu_cudnn_attn_graph_check(int bwd, const gpu_cudnn_shape *s, size_t version, char *err, size_t errlen);
/* The same graph as text, one tensor or operation a line (what MOEC_CUDNN_DEBUG=1 prints);
 * returns the number of operations. */
int gpu_cudnn_attn_graph_dump(int bwd, const gpu_cudnn_shape *s, size_t version, char *buf, size_t len);

#endif
