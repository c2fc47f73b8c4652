/* cpu_kernels.h -- the CPU reference kernels: forward and backward of every op in ops.def,
 * plus the optimizer and the number formats. The CPU executor calls these, and every GPU
 * kernel is checked against them.
 *
 * Conventions
 *  - Tensors are row-major float32 (int32 for token, label and expert ids); sizes are int64_t.
 *    Every pointer argument carries its shape as a comment, outermost dimension first.
 *  - Forward kernels overwrite their outputs. Backward kernels overwrite the gradients of
 *    activations (dx, dq, ...) and ADD INTO the gradients of parameters (dw, dtable, db), so
 *    the caller zeroes parameter gradients once per step and micro-batches add up.
 *    Exceptions are marked "+=" in the comment of the argument: dispatch's dx (several experts
 *    scatter into one buffer) and the router losses' dlogits (three consumers of the logits).
 *  - A kernel that returns int returns CK_OK or a negative CK_E* code, and then has written
 *    nothing (the arguments are checked before any output is touched). Such kernels never read
 *    out of bounds on bad ids. Kernels that return void have only the size preconditions
 *    stated in their comment, which the IR shape rules guarantee.
 *  - Matrix products go through OpenBLAS cblas_sgemm; no OpenMP. Reductions that decide a
 *    loss (logsumexp, means) accumulate in double.
 *  - Semantics follow Hugging Face transformers' MixtralForCausalLM (fp32), so a parity test
 *    against PyTorch can pass; each family's .c file notes where and why it differs.
 */
#ifndef MOEC_CPU_KERNELS_H
#define MOEC_CPU_KERNELS_H

#include <stdint.h>

#include "config.h" /* moec_schedule */

enum {
  CK_OK = 0,
  CK_EINDEX = -1, /* a token, label or expert id is out of range */
  CK_ESHAPE = -2, /* a size the kernel cannot take (odd head dim, cols not a block multiple) */
  CK_ENOMEM = -3, /* scratch allocation failed */
};
const char *ck_strerror(int rc);

/* ================================ ck_dense.c ================================ */

/* C = op(A)·op(B) + beta·C, op(X) = X or X^T. beta = 0 overwrites C (NaN in C is not read).
 * Any of m, n, k may be 0. */
void ck_matmul(const float *A, /* (m, k), or (k, m) when trans_a */
               const float *B, /* (k, n), or (n, k) when trans_b */
               float *C,       /* (m, n) */
               int64_t m, int64_t k, int64_t n, int trans_a, int trans_b, float beta);

/* The same with explicit leading dimensions and alpha (e.g. one head's columns of q).
 * Sizes and leading dimensions must fit a BLAS int: a larger one aborts with a message. */
void ck_gemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
             const float *A, int64_t lda, /* (m, k) or (k, m), row stride lda */
             const float *B, int64_t ldb, /* (k, n) or (n, k), row stride ldb */
             float beta, float *C, int64_t ldc /* (m, n), row stride ldc */);

/* 1 if every id is in [0, limit), else 0. */
int ck_ids_ok(const int32_t *ids, /* (n) */
              int64_t n, int64_t limit);

/* Linear layer, weight stored [in, out]: y = x·W (+ b). */
void ck_linear_fwd(const float *x, /* (n, in) */
                   const float *w, /* (in, out) */
                   const float *b, /* (out) or NULL */
                   float *y,       /* (n, out) */
                   int64_t n, int64_t in, int64_t out);
/* dx = dy·W^T; dw += x^T·dy; db += column sums of dy. Any of dx, dw, db may be NULL; x is
 * read only for dw and w only for dx, so either may be NULL when that gradient is. */
void ck_linear_bwd(const float *x,  /* (n, in) */
                   const float *w,  /* (in, out) */
                   const float *dy, /* (n, out) */
                   float *dx,       /* (n, in) */
                   float *dw,       /* (in, out) += */
                   float *db,       /* (out) += */
                   int64_t n, int64_t in, int64_t out);

