/* gpu_exec_grouped.c -- the GPU executor's exec functions for the fusion passes' ops
 * (group-linear, grouped-mlp, mxfp8): expert-sorted rows, grouped GEMMs on cuBLASLt or FP8,
 * the GroupedMLP and its backward, the MXFP8 quantizes (gpu_exec_int.h). */
#include <stdlib.h>
#include <string.h>

#include "gpu_exec_int.h"

/* ---- the fusion passes' ops (group-linear, grouped-mlp): expert-sorted rows, counts read on
 * the device (codegen/cg_grouped.c); nothing here waits for the GPU. ---- */
#define OPTP(id, k) (N(id)->n_in > (k) ? V(id, k)->p : 0)
static int need_f32(gx *x, int id, int v, const char *what) {
  return x->g->nodes[v].type.dtype == DT_F32 ? 0 : fail(x, id, "%s must be f32 on the GPU", what);
}

/* The counts' host copy is queued right behind the kernel that makes them: by the time a
 * grouped GEMM on cuBLASLt needs them (host_counts), the GPU has them on their way and still has
 * the layer's permute and quantizes to run, instead of draining its queue at a blocking copy. */
int exec_EXPERT_COUNTS(gx *x, int id) {
  const dev_value *idx = V(id, 0);
  const int64_t E = N(id)->type.dims[0];
  if (alloc_out(x, id, E, 0)) return -1;
  if (ck(x, id, rt_cuda_expert_counts(KX, idx->p, idx->rows, INCOLS(id, 0), E, x->val[id].p))) return -1;
  if (x->grouped_device) return 0; /* no host copy wanted */
  gpu_ctx *g = x->rt->g;
  if ((!x->cpin[id] && gpu_alloc_host(g, &x->cpin[id], (size_t)E * 4)) || (!x->cev[id] && gpu_event_new(g, &x->cev[id])) ||
      gpu_download_async(g, x->cpin[id], x->val[id].p, (size_t)E * 4) || gpu_event_record(g, x->cev[id]))
    return fail(x, id, "%s", gpu_error(g));
  x->cpending[id] = 1;
  return 0;
}

int exec_EXPERT_SORT(gx *x, int id) {
  const dev_value *idx = V(id, 0);
  if (alloc_out(x, id, idx->rows * INCOLS(id, 0), 0)) return -1;
  return ck(x, id, rt_cuda_expert_sort(KX, idx->p, idx->rows, INCOLS(id, 0), ir_get_int(N(id), "experts", 0), x->val[id].p));
}

int exec_EXPERT_PERMUTE(gx *x, int id) {
  const dev_value *a = V(id, 0);
  int64_t k = ir_get_int(N(id), "top_k", 1);
  if (x->view[id] == VIEW_GATHER && !x->keep_all) { /* its quantizes gather the rows (gpu_views.h) */
    x->val[id] = (dev_value){.rows = a->rows * k, .numel = a->rows * k * COLS(id)};
    return 0;
  }
  cg_dtype tw = N(id)->n_in > 2 ? DT(x, N(id)->in[2]) : CG_DT_F32;
  if (alloc_out(x, id, a->rows * k, 0)) return -1;
  if (DT(x, N(id)->in[0]) != DT(x, id)) return fail(x, id, "input and output dtypes differ");
  return ck(x, id, rt_cuda_expert_permute(KX, DT(x, id), tw, a->p, V(id, 1)->p, OPTP(id, 2), x->val[id].p, a->rows, k, COLS(id)));
}

/* Value v as a reader that takes slice windows in place sees it: its own buffer, rows
 * dense_ld apart, or for a slice that writes nothing (VIEW_WINDOW) its window of the slice's
 * input, rows as wide as that input's. 0 where that input has no buffer of its own. */
static gpu_ptr value_or_window(gx *x, int v, int64_t dense_ld, int64_t *ld) {
  *ld = dense_ld;
  if (x->view[v] != VIEW_WINDOW || x->val[v].p) return x->val[v].p;
  const int src = N(v)->in[0];
  *ld = COLS(src);
  return x->val[src].p ? x->val[src].p + (gpu_ptr)(ir_get_int(N(v), "start", 0) * (int64_t)dsize(N(src)->type.dtype)) : 0;
}

int exec_EXPERT_UNPERMUTE(gx *x, int id) {
  const dev_value *ys = V(id, 0);
  int64_t k = ir_get_int(N(id), "top_k", 1);
  const int res = (int)ir_get_int(N(id), "residual", 0), weighted = N(id)->n_in - res > 2; /* res: fuse-residual's add */
  cg_dtype tw = weighted ? DT(x, N(id)->in[2]) : CG_DT_F32;
  if (alloc_out(x, id, ys->rows / k, 0)) return -1;
  if (DT(x, N(id)->in[0]) != DT(x, id)) return fail(x, id, "input and output dtypes differ");
  /* ys: a value, or a slice's window of grouped_mlp's output, read with its stride */
  int64_t ldy;
  const gpu_ptr yp = value_or_window(x, N(id)->in[0], COLS(id), &ldy);
  if (!yp && x->view[N(id)->in[0]] == VIEW_WINDOW)
    return fail(x, id, "internal error: a window of a value that is itself a view");
  return ck(x, id, rt_cuda_expert_unpermute(KX, DT(x, id), tw, yp, ldy, V(id, 1)->p, weighted ? V(id, 2)->p : 0,
                                            res ? V(id, N(id)->n_in - 1)->p : 0, x->val[id].p, ys->rows / k, k, COLS(id)));
}

int exec_EXPERT_PROBS(gx *x, int id) {
  const dev_value *w = V(id, 0);
  if (need_f32(x, id, N(id)->in[0], "the routing weights") || need_f32(x, id, id, "the probabilities")) return -1;
  if (alloc_out(x, id, w->numel, 0)) return -1;
  return ck(x, id, rt_cuda_expert_probs(KX, w->p, V(id, 1)->p, x->val[id].p, w->rows, INCOLS(id, 0)));
}

int exec_EXPERT_PROBS_BWD(gx *x, int id) {
  int64_t k = COLS(id), T = V(id, 0)->rows / k;
  if (need_f32(x, id, N(id)->in[0], "the probabilities' gradient") || need_f32(x, id, id, "the routing weights' gradient"))
    return -1;
  if (alloc_out(x, id, T, 0)) return -1;
  return ck(x, id, rt_cuda_expert_probs_bwd(KX, V(id, 0)->p, V(id, 1)->p, x->val[id].p, T, k));
}

