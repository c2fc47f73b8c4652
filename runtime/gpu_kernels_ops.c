/* gpu_kernels_ops.c -- the launch functions of rt_cuda, one per CPU reference kernel: they
 * check what the CPU reports as CK_ESHAPE, pick the kernel by dtypes, size the grid, carve
 * scratch for partial sums and queue the launches. Kernel arguments must match the
 * generated parameter lists exactly: pointers are gpu_ptr, sizes int64_t (i64), flags int. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"
#include "gpu_kernels_int.h"

#define ARGS(...) ((void *[]){__VA_ARGS__})
#define KN(op, ...) cg_kname(name, sizeof name, op, __VA_ARGS__)

static size_t dt_size(cg_dtype t) { return t == CG_DT_BF16 ? 2 : 4; }

/* ---- elementwise ---- */

int rt_cuda_cast(rt_cuda *k, cg_dtype tx, gpu_ptr x, cg_dtype ty, gpu_ptr y, int64_t n) {
  char name[64];
  KN("cast", 2, tx, ty);
  return rtk_launch(k, CG_FAM_ELEMENTWISE, NULL, name, rtk_vec_blocks(n), 1, CG_NT_EW, ARGS(&x, &y, &n));
}

int rt_cuda_silu_fwd(rt_cuda *k, cg_dtype t, gpu_ptr x, gpu_ptr y, int64_t n) {
  char name[64];
  KN("silu_fwd", 1, t);
  return rtk_launch(k, CG_FAM_ELEMENTWISE, NULL, name, rtk_vec_blocks(n), 1, CG_NT_EW, ARGS(&x, &y, &n));
}

int rt_cuda_silu_bwd(rt_cuda *k, cg_dtype t, gpu_ptr x, gpu_ptr dy, gpu_ptr dx, int64_t n) {
  char name[64];
  KN("silu_bwd", 1, t);
  return rtk_launch(k, CG_FAM_ELEMENTWISE, NULL, name, rtk_vec_blocks(n), 1, CG_NT_EW, ARGS(&x, &dy, &dx, &n));
}

int rt_cuda_mul_fwd(rt_cuda *k, cg_dtype t, gpu_ptr a, gpu_ptr b, gpu_ptr y, int64_t n) {
  char name[64];
  KN("mul_fwd", 1, t);
  return rtk_launch(k, CG_FAM_ELEMENTWISE, NULL, name, rtk_vec_blocks(n), 1, CG_NT_EW, ARGS(&a, &b, &y, &n));
}

int rt_cuda_mul_bwd(rt_cuda *k, cg_dtype t, gpu_ptr a, gpu_ptr b, gpu_ptr dy, gpu_ptr da, gpu_ptr db, int64_t n) {
  char name[64];
  KN("mul_bwd", 1, t);
  return rtk_launch(k, CG_FAM_ELEMENTWISE, NULL, name, rtk_vec_blocks(n), 1, CG_NT_EW,
                    ARGS(&a, &b, &dy, &da, &db, &n));
}

int rt_cuda_add_fwd(rt_cuda *k, cg_dtype t, gpu_ptr a, gpu_ptr b, gpu_ptr y, int64_t n) {
  char name[64];
  KN("add_fwd", 1, t);
  return rtk_launch(k, CG_FAM_ELEMENTWISE, NULL, name, rtk_vec_blocks(n), 1, CG_NT_EW, ARGS(&a, &b, &y, &n));
}

int rt_cuda_add_bwd(rt_cuda *k, cg_dtype t, gpu_ptr dy, gpu_ptr da, gpu_ptr db, int64_t n) {
  char name[64];
  KN("add_bwd", 1, t);
  return rtk_launch(k, CG_FAM_ELEMENTWISE, NULL, name, rtk_blocks(n, CG_NT_EW), 1, CG_NT_EW, ARGS(&dy, &da, &db, &n));
}

int rt_cuda_fill(rt_cuda *k, cg_dtype t, gpu_ptr y, int64_t n, float value) {
  char name[64];
  KN("fill", 1, t);
  return rtk_launch(k, CG_FAM_ELEMENTWISE, NULL, name, rtk_blocks(n, CG_NT_EW), 1, CG_NT_EW, ARGS(&y, &n, &value));
}

int rt_cuda_slice_cols(rt_cuda *k, cg_dtype t, gpu_ptr x, gpu_ptr y, int64_t rows, int64_t W, int64_t start,
                       int64_t w) {
  if (start < 0 || w < 0 || start + w > W) return rtk_fail(k, "slice_cols: columns [%lld, %lld) outside [0, %lld)", (long long)start, (long long)(start + w), (long long)W);
  char name[64];
  KN("slice_cols", 1, t);
  return rtk_launch(k, CG_FAM_ELEMENTWISE, NULL, name, rtk_vec_blocks(rows * w), 1, CG_NT_EW,
                    ARGS(&x, &y, &rows, &W, &start, &w));
}

int rt_cuda_colsum(rt_cuda *k, cg_dtype t, gpu_ptr x, gpu_ptr out, int64_t N, int64_t M, int accumulate) {
  int64_t P = (N + CG_COLSUM_ROWS - 1) / CG_COLSUM_ROWS;
  gpu_ptr part = 0;
  if (P > 0 && rtk_scratch(k, (size_t)(P * M) * sizeof(float), &part) != 0) return -1;
  char name[64];
  KN("colsum_partial", 1, t);
  if (rtk_launch(k, CG_FAM_ELEMENTWISE, NULL, name, rtk_blocks(M, CG_NT_EW), (uint64_t)P, CG_NT_EW,
                 ARGS(&x, &part, &N, &M)) != 0)
    return -1;
  KN("colsum_final", 0);
  return rtk_launch(k, CG_FAM_ELEMENTWISE, NULL, name, rtk_blocks(M, CG_NT_EW), 1, CG_NT_EW,
                    ARGS(&part, &out, &P, &M, &accumulate));
}

/* ---- dense ---- */

int rt_cuda_embedding_fwd(rt_cuda *k, cg_dtype t, gpu_ptr table, gpu_ptr tokens, gpu_ptr out, int64_t T, int64_t V,
                          int64_t H) {
  char name[64];
  KN("embedding_fwd", 1, t);
  return rtk_launch(k, CG_FAM_EMBEDDING, NULL, name, (uint64_t)T, 1, CG_NT_ROW,
                    ARGS(&table, &tokens, &out, &T, &V, &H, &k->err_flag));
}

int rt_cuda_embedding_bwd(rt_cuda *k, cg_dtype t, gpu_ptr tokens, gpu_ptr dout, gpu_ptr dtable, int64_t T, int64_t V,
                          int64_t H) {
  char name[64];
  KN("embedding_bwd", 1, t);
  return rtk_launch(k, CG_FAM_EMBEDDING, NULL, name, rtk_blocks(H, CG_NT_ROW), (uint64_t)V, CG_NT_ROW,
                    ARGS(&tokens, &dout, &dtable, &T, &V, &H, &k->err_flag));
}

