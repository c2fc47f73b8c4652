/* test_gpu_fused.c -- the GPU kernels of the fusion passes' expert ops (rt_cuda_expert_*,
 * rt_cuda_grouped_*, rt_cuda_copy_cols) against their CPU references in ck_grouped.h, on
 * fresh random inputs (never zeros; the seed is printed, MOEC_TEST_SEED repeats it), f32 and
 * bf16 storage, with an expert that gets no rows. Skips where there is no CUDA driver or GPU;
 * scripts/cuda_emu/run.sh build test_gpu_fused runs it on the CPU emulator.
 *
 * Tolerances: bit-exact for counts, sort, permute, unpermute, probs (fwd and bwd), the column
 * copies and the grouped column sums (the CPU's operations in the CPU's order); rtol 1e-6 for
 * the routing weights' gradient (double sums in another order); rtol 1e-5 plus 1e-5 of the
 * largest value for the grouped GEMMs and the GroupedMLP in f32 (float sums in another
 * order); bf16 outputs one bf16 rounding more, and the bf16 GroupedMLP 2e-2 (its rounded
 * intermediates may land one bf16 step apart). The split backward rows (bf16 pieces) bit for
 * bit the f32 rows rounded, their dp 1e-6.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ck_test.h"
#include "runtime/gpu_kernels.h"
#include "runtime/ck_grouped.h"
#include "runtime/gpu_loader.h"

#include "gpu_test.h"

/* E experts, the last one never chosen (an empty group). */
enum { T = 97, KK = 2, E = 5, H = 40, F = 24, IN = 40, OUT = 36 };
enum { S = T * KK };

static int32_t *rnd_idx(void) {
  int32_t *idx = malloc(sizeof(int32_t) * T * KK);
  for (int t = 0; t < T; t++)
    for (int j = 0; j < KK; j++) {
      int e, dup_;
      do {
        e = rng_int(E - 1);
        dup_ = 0;
        for (int q = 0; q < j; q++) dup_ |= idx[t * KK + q] == e;
      } while (dup_);
      idx[t * KK + j] = e;
    }
  return idx;
}
static void get_i(int32_t *x, gpu_ptr p, int64_t n) { download(x, p, (size_t)n * 4); }
static void cmp_i(const char *what, const int32_t *got, const int32_t *want, int64_t n) {
  int64_t bad = -1;
  for (int64_t i = 0; i < n && bad < 0; i++)
    if (got[i] != want[i]) bad = i;
  CHECK(bad < 0, "%s: element %lld got %d want %d", what, (long long)bad, bad >= 0 ? got[bad] : 0, bad >= 0 ? want[bad] : 0);
  printf("  %-44s %6lld values, exact\n", what, (long long)n);
}

static void test_sort(void) {
  printf("expert counts and sort:\n");
  int32_t *idx = rnd_idx(), counts[E], gc[E], *perm = malloc(4 * S), *gp = malloc(4 * S);
  gpu_ptr di = up_raw(idx, 4 * S), dc = dmalloc(4 * E), dp = dmalloc(4 * S);
  CHECK(ck_expert_counts(idx, T, KK, E, counts) == CK_OK && ck_expert_sort(idx, T, KK, E, perm) == CK_OK, "ck");
  RUN(rt_cuda_expert_counts(K, di, T, KK, E, dc));
  RUN(rt_cuda_expert_sort(K, di, T, KK, E, dp));
  get_i(gc, dc, E);
  get_i(gp, dp, S);
  cmp_i("expert_counts", gc, counts, E);
  cmp_i("expert_sort", gp, perm, S);
  expect_flag("sort", CK_OK);
  idx[5] = E; /* a bad id */
  upload(di, idx, 4 * S);
  RUN(rt_cuda_expert_counts(K, di, T, KK, E, dc));
  expect_flag("expert_counts with a bad id", CK_EINDEX);
  free(idx), free(perm), free(gp);
  dfree_all();
}

