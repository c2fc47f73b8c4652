/* ck_grouped.h -- CPU reference kernels of the expert ops over expert-sorted tokens (made by
 * the group-linear and grouped-mlp passes) and of MXFP8 quantize-dequantize along any axis
 * (the mxfp8 pass). Conventions as in cpu_kernels.h: row-major fp32, int32 ids, shapes in
 * comments, int-returning kernels check their arguments before writing anything.
 *
 * Sorted rows. The T*k (token, slot) pairs are sorted by expert, then by pair index p = t*k + j
 * (the order in which ck_route_rows lists an expert's rows), so that the rows of expert e,
 * [off_e, off_e + counts[e]) with off_e = counts[0] + .. + counts[e-1], are exactly what
 * `dispatch {expert = e}` gathers. perm[r] = p names the pair of sorted row r.
 */
#ifndef MOEC_CK_GROUPED_H
#define MOEC_CK_GROUPED_H

#include <stdint.h>

#include "cpu_kernels.h"

/* counts[e] = #{(t, j): idx[t,j] = e}. CK_EINDEX if an id is outside [0, E). */
int ck_expert_counts(const int32_t *idx, /* (T, k) */
                     int64_t T, int64_t k, int64_t E,
                     int32_t *counts);   /* (E) */
/* Stable counting sort of the pairs by expert. CK_EINDEX if an id is outside [0, E). */
int ck_expert_sort(const int32_t *idx,   /* (T, k) */
                   int64_t T, int64_t k, int64_t E,
                   int32_t *perm);       /* (T*k) */

/* xs[r] = x[perm[r] / k], times w[perm[r]] when w is not NULL. CK_EINDEX unless perm is a
 * permutation of [0, T*k). */
int ck_expert_permute(const float *x,      /* (T, H) */
                      const int32_t *perm, /* (T*k) */
                      const float *w,      /* (T, k) or NULL */
                      float *xs,           /* (T*k, H) */
                      int64_t T, int64_t k, int64_t H);
/* out[t] = sum_j (w[t,j] *) ys[r(t,j)], r(t,j) the sorted row of pair (t, j); summed over j in
 * order, as ck_combine_fwd does. CK_EINDEX unless perm is a permutation. */
int ck_expert_unpermute(const float *ys,     /* (T*k, H) */
                        const int32_t *perm, /* (T*k) */
                        const float *w,      /* (T, k) or NULL */
                        float *out,          /* (T, H) */
                        int64_t T, int64_t k, int64_t H);
/* dw[perm[r]] = dot(a[perm[r] / k], b[r]) (accumulated in double): the gradient of the
 * weights of expert_permute (a = x, b = dxs) and of expert_unpermute (a = dout, b = ys). */
int ck_expert_weight_grad(const float *a,      /* (T, H) */
                          const float *b,      /* (T*k, H) */
                          const int32_t *perm, /* (T*k) */
                          float *dw,           /* (T, k) */
                          int64_t T, int64_t k, int64_t H);
/* p[r] = w[perm[r]] (gather: forward) and dw[perm[r]] = dp[r] (scatter: backward). */
int ck_expert_probs(const float *w, const int32_t *perm, float *p /* (T*k) */, int64_t T, int64_t k);
int ck_expert_probs_bwd(const float *dp, const int32_t *perm, float *dw /* (T, k) */, int64_t T, int64_t k);

/* Group offsets from counts: off[0] = 0, off[e+1] = off[e] + counts[e]. CK_EINDEX if a count
 * is negative or they do not add up to S. */
int ck_group_offsets(const int32_t *counts, int64_t E, int64_t S, int64_t *off /* (E+1) */);

/* y[rows of e] = xs[rows of e] . w[e] (+ b[e]). */
int ck_grouped_linear_fwd(const float *xs,       /* (S, in) */
                          const float *w,        /* (E, in, out) */
                          const float *b,        /* (E, out) or NULL */
                          const int32_t *counts, /* (E) */
                          float *y,              /* (S, out) */
                          int64_t S, int64_t E, int64_t in, int64_t out);
