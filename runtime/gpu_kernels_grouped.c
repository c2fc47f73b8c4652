/* gpu_kernels_grouped.c -- launchers of the expert-sorted ops (ck_grouped.h) on the GPU. The
 * per-expert counts stay on the device; grids are sized by static bounds (S = T*k rows). */
#include <string.h>

#include "cpu_kernels.h"
#include "gpu_kernels_int.h"

#define ARGS(...) ((void *[]){__VA_ARGS__})
#define KN(op, ...) cg_kname(name, sizeof name, op, __VA_ARGS__)
#define FAM CG_FAM_GROUPED

static int64_t ew_blocks(int64_t n) {
  int64_t b = (n + CG_NT_EW - 1) / CG_NT_EW;
  return b > 65535 ? 65535 : b;
}

/* route_count + route_scan into scratch: ccount, cbase, then offsets (E+1) after `extra`
 * bytes the caller carves for itself. */
static int count_sort(rt_cuda *k, gpu_ptr idx, int64_t np, int64_t E, gpu_ptr counts, int fill, int64_t kk,
                      gpu_ptr perm) {
  if (E < 1 || E > CG_MAX_E) return rtk_fail(k, "expert ops: %lld experts, the GPU kernels take 1..%d", (long long)E, CG_MAX_E);
  if (np > 0x7fffffff) return rtk_fail(k, "expert ops: %lld (token, slot) pairs overflow int32 row ids", (long long)np);
  if (np == 0) return 0;
  int64_t nb = (np + CG_ROUTE_CHUNK - 1) / CG_ROUTE_CHUNK;
  const size_t cb = rtk_align((size_t)(nb * E) * sizeof(int)), eb = rtk_align((size_t)(E + 1) * sizeof(int)),
               pb = rtk_align((size_t)np * sizeof(int));
  gpu_ptr ws = 0;
  if (rtk_scratch(k, 2 * cb + 2 * eb + 3 * pb + 256, &ws) != 0) return -1;
  gpu_ptr ccount = ws, cbase = ws + cb, offsets = ws + 2 * cb, cnt = counts ? counts : ws + 2 * cb + eb;
  gpu_ptr rows = ws + 2 * cb + 2 * eb, slots = rows + pb, pos = slots + pb;
  if (rtk_launch(k, CG_FAM_ROUTE, NULL, "moec_route_count", (uint64_t)nb, 1, CG_NT_ROUTE,
                 ARGS(&idx, &ccount, &np, &E, &k->err_flag)) != 0 ||
      rtk_launch(k, CG_FAM_ROUTE, NULL, "moec_route_scan", 1, 1, CG_NT_ROUTE,
                 ARGS(&ccount, &cbase, &cnt, &offsets, &nb, &E)) != 0)
    return -1;
  if (!fill) return 0;
  if (rtk_launch(k, CG_FAM_ROUTE, NULL, "moec_route_fill", (uint64_t)nb, 1, CG_NT_ROUTE,
                 ARGS(&idx, &cbase, &rows, &slots, &pos, &np, &kk, &E)) != 0)
    return -1;
  return rtk_launch(k, FAM, NULL, "moec_perm_from_pos", (uint64_t)ew_blocks(np), 1, CG_NT_EW,
                    ARGS(&pos, &perm, &np, &k->err_flag));
}

int rt_cuda_expert_counts(rt_cuda *k, gpu_ptr idx, int64_t T, int64_t kk, int64_t E, gpu_ptr counts) {
  if (T * kk == 0) return gpu_memset8(k->g, counts, 0, (size_t)E * 4) ? rtk_fail(k, "%s", gpu_error(k->g)) : 0;
  return count_sort(k, idx, T * kk, E, counts, 0, kk, 0);
}

int rt_cuda_expert_sort(rt_cuda *k, gpu_ptr idx, int64_t T, int64_t kk, int64_t E, gpu_ptr perm) {
  return count_sort(k, idx, T * kk, E, 0, 1, kk, perm);
}

int rt_cuda_expert_permute(rt_cuda *k, cg_dtype t, cg_dtype tw, gpu_ptr x, gpu_ptr perm, gpu_ptr w, gpu_ptr xs,
                           int64_t T, int64_t kk, int64_t H) {
  char name[64];
  KN("expert_permute", 2, t, tw);
  return rtk_launch(k, FAM, NULL, name, (uint64_t)(T * kk), 1, rtk_row_threads(H, H % 8 == 0),
                    ARGS(&x, &perm, &w, &xs, &T, &kk, &H, &k->err_flag));
}