static void test_permute(cg_dtype t) {
  printf("permute, unpermute, weight grad, probs [%s]:\n", cg_dtype_name(t));
  int32_t *idx = rnd_idx(), *perm = malloc(4 * S);
  ck_expert_sort(idx, T, KK, E, perm);
  float *x = rnd(T * H, -2, 2, t), *w = rnd(S, 0.1f, 1, CG_DT_F32), *ys = rnd(S * H, -2, 2, t);
  float *want = falloc(S * H), *got = falloc(S * H);
  gpu_ptr dperm = up_raw(perm, 4 * S), dx = up_f(x, T * H, t), dw = up_f(w, S, CG_DT_F32), dys = up_f(ys, S * H, t);
  gpu_ptr dxs = dmalloc((size_t)S * H * 4), dout = dmalloc((size_t)T * H * 4), ddw = dmalloc(4 * S);
  for (int wi = 0; wi < 2; wi++) {
    ck_expert_permute(x, perm, wi ? w : NULL, want, T, KK, H);
    RUN(rt_cuda_expert_permute(K, t, CG_DT_F32, dx, dperm, wi ? dw : 0, dxs, T, KK, H));
    get_f(got, dxs, S * H, t);
    cmp(wi ? "expert_permute (weighted)" : "expert_permute", got, want, S * H, t, -1, 0);
    ck_expert_unpermute(ys, perm, wi ? w : NULL, want, T, KK, H);
    RUN(rt_cuda_expert_unpermute(K, t, CG_DT_F32, dys, H, dperm, wi ? dw : 0, 0, dout, T, KK, H));
    get_f(got, dout, T * H, t);
    cmp(wi ? "expert_unpermute (weighted)" : "expert_unpermute", got, want, T * H, t, -1, 0);
    /* ys as a column window of wider rows (VIEW_WINDOW: grouped_mlp's y), from column 8 (the
       16-byte path) and from column 3 (element loads): the same bits */
    for (int c0 = 8; c0 >= 3; c0 -= 5) {
      const int64_t ld = H + 24;
      float *wide = rnd(S * ld, -2, 2, t), *got3 = falloc(T * H);
      for (int64_t r = 0; r < S; r++) memcpy(wide + r * ld + c0, ys + r * H, (size_t)H * sizeof(float));
      gpu_ptr dwide = up_f(wide, S * ld, t);
      RUN(rt_cuda_expert_unpermute(K, t, CG_DT_F32, dwide + (gpu_ptr)(c0 * dts(t)), ld, dperm, wi ? dw : 0, 0, dout, T, KK, H));
      get_f(got3, dout, T * H, t);
      cmp(c0 == 8 ? "expert_unpermute, a window of wider rows" : "expert_unpermute, an unaligned window", got3, want, T * H, t,
          -1, 0);
      free(wide), free(got3);
    }
    CHECK(rt_cuda_expert_unpermute(K, t, CG_DT_F32, dys, H - 1, dperm, 0, 0, dout, T, KK, H) != 0,
          "expert_unpermute accepted rows narrower than H");
    /* a residual folded in (fuse-residual): bit for bit the separate add of the residual and the
     * result just read back; off = 1 starts the residual off 16-byte alignment (the scalar path) */
    for (int off = 0; off < 2; off++) {
      float *res = rnd(T * H + 1, -2, 2, t), *sum = falloc(T * H), *got2 = falloc(T * H);
      for (int64_t i = 0; i < T * H; i++) sum[i] = res[off + i] + got[i];
      if (t == CG_DT_BF16) ck_round_bf16(sum, T * H);
      gpu_ptr dres = up_f(res, T * H + 1, t) + (gpu_ptr)(off * (t == CG_DT_BF16 ? 2 : 4));
      RUN(rt_cuda_expert_unpermute(K, t, CG_DT_F32, dys, H, dperm, wi ? dw : 0, dres, dout, T, KK, H));
      get_f(got2, dout, T * H, t);
      cmp(off ? "expert_unpermute + residual, unaligned (exact)" : "expert_unpermute + residual (exact)", got2, sum, T * H,
          t, -1, 0);
      if (!off) { /* written over the residual */
        RUN(rt_cuda_expert_unpermute(K, t, CG_DT_F32, dys, H, dperm, wi ? dw : 0, dres, dres, T, KK, H));
        get_f(got2, dres, T * H, t);
        cmp("expert_unpermute + residual, into the residual (exact)", got2, sum, T * H, t, -1, 0);
      }
      free(res), free(sum), free(got2);
    }
  }
  ck_expert_weight_grad(x, ys, perm, want, T, KK, H);
  RUN(rt_cuda_expert_weight_grad(K, t, t, dx, dys, dperm, ddw, T, KK, H));
  get_f(got, ddw, S, CG_DT_F32);
  cmp("expert_weight_grad", got, want, S, CG_DT_F32, 1e-6, 0);
  ck_expert_probs(w, perm, want, T, KK);
  RUN(rt_cuda_expert_probs(K, dw, dperm, ddw, T, KK));
  get_f(got, ddw, S, CG_DT_F32);
  cmp("expert_probs", got, want, S, CG_DT_F32, -1, 0);
  ck_expert_probs_bwd(w, perm, want, T, KK);
  RUN(rt_cuda_expert_probs_bwd(K, dw, dperm, ddw, T, KK));
  get_f(got, ddw, S, CG_DT_F32);
  cmp("expert_probs_bwd", got, want, S, CG_DT_F32, -1, 0);
  expect_flag("permute", CK_OK);
  free(idx), free(perm), free(x), free(w), free(ys), free(want), free(got);
  dfree_all();
}

static void test_copy_cols(cg_dtype t) {
  printf("copy_cols (stack, unstack, pad_cols) [%s]:\n", cg_dtype_name(t));
  const int64_t rows = 33, w = 7, W = 20, start = 5;
  float *x = rnd(rows * w, -2, 2, t), *want = falloc(rows * W), *got = falloc(rows * W);
  for (int64_t r = 0; r < rows; r++) memcpy(want + r * W + start, x + r * w, (size_t)w * 4);
  gpu_ptr dx = up_f(x, rows * w, t), dy = dmalloc((size_t)rows * W * 4);
  if (gpu_memset8(G, dy, 0, (size_t)rows * W * dts(t))) CHECK(0, "memset");
  RUN(rt_cuda_copy_cols(K, t, t, dx, w, 0, dy, W, start, rows, w));
  get_f(got, dy, rows * W, t);
  cmp("pad_cols", got, want, rows * W, t, -1, 0);
  RUN(rt_cuda_copy_cols(K, t, t, dy, W, start, dx, w, 0, rows, w));
  get_f(got, dx, rows * w, t);
  cmp("unstack (slice back)", got, x, rows * w, t, -1, 0);
  free(x), free(want), free(got);
  dfree_all();
}

