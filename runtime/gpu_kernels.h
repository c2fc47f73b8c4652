/* gpu_kernels.h -- rt_cuda: the generated kernels on one GPU. Modules are generated
 * (codegen/), compiled with NVRTC for the device (cached on disk) and loaded on first use.
 * There is one launch function per CPU reference kernel (cpu_kernels.h), named after it
 * (ck_rmsnorm_fwd -> rt_cuda_rmsnorm_fwd), with the same arguments in the same order except
 * that tensors are device pointers with a storage dtype (f32, or bf16 where the IR says
 * bf16), and with the same semantics (writes vs. "+=") unless noted.
 *
 * Everything is queued on the context's stream; nothing waits for the GPU except
 * rt_cuda_check, and no launch shape depends on data (routed row counts stay on the device),
 * so a step can be captured in one CUDA graph.
 *
 * Errors. Functions return 0, or -1 with a message in rt_cuda_error: a shape the kernels
 * cannot take (the CPU's CK_ESHAPE), a compile or launch failure, out of GPU memory. Bad ids
 * in the data (tokens, labels, expert or row ids: the CPU's CK_EINDEX) are found on the
 * device: the kernel skips the row and sets the device error flag, which rt_cuda_check reads.
 * Where the CPU writes nothing on CK_EINDEX, the GPU's output is unspecified.
 */
#ifndef MOEC_GPU_KERNELS_H
#define MOEC_GPU_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "codegen/cg_kernels.h"
#include "gpu_loader.h"

typedef struct rt_cuda rt_cuda;

typedef struct {
  const char *arch;      /* NULL: picked for the device (sm_90a on an H100/H200) */
  const char *dump_dir;  /* --dump-dir: write each module's source and NVRTC log */
  const char *cache_dir; /* NULL: $MOEC_CACHE or ~/.cache/moec/kernels; "": no cache */
} rt_cuda_opts;

/* What --device cuda needs, checked in order: the NVIDIA driver, a GPU, NVRTC. 0, with a
 * one-line summary in info ("1 GPU, NVRTC 13.0"), or -1 with what is missing in err: the
 * text that follows "moec: error: --device cuda: ". Also how the default device is chosen. */
int rt_cuda_probe(char *info, size_t info_len, char *err, size_t errlen);

rt_cuda *rt_cuda_new(gpu_ctx *g, const rt_cuda_opts *o, char *err, size_t errlen);
void rt_cuda_free(rt_cuda *k);
const char *rt_cuda_error(const rt_cuda *k);
gpu_ctx *rt_cuda_gpu(const rt_cuda *k);
const char *rt_cuda_arch(const rt_cuda *k);
/* Compiles and loads every module now (a warm-up; otherwise each loads on first use). */
int rt_cuda_load_all(rt_cuda *k);

/* Waits for the stream, then reads and clears the device error flag: *ck = CK_OK or the
 * first CK_E* code a kernel raised since the last check. */
int rt_cuda_check(rt_cuda *k, int *ck);

/* Every kernel a launch function may use: the generators' test checks each one exists. */
typedef struct {
  cg_family family;
  cg_variant variant;
  char name[64];
} rt_cuda_kernel_ref;
const rt_cuda_kernel_ref *rt_cuda_kernel_refs(int *n);

/* ---- elementwise (n values; outputs may alias inputs) ---- */
int rt_cuda_cast(rt_cuda *k, cg_dtype tx, gpu_ptr x, cg_dtype ty, gpu_ptr y, int64_t n); /* rounds to bf16 RNE */
int rt_cuda_silu_fwd(rt_cuda *k, cg_dtype t, gpu_ptr x, gpu_ptr y, int64_t n);
int rt_cuda_silu_bwd(rt_cuda *k, cg_dtype t, gpu_ptr x, gpu_ptr dy, gpu_ptr dx, int64_t n);
int rt_cuda_mul_fwd(rt_cuda *k, cg_dtype t, gpu_ptr a, gpu_ptr b, gpu_ptr y, int64_t n);
int rt_cuda_mul_bwd(rt_cuda *k, cg_dtype t, gpu_ptr a, gpu_ptr b, gpu_ptr dy, gpu_ptr da /* or 0 */,
                    gpu_ptr db /* or 0 */, int64_t n);
int rt_cuda_add_fwd(rt_cuda *k, cg_dtype t, gpu_ptr a, gpu_ptr b, gpu_ptr y, int64_t n);
int rt_cuda_add_bwd(rt_cuda *k, cg_dtype t, gpu_ptr dy, gpu_ptr da, gpu_ptr db, int64_t n);
int rt_cuda_fill(rt_cuda *k, cg_dtype t, gpu_ptr y, int64_t n, float value);
/* y (rows, w) = x (rows, W)[:, start : start + w] */
int rt_cuda_slice_cols(rt_cuda *k, cg_dtype t, gpu_ptr x, gpu_ptr y, int64_t rows, int64_t W, int64_t start,
                       int64_t w);