int exec_EXPERT_WEIGHT_GRAD(gx *x, int id) {
  const dev_value *a = V(id, 0);
  if (need_f32(x, id, id, "the routing weights' gradient")) return -1;
  if (alloc_out(x, id, a->rows, 0)) return -1;
  return ck(x, id, rt_cuda_expert_weight_grad(KX, DT(x, N(id)->in[0]), DT(x, N(id)->in[1]), a->p, V(id, 1)->p, V(id, 2)->p,
                                              x->val[id].p, a->rows, COLS(id), INCOLS(id, 0)));
}

int exec_STACK(gx *x, int id) {
  /* out[e, :, part p columns] = operand p*E + e */
  const ir_type *t = &N(id)->type;
  int64_t E = t->dims[0], in = t->dims[1], C = t->dims[2], parts = N(id)->n_in / E, c0 = 0;
  size_t es = dsize(t->dtype);
  const dev_stack *sk = x->stack_of[id] >= 0 ? &x->rt->stacks[x->stack_of[id]] : NULL;
  if (sk && sk->squares && !x->keep_all) { /* its quantizes take the squares (fp8_pack) */
    x->val[id] = (dev_value){.rows = E, .numel = E * in * C};
    return 0;
  }
  if (sk && !sk->squares) { /* the parameters' copies are the stack: refresh stale ones */
    for (int j = 0; j < N(id)->n_in; j++)
      if (fresh_copy(x, id, x->param_index[N(N(id)->in[j])->in[0]])) return -1;
    x->val[id] = (dev_value){.p = x->rt->dp[x->param_index[N(N(id)->in[0])->in[0]]].wb, .rows = E, .numel = E * in * C};
    return 0;
  }
  if (alloc_out(x, id, E, 0)) return -1;
  for (int64_t p = 0; p < parts; p++) {
    int64_t w = INCOLS(id, (int)(p * E));
    for (int64_t e = 0; e < E; e++) {
      int v = N(id)->in[p * E + e];
      if (ck(x, id, rt_cuda_copy_cols(KX, DT(x, v), DT(x, id), x->val[v].p, w, 0, x->val[id].p + (gpu_ptr)((size_t)(e * in * C) * es),
                                      C, c0, in, w)))
        return -1;
    }
    c0 += w;
  }
  return 0;
}

int exec_UNSTACK(gx *x, int id) {
  int64_t in = N(N(id)->in[0])->type.dims[1], C = INCOLS(id, 0), e = ir_get_int(N(id), "expert", 0),
          start = ir_get_int(N(id), "start", 0), w = COLS(id);
  size_t es = dsize(N(N(id)->in[0])->type.dtype);
  if (x->view[id] == VIEW_SLAB && !x->keep_all) { /* expert e's slab of the stacked input, not owned */
    x->val[id] = (dev_value){.p = V(id, 0)->p + (gpu_ptr)((size_t)(e * in * C) * es), .rows = in, .numel = in * w};
    return 0;
  }
  if (x->view[id] == VIEW_STRIDED && !x->keep_all) { /* its window of expert e's rows, read with their stride */
    x->val[id] = (dev_value){.p = V(id, 0)->p + (gpu_ptr)((size_t)(e * in * C + start) * es), .rows = in, .numel = in * w,
                             .ld = C};
    return 0;
  }
  if (alloc_out(x, id, in, 0)) return -1;
  return ck(x, id, rt_cuda_copy_cols(KX, DT(x, N(id)->in[0]), DT(x, id), V(id, 0)->p + (gpu_ptr)((size_t)(e * in * C) * es), C,
                                     start, x->val[id].p, w, 0, in, w));
}

int exec_PAD_COLS(gx *x, int id) {
  const dev_value *a = V(id, 0);
  int64_t w = INCOLS(id, 0), start = ir_get_int(N(id), "start", 0), W = COLS(id);
  if (alloc_out(x, id, a->rows, 1)) return -1;
  return ck(x, id, rt_cuda_copy_cols(KX, DT(x, N(id)->in[0]), DT(x, id), a->p, w, 0, x->val[id].p, W, start, a->rows, w));
}

/* ---- grouped GEMMs through cuBLASLt, one call per expert. cuBLASLt takes each expert's row
 * count from the host, so a counts vector is downloaded once per step (a stream sync per MoE
 * layer; the backward reuses the copy). MOEC_GROUPED_GEMM=device keeps the device-driven
 * kernels above instead (no sync, capturable; slower until issue 6's wgmma kernel). ---- */
static int grouped_blas(gx *x, cg_dtype ta, cg_dtype tb) { return !x->grouped_device && ta == tb; }

/* counts value v (i32 (E)): its host copy; the counts must sum to S, the rows they split */
static const int32_t *host_counts(gx *x, int id, int v, int64_t S) {
  if (!x->hcounts[v]) {
    int64_t E = x->val[v].numel, sum = 0;
    int32_t *c = malloc((size_t)(E > 0 ? E : 1) * sizeof *c);
    if (!c) return fail(x, id, "out of host memory"), NULL;
    if (N(v)->op == OP_FILL) { /* a constant (mxfp8-projections' one group): no download */
      for (int64_t e = 0; e < E; e++) c[e] = (int32_t)ir_get_float(N(v), "value", 0);
    } else if (x->cpending[v]) { /* queued by exec_EXPERT_COUNTS */
      x->cpending[v] = 0;
      if (gpu_event_wait(x->rt->g, x->cev[v]) != 0) {
        free(c);
        return fail(x, id, "%s", gpu_error(x->rt->g)), NULL;
      }
      memcpy(c, x->cpin[v], (size_t)E * sizeof *c);
    } else if (gpu_download(x->rt->g, c, x->val[v].p, (size_t)E * sizeof *c) != 0) {
      free(c);
      return fail(x, id, "%s", gpu_error(x->rt->g)), NULL;
    }
    for (int64_t e = 0; e < E; e++) sum += c[e] >= 0 ? c[e] : S + 1;
    x->hcounts[v] = c;
    if (sum != S) return fail(x, id, "expert counts sum to %lld, not to the %lld rows", (long long)sum, (long long)S), NULL;
  }
  return x->hcounts[v];
}

/* C rows of expert e (row stride ldc) = A rows of e (row stride lda, K columns) . B_e, the e-th
 * (K, N) matrix of b, or its stored (N, K) matrix read transposed (trans_b). */