static void test_grouped_gemm(cg_dtype t, cg_dtype tw) {
  printf("grouped GEMMs and column sums [%s, weights %s]:\n", cg_dtype_name(t), cg_dtype_name(tw));
  int32_t *idx = rnd_idx(), counts[E];
  ck_expert_counts(idx, T, KK, E, counts);
  float *xs = rnd(S * IN, -1, 1, t), *w = rnd(E * IN * OUT, -1, 1, tw), *dy = rnd(S * OUT, -1, 1, t);
  float *want = falloc(S * IN + E * IN * OUT), *got = falloc(S * IN + E * IN * OUT);
  gpu_ptr dc = up_raw(counts, 4 * E), dxs = up_f(xs, S * IN, t), dwt = up_f(w, E * IN * OUT, tw), ddy = up_f(dy, S * OUT, t);
  gpu_ptr o1 = dmalloc((size_t)S * OUT * 4), o2 = dmalloc((size_t)S * IN * 4), o3 = dmalloc((size_t)E * IN * OUT * 4);
  ck_grouped_linear_fwd(xs, w, NULL, counts, want, S, E, IN, OUT);
  RUN(rt_cuda_grouped_linear_fwd(K, t, tw, t, dxs, dwt, dc, o1, S, E, IN, OUT));
  get_f(got, o1, S * OUT, t);
  cmp("grouped_linear", got, want, S * OUT, t, 1e-5, 1e-5 * maxabs(want, S * OUT));
  ck_grouped_linear_dgrad(dy, w, counts, want, S, E, IN, OUT);
  RUN(rt_cuda_grouped_linear_dgrad(K, t, tw, t, ddy, dwt, dc, o2, S, E, IN, OUT));
  get_f(got, o2, S * IN, t);
  cmp("grouped_linear_dgrad", got, want, S * IN, t, 1e-5, 1e-5 * maxabs(want, S * IN));
  ck_grouped_linear_wgrad(xs, dy, counts, want, S, E, IN, OUT);
  for (int64_t i = 0; i < E * IN * OUT; i++) got[i] = 1.0f;
  RUN(gpu_memset8(G, o3, 0xff, (size_t)E * IN * OUT * 4)); /* the empty expert must be written */
  RUN(rt_cuda_grouped_linear_wgrad(K, t, t, CG_DT_F32, dxs, ddy, dc, o3, S, E, IN, OUT));
  get_f(got, o3, E * IN * OUT, CG_DT_F32);
  cmp("grouped_linear_wgrad (f32 out)", got, want, E * IN * OUT, CG_DT_F32, 1e-5, 1e-5 * maxabs(want, E * IN * OUT));
  ck_grouped_colsum(dy, counts, want, S, E, OUT);
  RUN(rt_cuda_grouped_colsum(K, t, ddy, dc, o3, S, E, OUT));
  get_f(got, o3, E * OUT, CG_DT_F32);
  cmp("grouped_colsum", got, want, E * OUT, CG_DT_F32, -1, 0);
  expect_flag("grouped GEMMs", CK_OK);
  counts[0] += 3; /* counts that overrun S */
  upload(dc, counts, 4 * E);
  RUN(rt_cuda_grouped_linear_fwd(K, t, tw, t, dxs, dwt, dc, o1, S, E, IN, OUT));
  expect_flag("grouped_linear with bad counts", CK_EINDEX);
  free(idx), free(xs), free(w), free(dy), free(want), free(got);
  dfree_all();
}

static void test_grouped_mlp(cg_dtype t) {
  printf("grouped_mlp fwd and bwd [%s]:\n", cg_dtype_name(t));
  int32_t *idx = rnd_idx(), counts[E];
  ck_expert_counts(idx, T, KK, E, counts);
  const int64_t W = H + 2 * F, WB = 3 * F + 4; /* the backward's rows padded, as the IR pads them */
  float *xs = rnd(S * H, -1, 1, t), *wgu = rnd(E * H * 2 * F, -0.5f, 0.5f, t), *wd = rnd(E * F * H, -0.5f, 0.5f, t);
  float *p = rnd(S, 0.1f, 1, CG_DT_F32), *dy = rnd(S * H, -1, 1, t);
  float *want = falloc(S * W), *got = falloc(S * W), *gu = falloc(S * 2 * F);
  gpu_ptr dc = up_raw(counts, 4 * E), dxs = up_f(xs, S * H, t), dgu = up_f(wgu, E * H * 2 * F, t), dwd = up_f(wd, E * F * H, t);
  gpu_ptr dp = up_f(p, S, CG_DT_F32), ddy = up_f(dy, S * H, t), dout = dmalloc((size_t)S * W * 4);
  ck_mlp_precision prec = {t == CG_DT_BF16, 0, 0};
  ck_grouped_mlp_fwd(xs, wgu, wd, counts, p, want, S, E, H, F, prec);
  RUN(rt_cuda_grouped_mlp_fwd(K, t, t, t, dxs, dgu, dwd, dc, dp, dout, S, E, H, F, 0));
  get_f(got, dout, S * W, t);
  const double rt = t == CG_DT_BF16 ? 2e-2 : 1e-5;
  cmp("grouped_mlp", got, want, S * W, t, rt, rt * maxabs(want, S * W));
  /* the backward from the CPU's gate_up (exactly representable in t) */
  for (int64_t r = 0; r < S; r++) memcpy(gu + r * 2 * F, want + r * W + H, (size_t)(2 * F) * 4);
  gpu_ptr dgate = up_f(gu, S * 2 * F, t), dob = dmalloc((size_t)S * WB * 4);
  ck_grouped_mlp_bwd(dy, gu, wd, counts, p, want, S, E, H, F, WB);
  RUN(rt_cuda_grouped_mlp_bwd(K, t, t, t, t, ddy, dgate, dwd, dc, dp, dob, S, E, H, F, WB));
  get_f(got, dob, S * WB, t);
  cmp("grouped_mlp_bwd", got, want, S * WB, t, rt, rt * maxabs(want, S * WB));
  expect_flag("grouped_mlp", CK_OK);
  free(idx), free(xs), free(wgu), free(wd), free(p), free(dy), free(want), free(got), free(gu);
  dfree_all();
}