/* out (M) f32 = (accumulate ? out : 0) + column sums of x (N, M) */
int rt_cuda_colsum(rt_cuda *k, cg_dtype t, gpu_ptr x, gpu_ptr out, int64_t N, int64_t M, int accumulate);

/* ---- dense ---- */
int rt_cuda_embedding_fwd(rt_cuda *k, cg_dtype t, gpu_ptr table /* (V, H) */, gpu_ptr tokens /* i32 (T) */,
                          gpu_ptr out /* (T, H) */, int64_t T, int64_t V, int64_t H);
int rt_cuda_embedding_bwd(rt_cuda *k, cg_dtype t, gpu_ptr tokens /* i32 (T) */, gpu_ptr dout /* (T, H) */,
                          gpu_ptr dtable /* f32 (V, H) += */, int64_t T, int64_t V, int64_t H);
int rt_cuda_rmsnorm_fwd(rt_cuda *k, cg_dtype tx, cg_dtype tw, gpu_ptr x /* (T, H) */, gpu_ptr w /* (H) */,
                        gpu_ptr y /* (T, H) */, int64_t T, int64_t H, float eps);
/* dx written (skipped when 0; then w is not read), dw accumulated (skipped when 0). With res,
 * dx = res + dx rounded to tx (a residual add folded in, bit for bit the add's). */
int rt_cuda_rmsnorm_bwd(rt_cuda *k, cg_dtype tx, cg_dtype tw, gpu_ptr x /* (T, H) */, gpu_ptr w /* (H) */,
                        gpu_ptr dy /* (T, H) */, gpu_ptr res /* (T, H) or 0 */, gpu_ptr dx /* (T, H) or 0 */,
                        gpu_ptr dw /* f32 (H) += or 0 */, int64_t T, int64_t H, float eps);
/* x's rows ldx elements apart (>= nh*hd: a column window of a wider value, then not in place);
 * y (T, nh*hd) dense. */
int rt_cuda_rope_fwd(rt_cuda *k, cg_dtype t, gpu_ptr x /* (T, nh*hd), row stride ldx */, int64_t ldx, gpu_ptr y,
                     int64_t T, int64_t nh, int64_t hd, int64_t seq, double theta);
int rt_cuda_rope_bwd(rt_cuda *k, cg_dtype t, gpu_ptr dy /* (T, nh*hd), row stride ldx */, int64_t ldx, gpu_ptr dx,
                     int64_t T, int64_t nh, int64_t hd, int64_t seq, double theta);
int rt_cuda_softmax_rows(rt_cuda *k, gpu_ptr x /* f32 (T, E) */, gpu_ptr y, int64_t T, int64_t E);
int rt_cuda_logsumexp_rows(rt_cuda *k, gpu_ptr x /* f32 (T, E) */, gpu_ptr lse /* f64 (T) */, int64_t T, int64_t E);

/* ---- router (fp32) ---- */
int rt_cuda_topk(rt_cuda *k, gpu_ptr logits /* (T, E) */, gpu_ptr idx /* i32 (T, kk) */, int64_t T, int64_t E,
                 int64_t kk);
int rt_cuda_route_weights_fwd(rt_cuda *k, gpu_ptr logits, gpu_ptr idx, gpu_ptr w /* (T, kk) */, int64_t T, int64_t E,
                              int64_t kk);
int rt_cuda_route_weights_bwd(rt_cuda *k, gpu_ptr logits, gpu_ptr idx, gpu_ptr dw /* (T, kk) */,
                              gpu_ptr dlogits /* (T, E) */, int64_t T, int64_t E, int64_t kk);
/* loss (f32 scalar on the device); dloss is a device f32 scalar, dlogits += as on the CPU */
int rt_cuda_aux_loss_fwd(rt_cuda *k, gpu_ptr logits, gpu_ptr idx, gpu_ptr loss, int64_t T, int64_t E, int64_t kk,
                         float coef);
int rt_cuda_aux_loss_bwd(rt_cuda *k, gpu_ptr logits, gpu_ptr idx, gpu_ptr dloss, gpu_ptr dlogits, int64_t T,
                         int64_t E, int64_t kk, float coef);
/* The share forms (data/expert parallelism): counts = i32 (E) routes of all ranks */
int rt_cuda_aux_loss_share_fwd(rt_cuda *k, gpu_ptr logits, gpu_ptr counts, gpu_ptr loss, int64_t T, int64_t E,
                               int64_t kk, float coef);
int rt_cuda_aux_loss_share_bwd(rt_cuda *k, gpu_ptr logits, gpu_ptr counts, gpu_ptr dloss, gpu_ptr dlogits, int64_t T,
                               int64_t E, int64_t kk, float coef);