int rt_cuda_rmsnorm_fwd(rt_cuda *k, cg_dtype tx, cg_dtype tw, gpu_ptr x, gpu_ptr w, gpu_ptr y, int64_t T, int64_t H,
                        float eps) {
  char name[64];
  KN("rmsnorm_fwd", 2, tx, tw);
  return rtk_launch(k, CG_FAM_RMSNORM, NULL, name, (uint64_t)T, 1, rtk_row_threads(H, H % 8 == 0),
                    ARGS(&x, &w, &y, &T, &H, &eps));
}

int rt_cuda_rmsnorm_bwd(rt_cuda *k, cg_dtype tx, cg_dtype tw, gpu_ptr x, gpu_ptr w, gpu_ptr dy, gpu_ptr res, gpu_ptr dx,
                        gpu_ptr dw, int64_t T, int64_t H, float eps) {
  char name[64];
  if (dw) { /* first: dx may overwrite dy */
    int64_t P = (T + CG_COLSUM_ROWS - 1) / CG_COLSUM_ROWS;
    const size_t rstd_bytes = rtk_align((size_t)T * sizeof(float));
    gpu_ptr ws, rstd, part;
    if (rtk_scratch(k, rstd_bytes + (size_t)(P * H) * sizeof(float), &ws) != 0) return -1;
    rstd = ws;
    part = ws + rstd_bytes;
    KN("rmsnorm_rstd", 1, tx);
    if (rtk_launch(k, CG_FAM_RMSNORM, NULL, name, (uint64_t)T, 1, rtk_row_threads(H, H % 8 == 0),
                   ARGS(&x, &rstd, &T, &H, &eps)) != 0)
      return -1;
    KN("rmsnorm_bwd_w_partial", 1, tx);
    if (rtk_launch(k, CG_FAM_RMSNORM, NULL, name, rtk_blocks(H, CG_NT_EW), (uint64_t)P, CG_NT_EW,
                   ARGS(&x, &dy, &rstd, &part, &T, &H)) != 0)
      return -1;
    int acc = 1;
    KN("colsum_final", 0);
    if (rtk_launch(k, CG_FAM_ELEMENTWISE, NULL, name, rtk_blocks(H, CG_NT_EW), 1, CG_NT_EW,
                   ARGS(&part, &dw, &P, &H, &acc)) != 0)
      return -1;
  }
  if (!dx) return 0;
  KN("rmsnorm_bwd_x", 2, tx, tw);
  return rtk_launch(k, CG_FAM_RMSNORM, NULL, name, (uint64_t)T, 1, rtk_row_threads(H, H % 8 == 0),
                    ARGS(&x, &w, &dy, &res, &dx, &T, &H, &eps));
}

static int rope(rt_cuda *k, cg_dtype t, gpu_ptr x, int64_t ldx, gpu_ptr y, int64_t T, int64_t nh, int64_t hd, int64_t seq,
                double theta, float sign) {
  if (hd < 0 || hd % 2 != 0 || seq < 1 || nh < 0 || T < 0)
    return rtk_fail(k, "rope: head dim %lld must be even and seq %lld >= 1 (%s)", (long long)hd, (long long)seq, ck_strerror(CK_ESHAPE));
  if (ldx < nh * hd || (ldx != nh * hd && x == y))
    return rtk_fail(k, "rope: row stride %lld under the row's %lld elements, or strided and in place (%s)", (long long)ldx,
                    (long long)(nh * hd), ck_strerror(CK_ESHAPE));
  int64_t half = hd / 2, P = T < seq ? T : seq;
  if (half == 0 || P == 0) {
    if (x != y && gpu_copy(k->g, y, x, (size_t)(T * nh * hd) * dt_size(t)) != 0) return rtk_fail(k, "%s", gpu_error(k->g));
    return 0;
  }
  char name[64];
  if (!k->rope.cs || k->rope.P != P || k->rope.half != half || k->rope.hd != hd || k->rope.theta != theta) {
    /* the table, built as ck_attention.c builds it (see rope.cu for why on the host) */
    float *cs = malloc((size_t)(P * half * 2) * sizeof(float)); /* (P, half, {cos, sin}) */
    if (!cs) return rtk_fail(k, "rope: out of host memory");
    for (int64_t i = 0; i < half; i++) {
      double inv_freq = pow(theta, -2.0 * (double)i / (double)hd);
      for (int64_t p = 0; p < P; p++) {
        double a = (double)p * inv_freq;
        cs[(p * half + i) * 2] = (float)cos(a);
        cs[(p * half + i) * 2 + 1] = (float)sin(a);
      }
    }
    int rc = k->rope.cs ? gpu_sync(k->g) : 0; /* queued kernels may read the old table */
    gpu_free(k->g, k->rope.cs);
    k->rope.cs = 0;
    if (rc == 0) rc = gpu_alloc(k->g, &k->rope.cs, (size_t)(P * half * 2) * sizeof(float), "the rope table");
    if (rc == 0) rc = gpu_upload(k->g, k->rope.cs, cs, (size_t)(P * half * 2) * sizeof(float));
    free(cs);
    if (rc != 0) return rtk_fail(k, "%s", gpu_error(k->g));
    k->rope.P = P, k->rope.half = half, k->rope.hd = hd, k->rope.theta = theta;
  }
  KN("rope", 1, t);
  /* 8 pairs a thread where the kernel takes its 16-byte path (cg_rope.c); its loop covers any grid */
  const int vec = half % 8 == 0 && x % 16 == 0 && y % 16 == 0 && (ldx * (int64_t)dt_size(t)) % 16 == 0;
  return rtk_launch(k, CG_FAM_ROPE, NULL, name, rtk_blocks(T * nh * half / (vec ? 8 : 1), CG_NT_EW), 1, CG_NT_EW,
                    ARGS(&x, &ldx, &y, &k->rope.cs, &T, &nh, &hd, &seq, &sign));
}

int rt_cuda_rope_fwd(rt_cuda *k, cg_dtype t, gpu_ptr x, int64_t ldx, gpu_ptr y, int64_t T, int64_t nh, int64_t hd,
                     int64_t seq, double theta) {
  return rope(k, t, x, ldx, y, T, nh, hd, seq, theta, 1.0f);
}

int rt_cuda_rope_bwd(rt_cuda *k, cg_dtype t, gpu_ptr dy, int64_t ldx, gpu_ptr dx, int64_t T, int64_t nh, int64_t hd,
                     int64_t seq, double theta) {
  return rope(k, t, dy, ldx, dx, T, nh, hd, seq, theta, -1.0f);
}