/* rt_cuda_mlp_bwd_split (the executor's split layout, gpu_views.h) against rt_cuda_mlp_bwd_rows
 * on the same inputs, gate_up read as a window (rows ldg > 2F apart, from column 8): dg | du and
 * act bit for bit the rows' f32 values rounded to bf16 (as the casts it replaces round them);
 * dp to rtol 1e-6 (double sums in another order). F = 24 is one 16-byte chunk or less a thread;
 * F = 2056 gives thread 0 a second chunk past the block's first 2048 columns (the batched loads)
 * and the others one. */
static void test_mlp_bwd_split(cg_dtype t, int64_t F) {
  const int64_t ldg = 2 * F + 16, WB = 3 * F + 4;
  float *gu = rnd(S * ldg, -2, 2, t), *dact = rnd(S * F, -1, 1, CG_DT_F32), *p = rnd(S, 0.1f, 1, CG_DT_F32);
  float *rows = falloc(S * WB), *want = falloc(S * 3 * F), *got = falloc(S * 3 * F), *dpw = falloc(S), *dpg = falloc(S);
  gpu_ptr dgu = up_f(gu, S * ldg, t), dd = up_f(dact, S * F, CG_DT_F32), dp = up_f(p, S, CG_DT_F32);
  gpu_ptr drows = dmalloc((size_t)(S * WB) * 4), dsplit = dmalloc((size_t)(S * 3 * F) * 2 + (size_t)S * 4);
  const gpu_ptr window = dgu + (gpu_ptr)(8 * dts(t)), act = dsplit + (gpu_ptr)(S * 2 * F * 2), dpo = dsplit + (gpu_ptr)(S * 3 * F * 2);
  RUN(rt_cuda_mlp_bwd_rows(K, t, CG_DT_F32, dd, window, ldg, dp, drows, S, F, WB));
  RUN(rt_cuda_mlp_bwd_split(K, t, dd, window, ldg, dp, dsplit, act, dpo, S, F));
  get_f(rows, drows, S * WB, CG_DT_F32);
  for (int64_t r = 0; r < S; r++) {
    memcpy(want + r * 2 * F, rows + r * WB, (size_t)(2 * F) * 4);
    memcpy(want + S * 2 * F + r * F, rows + r * WB + 2 * F, (size_t)F * 4);
    dpw[r] = rows[r * WB + 3 * F];
  }
  get_f(got, dsplit, S * 3 * F, CG_DT_BF16);
  char what[64];
  snprintf(what, sizeof what, "mlp_bwd_split dg|du, act (gate_up %s, F %lld)", cg_dtype_name(t), (long long)F);
  cmp(what, got, want, S * 3 * F, CG_DT_BF16, -1, 0);
  get_f(dpg, dpo, S, CG_DT_F32);
  snprintf(what, sizeof what, "mlp_bwd_split dp (gate_up %s, F %lld)", cg_dtype_name(t), (long long)F);
  cmp(what, dpg, dpw, S, CG_DT_F32, 1e-6, 1e-6 * maxabs(dpw, S));
  expect_flag("mlp_bwd_split", CK_OK);
  free(gu), free(dact), free(p), free(rows), free(want), free(got), free(dpw), free(dpg);
  dfree_all();
}

/* mlp_bwd_split reading gate_up from its stored MXFP8 form (E4M3 + E8M0 codes, block 32
 * sharing 128, as the saved gate_up is kept) must give, bit for bit, what it gives on the
 * values rt_cuda_mxfp8_dequantize expands from that form (2F = 128 here); a NaN among the
 * inputs checks that the NaN group decodes alike. */
static void test_mlp_bwd_split_mx(cg_dtype t) {
  const int64_t F = 64; /* rows of 2F = 128: whole 128-element MXFP8 groups */
  float *gu = rnd(S * 2 * F, -2, 2, CG_DT_F32), *dact = rnd(S * F, -1, 1, CG_DT_F32), *p = rnd(S, 0.1f, 1, CG_DT_F32);
  gu[3 * 2 * F + 5] = NAN;
  float *want = falloc(S * 3 * F), *got = falloc(S * 3 * F), *dpw = falloc(S), *dpg = falloc(S);
  gpu_ptr dx = up_f(gu, S * 2 * F, t), dd = up_f(dact, S * F, CG_DT_F32), dp = up_f(p, S, CG_DT_F32);
  gpu_ptr q = dmalloc((size_t)(S * 2 * F)), sc = dmalloc((size_t)(S * 2 * F / 32)), vals = dmalloc((size_t)(S * 2 * F) * dts(t));
  gpu_ptr s1 = dmalloc((size_t)(S * 3 * F) * 2 + (size_t)S * 4), s2 = dmalloc((size_t)(S * 3 * F) * 2 + (size_t)S * 4);
  RUN(rt_cuda_mxfp8_quantize(K, t, dx, S, 2 * F, 32, 1, q, sc));
  RUN(rt_cuda_mxfp8_dequantize(K, t, q, sc, S, 2 * F, 32, vals));
  const gpu_ptr o1 = s1 + (gpu_ptr)(S * 2 * F * 2), d1 = s1 + (gpu_ptr)(S * 3 * F * 2);
  const gpu_ptr o2 = s2 + (gpu_ptr)(S * 2 * F * 2), d2 = s2 + (gpu_ptr)(S * 3 * F * 2);
  RUN(rt_cuda_mlp_bwd_split(K, t, dd, vals, 2 * F, dp, s1, o1, d1, S, F));
  RUN(rt_cuda_mlp_bwd_split_mx(K, t, dd, 0, 0, q, sc, 32, dp, s2, o2, d2, S, F, 0, 0, 0));
  get_f(want, s1, S * 3 * F, CG_DT_BF16);
  get_f(got, s2, S * 3 * F, CG_DT_BF16);
  char what[64];
  snprintf(what, sizeof what, "mlp_bwd_split from MXFP8 (%s values)", cg_dtype_name(t));
  cmp(what, got, want, S * 3 * F, CG_DT_BF16, -1, 0);
  get_f(dpw, d1, S, CG_DT_F32);
  get_f(dpg, d2, S, CG_DT_F32);
  snprintf(what, sizeof what, "mlp_bwd_split dp from MXFP8 (%s values)", cg_dtype_name(t));
  cmp(what, dpg, dpw, S, CG_DT_F32, -1, 0);
  CHECK(rt_cuda_mlp_bwd_split_mx(K, t, dd, 0, 0, q, sc, 3 * F, dp, s2, o2, d2, S, F, 0, 0, 0) != 0,
        "mlp_bwd_split_mx accepted blocks of 3F that do not divide a row");
  expect_flag("mlp_bwd_split_mx", CK_OK);
  free(gu), free(dact), free(p), free(want), free(got), free(dpw), free(dpg);
  dfree_all();
}