/* dx[rows of e] = dy[rows of e] . w[e]^T. */
int ck_grouped_linear_dgrad(const float *dy, const float *w, const int32_t *counts,
                            float *dx, /* (S, in) */
                            int64_t S, int64_t E, int64_t in, int64_t out);
/* dw[e] = xs[rows of e]^T . dy[rows of e] (written; zero for an expert without rows). */
int ck_grouped_linear_wgrad(const float *xs, const float *dy, const int32_t *counts,
                            float *dw, /* (E, in, out) */
                            int64_t S, int64_t E, int64_t in, int64_t out);
/* db[e] = column sums of dy[rows of e] (written). */
int ck_grouped_colsum(const float *dy, const int32_t *counts, float *db /* (E, out) */, int64_t S, int64_t E,
                      int64_t out);

/* How the fused MLP rounds what a GPU kernel would hold in a narrower type: round_bf16 rounds
 * gate_up and the scaled activation to bf16 (a bf16 step); mx_block > 0 then quantizes the
 * activation, the second GEMM's operand, to MXFP8 row blocks (share128 as ck_mxfp8_quantize). */
typedef struct {
  int round_bf16;
  int64_t mx_block;
  int share128;
} ck_mlp_precision;

/* out[r] = y | gate_up with gate_up = xs . w_gu[e] = (g | u), act = p * silu(g) * u,
 * y = act . w_down[e]. */
int ck_grouped_mlp_fwd(const float *xs,       /* (S, H) */
                       const float *w_gu,     /* (E, H, 2F) */
                       const float *w_down,   /* (E, F, H) */
                       const int32_t *counts, /* (E) */
                       const float *probs,    /* (S) */
                       float *out,            /* (S, H + 2F) */
                       int64_t S, int64_t E, int64_t H, int64_t F, ck_mlp_precision prec);
/* From the saved gate_up (SwiGLU recomputed): dact = dy . w_down[e]^T, dp = dot(dact, silu(g)*u),
 * da = p*dact, dg = da*u*silu'(g), du = da*silu(g); out[r] = dg | du | act | dp, act = p*silu(g)*u
 * (the operand of the down projection's weight gradient). */
int ck_grouped_mlp_bwd(const float *dy,       /* (S, H) */
                       const float *gate_up,  /* (S, 2F) */
                       const float *w_down,   /* (E, F, H) */
                       const int32_t *counts, /* (E) */
                       const float *probs,    /* (S) */
                       float *out,            /* (S, W): dg | du | act | dp | zeros, W >= 3F + 1 */
                       int64_t S, int64_t E, int64_t H, int64_t F, int64_t W);

/* MXFP8 quantize then dequantize (exactly the values an MX tensor holds), with blocks of
 * `block` consecutive elements along dimension `axis` of a tensor of the given dims (rank
 * 1..4); share128 as in ck_mxfp8_quantize. With counts (axis 0 only), blocks restart at the
 * first row of each expert group. A short block (the end of a group, or of an axis that is
 * not a multiple of the block) takes the scale of its own elements, as if padded with zeros.
 * Scales and element rounding are ck_mxfp8_quantize's. CK_ESHAPE on a bad axis or block,
 * CK_EINDEX if counts do not add up to dims[0]. y may alias x. */
int ck_mxfp8_qdq(const float *x, float *y, int rank, const int64_t *dims, int axis, int64_t block, int share128,
                 const int32_t *counts, int64_t E);
/* MXFP8 quantize then dequantize of E (A, B) matrices in tile x tile squares (the weight-tile
 * recipe, mxfp8(block = 128, weight_tile = 128)): each square's elements share one E8M0 scale
 * from its amax (ck_mxfp8_quantize_group), so every block of 32 along either axis is valid
 * MXFP8 and both orientations of a weight hold the same values. CK_ESHAPE unless tile divides
 * A and B. y may alias x. */
int ck_mxfp8_qdq_tiles(const float *x, float *y, int64_t E, int64_t A, int64_t B, int64_t tile);

#endif