int rt_cuda_softmax_rows(rt_cuda *k, gpu_ptr x, gpu_ptr y, int64_t T, int64_t E) {
  return rtk_launch(k, CG_FAM_ROUTER, NULL, "moec_softmax_rows", rtk_blocks(T, CG_NT_RED), 1, CG_NT_RED,
                    ARGS(&x, &y, &T, &E));
}

int rt_cuda_logsumexp_rows(rt_cuda *k, gpu_ptr x, gpu_ptr lse, int64_t T, int64_t E) {
  return rtk_launch(k, CG_FAM_ROUTER, NULL, "moec_logsumexp_rows", rtk_blocks(T, CG_NT_RED), 1, CG_NT_RED,
                    ARGS(&x, &lse, &T, &E));
}

/* ---- router ---- */

int rt_cuda_topk(rt_cuda *k, gpu_ptr logits, gpu_ptr idx, int64_t T, int64_t E, int64_t kk) {
  if (kk < 1 || kk > E) return rtk_fail(k, "topk: k = %lld outside [1, %lld] (%s)", (long long)kk, (long long)E, ck_strerror(CK_ESHAPE));
  return rtk_launch(k, CG_FAM_ROUTER, NULL, "moec_topk", rtk_blocks(T, CG_NT_RED), 1, CG_NT_RED,
                    ARGS(&logits, &idx, &T, &E, &kk));
}

int rt_cuda_route_weights_fwd(rt_cuda *k, gpu_ptr logits, gpu_ptr idx, gpu_ptr w, int64_t T, int64_t E, int64_t kk) {
  return rtk_launch(k, CG_FAM_ROUTER, NULL, "moec_route_weights_fwd", rtk_blocks(T, CG_NT_RED), 1, CG_NT_RED,
                    ARGS(&logits, &idx, &w, &T, &E, &kk, &k->err_flag));
}

int rt_cuda_route_weights_bwd(rt_cuda *k, gpu_ptr logits, gpu_ptr idx, gpu_ptr dw, gpu_ptr dlogits, int64_t T,
                              int64_t E, int64_t kk) {
  return rtk_launch(k, CG_FAM_ROUTER, NULL, "moec_route_weights_bwd", rtk_blocks(T, CG_NT_RED), 1, CG_NT_RED,
                    ARGS(&logits, &idx, &dw, &dlogits, &T, &E, &kk, &k->err_flag));
}

/* Partial sums of the aux loss into scratch, then the final kernel writes loss and/or a (E + 1
 * doubles). counts = 0: the routes are this rank's (idx); else the share form: the partial sums
 * need no ids, and the final kernel takes the routes of all ranks (counts, E ints), a[E] = their
 * token count. */
static int aux_sums(rt_cuda *k, gpu_ptr logits, gpu_ptr idx, gpu_ptr counts, int64_t T, int64_t E, int64_t kk,
                    float coef, gpu_ptr loss, int want_a, gpu_ptr *a) {
  if (E < 1 || E > CG_MAX_E) return rtk_fail(k, "aux_loss: %lld experts, the GPU kernels take 1..%d", (long long)E, CG_MAX_E);
  if (counts && kk < 1) return rtk_fail(k, "aux_loss: top_k %lld (%s)", (long long)kk, ck_strerror(CK_ESHAPE));
  int64_t nb = (T + CG_NT_RED - 1) / CG_NT_RED;
  const size_t pb = rtk_align((size_t)(nb * E) * sizeof(double)), cb = rtk_align((size_t)(nb * E) * sizeof(int));
  gpu_ptr ws, ids = counts ? 0 : idx;
  if (rtk_scratch(k, pb + cb + (size_t)(E + 1) * sizeof(double), &ws) != 0) return -1;
  gpu_ptr Ppart = ws, cpart = ws + pb;
  *a = want_a ? ws + pb + cb : 0;
  if (rtk_launch(k, CG_FAM_ROUTER, NULL, "moec_aux_partial", (uint64_t)nb, 1, CG_NT_RED,
                 ARGS(&logits, &ids, &Ppart, &cpart, &T, &E, &kk, &k->err_flag)) != 0)
    return -1;
  if (counts)
    return rtk_launch(k, CG_FAM_ROUTER, NULL, "moec_aux_final_share", 1, 1, CG_NT_RED,
                      ARGS(&Ppart, &nb, &T, &counts, &E, &kk, &coef, &loss, a));
  return rtk_launch(k, CG_FAM_ROUTER, NULL, "moec_aux_final", 1, 1, CG_NT_RED,
                    ARGS(&Ppart, &cpart, &nb, &T, &E, &coef, &loss, a));
}

int rt_cuda_aux_loss_fwd(rt_cuda *k, gpu_ptr logits, gpu_ptr idx, gpu_ptr loss, int64_t T, int64_t E, int64_t kk,
                         float coef) {
  gpu_ptr a;
  return aux_sums(k, logits, idx, 0, T, E, kk, coef, loss, 0, &a);
}

int rt_cuda_aux_loss_bwd(rt_cuda *k, gpu_ptr logits, gpu_ptr idx, gpu_ptr dloss, gpu_ptr dlogits, int64_t T,
                         int64_t E, int64_t kk, float coef) {
  gpu_ptr a, none = 0;
  if (T == 0) return 0;
  if (aux_sums(k, logits, idx, 0, T, E, kk, coef, none, 1, &a) != 0) return -1;
  return rtk_launch(k, CG_FAM_ROUTER, NULL, "moec_aux_bwd", rtk_blocks(T, CG_NT_RED), 1, CG_NT_RED,
                    ARGS(&logits, &a, &dloss, &dlogits, &T, &E));
}

int rt_cuda_aux_loss_share_fwd(rt_cuda *k, gpu_ptr logits, gpu_ptr counts, gpu_ptr loss, int64_t T, int64_t E,
                               int64_t kk, float coef) {
  gpu_ptr a;
  return aux_sums(k, logits, 0, counts, T, E, kk, coef, loss, 0, &a);
}

int rt_cuda_aux_loss_share_bwd(rt_cuda *k, gpu_ptr logits, gpu_ptr counts, gpu_ptr dloss, gpu_ptr dlogits, int64_t T,
                               int64_t E, int64_t kk, float coef) {
  gpu_ptr a, none = 0;
  if (T == 0) return 0;
  if (aux_sums(k, logits, 0, counts, T, E, kk, coef, none, 1, &a) != 0) return -1;
  return rtk_launch(k, CG_FAM_ROUTER, NULL, "moec_aux_bwd_share", rtk_blocks(T, CG_NT_RED), 1, CG_NT_RED,
                    ARGS(&logits, &a, &dloss, &dlogits, &T, &E));
}