/* out[t] = table[tokens[t]]. CK_EINDEX if any token is outside [0, V). */
int ck_embedding_fwd(const float *table,    /* (V, H) */
                     const int32_t *tokens, /* (T) */
                     float *out,            /* (T, H) */
                     int64_t T, int64_t V, int64_t H);
/* dtable[tokens[t]] += dout[t]. CK_EINDEX if any token is outside [0, V). */
int ck_embedding_bwd(const int32_t *tokens, /* (T) */
                     const float *dout,     /* (T, H) */
                     float *dtable,         /* (V, H) += */
                     int64_t T, int64_t V, int64_t H);

/* y = x * rsqrt(mean(x^2) + eps) * w, per row, in fp32 (mean accumulated in double). */
void ck_rmsnorm_fwd(const float *x, /* (T, H) */
                    const float *w, /* (H) */
                    float *y,       /* (T, H); may alias x */
                    int64_t T, int64_t H, float eps);
/* dx written, dw accumulated; the row scale is recomputed from x (nothing saved). */
void ck_rmsnorm_bwd(const float *x,  /* (T, H) */
                    const float *w,  /* (H) */
                    const float *dy, /* (T, H) */
                    float *dx,       /* (T, H); may alias dy */
                    float *dw,       /* (H) +=; may be NULL */
                    int64_t T, int64_t H, float eps);

/* Elementwise over n values; every pointer is (n). Outputs may alias inputs (y = a, dx = dy). */
void ck_silu_fwd(const float *x, float *y, int64_t n);                  /* y = x·sigmoid(x) */
void ck_silu_bwd(const float *x, const float *dy, float *dx, int64_t n);
void ck_mul_fwd(const float *a, const float *b, float *y, int64_t n);   /* y = a·b */
void ck_mul_bwd(const float *a, const float *b, const float *dy,
                float *da, float *db, int64_t n);                       /* da, db may be NULL */
void ck_add_fwd(const float *a, const float *b, float *y, int64_t n);   /* y = a + b */
void ck_add_bwd(const float *dy, float *da, float *db, int64_t n);      /* da = db = dy */

/* Row softmax and logsumexp (max-subtracted, sums in double); the router and the loss use
 * them. */
void ck_softmax_rows(const float *x, /* (T, E) */
                     float *y,       /* (T, E); may alias x */
                     int64_t T, int64_t E);
void ck_logsumexp_rows(const float *x, /* (T, E) */
                       double *lse,    /* (T) */
                       int64_t T, int64_t E);

/* ============================== ck_attention.c ============================== */

/* Rotary embedding, Hugging Face "rotate_half" layout. Row t of x holds nh heads of hd
 * values; position p = t % seq; for i < hd/2, angle = p * theta^(-2i/hd) (in double, then
 * cos/sin cast to float), x1 = x[i], x2 = x[i + hd/2]:
 *   y[i] = x1 cos - x2 sin,  y[i + hd/2] = x2 cos + x1 sin.
 * The backward is the rotation by minus the angle. CK_ESHAPE if hd is odd or seq < 1. */
int ck_rope_fwd(const float *x, /* (T, nh*hd) */
                float *y,       /* (T, nh*hd); may alias x */
                int64_t T, int64_t nh, int64_t hd, int64_t seq, double theta);
int ck_rope_bwd(const float *dy, /* (T, nh*hd) */
                float *dx,       /* (T, nh*hd); may alias dy */
                int64_t T, int64_t nh, int64_t hd, int64_t seq, double theta);

/* Scaled dot-product attention over B sequences of length seq laid out one after another
 * (T = B*seq rows), scale 1/sqrt(hd), optional causal mask, grouped KV heads: query head h
 * reads kv head h / (nh/nkv). Forward saves lse = logsumexp of each score row.
 * CK_ESHAPE unless nkv divides nh; CK_ENOMEM if scratch cannot be allocated. */