int rt_cuda_expert_unpermute(rt_cuda *k, cg_dtype t, cg_dtype tw, gpu_ptr ys, int64_t ldy, gpu_ptr perm, gpu_ptr w, gpu_ptr res,
                             gpu_ptr out, int64_t T, int64_t kk, int64_t H) {
  int64_t np = T * kk;
  if (np == 0) return 0;
  if (ldy < H)
    return rtk_fail(k, "expert_unpermute: rows %lld apart, narrower than H = %lld (%s)", (long long)ldy, (long long)H,
                    ck_strerror(CK_ESHAPE));
  gpu_ptr inv = 0;
  if (rtk_scratch(k, (size_t)np * 4 + 256, &inv) != 0) return -1;
  if (rtk_launch(k, FAM, NULL, "moec_perm_invert", (uint64_t)ew_blocks(np), 1, CG_NT_EW,
                 ARGS(&perm, &inv, &np, &k->err_flag)) != 0)
    return -1;
  char name[64];
  KN("expert_unpermute", 2, t, tw);
  return rtk_launch(k, FAM, NULL, name, (uint64_t)T, 1, rtk_row_threads(H, H % 8 == 0),
                    ARGS(&ys, &inv, &w, &res, &out, &T, &kk, &H, &ldy, &k->err_flag));
}

int rt_cuda_expert_weight_grad(rt_cuda *k, cg_dtype ta, cg_dtype tb, gpu_ptr a, gpu_ptr b, gpu_ptr perm, gpu_ptr dw,
                               int64_t T, int64_t kk, int64_t H) {
  char name[64];
  KN("expert_weight_grad", 2, ta, tb);
  return rtk_launch(k, FAM, NULL, name, (uint64_t)(T * kk), 1, CG_NT_ROW,
                    ARGS(&a, &b, &perm, &dw, &T, &kk, &H, &k->err_flag));
}

static int probs(rt_cuda *k, gpu_ptr src, gpu_ptr perm, gpu_ptr dst, int64_t np, int dir) {
  return rtk_launch(k, FAM, NULL, "moec_expert_probs", (uint64_t)ew_blocks(np), 1, CG_NT_EW,
                    ARGS(&src, &perm, &dst, &np, &dir, &k->err_flag));
}
int rt_cuda_expert_probs(rt_cuda *k, gpu_ptr w, gpu_ptr perm, gpu_ptr p, int64_t T, int64_t kk) {
  return probs(k, w, perm, p, T * kk, 0);
}
int rt_cuda_expert_probs_bwd(rt_cuda *k, gpu_ptr dp, gpu_ptr perm, gpu_ptr dw, int64_t T, int64_t kk) {
  return probs(k, dp, perm, dw, T * kk, 1);
}

int rt_cuda_copy_cols(rt_cuda *k, cg_dtype tx, cg_dtype ty, gpu_ptr x, int64_t ldx, int64_t sx, gpu_ptr y, int64_t ldy,
                      int64_t sy, int64_t rows, int64_t w) {
  char name[64];
  KN("copy_cols", 2, tx, ty);
  return rtk_launch(k, FAM, NULL, name, (uint64_t)ew_blocks(rows * w), 1, CG_NT_EW,
                    ARGS(&x, &y, &rows, &w, &ldx, &sx, &ldy, &sy));
}

static int gemm_grid_ok(rt_cuda *k, int64_t nx, int64_t ny, int64_t E) {
  if (E < 1 || E > 65535 || ny > 65535 || nx > 0x7fffffff)
    return rtk_fail(k, "grouped GEMM: grid (%lld, %lld, %lld) too large", (long long)nx, (long long)ny, (long long)E);
  return 0;
}