int rt_cuda_z_loss_fwd(rt_cuda *k, gpu_ptr logits, gpu_ptr loss, int64_t T, int64_t E, float coef) {
  int64_t nb = (T + CG_NT_RED - 1) / CG_NT_RED;
  gpu_ptr part = 0;
  if (nb > 0 && rtk_scratch(k, (size_t)nb * sizeof(double), &part) != 0) return -1;
  if (rtk_launch(k, CG_FAM_ROUTER, NULL, "moec_z_partial", (uint64_t)nb, 1, CG_NT_RED, ARGS(&logits, &part, &T, &E)) != 0)
    return -1;
  return rtk_launch(k, CG_FAM_ROUTER, NULL, "moec_z_final", 1, 1, CG_NT_RED, ARGS(&part, &nb, &T, &coef, &loss));
}

int rt_cuda_z_loss_bwd(rt_cuda *k, gpu_ptr logits, gpu_ptr dloss, gpu_ptr dlogits, int64_t T, int64_t E, float coef) {
  return rtk_launch(k, CG_FAM_ROUTER, NULL, "moec_z_bwd", rtk_blocks(T, CG_NT_RED), 1, CG_NT_RED,
                    ARGS(&logits, &dloss, &dlogits, &T, &E, &coef));
}

/* ---- the expert permutation, dispatch, combine ---- */

int rt_cuda_route(rt_cuda *k, gpu_ptr idx, int64_t T, int64_t kk, int64_t E, const rt_cuda_routing *r) {
  if (E < 1 || E > CG_MAX_E) return rtk_fail(k, "route: %lld experts, the GPU kernels take 1..%d", (long long)E, CG_MAX_E);
  int64_t np = T * kk, nb = (np + CG_ROUTE_CHUNK - 1) / CG_ROUTE_CHUNK;
  if (np > 0x7fffffff) return rtk_fail(k, "route: %lld (token, slot) pairs overflow int32 row ids", (long long)np);
  const size_t cb = rtk_align((size_t)(nb * E) * sizeof(int));
  gpu_ptr ws = 0;
  if (rtk_scratch(k, 2 * cb + 256, &ws) != 0) return -1;
  gpu_ptr ccount = ws, cbase = ws + cb;
  if (rtk_launch(k, CG_FAM_ROUTE, NULL, "moec_route_count", (uint64_t)nb, 1, CG_NT_ROUTE,
                 ARGS(&idx, &ccount, &np, &E, &k->err_flag)) != 0)
    return -1;
  gpu_ptr counts = r->counts, offsets = r->offsets, rows = r->rows, slots = r->slots, pos = r->pos;
  if (rtk_launch(k, CG_FAM_ROUTE, NULL, "moec_route_scan", 1, 1, CG_NT_ROUTE,
                 ARGS(&ccount, &cbase, &counts, &offsets, &nb, &E)) != 0)
    return -1;
  return rtk_launch(k, CG_FAM_ROUTE, NULL, "moec_route_fill", (uint64_t)nb, 1, CG_NT_ROUTE,
                    ARGS(&idx, &cbase, &rows, &slots, &pos, &np, &kk, &E));
}

int rt_cuda_dispatch_fwd(rt_cuda *k, cg_dtype t, gpu_ptr x, gpu_ptr rows, gpu_ptr offsets, int e, gpu_ptr xe, int64_t T,
                         int64_t nmax, int64_t H) {
  char name[64];
  KN("dispatch_fwd", 1, t);
  return rtk_launch(k, CG_FAM_ROUTE, NULL, name, (uint64_t)nmax, 1, CG_NT_ROW,
                    ARGS(&x, &rows, &offsets, &e, &xe, &T, &nmax, &H, &k->err_flag));
}

int rt_cuda_dispatch_bwd(rt_cuda *k, cg_dtype t, gpu_ptr dxe, gpu_ptr rows, gpu_ptr offsets, int e, gpu_ptr dx,
                         int64_t T, int64_t nmax, int64_t H) {
  if (e < 0) return rtk_fail(k, "dispatch_bwd: one expert at a time (all experts: rt_cuda_dispatch_bwd_all)");
  char name[64];
  KN("dispatch_bwd", 1, t);
  return rtk_launch(k, CG_FAM_ROUTE, NULL, name, (uint64_t)nmax, 1, CG_NT_ROW,
                    ARGS(&dxe, &rows, &offsets, &e, &dx, &T, &nmax, &H, &k->err_flag));
}

int rt_cuda_dispatch_bwd_all(rt_cuda *k, cg_dtype t, gpu_ptr dxe, gpu_ptr pos, gpu_ptr dx, int64_t T, int64_t kk,
                             int64_t H) {
  char name[64];
  KN("dispatch_bwd_gather", 1, t);
  return rtk_launch(k, CG_FAM_ROUTE, NULL, name, (uint64_t)T, 1, CG_NT_ROW, ARGS(&dxe, &pos, &dx, &T, &kk, &H));
}

int rt_cuda_combine_fwd(rt_cuda *k, cg_dtype t, cg_dtype tw, gpu_ptr pos, gpu_ptr w, gpu_ptr y, gpu_ptr out, int64_t T,
                        int64_t kk, int64_t H) {
  char name[64];
  KN("combine_fwd", 2, t, tw);
  return rtk_launch(k, CG_FAM_ROUTE, NULL, name, (uint64_t)T, 1, CG_NT_ROW,
                    ARGS(&pos, &w, &y, &out, &T, &kk, &H, &k->err_flag));
}

int rt_cuda_combine_bwd(rt_cuda *k, cg_dtype t, cg_dtype tw, gpu_ptr pos, gpu_ptr w, gpu_ptr y, gpu_ptr dout,
                        gpu_ptr dy, gpu_ptr dw, int64_t T, int64_t kk, int64_t H) {
  char name[64];
  KN("combine_bwd", 2, t, tw);
  return rtk_launch(k, CG_FAM_ROUTE, NULL, name, (uint64_t)T, 1, CG_NT_ROW,
                    ARGS(&pos, &w, &y, &dout, &dy, &dw, &T, &kk, &H, &k->err_flag));
}

/* ---- loss ---- */

int rt_cuda_cross_entropy_fwd(rt_cuda *k, cg_dtype t, gpu_ptr logits, gpu_ptr labels, gpu_ptr loss, int64_t T,
                              int64_t V) {
  int64_t nb = (T + CG_CE_ROWS - 1) / CG_CE_ROWS;
  const size_t pb = rtk_align((size_t)nb * sizeof(double));
  gpu_ptr ws = 0, none = 0;
  if (rtk_scratch(k, pb + (size_t)nb * sizeof(int) + 256, &ws) != 0) return -1;
  gpu_ptr part = ws, npart = ws + pb;
  char name[64];
  KN("ce_partial", 1, t);
  if (rtk_launch(k, CG_FAM_LOSS, NULL, name, (uint64_t)nb, 1, CG_NT_CE,
                 ARGS(&logits, &labels, &part, &npart, &T, &V, &k->err_flag)) != 0)
    return -1;
  return rtk_launch(k, CG_FAM_LOSS, NULL, "moec_ce_final", 1, 1, CG_NT_CE, ARGS(&part, &npart, &nb, &loss, &none));
}