int ck_attention_fwd(const float *q, /* (B*seq, nh*hd) */
                     const float *k, /* (B*seq, nkv*hd) */
                     const float *v, /* (B*seq, nkv*hd) */
                     float *out,     /* (B*seq, nh*hd) */
                     float *lse,     /* (B, nh, seq) */
                     int64_t B, int64_t seq, int64_t nh, int64_t nkv, int64_t hd, int causal);
/* dq, dk, dv are written (dk, dv summed over the query heads of each group). */
int ck_attention_bwd(const float *q,    /* (B*seq, nh*hd) */
                     const float *k,    /* (B*seq, nkv*hd) */
                     const float *v,    /* (B*seq, nkv*hd) */
                     const float *out,  /* (B*seq, nh*hd) */
                     const float *lse,  /* (B, nh, seq) */
                     const float *dout, /* (B*seq, nh*hd) */
                     float *dq,         /* (B*seq, nh*hd) */
                     float *dk,         /* (B*seq, nkv*hd) */
                     float *dv,         /* (B*seq, nkv*hd) */
                     int64_t B, int64_t seq, int64_t nh, int64_t nkv, int64_t hd, int causal);

/* =============================== ck_router.c ================================ */

/* The k largest logits of each row, in descending order; ties go to the lower expert id and
 * NaN sorts after every number. CK_ESHAPE unless 1 <= k <= E. */
int ck_topk(const float *logits, /* (T, E) */
            int32_t *idx,        /* (T, k) */
            int64_t T, int64_t E, int64_t k);

/* w[t,j] = p[t, idx[t,j]] / sum_j' p[t, idx[t,j']], p = softmax(logits[t]) over all E. */
int ck_route_weights_fwd(const float *logits, /* (T, E) */
                         const int32_t *idx,  /* (T, k) */
                         float *w,            /* (T, k) */
                         int64_t T, int64_t E, int64_t k);
/* dlogits written (zero outside the selected experts, where the exact gradient is 0). The
 * aux and z losses then add their gradients into the same dlogits: call this one first. */
int ck_route_weights_bwd(const float *logits, /* (T, E) */
                         const int32_t *idx,  /* (T, k) */
                         const float *dw,     /* (T, k) */
                         float *dlogits,      /* (T, E) */
                         int64_t T, int64_t E, int64_t k);

/* Load-balancing loss of one router (HF load_balancing_loss_func on these rows):
 * P_e = mean_t softmax(logits_t)_e, c_e = #{(t,j): idx[t,j] = e},
 * loss = coef * E * sum_e (c_e / T) * P_e. The gradient flows through P only. */
int ck_aux_loss_fwd(const float *logits, /* (T, E) */
                    const int32_t *idx,  /* (T, k) */
                    float *loss,         /* () */
                    int64_t T, int64_t E, int64_t k, float coef);
int ck_aux_loss_bwd(const float *logits, /* (T, E) */
                    const int32_t *idx,  /* (T, k) */
                    float dloss,
                    float *dlogits,      /* (T, E) += */
                    int64_t T, int64_t E, int64_t k, float coef);

/* Router z-loss: coef * mean_t logsumexp(logits_t)^2. */
/* This rank's share of the global aux loss (data/expert parallelism): counts[e] = routes to e
 * over all ranks (T_g = sum(counts) / k tokens in all), f_e = counts[e] / T_g, and P_e the
 * sum of this rank's T routing probabilities over T_g; the shares of all ranks sum to the
 * loss of the whole batch. */
int ck_aux_loss_share_fwd(const float *logits, const int32_t *counts, float *loss, int64_t T, int64_t E, int64_t k,
                          float coef);
int ck_aux_loss_share_bwd(const float *logits, const int32_t *counts, float dloss, float *dlogits, int64_t T,
                          int64_t E, int64_t k, float coef);
void ck_z_loss_fwd(const float *logits, /* (T, E) */
                   float *loss,         /* () */
                   int64_t T, int64_t E, float coef);