int rt_cuda_z_loss_fwd(rt_cuda *k, gpu_ptr logits, gpu_ptr loss, int64_t T, int64_t E, float coef);
int rt_cuda_z_loss_bwd(rt_cuda *k, gpu_ptr logits, gpu_ptr dloss, gpu_ptr dlogits, int64_t T, int64_t E, float coef);

/* ---- narrow f32 GEMMs (the router's, and any f32 GEMM of at most CG_NARROW columns):
 * c (m, n; rows ldc apart) = op(a) (m, k) . op(b) (k, n), op(a)[i, p] = ta ? a[p lda + i] :
 * a[i lda + p], op(b) likewise with tb. rt_cuda_narrow_ok says which sizes they take (n at most
 * CG_NARROW, k within the partial sums' scratch); sums in a fixed order (repeatable), not
 * cuBLAS's. */
int rt_cuda_narrow_ok(int64_t m, int64_t n, int64_t k);
int rt_cuda_narrow_gemm(rt_cuda *k, int64_t m, int64_t n, int64_t kk, gpu_ptr a, int64_t lda, int ta, gpu_ptr b,
                        int64_t ldb, int tb, gpu_ptr c, int64_t ldc);

/* ---- the expert permutation: ck_route_rows for every expert at once, on the device ----
 * Pair i = t*kk + j of idx. Expert e's pairs are rows[offsets[e] .. offsets[e+1]) (token t)
 * and slots[...] (j), in ascending (t, j) order: ck_route_rows(idx, T, kk, e, ...) exactly.
 * pos[i] is where pair i went. */
typedef struct {
  gpu_ptr rows;    /* i32 (T*kk) */
  gpu_ptr slots;   /* i32 (T*kk) */
  gpu_ptr pos;     /* i32 (T*kk) */
  gpu_ptr counts;  /* i32 (E) */
  gpu_ptr offsets; /* i32 (E+1) */
} rt_cuda_routing;
int rt_cuda_route(rt_cuda *k, gpu_ptr idx /* i32 (T, kk) */, int64_t T, int64_t kk, int64_t E,
                  const rt_cuda_routing *r);
/* xe (n, H) = x[rows[base + r]] with base, n = offsets[e], counts[e] read on the device, or
 * all nmax rows when e < 0; the grid covers nmax rows. ck_dispatch_fwd with rows + base. */
int rt_cuda_dispatch_fwd(rt_cuda *k, cg_dtype t, gpu_ptr x /* (T, H) */, gpu_ptr rows, gpu_ptr offsets, int e,
                         gpu_ptr xe, int64_t T, int64_t nmax, int64_t H);
/* dx[rows[base + r]] += dxe[r], one expert (e >= 0). */
int rt_cuda_dispatch_bwd(rt_cuda *k, cg_dtype t, gpu_ptr dxe, gpu_ptr rows, gpu_ptr offsets, int e,
                         gpu_ptr dx /* (T, H) += */, int64_t T, int64_t nmax, int64_t H);
/* dx[t] += sum_j dxe[pos[t, j]]: the backward of dispatching all experts (e < 0). */
int rt_cuda_dispatch_bwd_all(rt_cuda *k, cg_dtype t, gpu_ptr dxe /* (T*kk, H) */, gpu_ptr pos,
                             gpu_ptr dx /* (T, H) += */, int64_t T, int64_t kk, int64_t H);
/* ck_combine_fwd / _bwd with the experts' outputs stacked in permutation order: y (T*kk, H),
 * y_e = y + offsets[e] rows; dy likewise. dy or dw may be 0. */
int rt_cuda_combine_fwd(rt_cuda *k, cg_dtype t, cg_dtype tw, gpu_ptr pos, gpu_ptr w /* (T, kk) */, gpu_ptr y,
                        gpu_ptr out /* (T, H) */, int64_t T, int64_t kk, int64_t H);
int rt_cuda_combine_bwd(rt_cuda *k, cg_dtype t, cg_dtype tw, gpu_ptr pos, gpu_ptr w, gpu_ptr y, gpu_ptr dout,
                        gpu_ptr dy, gpu_ptr dw /* f32 (T, kk) */, int64_t T, int64_t kk, int64_t H);

/* ---- loss ---- */
int rt_cuda_cross_entropy_fwd(rt_cuda *k, cg_dtype t, gpu_ptr logits /* (T, V) */, gpu_ptr labels /* i32 (T) */,
                              gpu_ptr loss /* f32 () */, int64_t T, int64_t V);
int rt_cuda_cross_entropy_bwd(rt_cuda *k, cg_dtype t, gpu_ptr logits, gpu_ptr labels, gpu_ptr dloss /* f32 () */,
                              gpu_ptr dlogits /* f32 (T, V) */, int64_t T, int64_t V);