/* mlp_bwd_split quantizing its own dg | du (the dgrad GEMM's MXFP8 rows, VIEW_SPLIT_Q) must
 * write, byte for byte, the split buffer the plain split writes and the E4M3 bytes and E8M0
 * codes that rt_cuda_mxfp8_quantize_win (blocks of 32 sharing 128) makes of its stored dg | du. F = 384
 * leaves the second half-warp of each row's last 256 columns idle (it runs the shuffles on
 * zeros); a NaN in dact checks the NaN group; mx: gate_up read from its stored MXFP8 form. */
static void test_mlp_bwd_split_q(cg_dtype t, int64_t Fq, int mx) {
  const int64_t block = 32; /* sharing 128, as mxfp8(block=128)'s quantizes */
  const int64_t ldg = 2 * Fq + 8, n2 = S * 2 * Fq;
  const size_t bytes = (size_t)(S * 3 * Fq) * 2 + (size_t)S * 4;
  float *gu = rnd(S * ldg, -2, 2, t), *dact = rnd(S * Fq, -1, 1, CG_DT_F32), *p = rnd(S, 0.1f, 1, CG_DT_F32);
  dact[2 * Fq + 7] = NAN;
  gpu_ptr dgu = up_f(gu, S * ldg, t), dd = up_f(dact, S * Fq, CG_DT_F32), dp = up_f(p, S, CG_DT_F32);
  gpu_ptr gq = 0, gsc = 0, s1 = dmalloc(bytes), s2 = dmalloc(bytes), q1 = dmalloc((size_t)n2), q2 = dmalloc((size_t)n2),
          c1 = dmalloc((size_t)(n2 / block)), c2 = dmalloc((size_t)(n2 / block));
  const gpu_ptr window = dgu + (gpu_ptr)(8 * dts(t));
  if (mx) { /* the saved gate_up as grouped_mlp stores it: rows of 2F, blocks of 32 sharing 128 */
    gq = dmalloc((size_t)n2), gsc = dmalloc((size_t)(n2 / 32));
    RUN(rt_cuda_mxfp8_quantize_win(K, t, dgu, ldg, 8, 0, S, 2 * Fq, 32, 1, gq, gsc, 0, 1, 0));
  }
  const gpu_ptr o1 = s1 + (gpu_ptr)(n2 * 2), d1 = s1 + (gpu_ptr)(S * 3 * Fq * 2);
  const gpu_ptr o2 = s2 + (gpu_ptr)(n2 * 2), d2 = s2 + (gpu_ptr)(S * 3 * Fq * 2);
  RUN(rt_cuda_mlp_bwd_split_mx(K, t, dd, mx ? 0 : window, ldg, gq, gsc, 32, dp, s1, o1, d1, S, Fq, 0, 0, 0));
  RUN(rt_cuda_mlp_bwd_split_mx(K, t, dd, mx ? 0 : window, ldg, gq, gsc, 32, dp, s2, o2, d2, S, Fq, q2, c2, block));
  RUN(rt_cuda_mxfp8_quantize_win(K, CG_DT_BF16, s1, 2 * Fq, 0, 0, S, 2 * Fq, block, 1, q1, c1, 0, 1, 0));
  uint8_t *b1 = malloc(bytes), *b2 = malloc(bytes);
  download(b1, s1, bytes);
  download(b2, s2, bytes);
  CHECK(memcmp(b1, b2, bytes) == 0, "mlp_bwd_split_q [%s, F %lld, block %lld%s]: dg | du, act or dp differ from the plain split's",
        cg_dtype_name(t), (long long)Fq, (long long)block, mx ? ", from MXFP8" : "");
  download(b1, q1, (size_t)n2);
  download(b2, q2, (size_t)n2);
  int64_t bad = 0;
  for (int64_t i = 0; i < n2; i++) bad += b1[i] != b2[i];
  download(b1, c1, (size_t)(n2 / block));
  download(b2, c2, (size_t)(n2 / block));
  int64_t nan_codes = 0;
  for (int64_t i = 0; i < n2 / block; i++) bad += b1[i] != b2[i], nan_codes += b2[i] == 0xFF;
  const int ok = bad == 0 && nan_codes > 0;
  CHECK(ok, "mlp_bwd_split_q [%s, F %lld, block %lld%s]: %lld bytes and codes differ from quantizing the "
        "stored dg | du (%lld NaN codes, want some)", cg_dtype_name(t), (long long)Fq, (long long)block, mx ? ", from MXFP8" : "",
        (long long)bad, (long long)nan_codes);
  CHECK(rt_cuda_mlp_bwd_split_mx(K, t, dd, window, ldg, 0, 0, 0, dp, s2, o2, d2, S, Fq - 8, q2, c2, block) != 0,
        "mlp_bwd_split_q accepted F %% 128 != 0");
  CHECK(rt_cuda_mlp_bwd_split_mx(K, t, dd, window, ldg, 0, 0, 0, dp, s2, o2, d2, S, Fq, q2, c2, 48) != 0,
        "mlp_bwd_split_q accepted blocks of 48");
  /* off 16-byte alignment the kernel would take its element path, which writes no E4M3 rows */
  CHECK(rt_cuda_mlp_bwd_split_mx(K, t, dd, window, ldg, 0, 0, 0, dp, s2, o2, d2, S, Fq, q2 + 8, c2, block) != 0,
        "mlp_bwd_split_q accepted E4M3 rows off 16-byte alignment");
  CHECK(rt_cuda_mlp_bwd_split_mx(K, t, dd, window + (gpu_ptr)dts(t), ldg, 0, 0, 0, dp, s2, o2, d2, S, Fq, q2, c2, block) != 0,
        "mlp_bwd_split_q accepted gate_up off 16-byte alignment");
  if (ok)
    printf("  mlp_bwd_split_q [%s, F %lld, block %lld%s]: %lld values and codes, bit-exact\n", cg_dtype_name(t), (long long)Fq,
         (long long)block, mx ? ", from MXFP8" : "", (long long)(n2 + n2 / block));
  expect_flag("mlp_bwd_split_q", CK_OK);
  free(gu), free(dact), free(p), free(b1), free(b2);
  dfree_all();
}