static int ggemm_blas(gx *x, int id, const int32_t *cnt, int64_t E, cg_dtype ta, gpu_ptr a, int64_t lda, cg_dtype tb,
                      gpu_ptr b, int trans_b, cg_dtype tc, gpu_ptr c, int64_t ldc, int64_t N, int64_t K) {
  char e_[512];
  size_t sa = ta == CG_DT_BF16 ? 2 : 4, sb = tb == CG_DT_BF16 ? 2 : 4, sc = tc == CG_DT_BF16 ? 2 : 4;
  int64_t r0 = 0;
  int rc = gpu_blas_fork(x->rt->blas, e_, sizeof e_); /* disjoint rows of C: the experts may overlap */
  for (int64_t e = 0; e < E && rc == 0; r0 += cnt[e++]) {
    if (cnt[e] == 0) continue;
    gpu_mat A = {ta, a + (gpu_ptr)((size_t)(r0 * lda) * sa), lda, 0, 0};
    gpu_mat B = {tb, b + (gpu_ptr)((size_t)(e * K * N) * sb), trans_b ? K : N, 0, trans_b};
    gpu_mat C = {tc, c + (gpu_ptr)((size_t)(r0 * ldc) * sc), ldc, 0, 0};
    rc = gpu_gemm(x->rt->blas, cnt[e], N, K, 1.0f, &A, &B, 0.0f, &C, 1, e_, sizeof e_);
    gpu_blas_next_lane(x->rt->blas);
  }
  return gpu_blas_join(x->rt->blas, rc, e_, sizeof e_) ? fail(x, id, "%s", e_) : 0;
}

#define DIMOF(id, k, d) (x->g->nodes[N(id)->in[k]].type.dims[d])

/* ---- FP8 expert GEMMs (gpu_fp8.h): the packed forms, and the sites' GEMMs ---- */
static int pool_buf(gx *x, int id, size_t bytes, gpu_ptr *p) {
  return pool_get(x->rt, bytes ? bytes : 4, p) != 0 ? fail(x, id, "%s", gpu_error(x->rt->g)) : 0;
}

/* val[id].q8 (q8 bytes) and .s8 (s8 bytes) from the pool; on failure neither is held. */
static int packed_bufs(gx *x, int id, size_t q8, size_t s8) {
  dev_value *v = &x->val[id];
  if (pool_buf(x, id, q8, &v->q8)) return -1;
  if (pool_buf(x, id, s8, &v->s8)) {
    pool_put(x->rt, v->q8);
    v->q8 = 0;
    return -1;
  }
  v->q8_bytes = q8, v->s8_bytes = s8;
  return 0;
}

/* The quantize behind input k of FP8 site id (input k is its dequantize). */
#define QOF(id, k) (N(N(id)->in[k])->in[0])

/* Is FP8_STORE quantize q's packed form already written this run, by the grouped_mlp whose act
 * quantize's kernel writes it (plan_gate_up_stores)? */
static int store_written(gx *x, int q) {
  for (int G = 0; G < q; G++)
    if (x->store_q[G] == q) return x->val[q].q8 != 0;
  return 0;
}

/* Writes quantize id's packed form (its plan kind) into val[id].q8 / .s8. */
static int fp8_pack(gx *x, int id) {
  const ir_node *n = N(id);
  const dev_value *a = V(id, 0);
  dev_value *v = &x->val[id];
  cg_dtype t = DT(x, n->in[0]);
  int64_t block = ir_get_int(n, "block", 32);
  size_t es = dsize(x->g->nodes[n->in[0]].type.dtype);
  int kind = x->fp8.kind[id];
  v->sq = 0;
  /* the input: a itself, or through a cast view (rounded here) and/or a slice's window, or the
     rows of an expert_permute's input gathered through its perm */
  int r = n->in[0], rb = 0;
  int64_t sx = 0, gk = 1, gn = 0;
  gpu_ptr gat = 0;
  if (x->view[r] == VIEW_GATHER && !x->val[r].p)
    gk = ir_get_int(N(r), "top_k", 1), gat = V(r, 1)->p, r = N(r)->in[0], gn = x->val[r].rows;
  if (x->view[r] == VIEW_CAST && !x->val[r].p) rb = 1, r = N(r)->in[0];
  if (x->view[r] == VIEW_WINDOW && !x->val[r].p) sx = ir_get_int(N(r), "start", 0), r = N(r)->in[0];
  gpu_ptr src = x->val[r].p;
  int64_t ldx = COLS(r);
  t = DT(x, r);
  if (kind == FP8_STORE) { /* (S, K) E4M3 + E8M0 codes, expanded by its dequantizes */
    if (store_written(x, id)) return 0; /* by its grouped_mlp's act quantize (store_q) */
    int64_t S = a->rows, K = COLS(id);
    if (packed_bufs(x, id, (size_t)(S * K), (size_t)(S * K / block))) return -1;
    return ck(x, id, rt_cuda_mxfp8_quantize_win(KX, t, src, ldx, sx, rb, S, K, block, (int)ir_get_int(n, "share128", 0),
                                                v->q8, v->s8, gat, gk, gn));
  }
  if (kind == FP8_ROWS) { /* (S, K): E4M3 as is, E8M0 codes; the reader lays the scales out per expert */
    int64_t S = a->rows, K = COLS(id);
    if (packed_bufs(x, id, (size_t)((S + 16) * K), (size_t)(S * K / block))) return -1; /* 16 rows of slack (gpu_fp8.h) */
    return ck(x, id, rt_cuda_mxfp8_quantize_win(KX, t, src, ldx, sx, rb, S, K, block, 1, v->q8, v->s8, gat, gk, gn));
  }
  if (kind == FP8_COLS) { /* (S, C) by expert: transposed, padded expert blocks with f32 scales; for
                              the wgmma kernel one (C, fp8_cols_ld) matrix (gpu_wgmma.h) */
    int64_t S = a->rows, C = COLS(id), E = DIMOF(id, 1, 0), ldq = x->wgmma ? fp8_cols_ld(S, E) : 0;
    if (packed_bufs(x, id, (size_t)(C * (ldq > S + 128 * E ? ldq : S + 128 * E)), (size_t)(C * (S / 128 + E)) * 4))
      return -1;
    return ck(x, id, rt_cuda_mxfp8_quantize_cols_experts_win(KX, t, src, ldx, sx, rb, S, C, V(id, 1)->p, E, ldq, v->q8,
                                                             v->s8, gat, gk, gn));
  }
  /* weights (E, A, B): W_IN along A -> (E, B, A) transposed; W_OUT along B -> as is. Then the
   * f32 scales, one segment of N rows per expert. */
  int64_t E = n->type.dims[0], A = n->type.dims[1], B = n->type.dims[2];
  int64_t N_ = kind == FP8_W_IN ? B : A, K = kind == FP8_W_IN ? A : B;
  size_t codes_bytes = (size_t)(E * N_ * K / block);
  gpu_ptr codes = 0;
  const int64_t tile = ir_get_int(n, "tile", 0);
  if (tile && x->stack_of[r] >= 0 && x->rt->stacks[x->stack_of[r]].squares) { /* kept as squares: not owned */
    dev_stack *sk = &x->rt->stacks[x->stack_of[r]];
    if (squares_refresh(x, id, sk)) return -1;
    const int tr = kind == FP8_W_IN;
    v->q8 = sk->q[tr], v->s8 = 0, v->sq = sk->blk[tr];
    v->q8_bytes = v->s8_bytes = 0;
    return 0;
  }
  /* squares: the VEC128 scales then the squares' (both GEMM paths read the squares where
     they exist, so for a tile weight the VEC128 pass is unused work: to drop once measured) */
  const size_t vec_bytes = (size_t)(E * fp8_scale_floats(fp8_rows(N_), K)) * 4,
               sq_bytes = tile ? (size_t)(E * rt_cuda_tile_blk_floats(N_, K)) * 4 : 0;
  if (packed_bufs(x, id, (size_t)(E * N_ * K), vec_bytes + sq_bytes) || pool_buf(x, id, codes_bytes, &codes)) return -1;
  int rc = 0;
  v->sq = 0;
  if (tile) { /* one pass: the squares' codes, the bytes in the reader's orientation, the scales */
    v->sq = v->s8 + (gpu_ptr)vec_bytes;
    if (sx) {
      pool_put(x->rt, codes);
      return fail(x, id, "internal error: a weight in squares read through a slice's window");
    }
    rc = rt_cuda_mxfp8_quantize_tiles(KX, t, src, rb, E, A, B, block, kind == FP8_W_IN, v->q8, codes, v->sq);
  } else if (kind == FP8_W_IN)
    for (int64_t e = 0; e < E && rc == 0; e++)
      rc = rt_cuda_mxfp8_quantize_cols(KX, t, a->p + (gpu_ptr)((size_t)(e * A * B) * es), A, B, block, 1,
                                       v->q8 + (gpu_ptr)(e * A * B), codes + (gpu_ptr)(e * A * B / block));
  else
    rc = rt_cuda_mxfp8_quantize(KX, t, a->p, E * A, B, block, 1, v->q8, codes);
  if (rc == 0) rc = rt_cuda_mxfp8_scales_vec128(KX, codes, E * N_, K, block, 0, 0, N_, v->s8);
  pool_put(x->rt, codes); /* stream order keeps it alive for the queued kernels */
  return ck(x, id, rc);
}