/* The share forms and the label count (data/expert parallelism): n_global and n are f32 () */
int rt_cuda_cross_entropy_share_fwd(rt_cuda *k, cg_dtype t, gpu_ptr logits, gpu_ptr labels, gpu_ptr n_global,
                                    gpu_ptr loss, int64_t T, int64_t V);
int rt_cuda_cross_entropy_share_bwd(rt_cuda *k, cg_dtype t, gpu_ptr logits, gpu_ptr labels, gpu_ptr n_global,
                                    gpu_ptr dloss, gpu_ptr dlogits, int64_t T, int64_t V);
int rt_cuda_label_count(rt_cuda *k, gpu_ptr labels /* i32 (T) */, gpu_ptr n /* f32 () */, int64_t T);

/* ---- optimizer ---- */
typedef struct {
  double lr, beta1, beta2, eps, wd; /* wd = 0: no decay (norms) */
  int64_t step;                     /* from 1 */
  double clip;                      /* <= 0: no clipping */
  int moments_bf16;                 /* the moments m and v are stored in bf16 (adamw(moments = bf16)),
                                       rounded to nearest after each update; else f32 */
} rt_cuda_adamw_hp;
/* ck_adamw_step with grad_scale = ck_clip_coef(*gnorm, clip), formed on the device from the
 * norm rt_cuda_grad_norm left there (gnorm 0: scale 1). g is f32 or bf16 (gt); wb, when not
 * 0, also gets the updated weight rounded to bf16 (the next step's compute copy). */
int rt_cuda_adamw_step(rt_cuda *k, gpu_ptr p /* f32 (n) */, cg_dtype gt, gpu_ptr g, gpu_ptr m, gpu_ptr v,
                       gpu_ptr wb /* bf16 (n) or 0 */, int64_t n, gpu_ptr gnorm, const rt_cuda_adamw_hp *hp);
/* The gradient and the bf16 copy as windows of wider rows (a stacked expert weight): element i
 * of the weight is g[i / g_cols * g_ld + i % g_cols], likewise wb; n a multiple of both widths.
 * rt_cuda_adamw_step is this with contiguous ones (win NULL). */
typedef struct {
  int64_t g_cols, g_ld, wb_cols, wb_ld;
} rt_cuda_adamw_win;
int rt_cuda_adamw_step_win(rt_cuda *k, gpu_ptr p, cg_dtype gt, gpu_ptr g, gpu_ptr m, gpu_ptr v, gpu_ptr wb, int64_t n,
                           gpu_ptr gnorm, const rt_cuda_adamw_hp *hp, const rt_cuda_adamw_win *win);
/* The same for many parameters of one gradient storage, CG_AW_TABLE a launch, each with its own
 * weight decay (hp->wd unused) and windows (win all zero: contiguous); the same values as one
 * rt_cuda_adamw_step_win each. */
typedef struct {
  gpu_ptr p, g, m, v, wb;
  int64_t n;
  double wd;
  rt_cuda_adamw_win win;
} rt_cuda_adamw_tensor;
int rt_cuda_adamw_multi(rt_cuda *k, cg_dtype gt, const rt_cuda_adamw_tensor *t, int n_tensors, gpu_ptr gnorm,
                        const rt_cuda_adamw_hp *hp);
/* *norm (f32 on the device) = global L2 norm of n_bufs buffers, buffer i of dtype dts[i]. */
int rt_cuda_grad_norm(rt_cuda *k, const gpu_ptr *bufs, const cg_dtype *dts, const int64_t *sizes, int n_bufs,
                      gpu_ptr norm);
/* The same with buffer i read as rows of cols[i] elements, ld[i] apart (cols NULL: contiguous). */
int rt_cuda_grad_norm_win(rt_cuda *k, const gpu_ptr *bufs, const cg_dtype *dts, const int64_t *sizes,
                          const int64_t *cols, const int64_t *ld, int n_bufs, gpu_ptr norm);

/* ---- expert-sorted ops (ck_grouped.h): the fusion passes' ops. Counts (i32 (E)) are read on
 * the device; S = T*kk sorted rows; grids are sized by S, never by the counts. ---- */
int rt_cuda_expert_counts(rt_cuda *k, gpu_ptr idx /* i32 (T, kk) */, int64_t T, int64_t kk, int64_t E,
                          gpu_ptr counts /* i32 (E) */);
int rt_cuda_expert_sort(rt_cuda *k, gpu_ptr idx, int64_t T, int64_t kk, int64_t E, gpu_ptr perm /* i32 (T*kk) */);
/* w (T, kk) may be 0 (no weights). */
int rt_cuda_expert_permute(rt_cuda *k, cg_dtype t, cg_dtype tw, gpu_ptr x /* (T, H) */, gpu_ptr perm, gpu_ptr w,
                           gpu_ptr xs /* (T*kk, H) */, int64_t T, int64_t kk, int64_t H);