/* mlp_bwd_split_fp8 (VIEW_SPLIT_FP8) must write, byte for byte, what the split quantizing its
 * rows (mlp_bwd_split_q) and then the column quantizes of its bf16 pieces write: dg | du's E4M3
 * rows and codes, the expert columns of dg | du (C = 2F) and of act (C = F) with their f32
 * scales, and dp's bits. Experts of 133 rows (two units, the second short), 0, 40 and 21; a NaN
 * in dact checks the NaN groups both ways; mx: gate_up read from its stored MXFP8 form; wide:
 * the columns in one (C, ldq) matrix (the wgmma layout). Every output is filled first, so a
 * byte left unwritten shows. */
static void test_mlp_bwd_split_fp8(cg_dtype t, int64_t Fq, int mx, int wide) {
  enum { E4 = 4 };
  const int32_t counts[E4] = {133, 0, 40, S - 173};
  const int64_t block = 32, ldg = 2 * Fq + 8, n2 = S * 2 * Fq, ldq = wide ? fp8_cols_ld(S, E4) : 0;
  const int64_t col_bytes = ldq > S + 128 * E4 ? ldq : S + 128 * E4, units = S / 128 + E4; /* as fp8_pack's */
  const size_t split_bytes = (size_t)(S * 3 * Fq) * 2 + (size_t)S * 4;
  /* the outputs, each as [reference, fused]: rows, codes, dg | du's columns and scales, act's, dp */
  const size_t size[7] = {(size_t)n2, (size_t)(n2 / block), (size_t)(2 * Fq * col_bytes), (size_t)(2 * Fq * units) * 4,
                          (size_t)(Fq * col_bytes), (size_t)(Fq * units) * 4, (size_t)S * 4};
  float *gu = rnd(S * ldg, -2, 2, t), *dact = rnd(S * Fq, -1, 1, CG_DT_F32), *p = rnd(S, 0.1f, 1, CG_DT_F32);
  dact[130 * Fq + 77] = NAN; /* in expert 0's second, short unit */
  gpu_ptr dgu = up_f(gu, S * ldg, t), dd = up_f(dact, S * Fq, CG_DT_F32), dp = up_f(p, S, CG_DT_F32), dc = up_raw(counts, 4 * E4);
  gpu_ptr out[2][7], gq = 0, gsc = 0, s1 = dmalloc(split_bytes), dpc = dmalloc((size_t)(S * Fq / 8) * 4);
  for (int w = 0; w < 2; w++)
    for (int i = 0; i < 7; i++) {
      out[w][i] = dmalloc(size[i]);
      CHECK(gpu_memset8(G, out[w][i], 0xA5, size[i]) == 0, "memset");
    }
  const gpu_ptr window = dgu + (gpu_ptr)(8 * dts(t));
  if (mx) { /* the saved gate_up as grouped_mlp stores it: rows of 2F, blocks of 32 sharing 128 */
    gq = dmalloc((size_t)n2), gsc = dmalloc((size_t)(n2 / 32));
    RUN(rt_cuda_mxfp8_quantize_win(K, t, window, ldg, 0, 0, S, 2 * Fq, 32, 1, gq, gsc, 0, 1, 0));
  }
  gpu_ptr *o = out[0];
  RUN(rt_cuda_mlp_bwd_split_mx(K, t, dd, mx ? 0 : window, ldg, gq, gsc, 32, dp, s1, s1 + (gpu_ptr)(n2 * 2), o[6], S, Fq, o[0],
                               o[1], block));
  RUN(rt_cuda_mxfp8_quantize_cols_experts_win(K, CG_DT_BF16, s1, 2 * Fq, 0, 0, S, 2 * Fq, dc, E4, ldq, o[2], o[3], 0, 1, 0));
  RUN(rt_cuda_mxfp8_quantize_cols_experts_win(K, CG_DT_BF16, s1 + (gpu_ptr)(n2 * 2), Fq, 0, 0, S, Fq, dc, E4, ldq, o[4], o[5],
                                              0, 1, 0));
  o = out[1];
  rt_split_fp8 f = {o[0], o[1], block, o[2], o[3], o[4], o[5], ldq, dpc, mx}; /* mx: with the L2 hint too */
  RUN(rt_cuda_mlp_bwd_split_fp8(K, t, dd, mx ? 0 : window, ldg, gq, gsc, 32, dp, dc, E4, o[6], S, Fq, &f));
  static const char *const what[7] = {"dg | du's rows", "their codes", "dg | du's columns", "their scales",
                                      "act's columns",  "their scales", "dp"};
  int64_t bad = 0, nan_codes = 0, nan_scales = 0;
  for (int i = 0; i < 7; i++) {
    uint8_t *b1 = malloc(size[i]), *b2 = malloc(size[i]);
    download(b1, out[0][i], size[i]);
    download(b2, out[1][i], size[i]);
    int64_t d = 0;
    for (size_t j = 0; j < size[i]; j++) d += b1[j] != b2[j];
    CHECK(d == 0, "mlp_bwd_split_fp8 [%s, F %lld%s%s]: %lld bytes of %s differ from the split and separate quantizes'",
          cg_dtype_name(t), (long long)Fq, mx ? ", from MXFP8" : "", wide ? ", ldq" : "", (long long)d, what[i]);
    for (size_t j = 0; i == 1 && j < size[i]; j++) nan_codes += b2[j] == 0xFF;
    for (size_t j = 0; i == 3 && j < size[i] / 4; j++) {
      float v;
      memcpy(&v, b2 + 4 * j, 4);
      nan_scales += isnan(v);
    }
    bad += d;
    free(b1), free(b2);
  }
  CHECK(nan_codes > 0 && nan_scales > 0, "mlp_bwd_split_fp8: %lld NaN row codes and %lld NaN column scales, want some of each",
        (long long)nan_codes, (long long)nan_scales);
  rt_split_fp8 b = f;
  CHECK(rt_cuda_mlp_bwd_split_fp8(K, t, dd, mx ? 0 : window, ldg, gq, gsc, 32, dp, dc, E4, o[6], S, Fq - 8, &f) != 0,
        "mlp_bwd_split_fp8 accepted F %% 128 != 0");
  b.ldq = 100;
  CHECK(rt_cuda_mlp_bwd_split_fp8(K, t, dd, mx ? 0 : window, ldg, gq, gsc, 32, dp, dc, E4, o[6], S, Fq, &b) != 0,
        "mlp_bwd_split_fp8 accepted ldq 100");
  b = f, b.qa += 8;
  CHECK(rt_cuda_mlp_bwd_split_fp8(K, t, dd, mx ? 0 : window, ldg, gq, gsc, 32, dp, dc, E4, o[6], S, Fq, &b) != 0,
        "mlp_bwd_split_fp8 accepted act's columns off 16-byte alignment");
  if (bad == 0)
    printf("  mlp_bwd_split_fp8 [%s, F %lld%s%s]: rows, columns, scales and dp, byte for byte\n", cg_dtype_name(t),
           (long long)Fq, mx ? ", from MXFP8" : "", wide ? ", ldq" : "");
  expect_flag("mlp_bwd_split_fp8", CK_OK);
  free(gu), free(dact), free(p);
  dfree_all();
}