/* Per-expert f32 scales of the FP8_ROWS operand quantized by q (K columns) into a pool buffer. */
static int fp8_row_scales(gx *x, int id, int q, int64_t E, gpu_ptr counts, gpu_ptr *sf, size_t *bytes) {
  int64_t S = x->val[q].rows, K = COLS(q);
  *bytes = (size_t)((S + 16 * E) * (K / 128) + 4 * E) * 4; /* segments of fp8_rows(m_e) */
  if (pool_buf(x, id, *bytes, sf)) return -1;
  return ck(x, id, rt_cuda_mxfp8_scales_vec128(KX, x->val[q].s8, S, K, ir_get_int(N(q), "block", 32), counts, E, 0, *sf));
}

static int fp8_fail(gx *x, int id, const char *e) {
  return fail(x, id, "%s (MOEC_FP8_GEMM=0 runs the expert GEMMs in bf16 on the same MXFP8 values)", e);
}

/* The FP8 expert GEMMs run on the device-driven wgmma kernel (gpu_wgmma.h: one launch, the
 * counts value vc read on the device, no host sync) where the executor has it, else on
 * cuBLASLt, one call per expert, from the counts' host copy. */
static int fp8_gemm_rows(gx *x, int id, int vc, int64_t E, int64_t S, int64_t N_, int64_t K, gpu_ptr qa, gpu_ptr sa,
                         gpu_ptr qb, gpu_ptr sb, gpu_ptr sq, cg_dtype tc, gpu_ptr c, int64_t ldc) {
  char e_[512];
  int rc;
  if (x->wgmma) {
    rc = gpu_wgmma_fp8_rows(x->wgmma, x->val[vc].p, E, S, N_, K, qa, sa, qb, sb, sq, tc, c, ldc, e_, sizeof e_);
  } else {
    const int32_t *cnt = host_counts(x, id, vc, S);
    if (!cnt) return -1;
    rc = gpu_fp8_grouped_gemm(x->rt->blas, cnt, E, N_, K, qa, sa, qb, sb, sq, tc, c, ldc, e_, sizeof e_);
  }
  return rc ? fp8_fail(x, id, e_) : 0;
}

/* out rows of expert e (N columns, stride ldc) = rows operand at input ka (K columns) . weights
 * operand at input kw, both in FP8; vc the counts value, S the rows. */
static int fp8_site_gemm(gx *x, int id, int ka, int kw, int64_t E, int vc, int64_t S, int64_t N_, int64_t K,
                         cg_dtype tc, gpu_ptr c, int64_t ldc) {
  gpu_ptr sf = 0;
  size_t sf_bytes = 0;
  if (fp8_row_scales(x, id, QOF(id, ka), E, x->val[vc].p, &sf, &sf_bytes)) return -1;
  const dev_value *qa = &x->val[QOF(id, ka)], *qw = &x->val[QOF(id, kw)];
  int rc = fp8_gemm_rows(x, id, vc, E, S, N_, K, qa->q8, sf, qw->q8, qw->s8, qw->sq, tc, c, ldc);
  pool_put(x->rt, sf);
  return rc;
}

int exec_GROUPED_LINEAR(gx *x, int id) {
  const dev_value *a = V(id, 0);
  if (N(id)->n_in > 3) return fail(x, id, "a grouped linear with a bias is not on the GPU yet");
  int64_t E = DIMOF(id, 1, 0), in = DIMOF(id, 1, 1), out = DIMOF(id, 1, 2);
  if (alloc_out_slack(x, id, a->rows, 0, x->fp8.site[id] ? 16 : 0)) return -1;
  if (x->fp8.site[id]) /* w (E, in, out) packed as (E, out, in) */
    return fp8_site_gemm(x, id, 0, 1, E, N(id)->in[2], a->rows, out, in, DT(x, id), x->val[id].p, out);
  if (grouped_blas(x, DT(x, N(id)->in[0]), DT(x, N(id)->in[1]))) {
    const int32_t *cnt = host_counts(x, id, N(id)->in[2], a->rows);
    return cnt ? ggemm_blas(x, id, cnt, E, DT(x, N(id)->in[0]), a->p, in, DT(x, N(id)->in[1]), V(id, 1)->p, 0, DT(x, id),
                            x->val[id].p, out, out, in)
               : -1;
  }
  return ck(x, id, rt_cuda_grouped_linear_fwd(KX, DT(x, N(id)->in[0]), DT(x, N(id)->in[1]), DT(x, id), a->p, V(id, 1)->p,
                                              V(id, 2)->p, x->val[id].p, a->rows, E, in, out));
}