void ck_z_loss_bwd(const float *logits, /* (T, E) */
                   float dloss,
                   float *dlogits,      /* (T, E) += */
                   int64_t T, int64_t E, float coef);

/* The (t, j) pairs with idx[t,j] = e, in ascending (t, j) order: rows[r] = t, slots[r] = j.
 * Returns their number n_e (0 for an expert with no tokens). slots may be NULL. */
int64_t ck_route_rows(const int32_t *idx, /* (T, k) */
                      int64_t T, int64_t k, int32_t e,
                      int32_t *rows,  /* (n_e), capacity T*k (T when rows of idx are distinct) */
                      int32_t *slots  /* (n_e) or NULL */);

/* xe[r] = x[rows[r]]. CK_EINDEX if a row id is outside [0, T). */
int ck_dispatch_fwd(const float *x,       /* (T, H) */
                    const int32_t *rows,  /* (n) */
                    float *xe,            /* (n, H) */
                    int64_t T, int64_t n, int64_t H);
/* dx[rows[r]] += dxe[r]. CK_EINDEX if a row id is outside [0, T). */
int ck_dispatch_bwd(const float *dxe,     /* (n, H) */
                    const int32_t *rows,  /* (n) */
                    float *dx,            /* (T, H) += */
                    int64_t T, int64_t n, int64_t H);

/* out[t] = sum_j w[t,j] * y_{idx[t,j]}[row of (t,j) in that expert], where an expert's rows
 * are its (t, j) pairs in ascending order (as ck_route_rows lists them). y[e] may be NULL
 * for an expert with no rows. CK_EINDEX if an id is outside [0, E). */
int ck_combine_fwd(const int32_t *idx,     /* (T, k) */
                   const float *w,         /* (T, k) */
                   const float *const *y,  /* E pointers, y[e]: (n_e, H) */
                   float *out,             /* (T, H) */
                   int64_t T, int64_t k, int64_t E, int64_t H);
/* dy_e[row] = w[t,j] * dout[t]; dw[t,j] = dot(dout[t], y_e[row]). Both written. */
int ck_combine_bwd(const int32_t *idx,     /* (T, k) */
                   const float *w,         /* (T, k) */
                   const float *const *y,  /* E pointers, y[e]: (n_e, H) */
                   const float *dout,      /* (T, H) */
                   float *const *dy,       /* E pointers, dy[e]: (n_e, H) */
                   float *dw,              /* (T, k) */
                   int64_t T, int64_t k, int64_t E, int64_t H);

/* ================================ ck_loss.c ================================= */

/* Mean over rows with labels[t] != -1 of logsumexp(logits[t]) - logits[t, labels[t]]
 * (logsumexp and the mean in double). No unmasked rows: loss 0. CK_EINDEX if a label is
 * outside [0, V) and not -1. */
int ck_cross_entropy_fwd(const float *logits,   /* (T, V) */
                         const int32_t *labels, /* (T), -1 = masked */
                         float *loss,           /* () */
                         int64_t T, int64_t V);
/* dlogits = dloss * (softmax - onehot) / n_valid; zero on masked rows (all zero if none). */
int ck_cross_entropy_bwd(const float *logits,   /* (T, V) */
                         const int32_t *labels, /* (T) */
                         float dloss,
                         float *dlogits,        /* (T, V) */
                         int64_t T, int64_t V);
/* Data/expert parallelism (docs/parallel.md): this rank's share of the mean over the labels of
 * all ranks, n_global of them: the local mean times the float share (float)(n_local / n_global)
 * (0 when n_global <= 0), the backward with dloss times that share. n_local = ck_label_count. */
int ck_cross_entropy_share_fwd(const float *logits, const int32_t *labels, float n_global, float *loss, int64_t T,
                               int64_t V);
int ck_cross_entropy_share_bwd(const float *logits, const int32_t *labels, float n_global, float dloss,
                               float *dlogits, int64_t T, int64_t V);
/* Labels that count (not masked: >= 0) among T. */
int64_t ck_label_count(const int32_t *labels, int64_t T);