int rt_cuda_cross_entropy_bwd(rt_cuda *k, cg_dtype t, gpu_ptr logits, gpu_ptr labels, gpu_ptr dloss, gpu_ptr dlogits,
                              int64_t T, int64_t V) {
  gpu_ptr nvalid;
  if (rtk_scratch(k, sizeof(int), &nvalid) != 0) return -1;
  if (rtk_launch(k, CG_FAM_LOSS, NULL, "moec_ce_count", 1, 1, CG_NT_CE, ARGS(&labels, &nvalid, &T, &V, &k->err_flag)) != 0)
    return -1;
  char name[64];
  KN("ce_bwd", 1, t);
  return rtk_launch(k, CG_FAM_LOSS, NULL, name, rtk_blocks(T, CG_NT_CE / 32), 1, CG_NT_CE,
                    ARGS(&logits, &labels, &dloss, &nvalid, &dlogits, &T, &V));
}

/* The share forms: the local mean (or the incoming gradient) times (float)(n_local / n_global),
 * n_local counted on the device (ce_final's or ce_count's valid labels). */
int rt_cuda_cross_entropy_share_fwd(rt_cuda *k, cg_dtype t, gpu_ptr logits, gpu_ptr labels, gpu_ptr n_global,
                                    gpu_ptr loss, int64_t T, int64_t V) {
  int64_t nb = (T + CG_CE_ROWS - 1) / CG_CE_ROWS;
  const size_t pb = rtk_align((size_t)nb * sizeof(double)), nbb = rtk_align((size_t)nb * sizeof(int));
  gpu_ptr ws = 0;
  if (rtk_scratch(k, pb + nbb + 256, &ws) != 0) return -1;
  gpu_ptr part = ws, npart = ws + pb, nvalid = ws + pb + nbb;
  char name[64];
  KN("ce_partial", 1, t);
  if (nb > 0 && rtk_launch(k, CG_FAM_LOSS, NULL, name, (uint64_t)nb, 1, CG_NT_CE,
                           ARGS(&logits, &labels, &part, &npart, &T, &V, &k->err_flag)) != 0)
    return -1;
  if (rtk_launch(k, CG_FAM_LOSS, NULL, "moec_ce_final", 1, 1, CG_NT_CE, ARGS(&part, &npart, &nb, &loss, &nvalid)) != 0)
    return -1;
  return rtk_launch(k, CG_FAM_LOSS, NULL, "moec_ce_share", 1, 1, 32, ARGS(&loss, &nvalid, &n_global, &loss));
}

int rt_cuda_cross_entropy_share_bwd(rt_cuda *k, cg_dtype t, gpu_ptr logits, gpu_ptr labels, gpu_ptr n_global,
                                    gpu_ptr dloss, gpu_ptr dlogits, int64_t T, int64_t V) {
  gpu_ptr ws;
  if (rtk_scratch(k, 512, &ws) != 0) return -1;
  gpu_ptr nvalid = ws, dshare = ws + 256; /* int (), f32 () */
  if (rtk_launch(k, CG_FAM_LOSS, NULL, "moec_ce_count", 1, 1, CG_NT_CE, ARGS(&labels, &nvalid, &T, &V, &k->err_flag)) != 0 ||
      rtk_launch(k, CG_FAM_LOSS, NULL, "moec_ce_share", 1, 1, 32, ARGS(&dloss, &nvalid, &n_global, &dshare)) != 0)
    return -1;
  char name[64];
  KN("ce_bwd", 1, t);
  return rtk_launch(k, CG_FAM_LOSS, NULL, name, rtk_blocks(T, CG_NT_CE / 32), 1, CG_NT_CE,
                    ARGS(&logits, &labels, &dshare, &nvalid, &dlogits, &T, &V));
}

int rt_cuda_label_count(rt_cuda *k, gpu_ptr labels, gpu_ptr n, int64_t T) {
  return rtk_launch(k, CG_FAM_LOSS, NULL, "moec_label_count", 1, 1, CG_NT_CE, ARGS(&labels, &n, &T));
}

/* ---- optimizer ---- */

int rt_cuda_adamw_step(rt_cuda *k, gpu_ptr p, cg_dtype gt, gpu_ptr g, gpu_ptr m, gpu_ptr v, gpu_ptr wb, int64_t n,
                       gpu_ptr gnorm, const rt_cuda_adamw_hp *hp) {
  return rt_cuda_adamw_step_win(k, p, gt, g, m, v, wb, n, gnorm, hp, NULL);
}

rtk_adamw_scalars rtk_adamw_scalars_of(const rt_cuda_adamw_hp *hp) {
  rtk_adamw_scalars s;
  s.w1 = (float)(1.0 - hp->beta1), s.b2 = (float)hp->beta2, s.c2 = (float)(1.0 - hp->beta2);
  const double bc1 = 1.0 - pow(hp->beta1, (double)hp->step), bc2 = 1.0 - pow(hp->beta2, (double)hp->step);
  s.neg_step = (float)(-(hp->lr / bc1)), s.bc2_sqrt = (float)sqrt(bc2), s.eps = (float)hp->eps;
  s.small = fabsf(s.w1) < 0.5f;
  s.clip = hp->clip > 0 ? (float)hp->clip : 0.0f;
  return s;
}

static int check_win(rt_cuda *k, int64_t n, int64_t gc, int64_t gl, int64_t wc, int64_t wl) {
  if (gc < 1 || gl < gc || wc < 1 || wl < wc || n % gc != 0 || n % wc != 0)
    return rtk_fail(k, "adamw: windows of %lld of %lld (gradient), %lld of %lld (bf16 copy) for %lld elements (%s)",
                    (long long)gc, (long long)gl, (long long)wc, (long long)wl, (long long)n, ck_strerror(CK_ESHAPE));
  return 0;
}