int exec_GROUPED_LINEAR_DGRAD(gx *x, int id) {
  const dev_value *dy = V(id, 0);
  int64_t E = DIMOF(id, 1, 0), in = DIMOF(id, 1, 1), out = DIMOF(id, 1, 2);
  if (alloc_out_slack(x, id, dy->rows, 0, x->fp8.site[id] ? 16 : 0)) return -1;
  if (x->fp8.site[id]) /* dx (S, in) = dy (S, out) . w[e]^T, w (E, in, out) along out, as is */
    return fp8_site_gemm(x, id, 0, 1, E, N(id)->in[2], dy->rows, in, out, DT(x, id), x->val[id].p, in);
  if (grouped_blas(x, DT(x, N(id)->in[0]), DT(x, N(id)->in[1]))) {
    const int32_t *cnt = host_counts(x, id, N(id)->in[2], dy->rows);
    return cnt ? ggemm_blas(x, id, cnt, E, DT(x, N(id)->in[0]), dy->p, out, DT(x, N(id)->in[1]), V(id, 1)->p, 1, DT(x, id),
                            x->val[id].p, in, in, out)
               : -1;
  }
  return ck(x, id, rt_cuda_grouped_linear_dgrad(KX, DT(x, N(id)->in[0]), DT(x, N(id)->in[1]), DT(x, id), dy->p, V(id, 1)->p,
                                                V(id, 2)->p, x->val[id].p, dy->rows, E, in, out));
}

int exec_GROUPED_LINEAR_WGRAD(gx *x, int id) {
  const dev_value *a = V(id, 0);
  const ir_type *t = &N(id)->type;
  if (alloc_out(x, id, t->dims[0], 0)) return -1;
  if (x->fp8.site[id]) { /* dw[e] (in, out) = xs_e^T . dy_e over the expert's padded rows */
    const dev_value *qx = &x->val[QOF(id, 0)], *qd = &x->val[QOF(id, 1)];
    char e_[512];
    int rc;
    if (x->wgmma) {
      const int64_t ld = fp8_cols_ld(a->rows, t->dims[0]);
      rc = gpu_wgmma_fp8_wgrad(x->wgmma, V(id, 2)->p, t->dims[0], a->rows, t->dims[1], t->dims[2], ld, qx->q8, qx->s8,
                               qd->q8, qd->s8, DT(x, id), x->val[id].p, e_, sizeof e_);
    } else {
      const int32_t *cnt = host_counts(x, id, N(id)->in[2], a->rows);
      if (!cnt) return -1;
      rc = gpu_fp8_grouped_wgrad(x->rt->blas, x->rt->g, cnt, t->dims[0], t->dims[1], t->dims[2], qx->q8, qx->s8, qd->q8,
                                 qd->s8, DT(x, id), x->val[id].p, e_, sizeof e_);
    }
    return rc ? fp8_fail(x, id, e_) : 0;
  }
  if (grouped_blas(x, DT(x, N(id)->in[0]), DT(x, N(id)->in[1]))) {
    /* dw[e] (in, out) = xs_e^T . dy_e, K = the expert's rows; zero for an expert without rows */
    const int32_t *cnt = host_counts(x, id, N(id)->in[2], a->rows);
    if (!cnt) return -1;
    int64_t in = t->dims[1], out = t->dims[2], r0 = 0;
    cg_dtype ta = DT(x, N(id)->in[0]), tc = DT(x, id);
    size_t sa = dsize(x->g->nodes[N(id)->in[0]].type.dtype), sc = dsize(t->dtype);
    char e_[512];
    int rc = gpu_blas_fork(x->rt->blas, e_, sizeof e_); /* one expert's gradient each: disjoint */
    for (int64_t e = 0; e < t->dims[0] && rc == 0; r0 += cnt[e++]) {
      gpu_ptr dw = x->val[id].p + (gpu_ptr)((size_t)(e * in * out) * sc);
      if (cnt[e] == 0) {
        if (gpu_memset8(x->rt->g, dw, 0, (size_t)(in * out) * sc) != 0) snprintf(e_, sizeof e_, "%s", gpu_error(x->rt->g)), rc = -1;
        continue;
      }
      gpu_mat A = {ta, a->p + (gpu_ptr)((size_t)(r0 * in) * sa), in, 0, 1};
      gpu_mat B = {ta, V(id, 1)->p + (gpu_ptr)((size_t)(r0 * out) * sa), out, 0, 0};
      gpu_mat C = {tc, dw, out, 0, 0};
      rc = gpu_gemm(x->rt->blas, in, out, cnt[e], 1.0f, &A, &B, 0.0f, &C, 1, e_, sizeof e_);
      gpu_blas_next_lane(x->rt->blas);
    }
    return gpu_blas_join(x->rt->blas, rc, e_, sizeof e_) ? fail(x, id, "%s", e_) : 0;
  }
  return ck(x, id, rt_cuda_grouped_linear_wgrad(KX, DT(x, N(id)->in[0]), DT(x, N(id)->in[1]), DT(x, id), a->p, V(id, 1)->p,
                                                V(id, 2)->p, x->val[id].p, a->rows, t->dims[0], t->dims[1], t->dims[2]));
}

int exec_GROUPED_COLSUM(gx *x, int id) {
  const dev_value *dy = V(id, 0);
  int64_t E = N(id)->type.dims[0];
  if (need_f32(x, id, id, "the bias gradient")) return -1;
  if (alloc_out(x, id, E, 0)) return -1;
  return ck(x, id, rt_cuda_grouped_colsum(KX, DT(x, N(id)->in[0]), dy->p, V(id, 1)->p, x->val[id].p, dy->rows, E, COLS(id)));
}