/* ys's rows ldy >= H apart (a column window of a wider value: H for dense rows). With res,
 * out = res + the sum rounded to t (a residual add folded in, bit for bit the add's). */
int rt_cuda_expert_unpermute(rt_cuda *k, cg_dtype t, cg_dtype tw, gpu_ptr ys /* (T*kk, ldy) */, int64_t ldy, gpu_ptr perm,
                             gpu_ptr w, gpu_ptr res /* (T, H) or 0 */, gpu_ptr out /* (T, H) */, int64_t T, int64_t kk,
                             int64_t H);
int rt_cuda_expert_weight_grad(rt_cuda *k, cg_dtype ta, cg_dtype tb, gpu_ptr a /* (T, H) */, gpu_ptr b /* (T*kk, H) */,
                               gpu_ptr perm, gpu_ptr dw /* f32 (T, kk) */, int64_t T, int64_t kk, int64_t H);
int rt_cuda_expert_probs(rt_cuda *k, gpu_ptr w /* f32 (T, kk) */, gpu_ptr perm, gpu_ptr p /* f32 (T*kk) */, int64_t T,
                         int64_t kk);
int rt_cuda_expert_probs_bwd(rt_cuda *k, gpu_ptr dp, gpu_ptr perm, gpu_ptr dw, int64_t T, int64_t kk);
/* y[r*ldy + sy + c] = x[r*ldx + sx + c], c < w (stack, unstack, pad_cols; converts dtypes). */
int rt_cuda_copy_cols(rt_cuda *k, cg_dtype tx, cg_dtype ty, gpu_ptr x, int64_t ldx, int64_t sx, gpu_ptr y, int64_t ldy,
                      int64_t sy, int64_t rows, int64_t w);
/* C[rows of e] (row stride ldc) = A[rows of e] (stride lda, K columns) . B[e] ((K, N), or (N, K)
 * read transposed with trans_b); fp32 accumulation. */
int rt_cuda_grouped_gemm(rt_cuda *k, cg_dtype ta, cg_dtype tb, cg_dtype tc, gpu_ptr a, int64_t lda, gpu_ptr b, int trans_b,
                         gpu_ptr counts, gpu_ptr c, int64_t ldc, int64_t S, int64_t E, int64_t N, int64_t K);
int rt_cuda_grouped_linear_fwd(rt_cuda *k, cg_dtype tx, cg_dtype tw, cg_dtype ty, gpu_ptr xs, gpu_ptr w /* (E, in, out) */,
                               gpu_ptr counts, gpu_ptr y, int64_t S, int64_t E, int64_t in, int64_t out);
int rt_cuda_grouped_linear_dgrad(rt_cuda *k, cg_dtype tdy, cg_dtype tw, cg_dtype tdx, gpu_ptr dy, gpu_ptr w,
                                 gpu_ptr counts, gpu_ptr dx, int64_t S, int64_t E, int64_t in, int64_t out);
/* dw[e] written (zero for an expert without rows); K = the expert's row count. */
int rt_cuda_grouped_linear_wgrad(rt_cuda *k, cg_dtype tx, cg_dtype tdy, cg_dtype tdw, gpu_ptr xs, gpu_ptr dy,
                                 gpu_ptr counts, gpu_ptr dw, int64_t S, int64_t E, int64_t in, int64_t out);
int rt_cuda_grouped_colsum(rt_cuda *k, cg_dtype t, gpu_ptr dy, gpu_ptr counts, gpu_ptr db /* f32 (E, out) */, int64_t S,
                           int64_t E, int64_t out);
/* ck_grouped_mlp_fwd; the bf16 rounding of gate_up and the activation is the output dtype's
 * (to = bf16 is ck_mlp_precision.round_bf16). mx_block > 0 is refused (not on the GPU yet). */
int rt_cuda_grouped_mlp_fwd(rt_cuda *k, cg_dtype tx, cg_dtype tw, cg_dtype to, gpu_ptr xs, gpu_ptr w_gu, gpu_ptr w_down,
                            gpu_ptr counts, gpu_ptr probs /* f32 (S) */, gpu_ptr out /* (S, H+2F) */, int64_t S,
                            int64_t E, int64_t H, int64_t F, int64_t mx_block);
int rt_cuda_grouped_mlp_bwd(rt_cuda *k, cg_dtype tdy, cg_dtype tgu, cg_dtype tw, cg_dtype to, gpu_ptr dy, gpu_ptr gate_up,
                            gpu_ptr w_down, gpu_ptr counts, gpu_ptr probs, gpu_ptr out /* (S, W), W >= 3F+1 */, int64_t S,
                            int64_t E, int64_t H, int64_t F, int64_t W);