int rt_cuda_grouped_gemm(rt_cuda *k, cg_dtype ta, cg_dtype tb, cg_dtype tc, gpu_ptr a, int64_t lda, gpu_ptr b, int trans_b,
                         gpu_ptr counts, gpu_ptr c, int64_t ldc, int64_t S, int64_t E, int64_t N, int64_t K) {
  int64_t nx = (N + CG_GT - 1) / CG_GT, ny = (S + CG_GT - 1) / CG_GT;
  if (S == 0 || N == 0) return 0;
  if (gemm_grid_ok(k, nx, ny, E)) return -1;
  char name[64];
  KN("ggemm_rows", 3, ta, tb, tc);
  void *args[] = {&a, &lda, &b, &trans_b, &counts, &c, &ldc, &S, &N, &K, &k->err_flag};
  return rtk_launch3(k, FAM, name, (uint64_t)nx, (uint64_t)ny, (uint64_t)E, CG_GT * CG_GT, args);
}

int rt_cuda_grouped_linear_fwd(rt_cuda *k, cg_dtype tx, cg_dtype tw, cg_dtype ty, gpu_ptr xs, gpu_ptr w, gpu_ptr counts,
                               gpu_ptr y, int64_t S, int64_t E, int64_t in, int64_t out) {
  return rt_cuda_grouped_gemm(k, tx, tw, ty, xs, in, w, 0, counts, y, out, S, E, out, in);
}

int rt_cuda_grouped_linear_dgrad(rt_cuda *k, cg_dtype tdy, cg_dtype tw, cg_dtype tdx, gpu_ptr dy, gpu_ptr w,
                                 gpu_ptr counts, gpu_ptr dx, int64_t S, int64_t E, int64_t in, int64_t out) {
  return rt_cuda_grouped_gemm(k, tdy, tw, tdx, dy, out, w, 1, counts, dx, in, S, E, in, out);
}

int rt_cuda_grouped_linear_wgrad(rt_cuda *k, cg_dtype tx, cg_dtype tdy, cg_dtype tdw, gpu_ptr xs, gpu_ptr dy,
                                 gpu_ptr counts, gpu_ptr dw, int64_t S, int64_t E, int64_t in, int64_t out) {
  int64_t nx = (out + CG_GT - 1) / CG_GT, ny = (in + CG_GT - 1) / CG_GT;
  if (in == 0 || out == 0) return 0;
  if (gemm_grid_ok(k, nx, ny, E)) return -1;
  char name[64];
  KN("ggemm_wgrad", 3, tx, tdy, tdw);
  void *args[] = {&xs, &in, &dy, &out, &counts, &dw, &S, &in, &out, &k->err_flag};
  return rtk_launch3(k, FAM, name, (uint64_t)nx, (uint64_t)ny, (uint64_t)E, CG_GT * CG_GT, args);
}

int rt_cuda_grouped_colsum(rt_cuda *k, cg_dtype t, gpu_ptr dy, gpu_ptr counts, gpu_ptr db, int64_t S, int64_t E,
                           int64_t out) {
  if (out == 0) return 0;
  if (E < 1 || E > 65535) return rtk_fail(k, "grouped_colsum: %lld experts", (long long)E);
  char name[64];
  KN("grouped_colsum", 1, t);
  void *args[] = {&dy, &counts, &db, &S, &out, &k->err_flag};
  return rtk_launch3(k, FAM, name, rtk_blocks(out, CG_NT_RED), 1, (uint64_t)E, CG_NT_RED, args);
}

int rt_cuda_grouped_mlp_fwd(rt_cuda *k, cg_dtype tx, cg_dtype tw, cg_dtype to, gpu_ptr xs, gpu_ptr w_gu, gpu_ptr w_down,
                            gpu_ptr counts, gpu_ptr probs_, gpu_ptr out, int64_t S, int64_t E, int64_t H, int64_t F,
                            int64_t mx_block) {
  if (mx_block > 0) return rtk_fail(k, "grouped_mlp: the MXFP8 activation (mx_block) is not on the GPU yet");
  if (S == 0) return 0;
  const int64_t W = H + 2 * F;
  const size_t es = to == CG_DT_BF16 ? 2 : 4;
  gpu_ptr act = 0;
  if (rtk_scratch(k, (size_t)(S * F) * es + 256, &act) != 0) return -1;
  gpu_ptr gu = out + (gpu_ptr)((size_t)H * es);
  if (rt_cuda_grouped_gemm(k, tx, tw, to, xs, H, w_gu, 0, counts, gu, W, S, E, 2 * F, H) != 0 ||
      rt_cuda_mlp_act(k, to, gu, W, probs_, act, S, F) != 0)
    return -1;
  return rt_cuda_grouped_gemm(k, to, tw, to, act, F, w_down, 0, counts, out, W, S, E, H, F);
}