int exec_GROUPED_MLP(gx *x, int id) {
  const dev_value *a = V(id, 0);
  int64_t E = DIMOF(id, 1, 0), H = INCOLS(id, 0), F = ir_get_int(N(id), "ffn", 0);
  if (need_f32(x, id, N(id)->in[4], "the routing probabilities")) return -1;
  if (DT(x, N(id)->in[1]) != DT(x, N(id)->in[2])) return fail(x, id, "w_gu and w_down dtypes differ");
  if (alloc_out_slack(x, id, a->rows, 0, x->fp8.site[id] ? 16 : 0)) return -1;
  cg_dtype tx = DT(x, N(id)->in[0]), tw = DT(x, N(id)->in[1]), to = DT(x, id);
  int64_t mx_block = ir_get_int(N(id), "mx_block", 0);
  if (x->fp8.site[id]) {
    /* gate_up = xs . w_gu[e] and y = act . w_down[e] in FP8, act quantized here (128-shared) */
    int64_t S = a->rows, W = H + 2 * F;
    gpu_ptr counts = V(id, 3)->p, gu = x->val[id].p + (gpu_ptr)((size_t)H * dsize(N(id)->type.dtype)), qa = 0, ca = 0, sfa = 0;
    size_t qa_bytes = (size_t)((S + 16) * F), ca_bytes = (size_t)(S * F / mx_block) + 4,
           sfa_bytes = (size_t)((S + 16 * E) * (F / 128) + 4 * E) * 4;
    int rc = pool_buf(x, id, qa_bytes, &qa) || pool_buf(x, id, ca_bytes, &ca) || pool_buf(x, id, sfa_bytes, &sfa) ? -1 : 0;
    if (rc == 0) rc = fp8_site_gemm(x, id, 0, 1, E, N(id)->in[3], S, 2 * F, H, to, gu, W);
    /* act = p silu(g) u, rounded to `to`, quantized in the same pass: no act in memory; and
       where the saved gate_up is kept as MXFP8 (store_q), its quantize from the same loads */
    const int q = x->store_q[id];
    gpu_ptr qs = 0, ss = 0;
    if (rc == 0 && q >= 0) { /* (each run starts with every value released: none is held yet) */
      dev_value *vq = &x->val[q];
      if (vq->q8) {
        rc = fail(x, id, "internal error: the saved gate_up's quantize is already written");
      } else if (pool_buf(x, id, (size_t)(S * 2 * F), &vq->q8) == 0) { /* failures named here, at the grouped_mlp */
        vq->q8_bytes = (size_t)(S * 2 * F);
        if (pool_buf(x, id, (size_t)(S * 2 * F / mx_block), &vq->s8) == 0) vq->s8_bytes = (size_t)(S * 2 * F / mx_block);
        else rc = -1; /* q8 goes back with the value's release */
      } else {
        rc = -1;
      }
      qs = vq->q8, ss = vq->s8;
    }
    if (rc == 0)
      rc = ck(x, id, rt_cuda_mxfp8_quantize_act_store(KX, to, gu, W, V(id, 4)->p, S, F, mx_block, 1, qa, ca, qs, ss));
    if (rc == 0) rc = ck(x, id, rt_cuda_mxfp8_scales_vec128(KX, ca, S, F, mx_block, counts, E, 0, sfa));
    const dev_value *qd = &x->val[QOF(id, 2)];
    if (rc == 0) rc = fp8_gemm_rows(x, id, N(id)->in[3], E, S, H, F, qa, sfa, qd->q8, qd->s8, qd->sq, to, x->val[id].p, W);
    if (qa) pool_put(x->rt, qa); /* those obtained; stream order keeps them for the queued work */
    if (ca) pool_put(x->rt, ca);
    if (sfa) pool_put(x->rt, sfa);
    return rc;
  }
  if (grouped_blas(x, tx, tw) && to == tw) {
    /* out (S, H + 2F) = y | gate_up: gate_up = xs . w_gu[e]; act = p * silu(g) * u; y = act . w_down[e] */
    const int32_t *cnt = host_counts(x, id, N(id)->in[3], a->rows);
    if (!cnt) return -1;
    int64_t S = a->rows, W = H + 2 * F;
    size_t es = dsize(N(id)->type.dtype), act_bytes = (size_t)(S * F > 0 ? S * F : 1) * es;
    gpu_ptr gu = x->val[id].p + (gpu_ptr)((size_t)H * es), act = 0;
    if (pool_get(x->rt, act_bytes, &act) != 0) return fail(x, id, "%s", gpu_error(x->rt->g));
    int rc = ggemm_blas(x, id, cnt, E, tx, a->p, H, tw, V(id, 1)->p, 0, to, gu, W, 2 * F, H);
    if (rc == 0) rc = ck(x, id, rt_cuda_mlp_act(KX, to, gu, W, V(id, 4)->p, act, S, F));
    /* mxfp8: the down GEMM's operand quantized to MXFP8 row blocks, as ck_grouped_mlp_fwd */
    const int64_t act_dims[2] = {S, F};
    if (rc == 0 && mx_block > 0)
      rc = ck(x, id, rt_cuda_mxfp8_qdq(KX, to, act, to, act, 2, act_dims, 1, mx_block, (int)ir_get_int(N(id), "mx_share128", 0), 0, 0));
    if (rc == 0) rc = ggemm_blas(x, id, cnt, E, to, act, F, tw, V(id, 2)->p, 0, to, x->val[id].p, W, H, F);
    pool_put(x->rt, act); /* stream order keeps it alive for the queued GEMMs */
    return rc;
  }
  return ck(x, id, rt_cuda_grouped_mlp_fwd(KX, DT(x, N(id)->in[0]), DT(x, N(id)->in[1]), DT(x, id), a->p, V(id, 1)->p,
                                           V(id, 2)->p, V(id, 3)->p, V(id, 4)->p, x->val[id].p, a->rows, E, H, F,
                                           ir_get_int(N(id), "mx_block", 0)));
}

/* The quantize split id makes itself (VIEW_SPLIT_Q, reading dg | du through its piece and
 * cast), or -1. */
static int split_quantize(gx *x, int id) {
  for (int q = id + 1; q < x->g->n_nodes; q++)
    if (x->view[q] == VIEW_SPLIT_Q && gpu_view_root(x->g, x->view, N(q)->in[0]) == id) return q;
  return -1;
}