/* The GroupedMLP's elementwise halves, for callers that run its GEMMs themselves:
 * act[r] (S, F) = p[r] * silu(g) * u with (g | u) = gu[r] (row stride ldg); and after
 * dact = dy . w_down^T (f32, (S, F)), out (S, W) = dg | du | act | dp | zeros (W >= 3F + 1: the
 * IR pads the row, ir_mlp_bwd_width), gate_up's rows ldg apart (>= 2F: a window of a wider
 * value). rt_cuda_mlp_bwd_split writes the pieces apart instead: dg | du (S, 2F) and act (S, F)
 * in bf16 (rounded as a cast would), dp (S) in f32. */
int rt_cuda_mlp_act(rt_cuda *k, cg_dtype t, gpu_ptr gu, int64_t ldg, gpu_ptr probs, gpu_ptr act, int64_t S, int64_t F);
int rt_cuda_mlp_bwd_rows(rt_cuda *k, cg_dtype tgu, cg_dtype to, gpu_ptr dact, gpu_ptr gate_up, int64_t ldg, gpu_ptr probs,
                         gpu_ptr out, int64_t S, int64_t F, int64_t W);
int rt_cuda_mlp_bwd_split(rt_cuda *k, cg_dtype tgu, gpu_ptr dact, gpu_ptr gate_up, int64_t ldg, gpu_ptr probs, gpu_ptr dgu,
                          gpu_ptr act, gpu_ptr dp, int64_t S, int64_t F);
/* The same reading gate_up from its stored MXFP8 form when gq is not 0 (gate_up unused): E4M3
 * gq (S, 2F) and E8M0 codes gsc, one per gblock elements (rt_cuda_mxfp8_quantize's output),
 * each value decoded and rounded to tgu as rt_cuda_mxfp8_dequantize would write it. With dq
 * not 0 it also writes the stored dg | du's MXFP8 rows, byte for byte what
 * rt_cuda_mxfp8_quantize_win(share128 = 1, block dblock) would make of them: E4M3 dq (S, 2F)
 * and E8M0 codes dsc (S, 2F / dblock); F % 128 == 0, dblock in 8 .. 128 dividing 128, dq and
 * the rows 16-byte aligned (else it fails, writing nothing). */
int rt_cuda_mlp_bwd_split_mx(rt_cuda *k, cg_dtype tgu, gpu_ptr dact, gpu_ptr gate_up, int64_t ldg, gpu_ptr gq, gpu_ptr gsc,
                             int64_t gblock, gpu_ptr probs, gpu_ptr dgu, gpu_ptr act, gpu_ptr dp, int64_t S, int64_t F,
                             gpu_ptr dq, gpu_ptr dsc, int64_t dblock);
/* The split writing every FP8 operand and no bf16 piece (the executor's VIEW_SPLIT_FP8): from
 * the same inputs as rt_cuda_mlp_bwd_split_mx with rows split by counts (E, on the device;
 * summing to S), byte for byte what these would make of its bf16 dg | du and act: dq / dsc,
 * rt_cuda_mxfp8_quantize_win's rows of dg | du (as rt_cuda_mlp_bwd_split_mx); qgu / sgu and
 * qa / sa, rt_cuda_mxfp8_quantize_cols_experts_win's of dg | du (C = 2F) and act (C = F),
 * laid out by ldq as there. dp as rt_cuda_mlp_bwd_split writes it, through dpc (S, F / 8)
 * f32 scratch. F % 128 == 0, dblock in 8 .. 128 dividing 128, 16-byte aligned rows and
 * outputs (else it fails, writing nothing). */
typedef struct {
  gpu_ptr dq, dsc;  /* dg | du's rows: E4M3 (S, 2F), E8M0 codes (S, 2F / dblock) */
  int64_t dblock;
  gpu_ptr qgu, sgu; /* dg | du's expert columns: E4M3 (C, P_e) blocks and f32 scales, C = 2F */
  gpu_ptr qa, sa;   /* act's, C = F */
  int64_t ldq;      /* 0: (C, P_e) blocks one after another; else one (C, ldq) matrix */
  gpu_ptr dpc;      /* scratch, f32 (S, F / 8) */
  int64_t ahead;    /* > 0: each block sends for the rows of the tile this many blocks on (an L2 hint) */
} rt_split_fp8;
int rt_cuda_mlp_bwd_split_fp8(rt_cuda *k, cg_dtype tgu, gpu_ptr dact, gpu_ptr gate_up, int64_t ldg, gpu_ptr gq, gpu_ptr gsc,
                              int64_t gblock, gpu_ptr probs, gpu_ptr counts, int64_t E, gpu_ptr dp, int64_t S, int64_t F,
                              const rt_split_fp8 *o);