int rt_cuda_adamw_step_win(rt_cuda *k, gpu_ptr p, cg_dtype gt, gpu_ptr g, gpu_ptr m, gpu_ptr v, gpu_ptr wb, int64_t n,
                           gpu_ptr gnorm, const rt_cuda_adamw_hp *hp, const rt_cuda_adamw_win *win) {
  char name[64];
  int64_t gc = win ? win->g_cols : 1, gl = win ? win->g_ld : 1, wc = win ? win->wb_cols : 1, wl = win ? win->wb_ld : 1;
  if (check_win(k, n, gc, gl, wc, wl) != 0) return -1;
  KN("adamw", 2, gt, hp->moments_bf16 ? CG_DT_BF16 : CG_DT_F32);
  rtk_adamw_scalars s = rtk_adamw_scalars_of(hp);
  float decay = (float)(1.0 - hp->lr * hp->wd);
  int decay_on = hp->wd != 0.0;
  return rtk_launch(k, CG_FAM_OPTIM, NULL, name, rtk_vec_blocks(n), 1, CG_NT_EW,
                    ARGS(&p, &g, &m, &v, &wb, &n, &gnorm, &s.clip, &decay, &s.w1, &s.b2, &s.c2, &s.neg_step, &s.bc2_sqrt,
                         &s.eps, &s.small, &decay_on, &gc, &gl, &wc, &wl));
}

/* The launch parameter block of moec_adamw_table (codegen/cg_optim.c's aw_table). */
typedef struct {
  gpu_ptr p[CG_AW_TABLE], m[CG_AW_TABLE], v[CG_AW_TABLE], g[CG_AW_TABLE], wb[CG_AW_TABLE];
  int64_t n[CG_AW_TABLE], gc[CG_AW_TABLE], gl[CG_AW_TABLE], wc[CG_AW_TABLE], wl[CG_AW_TABLE];
  float decay[CG_AW_TABLE];
  int decay_on[CG_AW_TABLE];
} aw_table;

static int by_size_desc(const void *a, const void *b) {
  int64_t x = ((const rt_cuda_adamw_tensor *)a)->n, y = ((const rt_cuda_adamw_tensor *)b)->n;
  return (x < y) - (x > y);
}

int rt_cuda_adamw_multi(rt_cuda *k, cg_dtype gt, const rt_cuda_adamw_tensor *t_in, int n_tensors, gpu_ptr gnorm,
                        const rt_cuda_adamw_hp *hp) {
  char name[64];
  KN("adamw_table", 2, gt, hp->moments_bf16 ? CG_DT_BF16 : CG_DT_F32);
  rtk_adamw_scalars s = rtk_adamw_scalars_of(hp);
  /* largest first: a launch's x blocks are sized for its largest tensor, so tensors of like
     size share launches (the parameters are independent: the order changes no value) */
  rt_cuda_adamw_tensor *t = malloc((size_t)(n_tensors > 0 ? n_tensors : 1) * sizeof *t);
  if (!t) return rtk_fail(k, "adamw: out of host memory");
  memcpy(t, t_in, (size_t)n_tensors * sizeof *t);
  qsort(t, (size_t)n_tensors, sizeof *t, by_size_desc);
  int rc = 0;
  for (int i = 0; i < n_tensors;) {
    aw_table a;
    memset(&a, 0, sizeof a);
    int64_t most = 1;
    int nt = 0;
    for (; i + nt < n_tensors && nt < CG_AW_TABLE; nt++) {
      const rt_cuda_adamw_tensor *e = &t[i + nt];
      const rt_cuda_adamw_win *w = &e->win;
      a.p[nt] = e->p, a.m[nt] = e->m, a.v[nt] = e->v, a.g[nt] = e->g, a.wb[nt] = e->wb, a.n[nt] = e->n;
      a.gc[nt] = w->g_cols ? w->g_cols : 1, a.gl[nt] = w->g_cols ? w->g_ld : 1;
      a.wc[nt] = w->wb_cols ? w->wb_cols : 1, a.wl[nt] = w->wb_cols ? w->wb_ld : 1;
      if ((rc = check_win(k, e->n, a.gc[nt], a.gl[nt], a.wc[nt], a.wl[nt])) != 0) break;
      a.decay[nt] = (float)(1.0 - hp->lr * e->wd), a.decay_on[nt] = e->wd != 0.0;
      if (e->n > most) most = e->n;
    }
    /* enough x blocks for the largest; the others' spare blocks find no work */
    if (rc != 0 || (rc = rtk_launch(k, CG_FAM_OPTIM, NULL, name, rtk_vec_blocks(most), (uint64_t)nt, CG_NT_EW,
                                    ARGS(&a, &gnorm, &s.clip, &s.w1, &s.b2, &s.c2, &s.neg_step, &s.bc2_sqrt, &s.eps,
                                         &s.small))) != 0)
      break;
    i += nt;
  }
  free(t);
  return rc ? -1 : 0;
}

/* The launch parameter block of moec_sumsq_table (codegen/cg_optim.c's gn_table). */
typedef struct {
  gpu_ptr p[CG_GN_TABLE];
  int64_t n[CG_GN_TABLE], c[CG_GN_TABLE], l[CG_GN_TABLE];
} gn_table;

int rt_cuda_grad_norm(rt_cuda *k, const gpu_ptr *bufs, const cg_dtype *dts, const int64_t *sizes, int n_bufs,
                      gpu_ptr norm) {
  return rt_cuda_grad_norm_win(k, bufs, dts, sizes, NULL, NULL, n_bufs, norm);
}

int rt_cuda_grad_norm_win(rt_cuda *k, const gpu_ptr *bufs, const cg_dtype *dts, const int64_t *sizes,
                          const int64_t *cols, const int64_t *ld, int n_bufs, gpu_ptr norm) {
  char name[64];
  for (int i = 0; cols && i < n_bufs; i++)
    if (cols[i] < 1 || ld[i] < cols[i] || sizes[i] % cols[i] != 0)
      return rtk_fail(k, "grad norm: tensor %d of %lld elements in rows of %lld, %lld apart (%s)", i,
                      (long long)sizes[i], (long long)cols[i], (long long)ld[i], ck_strerror(CK_ESHAPE));
  int64_t parts = (int64_t)n_bufs * CG_GN_PARTS;
  gpu_ptr ws = 0;
  if (rtk_scratch(k, (size_t)(parts > 0 ? parts : 1) * sizeof(double), &ws) != 0) return -1;
  /* runs of consecutive tensors of one dtype, up to CG_GN_TABLE a launch; tensor i's partial
   * sums at i * CG_GN_PARTS either way, so the final sum's order is unchanged */
  for (int i = 0; i < n_bufs;) {
    gn_table t;
    memset(&t, 0, sizeof t);
    int nt = 0;
    for (; i + nt < n_bufs && nt < CG_GN_TABLE && dts[i + nt] == dts[i]; nt++) {
      t.p[nt] = bufs[i + nt];
      t.n[nt] = sizes[i + nt];
      t.c[nt] = cols ? cols[i + nt] : 1;
      t.l[nt] = cols ? ld[i + nt] : 1;
    }
    gpu_ptr part = ws + (gpu_ptr)i * CG_GN_PARTS * sizeof(double);
    KN("sumsq_table", 1, dts[i]);
    if (rtk_launch(k, CG_FAM_OPTIM, NULL, name, CG_GN_PARTS, (uint64_t)nt, CG_NT_RED, ARGS(&t, &part)) != 0) return -1;
    i += nt;
  }
  return rtk_launch(k, CG_FAM_OPTIM, NULL, "moec_grad_norm_final", 1, 1, CG_NT_RED, ARGS(&ws, &parts, &norm));
}