/* ================================ ck_optim.c ================================ */

/* One torch.optim.AdamW step on n fp32 master weights, step counting from 1: the same
 * operations as torch's single-tensor path, bit-identical to torch 2.11 on CPU (ck_optim.c).
 * The gradient used is fl(g * grad_scale), exactly what clip_grad_norm_ leaves in .grad
 * before the step (pass 1 for no clipping). wd = 0 for weights without decay (norms). */
void ck_adamw_step(float *p,       /* (n) */
                   const float *g, /* (n) */
                   float *m,       /* (n) first moment */
                   float *v,       /* (n) second moment */
                   int64_t n, int64_t step, float grad_scale,
                   double lr, double beta1, double beta2, double eps, double wd);

/* Learning rate at step (1-based): linear warmup lr*step/warmup for step <= warmup, then
 * cosine / linear decay to min_lr at step == steps (min_lr after), or constant lr. */
double ck_lr_at(int64_t step, int64_t steps, int64_t warmup, double lr, double min_lr,
                moec_schedule schedule);

/* Global L2 norm over n_bufs buffers (sum of squares in double). */
double ck_grad_norm(const float *const *bufs, /* n_bufs pointers, bufs[i]: (sizes[i]) */
                    const int64_t *sizes,     /* (n_bufs) */
                    int n_bufs);
/* clip_grad_norm_'s factor: min(1, clip / (norm + 1e-6)), computed in float as PyTorch. */
float ck_clip_coef(double norm, double clip);

/* ============================== ck_numerics.c =============================== */

/* Round each value to the nearest bf16 (ties to even), kept in fp32. NaN stays NaN (made
 * quiet, sign kept), inf stays inf, finite values beyond the bf16 range become inf. */
void ck_round_bf16(float *x, int64_t n); /* (n) in place */
uint16_t ck_float_to_bf16(float x);      /* same rounding, bf16 bits */
float ck_bf16_to_float(uint16_t b);

/* OCP FP8 E4M3 (E4M3FN): bias 7, max 448, subnormals down to 2^-9, no inf, NaN = 0x7F/0xFF.
 * ck_float_to_e4m3 rounds to nearest even and saturates like PTX cvt.rn.satfinite: finite
 * values and infinities beyond 448 give ±448; NaN gives 0x7F (0xFF if the sign bit is set). */
uint8_t ck_float_to_e4m3(float x);
float ck_e4m3_to_float(uint8_t b);

/* MXFP8: E4M3 elements with one E8M0 scale (biased exponent, 2^(code-127), 0xFF = NaN) per
 * block of `block` (32 for OCP MX) consecutive elements of a row. The scale exponent is
 * ceil(log2(amax / 448)) so that no element saturates; amax = 0 gives code 0. A block holding
 * a NaN or an inf gets scale 0xFF and NaN elements. share128 = 1: the blocks of each
 * 128-element group share one scale from the group's amax (the scale is still stored once
 * per block, so the result is valid MXFP8). CK_ESHAPE unless block divides cols and, with
 * share128, block divides 128 and 128 divides cols. */
/* n elements under one scale, from their amax (as one group of ck_mxfp8_quantize): their
 * E4M3 bits into q; returns the E8M0 code (0xFF, elements 0x7F, when one is NaN or inf). */
uint8_t ck_mxfp8_quantize_group(const float *x, int64_t n, uint8_t *q);
int ck_mxfp8_quantize(const float *x,   /* (rows, cols) */
                      int64_t rows, int64_t cols, int64_t block, int share128,
                      uint8_t *q,       /* (rows, cols) e4m3 bits */
                      uint8_t *scale    /* (rows, cols/block) e8m0 codes */);
int ck_mxfp8_dequantize(const uint8_t *q,     /* (rows, cols) */
                        const uint8_t *scale, /* (rows, cols/block) */
                        int64_t rows, int64_t cols, int64_t block,
                        float *x              /* (rows, cols) */);

#endif