int rt_cuda_mlp_act(rt_cuda *k, cg_dtype t, gpu_ptr gu, int64_t ldg, gpu_ptr probs_, gpu_ptr act, int64_t S, int64_t F) {
  char name[64];
  KN("mlp_act", 1, t);
  return rtk_launch(k, FAM, NULL, name, (uint64_t)ew_blocks(S * F), 1, CG_NT_EW, ARGS(&gu, &ldg, &probs_, &act, &S, &F));
}

int rt_cuda_mlp_bwd_rows(rt_cuda *k, cg_dtype tgu, cg_dtype to, gpu_ptr dact, gpu_ptr gate_up, int64_t ldg, gpu_ptr probs_,
                         gpu_ptr out, int64_t S, int64_t F, int64_t W) {
  if (W < 3 * F + 1) return rtk_fail(k, "mlp_bwd_rows: %lld columns for 3F + 1 = %lld (%s)", (long long)W, (long long)(3 * F + 1),
                                     ck_strerror(CK_ESHAPE));
  char name[64];
  KN("mlp_bwd_rows", 2, tgu, to);
  return rtk_launch(k, FAM, NULL, name, (uint64_t)S, 1, CG_NT_ROW, ARGS(&dact, &gate_up, &ldg, &probs_, &out, &S, &F, &W));
}

int rt_cuda_mlp_bwd_split(rt_cuda *k, cg_dtype tgu, gpu_ptr dact, gpu_ptr gate_up, int64_t ldg, gpu_ptr probs_, gpu_ptr dgu,
                          gpu_ptr act, gpu_ptr dp, int64_t S, int64_t F) {
  return rt_cuda_mlp_bwd_split_mx(k, tgu, dact, gate_up, ldg, 0, 0, 0, probs_, dgu, act, dp, S, F, 0, 0, 0);
}

int rt_cuda_mlp_bwd_split_mx(rt_cuda *k, cg_dtype tgu, gpu_ptr dact, gpu_ptr gate_up, int64_t ldg, gpu_ptr gq, gpu_ptr gsc,
                             int64_t gblock, gpu_ptr probs_, gpu_ptr dgu, gpu_ptr act, gpu_ptr dp, int64_t S, int64_t F,
                             gpu_ptr dq, gpu_ptr dsc, int64_t dblock) {
  if (!gq && ldg < 2 * F)
    return rtk_fail(k, "mlp_bwd_split: gate_up rows %lld apart, narrower than 2F = %lld (%s)", (long long)ldg, (long long)(2 * F),
                    ck_strerror(CK_ESHAPE));
  if (gq && (gblock < 1 || (2 * F) % gblock))
    return rtk_fail(k, "mlp_bwd_split: MXFP8 blocks of %lld do not divide a row of 2F = %lld (%s)", (long long)gblock,
                    (long long)(2 * F), ck_strerror(CK_ESHAPE));
  /* the quantized dg | du: groups of 128 as whole half-warps of the kernel's 16-byte path (its
     `vec`: with gq, gate_up is not read) */
  const size_t gsz = tgu == CG_DT_BF16 ? 2 : 4;
  if (dq && (F % 128 || dblock < 8 || dblock > 128 || 128 % dblock || dact % 16 || dgu % 16 || act % 16 || dq % 16 ||
             (!gq && (gate_up % 16 || (size_t)ldg * gsz % 16))))
    return rtk_fail(k, "mlp_bwd_split: dg | du quantized in blocks of %lld needs F %% 128 == 0 (F = %lld), blocks dividing 128 "
                    "and 16-byte aligned rows (%s)", (long long)dblock, (long long)F, ck_strerror(CK_ESHAPE));
  char name[64];
  KN(dq ? "mlp_bwd_split_q" : "mlp_bwd_split", 1, tgu);
  const uint64_t rows_a_block = CG_NT_ROW / 32; /* a warp a row */
  return rtk_launch(k, FAM, NULL, name, ((uint64_t)S + rows_a_block - 1) / rows_a_block, 1, CG_NT_ROW,
                    ARGS(&dact, &gate_up, &ldg, &probs_, &dgu, &act, &dp, &S, &F, &gq, &gsc, &gblock, &dq, &dsc, &dblock));
}