int exec_GROUPED_MLP_BWD(gx *x, int id) {
  const dev_value *dy = V(id, 0);
  int64_t E = DIMOF(id, 2, 0), H = INCOLS(id, 0), F = ir_get_int(N(id), "ffn", 0), S = dy->rows;
  if (need_f32(x, id, N(id)->in[4], "the routing probabilities")) return -1;
  const int split = x->view[id] == VIEW_SPLIT && !x->keep_all;
  /* the quantizes of dg | du's and act's expert columns the split makes itself (VIEW_SPLIT_FP8) */
  int cq[2] = {-1, -1};
  const int fp8_cols = split && gpu_split_fp8(x->g, x->view, id, cq);
  if (!split && alloc_out(x, id, S, 0)) return -1;
  if (split) { /* dg | du and act in bf16, dp in f32, apart (gpu_views.h); dp alone when fp8_cols */
    dev_value *v = &x->val[id];
    *v = (dev_value){.rows = S, .numel = S * COLS(id),
                     .bytes = fp8_cols ? (size_t)S * 4 : (size_t)gpu_split_offset(S, F, 3 * F + 1)};
    if (pool_get(x->rt, v->bytes > 0 ? v->bytes : 1, &v->p) != 0) {
      v->bytes = 0;
      return fail(x, id, "%s", gpu_error(x->rt->g));
    }
  }
  /* the saved gate_up: a value, or a window of grouped_mlp's output (its rows ldg apart) */
  int gu = N(id)->in[1];
  int64_t ldg;
  gpu_ptr gup = value_or_window(x, gu, 2 * F, &ldg);
  cg_dtype tdy = DT(x, N(id)->in[0]), tw = DT(x, N(id)->in[2]);
  if (x->fp8.site[id] || grouped_blas(x, tdy, tw)) {
    /* dact (S, F) f32 = dy . w_down[e]^T (FP8: w_down (E, F, H) along H, as is), then the
       rows: dg | du | act | dp */
    const int32_t *cnt = x->fp8.site[id] ? NULL : host_counts(x, id, N(id)->in[3], dy->rows);
    if (!x->fp8.site[id] && !cnt) return -1;
    size_t dact_bytes = (size_t)((S + (x->fp8.site[id] ? 16 : 0)) * F > 0 ? (S + (x->fp8.site[id] ? 16 : 0)) * F : 1) * 4;
    gpu_ptr dact = 0;
    if (pool_get(x->rt, dact_bytes, &dact) != 0) return fail(x, id, "%s", gpu_error(x->rt->g));
    int rc = x->fp8.site[id] ? fp8_site_gemm(x, id, 0, 2, E, N(id)->in[3], S, F, H, CG_DT_F32, dact, F)
                             : ggemm_blas(x, id, cnt, E, tdy, dy->p, H, tw, V(id, 2)->p, 1, CG_DT_F32, dact, F, F, H);
    const gpu_ptr out = x->val[id].p;
    /* a decoded gate_up (VIEW_DECODE): the stored quantize's E4M3 values and E8M0 codes */
    const int q = x->view[gu] == VIEW_DECODE && !gup ? N(gu)->in[0] : -1;
    /* the rows quantize of dg | du that the split makes itself (VIEW_SPLIT_Q): its packed form now */
    const int fq = split ? split_quantize(x, id) : -1;
    const int64_t fblock = fq >= 0 ? ir_get_int(N(fq), "block", 32) : 0;
    if (rc == 0 && fq >= 0) rc = packed_bufs(x, fq, (size_t)((S + 16) * 2 * F), (size_t)(S * 2 * F / fblock)); /* as fp8_pack's */
    if (rc == 0 && fp8_cols) { /* every FP8 operand, no bf16 piece; the columns sized as fp8_pack's */
      const int64_t ldq = x->wgmma ? fp8_cols_ld(S, E) : 0, colb = ldq > S + 128 * E ? ldq : S + 128 * E;
      const size_t scales = (size_t)(S / 128 + E) * 4;
      gpu_ptr dpc = 0;
      rc = packed_bufs(x, cq[0], (size_t)(2 * F * colb), (size_t)(2 * F) * scales) ||
                   packed_bufs(x, cq[1], (size_t)(F * colb), (size_t)F * scales) || pool_buf(x, id, (size_t)(S * F / 8) * 4, &dpc)
               ? -1
               : 0;
      /* MOEC_SPLIT_AHEAD=1: each block sends the next wave's rows into L2 (one block an SM) */
      const char *ah = getenv("MOEC_SPLIT_AHEAD");
      const rt_split_fp8 o = {x->val[fq].q8, x->val[fq].s8, fblock, x->val[cq[0]].q8, x->val[cq[0]].s8,
                              x->val[cq[1]].q8, x->val[cq[1]].s8, ldq, dpc,
                              ah && strcmp(ah, "1") == 0 ? gpu_info(x->rt->g)->sm_count : 0};
      if (rc == 0)
        rc = ck(x, id, rt_cuda_mlp_bwd_split_fp8(KX, DT(x, gu), dact, gup, ldg, q >= 0 ? x->val[q].q8 : 0,
                                                 q >= 0 ? x->val[q].s8 : 0, q >= 0 ? ir_get_int(N(q), "block", 32) : 0,
                                                 V(id, 4)->p, V(id, 3)->p, E, out, S, F, &o));
      if (dpc) pool_put(x->rt, dpc); /* stream order keeps it for the queued kernels */
    } else if (rc == 0 && split)
      rc = ck(x, id, rt_cuda_mlp_bwd_split_mx(KX, DT(x, gu), dact, gup, ldg, q >= 0 ? x->val[q].q8 : 0, q >= 0 ? x->val[q].s8 : 0,
                                              q >= 0 ? ir_get_int(N(q), "block", 32) : 0, V(id, 4)->p, out,
                                              out + gpu_split_offset(S, F, 2 * F), out + gpu_split_offset(S, F, 3 * F), S, F,
                                              fq >= 0 ? x->val[fq].q8 : 0, fq >= 0 ? x->val[fq].s8 : 0, fblock));
    else if (rc == 0 && q >= 0)
      rc = fail(x, id, "internal error: a decoded gate_up off the split path");
    else if (rc == 0)
      rc = ck(x, id, rt_cuda_mlp_bwd_rows(KX, DT(x, gu), DT(x, id), dact, gup, ldg, V(id, 4)->p, out, S, F, COLS(id)));
    pool_put(x->rt, dact);
    return rc;
  }
  if (split || gup != V(id, 1)->p) /* gpu_views_plan splits and windows only what runs on cuBLASLt */
    return fail(x, id, "internal error: a split or windowed grouped_mlp_bwd off the cuBLASLt path");
  return ck(x, id, rt_cuda_grouped_mlp_bwd(KX, DT(x, N(id)->in[0]), DT(x, N(id)->in[1]), DT(x, N(id)->in[2]), DT(x, id), dy->p,
                                           V(id, 1)->p, V(id, 2)->p, V(id, 3)->p, V(id, 4)->p, x->val[id].p, dy->rows, E, H,
                                           F, COLS(id)));
}