/* ---- MXFP8 ---- */

int rt_cuda_mxfp8_qdq(rt_cuda *k, cg_dtype tx, gpu_ptr x, cg_dtype ty, gpu_ptr y, int rank, const int64_t *dims,
                      int axis, int64_t block, int share128, gpu_ptr counts, int64_t E) {
  if (rank < 1 || rank > 4 || axis < 0 || axis >= rank || (counts && axis != 0))
    return rtk_fail(k, "mxfp8 qdq: axis %d of a rank-%d tensor%s (%s)", axis, rank, counts ? " with expert counts" : "",
                    ck_strerror(CK_ESHAPE));
  if (block < 1 || block > 128 || (block & (block - 1)) != 0)
    return rtk_fail(k, "mxfp8 qdq: block %lld: the GPU kernels take a power of two up to 128 (%s)", (long long)block,
                    ck_strerror(CK_ESHAPE));
  const cg_variant v = {(int)block, share128 != 0};
  int64_t outer = 1, L = dims[axis], inner = 1, group = share128 ? 128 : block;
  for (int d = 0; d < axis; d++) outer *= dims[d];
  for (int d = axis + 1; d < rank; d++) inner *= dims[d];
  int64_t units = (L + group - 1) / group + (counts ? E : 0), n = outer * inner * units;
  char name[64];
  if (inner == 1 && !counts) return rt_cuda_mxfp8_qdq_cols(k, tx, x, L, 0, ty, y, outer, L, block, share128);
  KN("mxfp8_qdq", 2, tx, ty);
  return rtk_launch(k, CG_FAM_MXFP8, &v, name, rtk_blocks(n, CG_NT_MX), 1, CG_NT_MX,
                    ARGS(&x, &y, &outer, &L, &inner, &units, &counts, &E));
}

/* Threads per group of the row-wise MXFP8 kernels (cg_mxfp8.c's TPG: 8 elements a thread). */
static int64_t mx_tpg(int64_t group) { return group >= 8 ? group / 8 : 1; }

/* Along the rows of a column window: lanes share a unit, so a warp's accesses are consecutive
 * (cg_mxfp8.c, mxfp8_qdq_last). */
int rt_cuda_mxfp8_qdq_cols(rt_cuda *k, cg_dtype tx, gpu_ptr x, int64_t ldx, int64_t sx, cg_dtype ty, gpu_ptr y,
                           int64_t rows, int64_t w, int64_t block, int share128) {
  if (block < 1 || block > 128 || (block & (block - 1)) != 0 || sx < 0 || sx + w > ldx)
    return rtk_fail(k, "mxfp8 qdq: block %lld, columns [%lld, %lld) of %lld (%s)", (long long)block, (long long)sx,
                    (long long)(sx + w), (long long)ldx, ck_strerror(CK_ESHAPE));
  const cg_variant v = {(int)block, share128 != 0};
  int64_t group = share128 ? 128 : block, tpg = mx_tpg(group), units = (w + group - 1) / group;
  char name[64];
  KN("mxfp8_qdq_last", 2, tx, ty);
  return rtk_launch(k, CG_FAM_MXFP8, &v, name, rtk_blocks(rows * units * tpg, CG_NT_MX), 1, CG_NT_MX,
                    ARGS(&x, &y, &rows, &w, &units, &ldx, &sx));
}

static int mx_check(rt_cuda *k, const char *what, int64_t along, int64_t block, int share128) {
  if (block < 1 || block > 128 || (block & (block - 1)) != 0)
    return rtk_fail(k, "%s: block %lld: the GPU kernels take a power of two up to 128 (%s)", what, (long long)block, ck_strerror(CK_ESHAPE));
  if (along % (share128 ? 128 : block) != 0)
    return rtk_fail(k, "%s: %lld elements per row are not a multiple of %lld (%s)", what, (long long)along,
                    (long long)(share128 ? 128 : block), ck_strerror(CK_ESHAPE));
  return 0;
}

int rt_cuda_mxfp8_quantize(rt_cuda *k, cg_dtype t, gpu_ptr x, int64_t rows, int64_t cols, int64_t block, int share128,
                           gpu_ptr q, gpu_ptr scale) {
  return rt_cuda_mxfp8_quantize_win(k, t, x, cols, 0, 0, rows, cols, block, share128, q, scale, 0, 1, 0);
}

/* A gather's top_k and source rows (rt_cuda_mxfp8_quantize_win): rows = gn gk. */
static int gather_check(rt_cuda *k, const char *what, gpu_ptr gather, int64_t gk, int64_t gn, int64_t rows) {
  if (gather && (gk < 1 || gn * gk != rows))
    return rtk_fail(k, "%s: a gather of top_k %lld over %lld rows cannot make %lld rows (%s)", what, (long long)gk,
                    (long long)gn, (long long)rows, ck_strerror(CK_ESHAPE));
  return 0;
}

int rt_cuda_mxfp8_quantize_win(rt_cuda *k, cg_dtype t, gpu_ptr x, int64_t ldx, int64_t sx, int round_bf16, int64_t rows,
                               int64_t cols, int64_t block, int share128, gpu_ptr q, gpu_ptr scale, gpu_ptr gather,
                               int64_t gk, int64_t gn) {
  if (mx_check(k, "mxfp8_quantize", cols, block, share128) || gather_check(k, "mxfp8_quantize", gather, gk, gn, rows))
    return -1;
  if (sx < 0 || sx + cols > ldx)
    return rtk_fail(k, "mxfp8_quantize: columns [%lld, %lld) of %lld (%s)", (long long)sx, (long long)(sx + cols),
                    (long long)ldx, ck_strerror(CK_ESHAPE));
  const cg_variant v = {(int)block, share128 != 0};
  int64_t group = share128 ? 128 : block, tpg = mx_tpg(group), gpr = cols / group, ngroups = rows * gpr;
  int rb = round_bf16 != 0;
  char name[64];
  KN("mxfp8_quantize", 1, t);
  /* QR_U = 4 chunks (of 8 elements) a thread (cg_mxfp8.c) */
  return rtk_launch(k, CG_FAM_MXFP8, &v, name, rtk_blocks(ngroups * tpg, CG_NT_MX * 4), 1, CG_NT_MX,
                    ARGS(&x, &q, &scale, &ngroups, &gpr, &ldx, &sx, &rb, &gather, &gk, &gn));
}