int rt_cuda_mlp_bwd_split_fp8(rt_cuda *k, cg_dtype tgu, gpu_ptr dact, gpu_ptr gate_up, int64_t ldg, gpu_ptr gq, gpu_ptr gsc,
                              int64_t gblock, gpu_ptr probs_, gpu_ptr counts, int64_t E, gpu_ptr dp, int64_t S, int64_t F,
                              const rt_split_fp8 *o) {
  const size_t gsz = tgu == CG_DT_BF16 ? 2 : 4;
  if (!gq && ldg < 2 * F)
    return rtk_fail(k, "mlp_bwd_split_fp8: gate_up rows %lld apart, narrower than 2F = %lld (%s)", (long long)ldg,
                    (long long)(2 * F), ck_strerror(CK_ESHAPE));
  if (gq && (gblock < 1 || (2 * F) % gblock))
    return rtk_fail(k, "mlp_bwd_split_fp8: MXFP8 blocks of %lld do not divide a row of 2F = %lld (%s)",
                    (long long)gblock, (long long)(2 * F), ck_strerror(CK_ESHAPE));
  if (F <= 0 || F % 128 || o->dblock < 8 || o->dblock > 128 || 128 % o->dblock || dact % 16 || o->dq % 16 || o->qgu % 16 ||
      o->qa % 16 || (!gq && (gate_up % 16 || (size_t)ldg * gsz % 16)))
    return rtk_fail(k, "mlp_bwd_split_fp8: needs F %% 128 == 0 (F = %lld), blocks dividing 128 (%lld) and 16-byte aligned "
                    "rows and outputs (%s)", (long long)F, (long long)o->dblock, ck_strerror(CK_ESHAPE));
  if (o->ldq && (o->ldq < fp8_cols_ld(S, E) || o->ldq % 128))
    return rtk_fail(k, "mlp_bwd_split_fp8: ldq %lld, want a multiple of 128 of at least %lld (%s)", (long long)o->ldq,
                    (long long)fp8_cols_ld(S, E), ck_strerror(CK_ESHAPE));
  if (S == 0) return 0;
  char name[64];
  KN("mlp_bwd_split_fp8", 1, tgu);
  int64_t nct = F / 128, dblock = o->dblock, ldq = o->ldq, ahead = o->ahead > 0 ? o->ahead : 0;
  gpu_ptr dq = o->dq, dsc = o->dsc, qgu = o->qgu, sgu = o->sgu, qa = o->qa, sa = o->sa, dpc = o->dpc;
  /* a block a tile of 128 rows of one expert by 128 columns; spare units return */
  if (rtk_launch_smem(k, FAM, NULL, name, (uint64_t)((S / 128 + E) * nct), 1, CG_NT_SPLIT_FP8, CG_SPLIT_FP8_SMEM,
                 ARGS(&dact, &gate_up, &ldg, &gq, &gsc, &gblock, &probs_, &F, &counts, &E, &dq, &dsc, &dblock, &qgu, &sgu, &qa,
                      &sa, &ldq, &dpc, &ahead)) != 0)
    return -1;
  const uint64_t rows_a_block = CG_NT_ROW / 32; /* a warp a row */
  return rtk_launch(k, FAM, NULL, "moec_mlp_dp_sum", ((uint64_t)S + rows_a_block - 1) / rows_a_block, 1, CG_NT_ROW,
                    ARGS(&dpc, &dp, &S, &F));
}

int rt_cuda_grouped_mlp_bwd(rt_cuda *k, cg_dtype tdy, cg_dtype tgu, cg_dtype tw, cg_dtype to, gpu_ptr dy, gpu_ptr gate_up,
                            gpu_ptr w_down, gpu_ptr counts, gpu_ptr probs_, gpu_ptr out, int64_t S, int64_t E, int64_t H,
                            int64_t F, int64_t W) {
  if (S == 0) return 0;
  gpu_ptr dact = 0;
  if (rtk_scratch(k, (size_t)(S * F) * 4 + 256, &dact) != 0) return -1;
  if (rt_cuda_grouped_gemm(k, tdy, tw, CG_DT_F32, dy, H, w_down, 1, counts, dact, F, S, E, F, H) != 0) return -1;
  return rt_cuda_mlp_bwd_rows(k, tgu, to, dact, gate_up, 2 * F, probs_, out, S, F, W);
}