/* ---- MXFP8 ---- */
int rt_cuda_mxfp8_quantize(rt_cuda *k, cg_dtype t, gpu_ptr x /* (rows, cols) */, int64_t rows, int64_t cols,
                           int64_t block, int share128, gpu_ptr q /* u8 (rows, cols) */,
                           gpu_ptr scale /* u8 (rows, cols/block) */);
/* The same of x's columns [sx, sx + cols), x (rows, ldx) in t, each value first rounded to bf16
 * when round_bf16 (a cast f32 -> bf16 that the quantize reads through, never written). With
 * gather (i32 (rows), an expert_permute's perm of top_k gk over x's gn rows): row r is x's row
 * gather[r] / gk, the permute read through and never written (gpu_views.h, VIEW_GATHER). */
int rt_cuda_mxfp8_quantize_win(rt_cuda *k, cg_dtype t, gpu_ptr x, int64_t ldx, int64_t sx, int round_bf16, int64_t rows,
                               int64_t cols, int64_t block, int share128, gpu_ptr q, gpu_ptr scale, gpu_ptr gather,
                               int64_t gk, int64_t gn);
/* rt_cuda_mlp_act into act (S, F), stored as t, then rt_cuda_mxfp8_quantize of act, in one pass
 * (act never in memory): the same q and scale bit for bit. */
int rt_cuda_mxfp8_quantize_act(rt_cuda *k, cg_dtype t, gpu_ptr gu, int64_t ldg, gpu_ptr probs, int64_t S, int64_t F,
                               int64_t block, int share128, gpu_ptr q, gpu_ptr scale);
/* The same, and gate_up's own quantize (rt_cuda_mxfp8_quantize_win of its (S, 2F) window, the
 * same block and share128: grouped_mlp's saved gate_up) into qs (S, 2F) and ss (S, 2F / block)
 * from the same loads: one read of gate_up for both, the same bytes as the two apart. qs, ss 0:
 * rt_cuda_mxfp8_quantize_act. */
int rt_cuda_mxfp8_quantize_act_store(rt_cuda *k, cg_dtype t, gpu_ptr gu, int64_t ldg, gpu_ptr probs, int64_t S, int64_t F,
                                     int64_t block, int share128, gpu_ptr q, gpu_ptr scale, gpu_ptr qs, gpu_ptr ss);
/* The column-wise copy: quantizes x^T, i.e. qt (cols, rows), scale_t (cols, rows/block). */
int rt_cuda_mxfp8_quantize_cols(rt_cuda *k, cg_dtype t, gpu_ptr x /* (rows, cols) */, int64_t rows, int64_t cols,
                                int64_t block, int share128, gpu_ptr qt, gpu_ptr scale_t);
/* The weight-tile recipe's quantize of E weights (A, B) (A, B multiples of 128; x 16-byte
 * aligned, of type t, each value rounded to bf16 first when round_bf16): one E8M0 scale per
 * 128 x 128 square from its amax (ck_mxfp8_qdq_tiles' values). Writes q, the E4M3 bytes as
 * (E, A, B), or (E, B, A) with transpose; codes, q's per-row codes as rt_cuda_mxfp8_quantize
 * writes them ((E A, B / block) or (E B, A / block)); blk, per expert
 * rt_cuda_tile_blk_floats(N, K) f32 scales of the squares for cuBLASLt's 128 x 128 block mode
 * on q's (N, K) matrix: square (nb, kb) at nb ldk + kb, ldk = K / 128 rounded up to 4 (the
 * layout the H200's cuBLASLt reads, Transformer Engine's "GEMM-ready" one). */
int rt_cuda_mxfp8_quantize_tiles(rt_cuda *k, cg_dtype t, gpu_ptr x, int round_bf16, int64_t E, int64_t A, int64_t B,
                                 int64_t block, int transpose, gpu_ptr q, gpu_ptr codes, gpu_ptr blk);
/* Floats of one expert's square scales for a (N, K) matrix: N / 128 rows of ldk. */
int64_t rt_cuda_tile_blk_floats(int64_t N, int64_t K);
/* AdamW over a stack of expert weights (E, A, B) kept as squares (gpu_exec_stacks.c): one
 * rt_cuda_adamw_multi step of each parameter (decay wd for all), and from the updated weights,
 * rounded to bf16, the squares of both rt_cuda_mxfp8_quantize_tiles orientations: q and blk as
 * with transpose 0, qt and blkt as with transpose 1 (no codes). tab: parts E device entries
 * rt_cuda_sq_param, part p of expert e at p E + e, parts in column order, cols multiples of
 * 128. g: the stacked gradient (E, A, B) of dtype gt, or 0: only the squares of the weights as
 * they are (hp unused). */