/* MXFP8 (the mxfp8 pass): an e4m3 value is kept, as on the CPU, as the exact values its
 * E4M3 elements and E8M0 scales encode (quantize-dequantize along the op's axis; stored in
 * bf16, see cdt); the GEMMs then read it through mxfp8_dequantize in bf16, except where
 * the FP8 plan (gpu_fp8.h) packs it for FP8 GEMMs instead. */
int exec_MXFP8_QUANTIZE(gx *x, int id) {
  const dev_value *a = V(id, 0);
  const ir_type *t = &N(id)->type;
  int64_t dims[IR_MAX_RANK];
  for (int d = 0; d < t->rank; d++) dims[d] = t->dims[d];
  dims[0] = a->rows;
  /* packed already by its split (split_quantize, gpu_split_fp8) */
  const int by_split = (x->view[id] == VIEW_SPLIT_Q || x->view[id] == VIEW_SPLIT_FP8) && !x->keep_all;
  if (x->fp8.kind[id] != FP8_NONE && !by_split && fp8_pack(x, id) != 0) return -1;
  if (!x->fp8.values[id]) { /* only FP8 GEMMs read it: the packed form is all */
    x->val[id].rows = a->rows;
    x->val[id].numel = a->numel;
    return 0;
  }
  if (alloc_out(x, id, a->rows, 0)) return -1;
  const int64_t tile = ir_get_int(N(id), "tile", 0);
  if (tile) { /* a weight in squares (E, A, B): quantized as is, then expanded into the values */
    const int64_t E = dims[0], A = dims[1], B = dims[2], block = ir_get_int(N(id), "block", 32);
    gpu_ptr q = 0, codes = 0, sq = 0;
    int rc = pool_buf(x, id, (size_t)(E * A * B), &q) || pool_buf(x, id, (size_t)(E * A * B / block), &codes) ||
                     pool_buf(x, id, (size_t)(E * rt_cuda_tile_blk_floats(A, B)) * 4, &sq)
                 ? -1
                 : 0;
    if (rc == 0) rc = ck(x, id, rt_cuda_mxfp8_quantize_tiles(KX, DT(x, N(id)->in[0]), a->p, 0, E, A, B, block, 0, q, codes, sq));
    if (rc == 0) rc = ck(x, id, rt_cuda_mxfp8_dequantize(KX, DT(x, id), q, codes, E * A, B, block, x->val[id].p));
    if (q) pool_put(x->rt, q); /* those obtained; stream order keeps them for the queued work */
    if (codes) pool_put(x->rt, codes);
    if (sq) pool_put(x->rt, sq);
    return rc;
  }
  if (x->view[N(id)->in[0]] == VIEW_WINDOW && !a->p) { /* the window of the slice's input, in place */
    int s = N(id)->in[0], src = N(s)->in[0];
    return ck(x, id, rt_cuda_mxfp8_qdq_cols(KX, DT(x, src), x->val[src].p, COLS(src), ir_get_int(N(s), "start", 0), DT(x, id),
                                            x->val[id].p, a->rows, COLS(id), ir_get_int(N(id), "block", 32),
                                            (int)ir_get_int(N(id), "share128", 0)));
  }
  gpu_ptr counts = N(id)->n_in == 2 ? V(id, 1)->p : 0;
  int64_t E = N(id)->n_in == 2 ? DIMOF(id, 1, 0) : 0;
  return ck(x, id, rt_cuda_mxfp8_qdq(KX, DT(x, N(id)->in[0]), a->p, DT(x, id), x->val[id].p, t->rank, dims,
                                     (int)ir_get_int(N(id), "axis", 0), ir_get_int(N(id), "block", 32),
                                     (int)ir_get_int(N(id), "share128", 0), counts, E));
}

int exec_MXFP8_DEQUANTIZE(gx *x, int id) {
  int q = N(id)->in[0];
  if (x->view[id] == VIEW_DECODE && !x->keep_all) { /* its readers decode the packed form (gpu_views.h) */
    x->val[id] = (dev_value){.rows = x->val[q].rows, .numel = x->val[q].numel};
    return 0;
  }
  if (x->fp8.kind[q] == FP8_STORE) { /* expands the packed values: those the quantize would have kept */
    if (alloc_out(x, id, x->val[q].rows, 0)) return -1;
    return ck(x, id, rt_cuda_mxfp8_dequantize(KX, DT(x, id), x->val[q].q8, x->val[q].s8, x->val[q].rows, COLS(id),
                                              ir_get_int(N(q), "block", 32), x->val[id].p));
  }
  if (x->view[id] == VIEW_ALIAS && !x->keep_all) { /* its input's buffer (gpu_views.h); not owned */
    x->val[id] = (dev_value){.p = V(id, 0)->p, .rows = V(id, 0)->rows, .numel = V(id, 0)->numel};
    return 0;
  }
  if (!x->fp8.skip[id]) return exec_CAST(x, id);
  x->val[id] = (dev_value){.rows = V(id, 0)->rows, .numel = V(id, 0)->numel}; /* its readers take the packed form */
  return 0;
}

void plan_gate_up_stores(gx *x) {
  const ir_graph *g = x->g;
  const char *env = getenv("MOEC_ACT_STORE");
  const int on = env && *env && strcmp(env, "0") != 0; /* opt-in until measured faster (docs/cuda.md) */
  for (int id = 0; id < g->n_nodes; id++) x->store_q[id] = -1;
  for (int q = 0; q < g->n_nodes && on; q++) {
    const ir_node *qn = &g->nodes[q];
    if (qn->op != OP_MXFP8_QUANTIZE || x->fp8.kind[q] != FP8_STORE || qn->n_in != 1) continue;
    /* its input: the gate_up window (columns H .. H + 2F) of an FP8 grouped_mlp, not copied */
    const int s = qn->in[0];
    const ir_node *sn = &g->nodes[s];
    if (sn->op != OP_SLICE_COLS || x->view[s] != VIEW_WINDOW) continue;
    const int G = sn->in[0];
    const ir_node *gn = &g->nodes[G];
    if (gn->op != OP_GROUPED_MLP || !x->fp8.site[G] || x->store_q[G] >= 0) continue;
    const int64_t H = g->nodes[gn->in[0]].type.dims[1], F = ir_get_int(gn, "ffn", 0);
    /* the act quantize's blocks: mx_block, 128-shared (exec_GROUPED_MLP) */
    if (ir_get_int(sn, "start", -1) != H || sn->type.dims[1] != 2 * F || sn->type.dtype != gn->type.dtype ||
        ir_get_int(qn, "block", 32) != ir_get_int(gn, "mx_block", 0) || ir_get_int(qn, "share128", 0) != 1)
      continue;
    x->store_q[G] = q;
  }
}