int rt_cuda_mxfp8_quantize_act(rt_cuda *k, cg_dtype t, gpu_ptr gu, int64_t ldg, gpu_ptr probs, int64_t S, int64_t F,
                               int64_t block, int share128, gpu_ptr q, gpu_ptr scale) {
  return rt_cuda_mxfp8_quantize_act_store(k, t, gu, ldg, probs, S, F, block, share128, q, scale, 0, 0);
}

int rt_cuda_mxfp8_quantize_act_store(rt_cuda *k, cg_dtype t, gpu_ptr gu, int64_t ldg, gpu_ptr probs, int64_t S, int64_t F,
                                     int64_t block, int share128, gpu_ptr q, gpu_ptr scale, gpu_ptr qs, gpu_ptr ss) {
  if (mx_check(k, "mxfp8_quantize_act", F, block, share128)) return -1;
  if ((qs == 0) != (ss == 0)) return rtk_fail(k, "mxfp8_quantize_act_store: gate_up's bytes and codes go together, both or neither");
  if (ldg < 2 * F)
    return rtk_fail(k, "mxfp8_quantize_act: gate_up rows %lld apart, narrower than 2F = %lld (%s)", (long long)ldg,
                    (long long)(2 * F), ck_strerror(CK_ESHAPE));
  const cg_variant v = {(int)block, share128 != 0};
  int64_t group = share128 ? 128 : block, tpg = mx_tpg(group), ngroups = S * (F / group);
  char name[64];
  KN(qs ? "mxfp8_quantize_act_store" : "mxfp8_quantize_act", 1, t);
  /* QR_U = 4 chunks (of 8 elements) a thread, as mxfp8_quantize; with gate_up's store AS_U */
  if (qs)
    return rtk_launch(k, CG_FAM_MXFP8, &v, name, rtk_blocks(ngroups * tpg, CG_NT_MX * CG_ACT_STORE_CHUNKS), 1, CG_NT_MX,
                      ARGS(&gu, &ldg, &probs, &F, &q, &scale, &ngroups, &qs, &ss));
  return rtk_launch(k, CG_FAM_MXFP8, &v, name, rtk_blocks(ngroups * tpg, CG_NT_MX * 4), 1, CG_NT_MX,
                    ARGS(&gu, &ldg, &probs, &F, &q, &scale, &ngroups));
}

int rt_cuda_mxfp8_quantize_cols(rt_cuda *k, cg_dtype t, gpu_ptr x, int64_t rows, int64_t cols, int64_t block,
                                int share128, gpu_ptr qt, gpu_ptr scale_t) {
  if (mx_check(k, "mxfp8_quantize_cols", rows, block, share128)) return -1;
  const cg_variant v = {(int)block, share128 != 0};
  char name[64];
  KN("mxfp8_quantize_cols", 1, t);
  /* tiles of 128 rows by 64 columns, one block each (cg_mxfp8.c, QC_COLS) */
  int64_t blocks = (cols + 63) / 64 * ((rows + 127) / 128);
  return rtk_launch(k, CG_FAM_MXFP8, &v, name, (uint64_t)blocks, 1, CG_NT_MX, ARGS(&x, &qt, &scale_t, &rows, &cols));
}

int rt_cuda_mxfp8_dequantize(rt_cuda *k, cg_dtype t, gpu_ptr q, gpu_ptr scale, int64_t rows, int64_t cols,
                             int64_t block, gpu_ptr x) {
  if (mx_check(k, "mxfp8_dequantize", cols, block, 0)) return -1;
  const cg_variant v = {(int)block, 0};
  int64_t n = rows * cols;
  char name[64];
  KN("mxfp8_dequantize", 1, t);
  return rtk_launch(k, CG_FAM_MXFP8, &v, name, rtk_vec_blocks(n), 1, CG_NT_MX, ARGS(&q, &scale, &x, &n));
}

int rt_cuda_mxfp8_scales_vec128(rt_cuda *k, gpu_ptr scale, int64_t rows, int64_t K, int64_t block, gpu_ptr counts,
                                int64_t E, int64_t seg_rows, gpu_ptr sf) {
  if (mx_check(k, "mxfp8_scales_vec128", K, block, 1)) return -1;
  const cg_variant v = {(int)block, 1};
  int64_t n = rows * ((K / 128 + 7) / 8); /* a thread a row's 8 column blocks (cg_mxfp8.c, QS_KB) */
  return rtk_launch(k, CG_FAM_MXFP8, &v, "moec_mxfp8_scales_vec128", rtk_blocks(n, CG_NT_MX), 1, CG_NT_MX,
                    ARGS(&scale, &sf, &rows, &K, &counts, &E, &seg_rows));
}

int rt_cuda_mxfp8_quantize_cols_experts(rt_cuda *k, cg_dtype t, gpu_ptr x, int64_t S, int64_t C, gpu_ptr counts, int64_t E,
                                        gpu_ptr qt, gpu_ptr sf) {
  return rt_cuda_mxfp8_quantize_cols_experts_win(k, t, x, C, 0, 0, S, C, counts, E, 0, qt, sf, 0, 1, 0);
}

int rt_cuda_mxfp8_quantize_cols_experts_win(rt_cuda *k, cg_dtype t, gpu_ptr x, int64_t ldx, int64_t sx, int round_bf16,
                                            int64_t S, int64_t C, gpu_ptr counts, int64_t E, int64_t ldq, gpu_ptr qt,
                                            gpu_ptr sf, gpu_ptr gather, int64_t gk, int64_t gn) {
  if (gather_check(k, "mxfp8_quantize_cols_experts", gather, gk, gn, S)) return -1;
  if (sx < 0 || sx + C > ldx)
    return rtk_fail(k, "mxfp8_quantize_cols_experts: columns [%lld, %lld) of %lld (%s)", (long long)sx, (long long)(sx + C),
                    (long long)ldx, ck_strerror(CK_ESHAPE));
  if (ldq && (ldq < fp8_cols_ld(S, E) || ldq % 128))
    return rtk_fail(k, "mxfp8_quantize_cols_experts: ldq %lld, want a multiple of 128 of at least %lld (%s)", (long long)ldq,
                    (long long)fp8_cols_ld(S, E), ck_strerror(CK_ESHAPE));
  const cg_variant v = {32, 1};
  int rb = round_bf16 != 0;
  int64_t units = S / 128 + E;
  char name[64];
  KN("mxfp8_quantize_cols_experts", 1, t);
  int64_t blocks = (C + 63) / 64 * units; /* one block a tile of 128 rows by 64 columns (cg_mxfp8.c, QC_COLS) */
  return rtk_launch(k, CG_FAM_MXFP8, &v, name, (uint64_t)blocks, 1, CG_NT_MX,
                    ARGS(&x, &qt, &sf, &C, &counts, &E, &units, &ldx, &sx, &rb, &ldq, &gather, &gk, &gn));
}