/* The activation quantized in one pass (grouped_mlp's FP8 path) must be, byte for byte, the
 * activation stored (mlp_act) and then quantized (mxfp8_quantize, 128-shared blocks of 32), on
 * gate_up read as a window of a wider row; a NaN checks the NaN group. */
static void test_quantize_act(cg_dtype t) {
  const int64_t F = 256, ldg = 2 * F + 40;
  float *gu = rnd(S * ldg, -3, 3, t), *p = rnd(S, 0.1f, 1, CG_DT_F32);
  gu[5 * ldg + 19] = NAN;     /* inside both windows, in g */
  gu[9 * ldg + F + 40] = NAN; /* and in u */
  gpu_ptr dgu = up_f(gu, S * ldg, t), dp = up_f(p, S, CG_DT_F32), act = dmalloc((size_t)(S * F) * dts(t));
  gpu_ptr q1 = dmalloc((size_t)(S * F)), c1 = dmalloc((size_t)(S * F / 32)), q2 = dmalloc((size_t)(S * F)),
          c2 = dmalloc((size_t)(S * F / 32));
  uint8_t *a1 = malloc((size_t)(S * F)), *a2 = malloc((size_t)(S * F)), *s1 = malloc((size_t)(S * F / 32)),
          *s2 = malloc((size_t)(S * F / 32));
  gpu_ptr g1 = dmalloc((size_t)(S * 2 * F)), e1 = dmalloc((size_t)(S * 2 * F / 32)), g2 = dmalloc((size_t)(S * 2 * F)),
          e2 = dmalloc((size_t)(S * 2 * F / 32));
  uint8_t *b1 = malloc((size_t)(S * 2 * F)), *b2 = malloc((size_t)(S * 2 * F)), *t1 = malloc((size_t)(S * 2 * F / 32)),
          *t2 = malloc((size_t)(S * 2 * F / 32));
  /* a window 16 elements in (16-byte chunks: the branch-free loads) and 3 in (element loads) */
  const int64_t starts[] = {16, 3};
  for (int w = 0; w < 2; w++) {
    const gpu_ptr window = dgu + (gpu_ptr)(starts[w] * dts(t));
    RUN(rt_cuda_mlp_act(K, t, window, ldg, dp, act, S, F));
    RUN(rt_cuda_mxfp8_quantize(K, t, act, S, F, 32, 1, q1, c1));
    RUN(rt_cuda_mxfp8_quantize_act(K, t, window, ldg, dp, S, F, 32, 1, q2, c2));
    download(a1, q1, (size_t)(S * F));
    download(a2, q2, (size_t)(S * F));
    download(s1, c1, (size_t)(S * F / 32));
    download(s2, c2, (size_t)(S * F / 32));
    CHECK(memcmp(a1, a2, (size_t)(S * F)) == 0 && memcmp(s1, s2, (size_t)(S * F / 32)) == 0,
          "quantize_act [%s, window at %lld] differs from mlp_act then mxfp8_quantize", cg_dtype_name(t),
          (long long)starts[w]);
    /* with gate_up's own quantize from the same loads (grouped_mlp's saved gate_up): the act's
       bytes unchanged, and gate_up's those of mxfp8_quantize on its (S, 2F) window; the outputs
       filled first, so that a byte left unwritten shows */
    RUN(rt_cuda_mxfp8_quantize_win(K, t, window, ldg, 0, 0, S, 2 * F, 32, 1, g1, e1, 0, 1, 0));
    CHECK(gpu_memset8(G, q2, 0xA5, (size_t)(S * F)) == 0 && gpu_memset8(G, c2, 0xA5, (size_t)(S * F / 32)) == 0 &&
              gpu_memset8(G, g2, 0xA5, (size_t)(S * 2 * F)) == 0 && gpu_memset8(G, e2, 0xA5, (size_t)(S * 2 * F / 32)) == 0,
          "memset");
    RUN(rt_cuda_mxfp8_quantize_act_store(K, t, window, ldg, dp, S, F, 32, 1, q2, c2, g2, e2));
    download(a2, q2, (size_t)(S * F));
    download(s2, c2, (size_t)(S * F / 32));
    download(b1, g1, (size_t)(S * 2 * F));
    download(b2, g2, (size_t)(S * 2 * F));
    download(t1, e1, (size_t)(S * 2 * F / 32));
    download(t2, e2, (size_t)(S * 2 * F / 32));
    CHECK(memcmp(a1, a2, (size_t)(S * F)) == 0 && memcmp(s1, s2, (size_t)(S * F / 32)) == 0,
          "quantize_act_store [%s, window at %lld]: the act differs from quantize_act's", cg_dtype_name(t), (long long)starts[w]);
    CHECK(memcmp(b1, b2, (size_t)(S * 2 * F)) == 0 && memcmp(t1, t2, (size_t)(S * 2 * F / 32)) == 0,
          "quantize_act_store [%s, window at %lld]: gate_up's bytes differ from mxfp8_quantize's", cg_dtype_name(t),
          (long long)starts[w]);
  }
  CHECK(rt_cuda_mxfp8_quantize_act_store(K, t, dgu, ldg, dp, S, F, 32, 1, q2, c2, g2, 0) != 0,
        "quantize_act_store accepted gate_up's bytes without their codes");
  CHECK(rt_cuda_mxfp8_quantize_act(K, t, dgu, 2 * F - 2, dp, S, F, 32, 1, q2, c2) != 0,
        "quantize_act accepted gate_up rows narrower than 2F");
  printf("  %-44s %6lld values, bit-exact (elements and codes)\n",
         t == CG_DT_BF16 ? "quantize_act (+ gate_up's) [bf16]" : "quantize_act (+ gate_up's) [f32]", (long long)(2 * S * F));
  expect_flag("quantize_act", CK_OK);
  free(gu), free(p), free(a1), free(a2), free(s1), free(s2), free(b1), free(b2), free(t1), free(t2);
  dfree_all();
}