typedef struct {
  gpu_ptr w, m, v;      /* (A, cols): the f32 weight and its moments (bf16 with hp->moments_bf16) */
  int64_t c0, cols;     /* its columns of the stack */
} rt_cuda_sq_param;
int rt_cuda_adamw_squares(rt_cuda *k, gpu_ptr tab, int parts, int64_t E, int64_t A, int64_t B, cg_dtype gt, gpu_ptr g,
                          gpu_ptr gnorm, const rt_cuda_adamw_hp *hp, double wd, int64_t block, gpu_ptr q, gpu_ptr blk,
                          gpu_ptr qt, gpu_ptr blkt);
int rt_cuda_mxfp8_dequantize(rt_cuda *k, cg_dtype t, gpu_ptr q, gpu_ptr scale, int64_t rows, int64_t cols,
                             int64_t block, gpu_ptr x /* (rows, cols) */);
/* FP8 GEMM operands (gpu_gemm_fp8, one GEMM per expert, one f32 scale per 128 of K). cuBLASLt
 * runs only whole 16-row blocks, so a segment of m rows is laid out as fp8_rows(m); it has
 * fp8_rows(m) K/128 scales and starts at a multiple of 4 floats (16 bytes). */
static inline int64_t fp8_rows(int64_t m) { return (m + 15) / 16 * 16; }
static inline int64_t fp8_scale_floats(int64_t m, int64_t K) { return (m * (K / 128) + 3) / 4 * 4; }
/* scale (rows, K/block) E8M0 of a 128-shared quantization -> sf: for each segment of rows
 * (counts (E) on the device, or E = rows / seg_rows segments of seg_rows, or one), its
 * (K/128, fp8_rows(m)) f32 powers of two, rows fastest (the padding columns left unwritten),
 * at the sum of fp8_scale_floats(fp8_rows(m), K) before it. */
int rt_cuda_mxfp8_scales_vec128(rt_cuda *k, gpu_ptr scale, int64_t rows, int64_t K, int64_t block, gpu_ptr counts,
                                int64_t E, int64_t seg_rows, gpu_ptr sf);
/* The weight gradient's operand: x (S, C) rows split by counts (E, on the device); expert e's
 * rows transposed, zero-padded to P_e = 128 ceil(m_e/128): qt (C, P_e) E4M3 at qt + C Poff_e
 * and sf (P_e/128, C) f32 at sf + 4 C Poff_e / 128 bytes (Poff_e = sum of the earlier P).
 * 128-shared MXFP8 blocks restarting at each expert (ck_mxfp8_qdq with counts). */
int rt_cuda_mxfp8_quantize_cols_experts(rt_cuda *k, cg_dtype t, gpu_ptr x, int64_t S, int64_t C, gpu_ptr counts, int64_t E,
                                        gpu_ptr qt, gpu_ptr sf);
/* The same of x's columns [sx, sx + C), x (S, ldx), rounded to bf16 first when round_bf16;
 * ldq > 0 lays qt out as one (C, ldq) matrix instead, expert e's block at columns Poff_e..
 * (ldq >= fp8_cols_ld(S, E); the layout gpu_wgmma's TMA reads, one tensor map for all).
 * gather, gk, gn: rows through an expert_permute, as rt_cuda_mxfp8_quantize_win. */
int rt_cuda_mxfp8_quantize_cols_experts_win(rt_cuda *k, cg_dtype t, gpu_ptr x, int64_t ldx, int64_t sx, int round_bf16,
                                            int64_t S, int64_t C, gpu_ptr counts, int64_t E, int64_t ldq, gpu_ptr qt,
                                            gpu_ptr sf, gpu_ptr gather, int64_t gk, int64_t gn);
/* Columns enough for the padded expert blocks of S rows in E experts: the sum of 128
 * ceil(m_e/128) is a multiple of 128 of at most S + 127 E (and at least 128, so never 0). */
static inline int64_t fp8_cols_ld(int64_t S, int64_t E) {
  int64_t ld = (S + 127 * E) / 128 * 128;
  return ld > 128 ? ld : 128;
}
/* ck_mxfp8_qdq: y (dims, in ty; may be x) = the exact values of x quantized to MXFP8 along
 * `axis` of dims (rank 1..4), blocks restarting at each expert's first row when counts (i32
 * (E) on the device, axis 0 only) is not 0. */
int rt_cuda_mxfp8_qdq(rt_cuda *k, cg_dtype tx, gpu_ptr x, cg_dtype ty, gpu_ptr y, int rank, const int64_t *dims,
                      int axis, int64_t block, int share128, gpu_ptr counts, int64_t E);
/* y (rows, w) = the same along the rows of x's columns [sx, sx + w), x (rows, ldx). */
int rt_cuda_mxfp8_qdq_cols(rt_cuda *k, cg_dtype tx, gpu_ptr x, int64_t ldx, int64_t sx, cg_dtype ty, gpu_ptr y,
                           int64_t rows, int64_t w, int64_t block, int share128);

#endif