int main(void) {
  double t0 = ck_now();
  uint64_t seed;
  int st = gpu_test_start(&seed);
  if (st) return st < 0;
  printf("GPU 0: %s; seed %llu (MOEC_TEST_SEED repeats it)\n", gpu_info(G)->name, (unsigned long long)seed);
  test_sort();
  for (int t = 0; t < CG_DT_COUNT; t++) {
    test_permute((cg_dtype)t);
    test_copy_cols((cg_dtype)t);
    for (int w = 0; w < CG_DT_COUNT; w++) test_grouped_gemm((cg_dtype)t, (cg_dtype)w);
    test_grouped_mlp((cg_dtype)t);
    test_mlp_bwd_split((cg_dtype)t, F);
    test_mlp_bwd_split((cg_dtype)t, 2056);
    test_mlp_bwd_split_mx((cg_dtype)t);
    test_mlp_bwd_split_q((cg_dtype)t, 384, 0);
    test_mlp_bwd_split_q((cg_dtype)t, 256, 0);
    test_mlp_bwd_split_q((cg_dtype)t, 384, 1);
    test_mlp_bwd_split_fp8((cg_dtype)t, 384, 0, 0);
    test_mlp_bwd_split_fp8((cg_dtype)t, 256, 1, 1);
    test_mlp_bwd_split_fp8((cg_dtype)t, 384, 1, 0);
    test_quantize_act((cg_dtype)t);
  }
  rt_cuda_free(K);
  gpu_close(G);
  return ck_finish("test_gpu_fused", t0);
}
