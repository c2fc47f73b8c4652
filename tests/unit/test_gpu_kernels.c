/* test_gpu_kernels.c -- every generated kernel on the GPU against its CPU reference kernel
 * (cpu_kernels.h), on fresh random inputs (never zeros; the seed is printed, MOEC_TEST_SEED
 * repeats a run), for f32 and bf16 storage. Skips, and passes, where there is no CUDA driver
 * or GPU.
 *
 * Tolerances, per op (bf16 outputs: the CPU result is rounded to bf16 first, and an inexact
 * op may differ by one bf16 rounding, 2^-7 relative, on top of its own tolerance):
 *   exact (bit for bit): cast, mul, add, fill, slice_cols, embedding fwd and bwd, rope fwd and
 *     bwd, topk, the expert permutation, dispatch fwd and bwd (one expert), combine fwd and its
 *     dy, AdamW, MXFP8 quantize (both modes, both orientations) and dequantize. These do the
 *     CPU's float operations in the CPU's order (NVRTC runs with --fmad=false).
 *   rtol 2e-6: silu fwd, softmax rows, route weights fwd (CUDA's expf is within 2 ulp of
 *     glibc's); 4e-6 silu bwd.
 *   rtol 1e-6: rmsnorm fwd, cross-entropy loss, z loss, grad norm, combine dw (sums in double,
 *     in another order; 1e-12 for logsumexp rows, which stay in double).
 *   rtol 1e-5 plus an absolute floor of 1e-5 of the largest value: rmsnorm dx and dw, route
 *     weights bwd, aux and z loss gradients, cross-entropy gradient, column sums, the
 *     all-experts dispatch backward: float sums in another order, and cancellation.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ck_test.h"
#include "runtime/ck_grouped.h"
#include "runtime/gpu_blas.h"
#include "runtime/gpu_kernels.h"
#include "runtime/gpu_loader.h"

#include "gpu_test.h"

enum { T = 777, H = 320, V = 256, E = 8, KK = 2, NH = 4, HD = 64, SEQ = 200 };
static const float EPS = 1e-5f;

/* ---- elementwise ---- */

static void test_cast(void) {
  printf("cast (round to nearest even; specials and ties):\n");
  const int64_t n = 4096;
  for (int ti = 0; ti < CG_DT_COUNT; ti++)
    for (int to = 0; to < CG_DT_COUNT; to++) {
      float *x = rnd(n, -3, 3, (cg_dtype)ti), *y = falloc(n);
      const float sp[] = {NAN, -NAN, INFINITY, -INFINITY, -0.0f, 3.4028235e38f, 1.0f + 0x1p-8f, 1.0f + 0x3p-8f,
                          -1.0f - 0x1p-8f, 0x1p-130f, 3.3961776e38f};
      for (size_t i = 0; i < sizeof sp / sizeof sp[0]; i++) x[i] = sp[i];
      if (ti == CG_DT_BF16) ck_round_bf16(x, n);
      gpu_ptr dx = up_f(x, n, (cg_dtype)ti), dy = dmalloc((size_t)n * dts((cg_dtype)to));
      RUN(rt_cuda_cast(K, (cg_dtype)ti, dx, (cg_dtype)to, dy, n));
      get_f(y, dy, n, (cg_dtype)to);
      char what[64];
      snprintf(what, sizeof what, "cast %s -> %s", cg_dtype_name((cg_dtype)ti), cg_dtype_name((cg_dtype)to));
      cmp(what, y, x, n, (cg_dtype)to, -1, 0);
      /* the scalar path (16-byte loads need aligned pointers) and the tail past n / 8 * 8:
       * from the second element on, n - 4 values */
      RUN(rt_cuda_cast(K, (cg_dtype)ti, dx + dts((cg_dtype)ti), (cg_dtype)to, dy, n - 4));
      get_f(y, dy, n - 4, (cg_dtype)to);
      snprintf(what, sizeof what, "cast %s -> %s, unaligned, n %% 8 = 4", cg_dtype_name((cg_dtype)ti), cg_dtype_name((cg_dtype)to));
      cmp(what, y, x + 1, n - 4, (cg_dtype)to, -1, 0);
      RUN(rt_cuda_cast(K, (cg_dtype)ti, dx, (cg_dtype)to, dy, n - 3));
      get_f(y, dy, n - 3, (cg_dtype)to);
      snprintf(what, sizeof what, "cast %s -> %s, n %% 8 = 5", cg_dtype_name((cg_dtype)ti), cg_dtype_name((cg_dtype)to));
      cmp(what, y, x, n - 3, (cg_dtype)to, -1, 0);
      free(x), free(y);
      dfree_all();
    }
}

static void test_elementwise(cg_dtype t) {
  printf("elementwise [%s]:\n", cg_dtype_name(t));
  const int64_t n = (int64_t)T * H;
  float *a = rnd(n, -4, 4, t), *b = rnd(n, -2, 2, t), *dy = rnd(n, -1, 1, t);
  float *want = falloc(n), *want2 = falloc(n), *got = falloc(n);
  gpu_ptr da = up_f(a, n, t), db = up_f(b, n, t), ddy = up_f(dy, n, t), dout = dmalloc((size_t)n * 4), dout2 = dmalloc((size_t)n * 4);

  ck_silu_fwd(a, want, n);
  RUN(rt_cuda_silu_fwd(K, t, da, dout, n));
  get_f(got, dout, n, t);
  cmp("silu fwd", got, want, n, t, 2e-6, 1e-7);
  ck_silu_bwd(a, dy, want, n);
  RUN(rt_cuda_silu_bwd(K, t, da, ddy, dout, n));
  get_f(got, dout, n, t);
  cmp("silu bwd", got, want, n, t, 4e-6, 1e-6);

  ck_mul_fwd(a, b, want, n);
  RUN(rt_cuda_mul_fwd(K, t, da, db, dout, n));
  get_f(got, dout, n, t);
  cmp("mul fwd", got, want, n, t, -1, 0);
  ck_mul_bwd(a, b, dy, want, want2, n);
  RUN(rt_cuda_mul_bwd(K, t, da, db, ddy, dout, dout2, n));
  get_f(got, dout, n, t);
  cmp("mul bwd da", got, want, n, t, -1, 0);
  get_f(got, dout2, n, t);
  cmp("mul bwd db", got, want2, n, t, -1, 0);
  RUN(rt_cuda_mul_bwd(K, t, da, db, ddy, 0, dout2, n)); /* da = NULL */
  get_f(got, dout2, n, t);
  cmp("mul bwd db alone", got, want2, n, t, -1, 0);

  ck_add_fwd(a, b, want, n);
  RUN(rt_cuda_add_fwd(K, t, da, db, dout, n));
  get_f(got, dout, n, t);
  cmp("add fwd", got, want, n, t, -1, 0);
  RUN(rt_cuda_add_bwd(K, t, ddy, dout, ddy, n)); /* db aliases dy: left alone */
  get_f(got, dout, n, t);
  cmp("add bwd da", got, dy, n, t, -1, 0);
  get_f(got, ddy, n, t);
  cmp("add bwd db aliasing dy", got, dy, n, t, -1, 0);

  RUN(rt_cuda_fill(K, t, dout, n, -0.3f));
  for (int64_t i = 0; i < n; i++) want[i] = -0.3f;
  get_f(got, dout, n, t);
  cmp("fill", got, want, n, t, -1, 0);

  const int64_t start = 37, w = 101;
  for (int64_t r = 0; r < T; r++)
    for (int64_t c = 0; c < w; c++) want[r * w + c] = a[r * H + start + c];
  RUN(rt_cuda_slice_cols(K, t, da, dout, T, H, start, w));
  get_f(got, dout, T * w, t);
  cmp("slice_cols", got, want, T * w, t, -1, 0);

  /* column sums into f32, fresh and accumulating */
  double *ws = dalloc(H);
  float *acc0 = rnd(H, -1, 1, CG_DT_F32);
  for (int64_t c = 0; c < H; c++) {
    double s = 0;
    for (int64_t r = 0; r < T; r++) s += a[r * H + c];
    ws[c] = s;
  }
  RUN(rt_cuda_colsum(K, t, da, dout, T, H, 0));
  get_f(got, dout, H, CG_DT_F32);
  check_close("colsum (f32 out)", got, ws, H, 1e-5, 1e-5 * T);
  for (int64_t c = 0; c < H; c++) ws[c] += acc0[c];
  upload(dout, acc0, H * 4);
  RUN(rt_cuda_colsum(K, t, da, dout, T, H, 1));
  get_f(got, dout, H, CG_DT_F32);
  check_close("colsum accumulate (f32 out)", got, ws, H, 1e-5, 1e-5 * T);
  expect_flag("elementwise", CK_OK);
  free(a), free(b), free(dy), free(want), free(want2), free(got), free(ws), free(acc0);
  dfree_all();
}

/* ---- dense ---- */

static void test_embedding(cg_dtype t) {
  printf("embedding [%s]:\n", cg_dtype_name(t));
  float *table = rnd((int64_t)V * H, -1, 1, t), *out = falloc((int64_t)T * H), *got = falloc((int64_t)T * H);
  int32_t tok[T];
  for (int i = 0; i < T; i++) tok[i] = rng_int(i % 3 ? 5 : V); /* DNA-like: a few hot rows */
  gpu_ptr dtab = up_f(table, (int64_t)V * H, t), dtok = up_raw(tok, sizeof tok), dout = dmalloc((size_t)T * H * 4);
  CHECK(ck_embedding_fwd(table, tok, out, T, V, H) == CK_OK, "ck_embedding_fwd");
  RUN(rt_cuda_embedding_fwd(K, t, dtab, dtok, dout, T, V, H));
  get_f(got, dout, (int64_t)T * H, t);
  cmp("embedding fwd", got, out, (int64_t)T * H, t, -1, 0);

  float *dy = rnd((int64_t)T * H, -1, 1, t), *dtable = rnd((int64_t)V * H, -1, 1, CG_DT_F32);
  float *gt = falloc((int64_t)V * H);
  gpu_ptr ddy = up_f(dy, (int64_t)T * H, t), ddt = up_f(dtable, (int64_t)V * H, CG_DT_F32);
  CHECK(ck_embedding_bwd(tok, dy, dtable, T, V, H) == CK_OK, "ck_embedding_bwd");
  RUN(rt_cuda_embedding_bwd(K, t, dtok, ddy, ddt, T, V, H));
  get_f(gt, ddt, (int64_t)V * H, CG_DT_F32);
  cmp("embedding bwd dtable += (f32)", gt, dtable, (int64_t)V * H, CG_DT_F32, -1, 0);
  expect_flag("embedding", CK_OK);
  { /* the backward over several windows of tokens (codegen's EB_WIN = 2048), a few hot rows,
       from the table gradient both sides hold now */
    enum { TL = 5003 };
    int32_t *tl = malloc(sizeof(int32_t) * TL);
    for (int i = 0; i < TL; i++) tl[i] = rng_int(i % 7 ? 4 : V);
    float *dyl = rnd((int64_t)TL * H, -1, 1, t);
    gpu_ptr dtl = up_raw(tl, sizeof(int32_t) * TL), ddyl = up_f(dyl, (int64_t)TL * H, t);
    CHECK(ck_embedding_bwd(tl, dyl, dtable, TL, V, H) == CK_OK, "ck_embedding_bwd (long)");
    RUN(rt_cuda_embedding_bwd(K, t, dtl, ddyl, ddt, TL, V, H));
    get_f(gt, ddt, (int64_t)V * H, CG_DT_F32);
    cmp("embedding bwd, 5003 tokens", gt, dtable, (int64_t)V * H, CG_DT_F32, -1, 0);
    free(tl), free(dyl);
  }

  tok[T / 2] = V; /* a bad token is reported, not read */
  upload(dtok, tok, sizeof tok);
  RUN(rt_cuda_embedding_fwd(K, t, dtab, dtok, dout, T, V, H));
  expect_flag("embedding fwd with token V", CK_EINDEX);
  expect_flag("the flag clears after a check", CK_OK);
  free(table), free(out), free(got), free(dy), free(dtable), free(gt);
  dfree_all();
}

static void test_rmsnorm(cg_dtype tx, cg_dtype tw) {
  printf("rmsnorm [x %s, w %s]:\n", cg_dtype_name(tx), cg_dtype_name(tw));
  const int64_t n = (int64_t)T * H;
  float *x = rnd(n, -2, 2, tx), *w = rnd(H, 0.5f, 1.5f, tw), *y = falloc(n), *got = falloc(n);
  gpu_ptr dx = up_f(x, n, tx), dw = up_f(w, H, tw), dy = dmalloc((size_t)n * 4);
  ck_rmsnorm_fwd(x, w, y, T, H, EPS);
  RUN(rt_cuda_rmsnorm_fwd(K, tx, tw, dx, dw, dy, T, H, EPS));
  get_f(got, dy, n, tx);
  cmp("rmsnorm fwd", got, y, n, tx, 1e-6, 1e-7);

  float *g = rnd(n, -1, 1, tx), *gx = falloc(n), *gw = rnd(H, -1, 1, CG_DT_F32), *gotw = falloc(H);
  gpu_ptr dg = up_f(g, n, tx), dgx = dmalloc((size_t)n * 4), dgw = up_f(gw, H, CG_DT_F32);
  ck_rmsnorm_bwd(x, w, g, gx, gw, T, H, EPS);
  RUN(rt_cuda_rmsnorm_bwd(K, tx, tw, dx, dw, dg, 0, dgx, dgw, T, H, EPS));
  get_f(got, dgx, n, tx);
  cmp("rmsnorm bwd dx", got, gx, n, tx, 1e-5, 1e-5 * maxabs(gx, n));
  get_f(gotw, dgw, H, CG_DT_F32);
  cmp("rmsnorm bwd dw += (f32)", gotw, gw, H, CG_DT_F32, 1e-5, 1e-5 * maxabs(gw, H));
  /* a residual folded in (fuse-residual): bit for bit the separate add of the residual and the
   * dx just read back, also written over the residual (the executor may reuse its buffer) */
  float *res = rnd(n, -2, 2, tx), *sum = falloc(n), *got2 = falloc(n);
  for (int64_t i = 0; i < n; i++) sum[i] = res[i] + got[i];
  if (tx == CG_DT_BF16) ck_round_bf16(sum, n);
  gpu_ptr dres = up_f(res, n, tx);
  RUN(rt_cuda_rmsnorm_bwd(K, tx, tw, dx, dw, dg, dres, dgx, 0, T, H, EPS));
  get_f(got2, dgx, n, tx);
  cmp("rmsnorm bwd dx + residual (exact)", got2, sum, n, tx, -1, 0);
  RUN(rt_cuda_rmsnorm_bwd(K, tx, tw, dx, dw, dg, dres, dres, 0, T, H, EPS));
  get_f(got2, dres, n, tx);
  cmp("rmsnorm bwd dx + residual, into the residual (exact)", got2, sum, n, tx, -1, 0);
  { /* the residual one element off 16-byte alignment: the rows' scalar path */
    float *res1 = falloc(n + 1);
    res1[0] = 1.0f;
    memcpy(res1 + 1, res, (size_t)n * sizeof *res);
    gpu_ptr dres1 = up_f(res1, n + 1, tx) + (gpu_ptr)(tx == CG_DT_BF16 ? 2 : 4);
    RUN(rt_cuda_rmsnorm_bwd(K, tx, tw, dx, dw, dg, dres1, dgx, 0, T, H, EPS));
    get_f(got2, dgx, n, tx);
    cmp("rmsnorm bwd dx + residual, unaligned (exact)", got2, sum, n, tx, -1, 0);
    free(res1);
  }
  free(res), free(sum), free(got2);
  /* in place: dx aliasing dy */
  RUN(rt_cuda_rmsnorm_bwd(K, tx, tw, dx, dw, dg, 0, dg, 0, T, H, EPS));
  get_f(got, dg, n, tx);
  cmp("rmsnorm bwd dx in place", got, gx, n, tx, 1e-5, 1e-5 * maxabs(gx, n));
  expect_flag("rmsnorm", CK_OK);
  free(x), free(w), free(y), free(got), free(g), free(gx), free(gw), free(gotw);
  dfree_all();
}

/* rope_bwd of x (T, NH*hd) placed at column off of a wider random (T, W) buffer, read in place
 * with row stride W, compared bit for bit with y (ck_rope_bwd of x); dy receives it. Returns the
 * wide buffer on the device. */
static gpu_ptr rope_window(cg_dtype t, const float *x, const float *y, float *got, gpu_ptr dy, int64_t hd, int64_t W,
                           int64_t off, const char *what) {
  const int64_t row = NH * hd, n = (int64_t)T * row, es = t == CG_DT_BF16 ? 2 : 4;
  float *wide = rnd(T * W, -2, 2, t);
  for (int64_t r = 0; r < T; r++) memcpy(wide + r * W + off, x + r * row, (size_t)row * sizeof(float));
  gpu_ptr dw = up_f(wide, T * W, t);
  RUN(rt_cuda_rope_bwd(K, t, dw + (gpu_ptr)(off * es), W, dy, T, NH, hd, SEQ, 5e5));
  get_f(got, dy, n, t);
  cmp(what, got, y, n, t, -1, 0);
  free(wide);
  return dw;
}

/* hd 64: the 16-byte path (8 pairs a thread); hd 12 (half 6): the pair-at-a-time one. */
static void test_rope(cg_dtype t, int64_t hd) {
  printf("rope [%s] (theta 5e5, seq %d over %d rows, head dim %lld):\n", cg_dtype_name(t), SEQ, T, (long long)hd);
  const int64_t n = (int64_t)T * NH * hd;
  float *x = rnd(n, -2, 2, t), *y = falloc(n), *got = falloc(n);
  gpu_ptr dx = up_f(x, n, t), dy = dmalloc((size_t)n * 4);
  CHECK(ck_rope_fwd(x, y, T, NH, hd, SEQ, 5e5) == CK_OK, "ck_rope_fwd");
  RUN(rt_cuda_rope_fwd(K, t, dx, NH * hd, dy, T, NH, hd, SEQ, 5e5));
  get_f(got, dy, n, t);
  cmp("rope fwd", got, y, n, t, -1, 0);
  CHECK(ck_rope_bwd(x, y, T, NH, hd, SEQ, 5e5) == CK_OK, "ck_rope_bwd");
  RUN(rt_cuda_rope_bwd(K, t, dx, NH * hd, dx, T, NH, hd, SEQ, 5e5)); /* in place */
  get_f(got, dx, n, t);
  cmp("rope bwd in place", got, y, n, t, -1, 0);
  CHECK(rt_cuda_rope_fwd(K, t, dx, NH * hd, dy, T, NH, hd - 1, SEQ, 5e5) != 0, "rope accepted an odd head dim");
  /* x a column window of a wider value (attention_bwd's dq | dk | dv: VIEW_COLS): the same
     values, aligned (16-byte loads) and at an odd column and row stride (pair at a time) */
  const int64_t row = NH * hd, W = row + 24;
  gpu_ptr dw = rope_window(t, x, y, got, dy, hd, W, 8, "rope bwd of a column window (row stride W > nh*hd)");
  rope_window(t, x, y, got, dy, hd, row + 3, 1, "rope bwd of an unaligned column window");
  CHECK(rt_cuda_rope_bwd(K, t, dw, W, dw, T, NH, hd, SEQ, 5e5) != 0, "rope accepted a strided x in place");
  CHECK(rt_cuda_rope_bwd(K, t, dw, row - 2, dy, T, NH, hd, SEQ, 5e5) != 0, "rope accepted a row stride under its row");
  expect_flag("rope", CK_OK);
  free(x), free(y), free(got);
  dfree_all();
}

/* ---- router ---- */

static void test_router(void) {
  printf("router (T=%d, E=%d, k=%d):\n", T, E, KK);
  const int64_t te = (int64_t)T * E;
  float *logits = rnd(te, -3, 3, CG_DT_F32), *got = falloc(te), *want = falloc(te);
  /* ties and NaN for top-k: rows 0..99 draw from four values, some rows hold a NaN */
  float *tl = dup(logits, te);
  for (int64_t i = 0; i < 100 * E; i++) tl[i] = (float)rng_int(4) - 1.0f;
  for (int64_t r = 100; r < 110; r++) tl[r * E + rng_int(E)] = NAN;
  int32_t *idx = malloc(sizeof(int32_t) * T * KK), *gidx = malloc(sizeof(int32_t) * T * KK);
  gpu_ptr dl = up_f(tl, te, CG_DT_F32), didx = dmalloc(sizeof(int32_t) * T * KK);
  CHECK(ck_topk(tl, idx, T, E, KK) == CK_OK, "ck_topk");
  RUN(rt_cuda_topk(K, dl, didx, T, E, KK));
  download(gidx, didx, sizeof(int32_t) * T * KK);
  CHECK(memcmp(idx, gidx, sizeof(int32_t) * T * KK) == 0, "topk ids differ (ties and NaN included)");
  printf("  %-44s %6d rows, exact (ties, NaN)\n", "topk", T);
  CHECK(rt_cuda_topk(K, dl, didx, T, E, E + 1) != 0, "topk accepted k > E");

  upload(dl, logits, te * 4);
  CHECK(ck_topk(logits, idx, T, E, KK) == CK_OK, "ck_topk");
  upload(didx, idx, sizeof(int32_t) * T * KK);
  gpu_ptr dout = dmalloc(te * 4), dsc = dmalloc(8);

  ck_softmax_rows(logits, want, T, E);
  RUN(rt_cuda_softmax_rows(K, dl, dout, T, E));
  get_f(got, dout, te, CG_DT_F32);
  cmp("softmax rows", got, want, te, CG_DT_F32, 2e-6, 1e-9);
  double *lse = dalloc(T), *glse = dalloc(T);
  ck_logsumexp_rows(logits, lse, T, E);
  gpu_ptr dlse = dmalloc(sizeof(double) * T);
  RUN(rt_cuda_logsumexp_rows(K, dl, dlse, T, E));
  download(glse, dlse, sizeof(double) * T);
  float *glf = falloc(T);
  for (int i = 0; i < T; i++) glf[i] = (float)(glse[i] - lse[i]);
  double *zero = dalloc(T);
  check_close("logsumexp rows (double; got - want)", glf, zero, T, 0, 1e-12 * 8);

  float *w = falloc((int64_t)T * KK), *gw = falloc((int64_t)T * KK);
  CHECK(ck_route_weights_fwd(logits, idx, w, T, E, KK) == CK_OK, "ck_route_weights_fwd");
  gpu_ptr dw = dmalloc(sizeof(float) * T * KK);
  RUN(rt_cuda_route_weights_fwd(K, dl, didx, dw, T, E, KK));
  get_f(gw, dw, (int64_t)T * KK, CG_DT_F32);
  cmp("route_weights fwd", gw, w, (int64_t)T * KK, CG_DT_F32, 2e-6, 1e-9);

  float *g = rnd((int64_t)T * KK, -1, 1, CG_DT_F32);
  gpu_ptr dg = up_f(g, (int64_t)T * KK, CG_DT_F32);
  CHECK(ck_route_weights_bwd(logits, idx, g, want, T, E, KK) == CK_OK, "ck_route_weights_bwd");
  RUN(rt_cuda_route_weights_bwd(K, dl, didx, dg, dout, T, E, KK));
  get_f(got, dout, te, CG_DT_F32);
  cmp("route_weights bwd", got, want, te, CG_DT_F32, 1e-5, 1e-5 * maxabs(want, te));

  float loss = 0, gloss = 0, dloss = 0.7f;
  gpu_ptr ddl = up_f(&dloss, 1, CG_DT_F32);
  CHECK(ck_aux_loss_fwd(logits, idx, &loss, T, E, KK, 0.01f) == CK_OK, "ck_aux_loss_fwd");
  RUN(rt_cuda_aux_loss_fwd(K, dl, didx, dsc, T, E, KK, 0.01f));
  get_f(&gloss, dsc, 1, CG_DT_F32);
  cmp("aux loss fwd", &gloss, &loss, 1, CG_DT_F32, 1e-6, 0);
  float *acc = rnd(te, -1, 1, CG_DT_F32);
  memcpy(want, acc, te * 4);
  upload(dout, acc, te * 4);
  CHECK(ck_aux_loss_bwd(logits, idx, dloss, want, T, E, KK, 0.01f) == CK_OK, "ck_aux_loss_bwd");
  RUN(rt_cuda_aux_loss_bwd(K, dl, didx, ddl, dout, T, E, KK, 0.01f));
  get_f(got, dout, te, CG_DT_F32);
  for (int64_t i = 0; i < te; i++) got[i] -= acc[i], want[i] -= acc[i]; /* compare the increments */
  /* each sum acc + increment was rounded to f32 before the subtraction recovered the increment:
     an ulp of |acc| (<= 1) of error each way, whatever the increment's size (an H200 run failed
     at 1.5e-8 against an atol of 1e-5 of the largest increment) */
  const double acc_ulp = 0x1p-22 * maxabs(acc, te);
  cmp("aux loss bwd (the += part)", got, want, te, CG_DT_F32, 1e-5, 1e-5 * maxabs(want, te) + acc_ulp);

  /* the share form: the routes of all ranks (this rank's, and random ones of 3 others) */
  int32_t counts[E];
  memset(counts, 0, sizeof counts);
  for (int64_t i = 0; i < (int64_t)T * KK; i++) counts[idx[i]]++;
  for (int e = 0; e < E; e++) counts[e] += rng_int(3 * T * KK / E + 1);
  gpu_ptr dcounts = up_raw(counts, sizeof counts);
  CHECK(ck_aux_loss_share_fwd(logits, counts, &loss, T, E, KK, 0.01f) == CK_OK, "ck_aux_loss_share_fwd");
  RUN(rt_cuda_aux_loss_share_fwd(K, dl, dcounts, dsc, T, E, KK, 0.01f));
  get_f(&gloss, dsc, 1, CG_DT_F32);
  cmp("aux loss share fwd (global counts)", &gloss, &loss, 1, CG_DT_F32, 1e-6, 0);
  memcpy(want, acc, te * 4);
  upload(dout, acc, te * 4);
  CHECK(ck_aux_loss_share_bwd(logits, counts, dloss, want, T, E, KK, 0.01f) == CK_OK, "ck_aux_loss_share_bwd");
  RUN(rt_cuda_aux_loss_share_bwd(K, dl, dcounts, ddl, dout, T, E, KK, 0.01f));
  get_f(got, dout, te, CG_DT_F32);
  for (int64_t i = 0; i < te; i++) got[i] -= acc[i], want[i] -= acc[i];
  cmp("aux loss share bwd (the += part)", got, want, te, CG_DT_F32, 1e-5, 1e-5 * maxabs(want, te) + acc_ulp);
  CHECK(maxabs(want, te) > 0, "aux loss share bwd: the reference gradient is all zero (test too weak)");
  memset(counts, 0, sizeof counts); /* no routes anywhere: loss 0, no gradient */
  upload(dcounts, counts, sizeof counts);
  upload(dout, acc, te * 4);
  RUN(rt_cuda_aux_loss_share_fwd(K, dl, dcounts, dsc, T, E, KK, 0.01f));
  RUN(rt_cuda_aux_loss_share_bwd(K, dl, dcounts, ddl, dout, T, E, KK, 0.01f));
  get_f(&gloss, dsc, 1, CG_DT_F32);
  get_f(got, dout, te, CG_DT_F32);
  CHECK(gloss == 0.0f && memcmp(got, acc, te * 4) == 0, "aux loss share with zero global counts: loss %g, gradient changed",
        gloss);

  ck_z_loss_fwd(logits, &loss, T, E, 0.001f);
  RUN(rt_cuda_z_loss_fwd(K, dl, dsc, T, E, 0.001f));
  get_f(&gloss, dsc, 1, CG_DT_F32);
  cmp("z loss fwd", &gloss, &loss, 1, CG_DT_F32, 1e-6, 0);
  memcpy(want, acc, te * 4);
  upload(dout, acc, te * 4);
  ck_z_loss_bwd(logits, dloss, want, T, E, 0.001f);
  RUN(rt_cuda_z_loss_bwd(K, dl, ddl, dout, T, E, 0.001f));
  get_f(got, dout, te, CG_DT_F32);
  for (int64_t i = 0; i < te; i++) got[i] -= acc[i], want[i] -= acc[i];
  cmp("z loss bwd (the += part)", got, want, te, CG_DT_F32, 1e-5, 1e-5 * maxabs(want, te));
  expect_flag("router", CK_OK);

  idx[5] = E; /* a bad expert id */
  upload(didx, idx, sizeof(int32_t) * T * KK);
  RUN(rt_cuda_route_weights_fwd(K, dl, didx, dw, T, E, KK));
  expect_flag("route_weights fwd with expert id E", CK_EINDEX);
  free(logits), free(got), free(want), free(tl), free(idx), free(gidx), free(lse), free(glse), free(glf), free(zero);
  free(w), free(gw), free(g), free(acc);
  dfree_all();
}

/* ---- the expert permutation, dispatch and combine ---- */

static void test_route(cg_dtype t, int distinct) {
  printf("route, dispatch, combine [%s] (%s expert ids):\n", cg_dtype_name(t),
         distinct ? "top-k, distinct per token" : "random, repeats within a token");
  const int64_t np = (int64_t)T * KK, nmax = distinct ? T : np;
  int32_t *idx = malloc(sizeof(int32_t) * np);
  if (distinct) {
    float *l = rnd((int64_t)T * E, -1, 1, CG_DT_F32);
    ck_topk(l, idx, T, E, KK);
    free(l);
  } else {
    for (int64_t i = 0; i < np; i++) idx[i] = rng_int(i % 5 ? E : 2); /* skewed: experts 0, 1 hot */
  }
  gpu_ptr didx = up_raw(idx, sizeof(int32_t) * np);
  rt_cuda_routing r = {dmalloc(4 * np), dmalloc(4 * np), dmalloc(4 * np), dmalloc(4 * E), dmalloc(4 * (E + 1))};
  RUN(rt_cuda_route(K, didx, T, KK, E, &r));
  int32_t *rows = malloc(4 * np), *slots = malloc(4 * np), *pos = malloc(4 * np), counts[E], offs[E + 1];
  download(rows, r.rows, 4 * np);
  download(slots, r.slots, 4 * np);
  download(pos, r.pos, 4 * np);
  download(counts, r.counts, sizeof counts);
  download(offs, r.offsets, sizeof offs);
  int32_t *wr = malloc(4 * np), *ws = malloc(4 * np);
  int ok = offs[0] == 0 && offs[E] == np;
  for (int e = 0; e < E; e++) {
    int64_t n = ck_route_rows(idx, T, KK, e, wr, ws);
    ok &= counts[e] == n && offs[e + 1] - offs[e] == n;
    ok &= n == 0 || (memcmp(wr, rows + offs[e], 4 * n) == 0 && memcmp(ws, slots + offs[e], 4 * n) == 0);
  }
  for (int64_t i = 0; i < np; i++) ok &= pos[i] >= 0 && pos[i] < np && rows[pos[i]] == i / KK && slots[pos[i]] == i % KK;
  CHECK(ok, "route: counts, offsets, rows, slots or pos differ from ck_route_rows");
  if (!ok) { /* the rest would index with bad rows */
    free(idx), free(rows), free(slots), free(pos), free(wr), free(ws);
    dfree_all();
    return;
  }
  printf("  %-44s %6lld pairs, exact (counts, offsets, rows, slots, pos)\n", "route (ck_route_rows, all experts)", (long long)np);

  /* dispatch per expert and all at once */
  const int64_t xn = (int64_t)T * H;
  float *x = rnd(xn, -1, 1, t), *xe = falloc(np * H), *got = falloc(np * H);
  gpu_ptr dx = up_f(x, xn, t), dxe = dmalloc(np * H * 4), dall = dmalloc(np * H * 4);
  int exact = 1;
  for (int e = 0; e < E; e++) {
    int64_t n = ck_route_rows(idx, T, KK, e, wr, ws);
    CHECK(ck_dispatch_fwd(x, wr, xe, T, n, H) == CK_OK, "ck_dispatch_fwd");
    RUN(rt_cuda_dispatch_fwd(K, t, dx, r.rows, r.offsets, e, dxe, T, nmax, H));
    get_f(got, dxe, n * H, t);
    exact &= memcmp(got, xe, (size_t)(n * H) * 4) == 0;
  }
  CHECK(exact, "dispatch fwd per expert differs");
  printf("  %-44s %6d experts, bit-exact\n", "dispatch fwd, one expert at a time", E);
  RUN(rt_cuda_dispatch_fwd(K, t, dx, r.rows, r.offsets, -1, dall, T, np, H));
  get_f(got, dall, np * H, t);
  for (int64_t p = 0; p < np; p++) memcpy(xe + p * H, x + (int64_t)rows[p] * H, H * 4);
  cmp("dispatch fwd, all experts", got, xe, np * H, t, -1, 0);

  /* dispatch bwd: per expert (exact), and the gathered all-experts form */
  float *dxa = rnd(xn, -1, 1, t), *dxw = dup(dxa, xn), *gdx = falloc(xn);
  float *ge = rnd(np * H, -1, 1, t);
  gpu_ptr dge = up_f(ge, np * H, t), ddx = up_f(dxa, xn, t);
  exact = 1;
  for (int e = 0; e < E && distinct; e++) {
    int64_t n = ck_route_rows(idx, T, KK, e, wr, ws);
    float *dxc = dup(dxa, xn);
    CHECK(ck_dispatch_bwd(ge + (int64_t)offs[e] * H, wr, dxc, T, n, H) == CK_OK, "ck_dispatch_bwd");
    if (t == CG_DT_BF16) ck_round_bf16(dxc, xn);
    gpu_ptr fresh = up_f(dxa, xn, t);
    RUN(rt_cuda_dispatch_bwd(K, t, dge + (gpu_ptr)offs[e] * H * dts(t), r.rows, r.offsets, e, fresh, T, nmax, H));
    get_f(gdx, fresh, xn, t);
    exact &= memcmp(gdx, dxc, (size_t)xn * 4) == 0;
    free(dxc);
  }
  if (distinct) {
    CHECK(exact, "dispatch bwd per expert differs");
    printf("  %-44s %6d experts, bit-exact\n", "dispatch bwd += , one expert at a time", E);
  }
  for (int e = 0; e < E; e++) {
    int64_t n = ck_route_rows(idx, T, KK, e, wr, ws);
    ck_dispatch_bwd(ge + (int64_t)offs[e] * H, wr, dxw, T, n, H);
  }
  RUN(rt_cuda_dispatch_bwd_all(K, t, dge, r.pos, ddx, T, KK, H));
  get_f(gdx, ddx, xn, t);
  cmp("dispatch bwd +=, all experts (gathered)", gdx, dxw, xn, t, 1e-5, 1e-6);

  /* combine: expert outputs stacked in permutation order */
  float *y = rnd(np * H, -1, 1, t), *w = rnd(np, 0.1f, 1, t), *out = falloc(xn);
  const float *yp[E];
  float *dyp[E];
  float *dyw = falloc(np * H), *dw = falloc(np), *gdw = falloc(np);
  for (int e = 0; e < E; e++) yp[e] = y + (int64_t)offs[e] * H, dyp[e] = dyw + (int64_t)offs[e] * H;
  gpu_ptr dy = up_f(y, np * H, t), dwt = up_f(w, np, t), dout = dmalloc(xn * 4);
  CHECK(ck_combine_fwd(idx, w, yp, out, T, KK, E, H) == CK_OK, "ck_combine_fwd");
  RUN(rt_cuda_combine_fwd(K, t, t, r.pos, dwt, dy, dout, T, KK, H));
  get_f(gdx, dout, xn, t);
  cmp("combine fwd", gdx, out, xn, t, -1, 0);
  float *go = rnd(xn, -1, 1, t);
  gpu_ptr dgo = up_f(go, xn, t), ddy = dmalloc(np * H * 4), ddw = dmalloc(np * 4);
  CHECK(ck_combine_bwd(idx, w, yp, go, dyp, dw, T, KK, E, H) == CK_OK, "ck_combine_bwd");
  RUN(rt_cuda_combine_bwd(K, t, t, r.pos, dwt, dy, dgo, ddy, ddw, T, KK, H));
  get_f(got, ddy, np * H, t);
  cmp("combine bwd dy", got, dyw, np * H, t, -1, 0);
  get_f(gdw, ddw, np, CG_DT_F32);
  cmp("combine bwd dw (f32)", gdw, dw, np, CG_DT_F32, 1e-6, 1e-7);
  expect_flag("route", CK_OK);

  idx[7] = -3;
  upload(didx, idx, 4 * np);
  RUN(rt_cuda_route(K, didx, T, KK, E, &r));
  expect_flag("route with expert id -3", CK_EINDEX);
  free(idx), free(rows), free(slots), free(pos), free(wr), free(ws), free(x), free(xe), free(got), free(dxa), free(dxw);
  free(gdx), free(ge), free(y), free(w), free(out), free(dyw), free(dw), free(gdw), free(go);
  dfree_all();
}

/* ---- loss ---- */

static void test_cross_entropy(cg_dtype t) {
  printf("cross-entropy [logits %s] (T=%d, V=%d, ~10%% masked):\n", cg_dtype_name(t), T, V);
  const int64_t n = (int64_t)T * V;
  float *logits = rnd(n, -6, 6, t), *want = falloc(n), *got = falloc(n);
  int32_t lab[T];
  for (int i = 0; i < T; i++) lab[i] = rng_int(10) == 0 ? -1 : rng_int(V);
  gpu_ptr dl = up_f(logits, n, t), dlab = up_raw(lab, sizeof lab), dsc = dmalloc(4), dg = dmalloc(n * 4);
  float loss = 0, gloss = 0, dloss = 1.3f;
  gpu_ptr ddl = up_f(&dloss, 1, CG_DT_F32);
  CHECK(ck_cross_entropy_fwd(logits, lab, &loss, T, V) == CK_OK, "ck_cross_entropy_fwd");
  RUN(rt_cuda_cross_entropy_fwd(K, t, dl, dlab, dsc, T, V));
  get_f(&gloss, dsc, 1, CG_DT_F32);
  cmp("cross-entropy loss", &gloss, &loss, 1, CG_DT_F32, 1e-6, 0);
  CHECK(ck_cross_entropy_bwd(logits, lab, dloss, want, T, V) == CK_OK, "ck_cross_entropy_bwd");
  RUN(rt_cuda_cross_entropy_bwd(K, t, dl, dlab, ddl, dg, T, V));
  get_f(got, dg, n, CG_DT_F32);
  cmp("cross-entropy dlogits (f32)", got, want, n, CG_DT_F32, 1e-5, 1e-5 * maxabs(want, n));
  /* the share forms: this rank's labels over those of all ranks */
  float n_loc = 0, n_glob = (float)(ck_label_count(lab, T) + 517), share_loss = 0;
  gpu_ptr dn = dmalloc(4), dng = up_f(&n_glob, 1, CG_DT_F32);
  RUN(rt_cuda_label_count(K, dlab, dn, T));
  get_f(&n_loc, dn, 1, CG_DT_F32);
  CHECK(n_loc == (float)ck_label_count(lab, T), "label_count %g, want %lld", n_loc, (long long)ck_label_count(lab, T));
  CHECK(ck_cross_entropy_share_fwd(logits, lab, n_glob, &share_loss, T, V) == CK_OK, "ck_cross_entropy_share_fwd");
  CHECK(share_loss < loss, "share %g of the global loss is not below the local mean %g", share_loss, loss);
  RUN(rt_cuda_cross_entropy_share_fwd(K, t, dl, dlab, dng, dsc, T, V));
  get_f(&gloss, dsc, 1, CG_DT_F32);
  cmp("cross-entropy share loss", &gloss, &share_loss, 1, CG_DT_F32, 1e-6, 0);
  CHECK(ck_cross_entropy_share_bwd(logits, lab, n_glob, dloss, want, T, V) == CK_OK, "ck_cross_entropy_share_bwd");
  RUN(rt_cuda_cross_entropy_share_bwd(K, t, dl, dlab, dng, ddl, dg, T, V));
  get_f(got, dg, n, CG_DT_F32);
  cmp("cross-entropy share dlogits (f32)", got, want, n, CG_DT_F32, 1e-5, 1e-5 * maxabs(want, n));
  n_glob = 0; /* no labels anywhere: share 0 */
  upload(dng, &n_glob, 4);
  RUN(rt_cuda_cross_entropy_share_fwd(K, t, dl, dlab, dng, dsc, T, V));
  get_f(&gloss, dsc, 1, CG_DT_F32);
  CHECK(gloss == 0.0f, "cross-entropy share with no global labels: %g", gloss);
  expect_flag("cross-entropy", CK_OK);
  lab[3] = V + 4;
  upload(dlab, lab, sizeof lab);
  RUN(rt_cuda_cross_entropy_fwd(K, t, dl, dlab, dsc, T, V));
  expect_flag("cross-entropy with label V+4", CK_EINDEX);
  free(logits), free(want), free(got);
  dfree_all();
}

/* ---- optimizer ---- */

static void test_optim(void) {
  printf("optimizer:\n");
  const int64_t n = 20011;
  static const struct {
    double b1, wd, clip;
    int64_t step;
    float norm;
  } cs[] = {{0.9, 0.1, 1.0, 1, 3.5f}, {0.9, 0.0, 1.0, 100, 0.25f}, {0.3, 0.1, 0.0, 7, 2.0f}, {0.9, 0.1, 1.0, 3, NAN}};
  /* gradients in f32, and in bf16 (fold-grad-cast) with the bf16 weight copy written too */
  for (size_t c = 0; c < 2 * sizeof cs / sizeof cs[0]; c++) {
    const int ci = (int)(c % (sizeof cs / sizeof cs[0]));
    const cg_dtype gt = c < sizeof cs / sizeof cs[0] ? CG_DT_F32 : CG_DT_BF16;
    float *p = rnd(n, -1, 1, CG_DT_F32), *g = rnd(n, -1, 1, gt), *m = rnd(n, -0.1f, 0.1f, CG_DT_F32);
    float *v = rnd(n, 1e-6f, 1e-2f, CG_DT_F32), *got = falloc(n);
    gpu_ptr dp = up_f(p, n, CG_DT_F32), dg = up_f(g, n, gt), dm = up_f(m, n, CG_DT_F32), dv = up_f(v, n, CG_DT_F32);
    gpu_ptr dwb = gt == CG_DT_BF16 ? dmalloc((size_t)n * 2) : 0;
    gpu_ptr dn = up_f(&cs[ci].norm, 1, CG_DT_F32);
    float scale = cs[ci].clip > 0 ? ck_clip_coef(cs[ci].norm, cs[ci].clip) : 1.0f;
    ck_adamw_step(p, g, m, v, n, cs[ci].step, scale, 3e-4, cs[ci].b1, 0.95, 1e-8, cs[ci].wd);
    rt_cuda_adamw_hp hp = {3e-4, cs[ci].b1, 0.95, 1e-8, cs[ci].wd, cs[ci].step, cs[ci].clip, 0};
    RUN(rt_cuda_adamw_step(K, dp, gt, dg, dm, dv, dwb, n, dn, &hp));
    char what[128];
    snprintf(what, sizeof what, "adamw b1=%g wd=%g clip=%g step=%lld norm=%g grad %s: p", cs[ci].b1, cs[ci].wd,
             cs[ci].clip, (long long)cs[ci].step, cs[ci].norm, cg_dtype_name(gt));
    get_f(got, dp, n, CG_DT_F32);
    cmp(what, got, p, n, CG_DT_F32, -1, 0);
    get_f(got, dm, n, CG_DT_F32);
    cmp("  m", got, m, n, CG_DT_F32, -1, 0);
    get_f(got, dv, n, CG_DT_F32);
    cmp("  v", got, v, n, CG_DT_F32, -1, 0);
    if (dwb) {
      get_f(got, dwb, n, CG_DT_BF16);
      cmp("  bf16 weight copy", got, p, n, CG_DT_BF16, -1, 0);
    }
    free(p), free(g), free(m), free(v), free(got);
    dfree_all();
  }
  /* a stacked expert weight's window: the gradient (f32 and bf16) a window of rows 80 wide,
     the bf16 copy one of rows 96 wide (columns 16..63), as the executor's stacked weights */
  for (int gi = 0; gi < 2; gi++) {
    const cg_dtype gt = gi ? CG_DT_BF16 : CG_DT_F32;
    const int64_t R = 37, C = 48, GL = 80, WL = 96, WO = 16, nw = R * C;
    float *p = rnd(nw, -1, 1, CG_DT_F32), *g = rnd(nw, -1, 1, gt), *m = rnd(nw, -0.1f, 0.1f, CG_DT_F32);
    float *v = rnd(nw, 1e-6f, 1e-2f, CG_DT_F32), *gw = rnd(R * GL, -5, 5, gt), *wbh = rnd(R * WL, -5, 5, CG_DT_BF16);
    float *got = falloc(R * WL);
    for (int64_t r = 0; r < R; r++)
      for (int64_t c = 0; c < C; c++) gw[r * GL + c] = g[r * C + c];
    gpu_ptr dp = up_f(p, nw, CG_DT_F32), dg = up_f(gw, R * GL, gt), dm = up_f(m, nw, CG_DT_F32), dv = up_f(v, nw, CG_DT_F32);
    gpu_ptr dwb = up_f(wbh, R * WL, CG_DT_BF16), dn = up_f(&cs[0].norm, 1, CG_DT_F32);
    ck_adamw_step(p, g, m, v, nw, 5, ck_clip_coef(cs[0].norm, 1.0), 3e-4, 0.9, 0.95, 1e-8, 0.1);
    rt_cuda_adamw_hp hp = {3e-4, 0.9, 0.95, 1e-8, 0.1, 5, 1.0, 0};
    rt_cuda_adamw_win win = {C, GL, C, WL};
    RUN(rt_cuda_adamw_step_win(K, dp, gt, dg, dm, dv, dwb + (gpu_ptr)WO * 2, nw, dn, &hp, &win));
    char what[96];
    snprintf(what, sizeof what, "adamw on windows (grad %s, rows %lld of %lld; copy of %lld): p", cg_dtype_name(gt),
             (long long)C, (long long)GL, (long long)WL);
    get_f(got, dp, nw, CG_DT_F32);
    cmp(what, got, p, nw, CG_DT_F32, -1, 0);
    get_f(got, dm, nw, CG_DT_F32);
    cmp("  m", got, m, nw, CG_DT_F32, -1, 0);
    /* the copy's window holds the rounded weights, and nothing outside it changed */
    get_f(got, dwb, R * WL, CG_DT_BF16);
    for (int64_t r = 0; r < R; r++)
      for (int64_t c = 0; c < WL; c++) {
        int in = c >= WO && c < WO + C;
        if (in) wbh[r * WL + c] = ck_bf16_to_float(ck_float_to_bf16(p[r * C + c - WO]));
      }
    cmp("  bf16 copy window (and the rest unchanged)", got, wbh, R * WL, CG_DT_BF16, -1, 0);
    /* the norm of the window alone, the rest of the rows ignored */
    const float *gb[1] = {g};
    int64_t gsz[1] = {nw}, gc[1] = {C}, gld[1] = {GL};
    float want = (float)ck_grad_norm(gb, gsz, 1), gotn = 0;
    RUN(rt_cuda_grad_norm_win(K, &dg, &gt, gsz, gc, gld, 1, dn));
    get_f(&gotn, dn, 1, CG_DT_F32);
    snprintf(what, sizeof what, "grad norm of a window (%s, rows %lld of %lld)", cg_dtype_name(gt), (long long)C,
             (long long)GL);
    cmp(what, &gotn, &want, 1, CG_DT_F32, 1e-6, 0);
    free(p), free(g), free(m), free(v), free(gw), free(wbh), free(got);
    dfree_all();
  }
  /* many parameters in one rt_cuda_adamw_multi (more than a launch's table): sizes from 1 to
     20011, decay on and off, every third with a bf16 copy, the fifth's gradient and copy
     windows of wider rows; each bit for bit ck_adamw_step alone */
  for (int gi = 0; gi < 2; gi++) {
    const cg_dtype gt = gi ? CG_DT_BF16 : CG_DT_F32;
    enum { NT = CG_AW_TABLE + 7 };
    rt_cuda_adamw_tensor t[NT];
    float *hp[NT], *hm[NT], *hv[NT], *hwb[NT];
    int64_t rows[NT], cols[NT];
    for (int i = 0; i < NT; i++) {
      rows[i] = 1 + (i * 37) % 101, cols[i] = i == 0 ? 1 : i % 4 == 1 ? 48 : 1 + (i * 13) % 199;
      const int64_t n = rows[i] * cols[i], win = i == 5, GL = cols[i] + 16, WL = cols[i] + 32;
      float *g = rnd(n, -1, 1, gt), *gw = win ? rnd(rows[i] * GL, -5, 5, gt) : NULL;
      hp[i] = rnd(n, -1, 1, CG_DT_F32), hm[i] = rnd(n, -0.1f, 0.1f, CG_DT_F32), hv[i] = rnd(n, 1e-6f, 1e-2f, CG_DT_F32);
      hwb[i] = i % 3 == 0 || win ? rnd(win ? rows[i] * WL : n, -5, 5, CG_DT_BF16) : NULL;
      for (int64_t r = 0; win && r < rows[i]; r++) memcpy(gw + r * GL, g + r * cols[i], (size_t)cols[i] * 4);
      t[i] = (rt_cuda_adamw_tensor){up_f(hp[i], n, CG_DT_F32), win ? up_f(gw, rows[i] * GL, gt) : up_f(g, n, gt),
                                    up_f(hm[i], n, CG_DT_F32), up_f(hv[i], n, CG_DT_F32),
                                    hwb[i] ? up_f(hwb[i], win ? rows[i] * WL : n, CG_DT_BF16) : 0, n, i % 2 ? 0.0 : 0.1,
                                    {win ? cols[i] : 0, win ? GL : 0, win ? cols[i] : 0, win ? WL : 0}};
      ck_adamw_step(hp[i], g, hm[i], hv[i], n, 9, ck_clip_coef(cs[0].norm, 1.0), 3e-4, 0.9, 0.95, 1e-8, t[i].wd);
      free(g), free(gw);
    }
    gpu_ptr dn = up_f(&cs[0].norm, 1, CG_DT_F32);
    rt_cuda_adamw_hp hp9 = {3e-4, 0.9, 0.95, 1e-8, 0, 9, 1.0, 0};
    RUN(rt_cuda_adamw_multi(K, gt, t, NT, dn, &hp9));
    int exact = 1;
    for (int i = 0; i < NT; i++) {
      const int64_t n = t[i].n, W = i == 5 ? cols[i] + 32 : cols[i];
      float *got = falloc(rows[i] * W), *want = falloc(rows[i] * W);
      get_f(got, t[i].p, n, CG_DT_F32);
      exact &= memcmp(got, hp[i], (size_t)n * 4) == 0;
      get_f(got, t[i].m, n, CG_DT_F32);
      exact &= memcmp(got, hm[i], (size_t)n * 4) == 0;
      get_f(got, t[i].v, n, CG_DT_F32);
      exact &= memcmp(got, hv[i], (size_t)n * 4) == 0;
      if (hwb[i]) { /* the rounded weights in the copy's window, the rest unchanged */
        memcpy(want, hwb[i], (size_t)(rows[i] * W) * 4);
        for (int64_t r = 0; r < rows[i]; r++)
          for (int64_t c = 0; c < cols[i]; c++) want[r * W + c] = ck_bf16_to_float(ck_float_to_bf16(hp[i][r * cols[i] + c]));
        get_f(got, t[i].wb, rows[i] * W, CG_DT_BF16);
        exact &= memcmp(got, want, (size_t)(rows[i] * W) * 4) == 0;
      }
      free(got), free(want), free(hp[i]), free(hm[i]), free(hv[i]), free(hwb[i]);
    }
    CHECK(exact, "adamw_multi (%d parameters, grad %s): not bit for bit ck_adamw_step", NT, cg_dtype_name(gt));
    printf("  adamw_multi: %d parameters in %d launches (grad %s), weights, moments and copies bit for bit\n", NT,
           (NT + CG_AW_TABLE - 1) / CG_AW_TABLE, cg_dtype_name(gt));
    dfree_all();
  }
  /* adamw(moments = bf16): m and v stored in bf16 -- bit for bit ck_adamw_step (which uses them
     unrounded) then ck_round_bf16 of both, through the single and the table launch, f32 and
     bf16 gradients, a clipping norm, 20011 values (a scalar tail) */
  for (int c = 0; c < 4; c++) {
    const cg_dtype gt = c % 2 ? CG_DT_BF16 : CG_DT_F32;
    const int multi = c >= 2;
    float *p = rnd(n, -1, 1, CG_DT_F32), *g = rnd(n, -1, 1, gt), *m = rnd(n, -0.1f, 0.1f, CG_DT_BF16);
    float *v = rnd(n, 1e-6f, 1e-2f, CG_DT_BF16), *got = falloc(n);
    gpu_ptr dp = up_f(p, n, CG_DT_F32), dg = up_f(g, n, gt), dm = up_f(m, n, CG_DT_BF16), dv = up_f(v, n, CG_DT_BF16);
    gpu_ptr dn = up_f(&cs[0].norm, 1, CG_DT_F32);
    ck_adamw_step(p, g, m, v, n, 4, ck_clip_coef(cs[0].norm, 1.0), 3e-4, 0.9, 0.95, 1e-8, 0.1);
    ck_round_bf16(m, n);
    ck_round_bf16(v, n);
    rt_cuda_adamw_hp hp = {3e-4, 0.9, 0.95, 1e-8, 0.1, 4, 1.0, 1};
    rt_cuda_adamw_tensor t = {dp, dg, dm, dv, 0, n, 0.1, {0, 0, 0, 0}};
    if (multi) RUN(rt_cuda_adamw_multi(K, gt, &t, 1, dn, &hp));
    else RUN(rt_cuda_adamw_step(K, dp, gt, dg, dm, dv, 0, n, dn, &hp));
    char what[96];
    snprintf(what, sizeof what, "adamw, bf16 moments (%s, grad %s): p", multi ? "table" : "single", cg_dtype_name(gt));
    get_f(got, dp, n, CG_DT_F32);
    cmp(what, got, p, n, CG_DT_F32, -1, 0);
    get_f(got, dm, n, CG_DT_BF16);
    cmp("  m (bf16)", got, m, n, CG_DT_BF16, -1, 0);
    get_f(got, dv, n, CG_DT_BF16);
    cmp("  v (bf16)", got, v, n, CG_DT_BF16, -1, 0);
    free(p), free(g), free(m), free(v), free(got);
    dfree_all();
  }
  /* global norm over buffers of assorted sizes (one empty), f32 and bf16 mixed */
  int64_t sizes[] = {1000, 1, 0, 70001, 4096};
  const cg_dtype gdt[] = {CG_DT_F32, CG_DT_BF16, CG_DT_F32, CG_DT_BF16, CG_DT_F32};
  const float *bufs[5];
  gpu_ptr dbufs[5];
  float *hb[5];
  for (int i = 0; i < 5; i++) {
    hb[i] = rnd(sizes[i], -2, 2, gdt[i]);
    bufs[i] = hb[i];
    dbufs[i] = up_f(hb[i], sizes[i], gdt[i]);
  }
  float want = (float)ck_grad_norm(bufs, sizes, 5), got = 0;
  gpu_ptr dn = dmalloc(4);
  RUN(rt_cuda_grad_norm(K, dbufs, gdt, sizes, 5, dn));
  get_f(&got, dn, 1, CG_DT_F32);
  cmp("grad norm (5 tensors, f32 and bf16, one empty)", &got, &want, 1, CG_DT_F32, 1e-6, 0);
  for (int i = 0; i < 5; i++) free(hb[i]);
  /* 70 tensors: 40 bf16 then 30 f32 (tables of 32 + 8, then 30), sizes 0 .. 5000 */
  enum { NT = 70 };
  int64_t tsz[NT];
  const float *tb[NT];
  float *th[NT];
  gpu_ptr td[NT];
  cg_dtype tdt[NT];
  for (int i = 0; i < NT; i++) {
    tsz[i] = i == 7 ? 0 : (int64_t)rng_int(5000) + 1;
    tdt[i] = i < 40 ? CG_DT_BF16 : CG_DT_F32;
    th[i] = rnd(tsz[i], -2, 2, tdt[i]);
    tb[i] = th[i];
    td[i] = up_f(th[i], tsz[i], tdt[i]);
  }
  want = (float)ck_grad_norm(tb, tsz, NT);
  RUN(rt_cuda_grad_norm(K, td, tdt, tsz, NT, dn));
  get_f(&got, dn, 1, CG_DT_F32);
  cmp("grad norm (70 tensors in launches of up to 32)", &got, &want, 1, CG_DT_F32, 1e-6, 0);
  for (int i = 0; i < NT; i++) free(th[i]);
  expect_flag("optimizer", CK_OK);
  dfree_all();
}

/* ---- cuBLASLt GEMM (gpu_blas.c) ---- */

/* A bf16 GEMM of each operand layout against the CPU, then the algorithm cache: a training
 * step's shape classes (sizes mostly powers of two) queried once, then never again. */
static void test_gemm(void) {
  printf("gemm (cuBLASLt):\n");
  char err[512];
  gpu_blas *bl = gpu_blas_new(G, err, sizeof err);
  if (!bl) {
    printf("  SKIP: %s\n", err); /* the CPU emulator has no cuBLASLt */
    return;
  }
  const int64_t m = 72, n = 40, k = 56;
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) {
      float *a = rnd(m * k, -1, 1, CG_DT_BF16), *b = rnd(k * n, -1, 1, CG_DT_BF16), *want = falloc(m * n), *got = falloc(m * n);
      for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
          double acc = 0;
          for (int64_t l = 0; l < k; l++) acc += (double)a[ta ? l * m + i : i * k + l] * b[tb ? j * k + l : l * n + j];
          want[i * n + j] = (float)acc;
        }
      gpu_mat A = {CG_DT_BF16, up_f(a, m * k, CG_DT_BF16), ta ? m : k, 0, ta};
      gpu_mat B = {CG_DT_BF16, up_f(b, k * n, CG_DT_BF16), tb ? k : n, 0, tb};
      gpu_mat C = {CG_DT_F32, dmalloc((size_t)(m * n) * 4), n, 0, 0};
      CHECK(gpu_gemm(bl, m, n, k, 1.0f, &A, &B, 0.0f, &C, 1, err, sizeof err) == 0, "gemm: %s", err);
      get_f(got, C.p, m * n, CG_DT_F32);
      char what[64];
      snprintf(what, sizeof what, "gemm %s%s bf16 -> f32", ta ? "T" : "N", tb ? "T" : "N");
      cmp(what, got, want, m * n, CG_DT_F32, 1e-5, 1e-5 * maxabs(want, m * n));
      free(a), free(b), free(want), free(got);
      dfree_all();
    }
  /* an addend (fuse-gemm-add): bf16 C = A B^T + addend, the f32 sum rounded once; the addend,
     a separate buffer, is left as it was */
  {
    float *a = rnd(m * k, -1, 1, CG_DT_BF16), *b = rnd(n * k, -1, 1, CG_DT_BF16), *c = rnd(m * n, -4, 4, CG_DT_BF16);
    float *want = falloc(m * n), *got = falloc(m * n), *c_after = falloc(m * n);
    gemm_nt_ref(a, b, m, n, k, want);
    for (int64_t i = 0; i < m * n; i++) want[i] += c[i];
    gpu_mat A = {CG_DT_BF16, up_f(a, m * k, CG_DT_BF16), k, 0, 0}, B = {CG_DT_BF16, up_f(b, n * k, CG_DT_BF16), k, 0, 1};
    gpu_mat C = {CG_DT_BF16, dmalloc((size_t)(m * n) * 2), n, 0, 0};
    gpu_ptr addend = up_f(c, m * n, CG_DT_BF16);
    CHECK(gpu_gemm_add(bl, m, n, k, &A, &B, addend, &C, err, sizeof err) == 0, "gemm_add: %s", err);
    get_f(got, C.p, m * n, CG_DT_BF16);
    get_f(c_after, addend, m * n, CG_DT_BF16);
    cmp("gemm NT bf16 + addend -> bf16", got, want, m * n, CG_DT_BF16, 1e-5, 1e-5 * maxabs(want, m * n));
    cmp("gemm's addend unchanged", c_after, c, m * n, CG_DT_BF16, -1, 0);
    free(a), free(b), free(c), free(want), free(got), free(c_after);
    dfree_all();
  }
  /* 48 shape classes as a step has them: (m, n, k) from powers of two, three layouts */
  const int64_t big = 2048;
  gpu_ptr x = dmalloc((size_t)(big * big) * 2), y = dmalloc((size_t)(big * big) * 2), z = dmalloc((size_t)(big * big) * 4);
  long q0 = gpu_blas_queries(bl), q1 = 0;
  for (int pass = 0; pass < 2; pass++) {
    if (pass == 1) q1 = gpu_blas_queries(bl);
    for (int s = 0; s < 48; s++) {
      int64_t mm = (int64_t)256 << (s % 4), nn = (int64_t)128 << (s / 4 % 4), kk = (int64_t)512 << (s / 16);
      int ta = s / 16 == 1, tb = s / 16 == 2;
      gpu_mat A = {CG_DT_BF16, x, ta ? mm : kk, 0, ta}, B = {CG_DT_BF16, y, tb ? kk : nn, 0, tb};
      gpu_mat C = {CG_DT_F32, z, nn, 0, 0};
      if (gpu_gemm(bl, mm, nn, kk, 1.0f, &A, &B, 0.0f, &C, 1, err, sizeof err) != 0) {
        CHECK(0, "gemm %lld x %lld x %lld: %s", (long long)mm, (long long)nn, (long long)kk, err);
        break;
      }
    }
  }
  long q2 = gpu_blas_queries(bl);
  CHECK(q1 - q0 == 48 && q2 == q1, "algorithm cache: 48 shape classes took %ld queries, and %ld more the second time (want 48, 0)",
        q1 - q0, q2 - q1);
  printf("  algorithm cache: 48 shape classes, %ld heuristic queries, %ld on the second pass\n", q1 - q0, q2 - q1);
  dfree_all();
  gpu_blas_free(bl);
}

/* ---- MXFP8 ---- */

/* Values across many binades (so blocks get many scales), plus special blocks. */
static float *mx_input(int64_t rows, int64_t cols, cg_dtype t) {
  float *x = falloc(rows * cols);
  for (int64_t b = 0; b < rows * cols / 32; b++) {
    int ex = (int)rng_int(60) - 30;
    for (int i = 0; i < 32; i++) {
      float m = rng_float(1.0f, 2.0f) * (rng_int(2) ? 1.0f : -1.0f);
      x[b * 32 + i] = ldexpf(m, ex - (int)rng_int(12));
    }
  }
  const int64_t n = rows * cols;
  x[0] = NAN;                               /* a NaN block */
  x[40] = INFINITY;                         /* an inf block */
  for (int i = 64; i < 96; i++) x[i] = 0.0f; /* an all-zero block */
  x[100] = 3.0e38f;                         /* a huge value */
  for (int i = 128; i < 160; i++) x[i] = ldexpf(1.0f + i % 7, -140); /* subnormals */
  x[n - 1] = 448.0f, x[n - 2] = -464.0f, x[n - 3] = 0.0009765625f;   /* the edges */
  if (t == CG_DT_BF16) ck_round_bf16(x, n);
  return x;
}

/* The executor's e4m3 values: quantize-dequantize along an axis, with expert segments, in
 * place, bit-exact with ck_mxfp8_qdq (units cut short at a line's or an expert's end). */
static void test_mxfp8_qdq(cg_dtype tx, cg_dtype ty, int share) {
  printf("mxfp8 qdq [%s -> %s]%s:\n", cg_dtype_name(tx), cg_dtype_name(ty), share ? ", 128-shared scales" : "");
  static const struct {
    int rank, axis;
    int64_t dims[3];
    int counts;
  } cs[] = {{2, 1, {70, 200}, 0}, {2, 0, {70, 40}, 0}, {2, 0, {70, 40}, 1},
            {3, 1, {3, 150, 40}, 0}, {3, 2, {3, 48, 264}, 0}, {1, 0, {1000}, 0},
            {2, 1, {7, 203}, 0}}; /* rows at unaligned addresses, a last unit of 75 */
  const int32_t counts[4] = {0, 33, 1, 36}; /* sum 70: an empty expert, a one-row one */
  for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
    int64_t n = 1;
    for (int d = 0; d < cs[c].rank; d++) n *= cs[c].dims[d];
    float *x = mx_input(1, n, tx), *want = falloc(n), *got = falloc(n);
    CHECK(ck_mxfp8_qdq(x, want, cs[c].rank, cs[c].dims, cs[c].axis, 32, share, cs[c].counts ? counts : NULL, 4) == CK_OK,
          "ck_mxfp8_qdq");
    gpu_ptr dx = up_f(x, n, tx), dy = dmalloc((size_t)n * 4), dc = cs[c].counts ? up_raw(counts, sizeof counts) : 0;
    RUN(rt_cuda_mxfp8_qdq(K, tx, dx, ty, dy, cs[c].rank, cs[c].dims, cs[c].axis, 32, share, dc, 4));
    get_f(got, dy, n, ty);
    char what[96];
    snprintf(what, sizeof what, "qdq rank %d axis %d%s", cs[c].rank, cs[c].axis, cs[c].counts ? " by expert" : "");
    cmp(what, got, want, n, ty, -1, 0);
    if (tx == ty) { /* in place */
      RUN(rt_cuda_mxfp8_qdq(K, tx, dx, tx, dx, cs[c].rank, cs[c].dims, cs[c].axis, 32, share, dc, 4));
      get_f(got, dx, n, tx);
      cmp("  in place", got, want, n, tx, -1, 0);
    }
    free(x), free(want), free(got);
    dfree_all();
  }
  { /* along the rows of a column window (a slice_cols read in place): x (70, 200), columns [40, 176) */
    const int64_t R = 70, W = 200, s0 = 40, w = 136, wd[2] = {R, w};
    float *x = mx_input(R, W, tx), *win = falloc(R * w), *want = falloc(R * w), *got = falloc(R * w);
    for (int64_t r = 0; r < R; r++) memcpy(win + r * w, x + r * W + s0, (size_t)w * sizeof *win);
    CHECK(ck_mxfp8_qdq(win, want, 2, wd, 1, 32, share, NULL, 0) == CK_OK, "ck_mxfp8_qdq");
    gpu_ptr dx = up_f(x, R * W, tx), dy = dmalloc((size_t)(R * w) * 4);
    RUN(rt_cuda_mxfp8_qdq_cols(K, tx, dx, W, s0, ty, dy, R, w, 32, share));
    get_f(got, dy, R * w, ty);
    cmp("qdq of a column window", got, want, R * w, ty, -1, 0);
    free(x), free(win), free(want), free(got);
    dfree_all();
  }
  expect_flag("mxfp8 qdq", CK_OK);
}

static void test_mxfp8(cg_dtype t, int block, int share) {
  printf("mxfp8 [%s] block %d%s:\n", cg_dtype_name(t), block, share ? ", 128-shared scales" : "");
  const int64_t rows = 48, cols = 1024, n = rows * cols, nb = n / block;
  float *x = mx_input(rows, cols, t);
  uint8_t *q = malloc(n), *s = malloc(nb), *gq = malloc(n), *gs = malloc(nb);
  CHECK(ck_mxfp8_quantize(x, rows, cols, block, share, q, s) == CK_OK, "ck_mxfp8_quantize");
  gpu_ptr dx = up_f(x, n, t), dq = dmalloc(n), ds = dmalloc(nb);
  RUN(rt_cuda_mxfp8_quantize(K, t, dx, rows, cols, block, share, dq, ds));
  download(gq, dq, n);
  download(gs, ds, nb);
  CHECK(memcmp(q, gq, n) == 0 && memcmp(s, gs, nb) == 0, "mxfp8 quantize differs from ck_mxfp8_quantize");
  printf("  %-44s %6lld values, bit-exact (elements and scales)\n", "quantize", (long long)n);
  for (int64_t s0 = 3; s0 <= 128; s0 += 125) { /* columns [s0, s0 + 768) of a f32 x (3: unaligned), through a cast to bf16 never written */
    const int64_t w = 768, nw = rows * w;
    float *xf = mx_input(rows, cols, CG_DT_F32), *win = falloc(nw);
    for (int64_t r = 0; r < rows; r++) memcpy(win + r * w, xf + r * cols + s0, (size_t)w * sizeof *win);
    ck_round_bf16(win, nw);
    uint8_t *qw = malloc(nw), *sw = malloc(nw / block);
    CHECK(ck_mxfp8_quantize(win, rows, w, block, share, qw, sw) == CK_OK, "ck_mxfp8_quantize");
    gpu_ptr dxf = up_f(xf, n, CG_DT_F32);
    RUN(rt_cuda_mxfp8_quantize_win(K, CG_DT_F32, dxf, cols, s0, 1, rows, w, block, share, dq, ds, 0, 1, 0));
    download(gq, dq, nw);
    download(gs, ds, nw / block);
    CHECK(memcmp(qw, gq, nw) == 0 && memcmp(sw, gs, nw / block) == 0, "mxfp8 quantize of a window, rounded to bf16, differs");
    printf("  %-44s %6lld values, bit-exact\n", "quantize a window through a bf16 cast", (long long)nw);
    free(xf), free(win), free(qw), free(sw);
  }

  /* column-wise: the same as quantizing the transpose */
  float *xt = falloc(n); /* x^T (cols, rows): its column-wise quantization is x's row-wise one */
  for (int64_t c = 0; c < cols; c++)
    for (int64_t r = 0; r < rows; r++) xt[c * rows + r] = x[r * cols + c];
  gpu_ptr dxt = up_f(xt, n, t);
  RUN(rt_cuda_mxfp8_quantize_cols(K, t, dxt, cols, rows, block, share, dq, ds));
  download(gq, dq, n);
  download(gs, ds, nb);
  CHECK(memcmp(q, gq, n) == 0 && memcmp(s, gs, nb) == 0, "mxfp8 quantize_cols differs from ck on the transpose");
  printf("  %-44s %6lld values, bit-exact\n", "quantize columns (x^T)", (long long)n);
  if (!share) { /* a last tile of 96 rows (the kernel works in tiles of 128): x^T's first 992 rows */
    const int64_t c2 = cols - 32, n2 = rows * c2;
    float *x2 = falloc(n2);
    for (int64_t r = 0; r < rows; r++) memcpy(x2 + r * c2, x + r * cols, (size_t)c2 * sizeof *x2);
    CHECK(ck_mxfp8_quantize(x2, rows, c2, block, 0, q, s) == CK_OK, "ck_mxfp8_quantize");
    RUN(rt_cuda_mxfp8_quantize_cols(K, t, dxt, c2, rows, block, 0, dq, ds));
    download(gq, dq, n2);
    download(gs, ds, n2 / block);
    CHECK(memcmp(q, gq, n2) == 0 && memcmp(s, gs, n2 / block) == 0, "mxfp8 quantize_cols differs on a short last tile");
    printf("  %-44s %6lld values, bit-exact\n", "quantize columns, a short last tile", (long long)n2);
    free(x2);
  }

  /* dequantize: every element code under every scale code */
  uint8_t *aq = malloc(256 * 256), *as = malloc(256 * 256 / block);
  for (int i = 0; i < 256 * 256; i++) aq[i] = (uint8_t)(i % 256);
  for (int i = 0; i < 256 * 256 / block; i++) as[i] = (uint8_t)(i * block / 256);
  float *want = falloc(256 * 256), *got = falloc(256 * 256);
  CHECK(ck_mxfp8_dequantize(aq, as, 256, 256, block, want) == CK_OK, "ck_mxfp8_dequantize");
  gpu_ptr daq = up_raw(aq, 256 * 256), das = up_raw(as, 256 * 256 / block), dout = dmalloc(256 * 256 * 4);
  RUN(rt_cuda_mxfp8_dequantize(K, t, daq, das, 256, 256, block, dout));
  get_f(got, dout, 256 * 256, t);
  cmp("dequantize (all codes x all scales)", got, want, 256 * 256, t, -1, 0);
  CHECK(rt_cuda_mxfp8_quantize(K, t, dx, rows, 100, block, share, dq, ds) != 0, "mxfp8 accepted cols = 100");
  expect_flag("mxfp8", CK_OK);
  free(x), free(q), free(s), free(gq), free(gs), free(xt), free(aq), free(as), free(want), free(got);
  dfree_all();
}

/* Blocks of quantize_cols_experts' output (gq, gsf) that differ from ck_mxfp8_quantize of each
 * expert's rows of x (S, C), transposed and zero-padded to a multiple of 128. */
static int64_t cols_experts_bad(const float *x, int64_t S, int64_t C, const int32_t *counts, int E4, const uint8_t *gq,
                                const float *gsf) {
  int64_t start = 0, poff = 0, bad = 0;
  (void)S;
  for (int e = 0; e < E4; e++) {
    int64_t m = counts[e], P = (m + 127) / 128 * 128;
    if (P == 0) continue;
    float *xt = falloc(C * P);
    for (int64_t c = 0; c < C; c++)
      for (int64_t j = 0; j < P; j++) xt[c * P + j] = j < m ? x[(start + j) * C + c] : 0.0f;
    uint8_t *q = malloc((size_t)(C * P)), *s = malloc((size_t)(C * P / 32));
    CHECK(ck_mxfp8_quantize(xt, C, P, 32, 1, q, s) == CK_OK, "ck_mxfp8_quantize");
    bad += memcmp(q, gq + C * poff, (size_t)(C * P)) != 0;
    for (int64_t u = 0; u < P / 128; u++)
      for (int64_t c = 0; c < C; c++) {
        float want = s[c * (P / 32) + u * 4] == 0xFF ? NAN : ldexpf(1.0f, s[c * (P / 32) + u * 4] - 127),
              got = gsf[C * poff / 128 + u * C + c];
        bad += !(got == want || (isnan(got) && isnan(want)));
      }
    free(xt), free(q), free(s);
    start += m, poff += P;
  }
  return bad;
}

/* FP8 GEMM operands from the 128-shared quantization, bit-exact with ck_mxfp8_quantize: the
 * per-expert f32 scale layouts (by device counts, by fixed segments) and the weight
 * gradient's transposed, zero-padded expert blocks. */
static void test_fp8_operands(cg_dtype t) {
  printf("fp8 gemm operands [%s]:\n", cg_dtype_name(t));
  const int64_t S = 300, C = 160, KD = 256, E4 = 4;
  const int32_t counts[4] = {0, 130, 1, 169}; /* an empty expert, a one-row one, blocks cut short */
  gpu_ptr dc = up_raw(counts, sizeof counts);
  /* wgrad operand */
  float *x = mx_input(S, C, t);
  int64_t Ptot = 0;
  for (int e = 0; e < E4; e++) Ptot += (counts[e] + 127) / 128 * 128;
  gpu_ptr dx = up_f(x, S * C, t), dq = dmalloc((size_t)(C * Ptot)), dsf = dmalloc((size_t)(C * Ptot / 128) * 4);
  RUN(rt_cuda_mxfp8_quantize_cols_experts(K, t, dx, S, C, dc, E4, dq, dsf));
  uint8_t *gq = malloc((size_t)(C * Ptot));
  float *gsf = falloc(C * Ptot / 128);
  download(gq, dq, (size_t)(C * Ptot));
  download(gsf, dsf, (size_t)(C * Ptot / 128) * 4);
  int64_t bad = cols_experts_bad(x, S, C, counts, E4, gq, gsf);
  CHECK(bad == 0, "quantize_cols_experts differs from ck_mxfp8_quantize on the padded transposes (%lld bad blocks)", (long long)bad);
  { /* a column window [24, 24 + C) of a wider f32 matrix, through a cast to bf16 never written */
    const int64_t W = C + 40, s0 = 24;
    float *xw = mx_input(S, W, CG_DT_F32), *win = falloc(S * C);
    for (int64_t r = 0; r < S; r++) memcpy(win + r * C, xw + r * W + s0, (size_t)C * sizeof *win);
    ck_round_bf16(win, S * C);
    gpu_ptr dxw = up_f(xw, S * W, CG_DT_F32);
    RUN(rt_cuda_mxfp8_quantize_cols_experts_win(K, CG_DT_F32, dxw, W, s0, 1, S, C, dc, E4, 0, dq, dsf, 0, 1, 0));
    download(gq, dq, (size_t)(C * Ptot));
    download(gsf, dsf, (size_t)(C * Ptot / 128) * 4);
    bad = cols_experts_bad(win, S, C, counts, E4, gq, gsf);
    CHECK(bad == 0, "quantize_cols_experts of a window, rounded to bf16, differs (%lld bad blocks)", (long long)bad);
    free(xw), free(win);
  }
  { /* through an expert_permute's gather (VIEW_GATHER): rows r of xs = x2's row perm[r] / 2, x2 (S / 2, C) and
       (S / 2, KD); the column and the row quantizes byte for byte those of the permuted rows written out */
    const int64_t gk = 2, gn = S / 2;
    int32_t *perm = malloc((size_t)S * 4);
    uint64_t st = 0x2545F4914F6CDD1Dull;
    for (int64_t r = 0; r < S; r++) perm[r] = (int32_t)r;
    for (int64_t r = S - 1; r > 0; r--) { /* Fisher-Yates with xorshift */
      st ^= st << 13, st ^= st >> 7, st ^= st << 17;
      const int64_t j = (int64_t)(st % (uint64_t)(r + 1));
      const int32_t tmp = perm[r];
      perm[r] = perm[j], perm[j] = tmp;
    }
    gpu_ptr dperm = up_raw(perm, (size_t)S * 4);
    for (int pass = 0; pass < 2; pass++) {
      const int64_t W = pass ? KD : C; /* columns: pass 0 the column quantize, pass 1 the row one */
      float *x2 = mx_input(gn, W, t), *xs = falloc(S * W);
      for (int64_t r = 0; r < S; r++) memcpy(xs + r * W, x2 + perm[r] / gk * W, (size_t)W * sizeof *xs);
      gpu_ptr dx2 = up_f(x2, gn * W, t), dxs = up_f(xs, S * W, t);
      const size_t qb = pass ? (size_t)(S * W) : (size_t)(C * Ptot), sb = pass ? (size_t)(S * W / 32) : (size_t)(C * Ptot / 128) * 4;
      gpu_ptr q0 = dmalloc(qb), s0 = dmalloc(sb), q1 = dmalloc(qb), s1 = dmalloc(sb);
      if (pass) {
        RUN(rt_cuda_mxfp8_quantize_win(K, t, dxs, W, 0, 0, S, W, 32, 1, q0, s0, 0, 1, 0));
        RUN(rt_cuda_mxfp8_quantize_win(K, t, dx2, W, 0, 0, S, W, 32, 1, q1, s1, dperm, gk, gn));
      } else {
        RUN(rt_cuda_mxfp8_quantize_cols_experts_win(K, t, dxs, W, 0, 0, S, W, dc, E4, 0, q0, s0, 0, 1, 0));
        RUN(rt_cuda_mxfp8_quantize_cols_experts_win(K, t, dx2, W, 0, 0, S, W, dc, E4, 0, q1, s1, dperm, gk, gn));
      }
      uint8_t *h0 = malloc(qb + sb), *h1 = malloc(qb + sb);
      download(h0, q0, qb), download(h0 + qb, s0, sb), download(h1, q1, qb), download(h1 + qb, s1, sb);
      if (!pass) { /* the reference itself against the CPU */
        bad = cols_experts_bad(xs, S, C, counts, E4, h0, (const float *)(const void *)(h0 + qb));
        CHECK(bad == 0, "quantize_cols_experts of the permuted rows differs from the CPU (%lld bad blocks)", (long long)bad);
      }
      CHECK(memcmp(h0, h1, qb + sb) == 0, "%s quantize through a gather differs from the written-out permute",
            pass ? "the row" : "the expert column");
      CHECK(pass ? rt_cuda_mxfp8_quantize_win(K, t, dx2, W, 0, 0, S, W, 32, 1, q1, s1, dperm, gk, gn + 1) != 0
                 : rt_cuda_mxfp8_quantize_cols_experts_win(K, t, dx2, W, 0, 0, S, W, dc, E4, 0, q1, s1, dperm, 3, gn) != 0,
            "a gather whose rows do not make S was accepted");
      printf("  %-44s %6lld values, bit-exact\n", pass ? "rows through a gather (top_k 2)" : "expert columns through a gather",
             (long long)(S * W));
      free(x2), free(xs), free(h0), free(h1);
    }
    free(perm);
  }
  { /* the same blocks as columns of one (C, ldq) matrix: byte for byte the blocks above */
    const int64_t ldq = fp8_cols_ld(S, E4) + 128;
    gpu_ptr dq1 = dmalloc((size_t)(C * ldq)), dsf1 = dmalloc((size_t)(C * Ptot / 128) * 4);
    RUN(rt_cuda_mxfp8_quantize_cols_experts(K, t, dx, S, C, dc, E4, dq, dsf));
    RUN(rt_cuda_mxfp8_quantize_cols_experts_win(K, t, dx, C, 0, 0, S, C, dc, E4, ldq, dq1, dsf1, 0, 1, 0));
    uint8_t *g1 = malloc((size_t)(C * ldq));
    float *s1 = falloc(C * Ptot / 128);
    download(gq, dq, (size_t)(C * Ptot));
    download(gsf, dsf, (size_t)(C * Ptot / 128) * 4);
    download(g1, dq1, (size_t)(C * ldq));
    download(s1, dsf1, (size_t)(C * Ptot / 128) * 4);
    int64_t diff = 0, poff = 0;
    for (int e = 0; e < E4; e++) {
      const int64_t P = (counts[e] + 127) / 128 * 128;
      for (int64_t c = 0; c < C; c++) diff += memcmp(gq + C * poff + c * P, g1 + poff + c * ldq, (size_t)P) != 0;
      poff += P;
    }
    CHECK(diff == 0 && memcmp(gsf, s1, (size_t)(C * Ptot / 128) * 4) == 0,
          "quantize_cols_experts into one (C, ldq) matrix differs from its blocks (%lld rows)", (long long)diff);
    CHECK(rt_cuda_mxfp8_quantize_cols_experts_win(K, t, dx, C, 0, 0, S, C, dc, E4, 128, dq1, dsf1, 0, 1, 0) != 0,
          "quantize_cols_experts accepted ldq 128 for %lld rows in %lld experts", (long long)S, (long long)E4);
    free(g1), free(s1);
  }
  printf("  %-44s %6lld values, bit-exact (elements and f32 scales)\n", "expert columns, transposed and padded", (long long)(S * C));
  /* per-expert scale layouts of a row quantization */
  float *y = mx_input(S, KD, t);
  uint8_t *q = malloc((size_t)(S * KD)), *s = malloc((size_t)(S * KD / 32));
  CHECK(ck_mxfp8_quantize(y, S, KD, 32, 1, q, s) == CK_OK, "ck_mxfp8_quantize");
  gpu_ptr dy = up_f(y, S * KD, t), dqy = dmalloc((size_t)(S * KD)), dsy = dmalloc((size_t)(S * KD / 32));
  RUN(rt_cuda_mxfp8_quantize(K, t, dy, S, KD, 32, 1, dqy, dsy));
  for (int mode = 0; mode < 2; mode++) { /* 0: by counts, 1: 3 segments of 100 rows */
    int64_t nseg = mode ? 3 : E4, total = 0;
    int64_t seg[4];
    for (int e = 0; e < nseg; e++) total += fp8_scale_floats(fp8_rows(seg[e] = mode ? 100 : counts[e]), KD);
    gpu_ptr dsf2 = dmalloc((size_t)total * 4);
    RUN(gpu_memset32(G, dsf2, 0x7f800000u, (size_t)total) == 0 ? 0 : -1);
    RUN(rt_cuda_mxfp8_scales_vec128(K, dsy, S, KD, 32, mode ? 0 : dc, mode ? 0 : E4, mode ? 100 : 0, dsf2));
    float *g2 = falloc(total);
    download(g2, dsf2, (size_t)total * 4);
    int64_t r0 = 0, so = 0, bad2 = 0;
    for (int e = 0; e < nseg; e++) {
      for (int64_t kb = 0; kb < KD / 128; kb++)
        for (int64_t r = 0; r < seg[e]; r++) {
          int code = s[(r0 + r) * (KD / 32) + kb * 4];
          float want = code == 0xFF ? NAN : ldexpf(1.0f, code - 127), got = g2[so + kb * fp8_rows(seg[e]) + r];
          bad2 += !(got == want || (isnan(got) && isnan(want)));
        }
      r0 += seg[e], so += fp8_scale_floats(fp8_rows(seg[e]), KD);
    }
    CHECK(bad2 == 0, "scales_vec128 (%s): %lld scales differ", mode ? "segments" : "counts", (long long)bad2);
    printf("  %-44s %6lld scales, bit-exact\n", mode ? "f32 scales, fixed segments" : "f32 scales, per expert", (long long)(S * KD / 128));
    free(g2);
  }
  expect_flag("fp8 operands", CK_OK);
  free(x), free(gq), free(gsf), free(y), free(q), free(s);
  dfree_all();
}

/* The MXFP8 quantizers' awkward shapes: column-wise with rows of 45 elements (not 16-byte
 * aligned, a short column tile); the weight-gradient operand from an unaligned window, C = 45,
 * 40 experts (the expert lookup reads counts 32 at a time) with empty ones first, in the
 * middle and last, and a NaN in an expert's short last unit (ck scales the padding too); the
 * f32 scales of a wide K (whole 16-byte loads of codes). */
static void test_mxfp8_shapes(cg_dtype t) {
  printf("mxfp8 shapes [%s]:\n", cg_dtype_name(t));
  for (int share = 0; share < 2; share++) { /* quantize_cols of x (256, 45): x^T's rows quantized */
    const int64_t R = 256, C = 45, n = R * C;
    float *x = mx_input(R, C, t), *xt = falloc(n);
    for (int64_t c = 0; c < C; c++)
      for (int64_t r = 0; r < R; r++) xt[c * R + r] = x[r * C + c];
    uint8_t *q = malloc(n), *s = malloc(n / 32), *gq = malloc(n), *gs = malloc(n / 32);
    CHECK(ck_mxfp8_quantize(xt, C, R, 32, share, q, s) == CK_OK, "ck_mxfp8_quantize");
    gpu_ptr dx = up_f(x, n, t), dq = dmalloc(n), ds = dmalloc(n / 32);
    RUN(rt_cuda_mxfp8_quantize_cols(K, t, dx, R, C, 32, share, dq, ds));
    download(gq, dq, n);
    download(gs, ds, n / 32);
    CHECK(memcmp(q, gq, n) == 0 && memcmp(s, gs, n / 32) == 0, "mxfp8 quantize_cols differs on 45 columns%s",
          share ? " (128-shared)" : "");
    printf("  %-44s %6lld values, bit-exact\n", share ? "quantize columns, 45 of them, 128-shared" : "quantize columns, 45 of them",
           (long long)n);
    free(x), free(xt), free(q), free(s), free(gq), free(gs);
  }
  { /* the weight-gradient operand */
    enum { E = 40 };
    int32_t counts[E] = {0};
    counts[3] = 200, counts[17] = 1, counts[34] = 128, counts[36] = 57; /* the rest empty */
    const int64_t C = 45, W = C + 10, s0 = 3;
    int64_t S = 0, Ptot = 0;
    for (int e = 0; e < E; e++) S += counts[e], Ptot += (counts[e] + 127) / 128 * 128;
    float *xw = mx_input(S, W, CG_DT_F32), *win = falloc(S * C);
    xw[150 * W + s0 + 7] = NAN; /* expert 3's second unit: rows 128 .. 199 and 56 of padding */
    for (int64_t r = 0; r < S; r++) memcpy(win + r * C, xw + r * W + s0, (size_t)C * sizeof *win);
    gpu_ptr dc = up_raw(counts, sizeof counts), dq = dmalloc((size_t)(C * Ptot)), dsf = dmalloc((size_t)(C * Ptot / 128) * 4);
    uint8_t *gq = malloc((size_t)(C * Ptot));
    float *gsf = falloc(C * Ptot / 128);
    if (t == CG_DT_F32) { /* through a cast to bf16 never written */
      ck_round_bf16(win, S * C);
      gpu_ptr dxw = up_f(xw, S * W, CG_DT_F32);
      RUN(rt_cuda_mxfp8_quantize_cols_experts_win(K, CG_DT_F32, dxw, W, s0, 1, S, C, dc, E, 0, dq, dsf, 0, 1, 0));
    } else { /* x itself, bf16 */
      ck_round_bf16(win, S * C);
      gpu_ptr dx = up_f(win, S * C, CG_DT_BF16);
      RUN(rt_cuda_mxfp8_quantize_cols_experts(K, CG_DT_BF16, dx, S, C, dc, E, dq, dsf));
    }
    download(gq, dq, (size_t)(C * Ptot));
    download(gsf, dsf, (size_t)(C * Ptot / 128) * 4);
    int64_t bad = cols_experts_bad(win, S, C, counts, E, gq, gsf);
    CHECK(bad == 0, "quantize_cols_experts differs with 40 experts and 45 columns (%lld bad blocks)", (long long)bad);
    printf("  %-44s %6lld values, bit-exact\n", "expert columns, 40 experts, 45 columns", (long long)(S * C));
    free(xw), free(win), free(gq), free(gsf);
  }
  { /* f32 scales of K = 2048 (16 column blocks a row: two threads a row) */
    const int64_t S = 300, KD = 2048, E4 = 4;
    const int32_t counts[4] = {0, 130, 1, 169};
    gpu_ptr dc = up_raw(counts, sizeof counts);
    float *y = mx_input(S, KD, t);
    uint8_t *q = malloc((size_t)(S * KD)), *s = malloc((size_t)(S * KD / 32));
    CHECK(ck_mxfp8_quantize(y, S, KD, 32, 1, q, s) == CK_OK, "ck_mxfp8_quantize");
    gpu_ptr dy = up_f(y, S * KD, t), dqy = dmalloc((size_t)(S * KD)), dsy = dmalloc((size_t)(S * KD / 32));
    RUN(rt_cuda_mxfp8_quantize(K, t, dy, S, KD, 32, 1, dqy, dsy));
    uint8_t *gq = malloc((size_t)(S * KD)), *gs = malloc((size_t)(S * KD / 32));
    download(gq, dqy, (size_t)(S * KD));
    download(gs, dsy, (size_t)(S * KD / 32));
    CHECK(memcmp(q, gq, (size_t)(S * KD)) == 0 && memcmp(s, gs, (size_t)(S * KD / 32)) == 0,
          "mxfp8 quantize (300 x 2048, 128-shared) differs from ck_mxfp8_quantize");
    int64_t total = 0;
    for (int e = 0; e < E4; e++) total += fp8_scale_floats(fp8_rows(counts[e]), KD);
    gpu_ptr dsf2 = dmalloc((size_t)total * 4);
    RUN(gpu_memset32(G, dsf2, 0x7f800000u, (size_t)total) == 0 ? 0 : -1);
    RUN(rt_cuda_mxfp8_scales_vec128(K, dsy, S, KD, 32, dc, E4, 0, dsf2));
    float *g2 = falloc(total);
    download(g2, dsf2, (size_t)total * 4);
    int64_t r0 = 0, so = 0, bad = 0;
    for (int e = 0; e < E4; e++) {
      for (int64_t kb = 0; kb < KD / 128; kb++)
        for (int64_t r = 0; r < counts[e]; r++) {
          int code = s[(r0 + r) * (KD / 32) + kb * 4];
          float want = code == 0xFF ? NAN : ldexpf(1.0f, code - 127), got = g2[so + kb * fp8_rows(counts[e]) + r];
          bad += !(got == want || (isnan(got) && isnan(want)));
        }
      r0 += counts[e], so += fp8_scale_floats(fp8_rows(counts[e]), KD);
    }
    CHECK(bad == 0, "scales_vec128 (K = 2048): %lld scales differ", (long long)bad);
    printf("  %-44s %6lld scales, bit-exact\n", "quantize and f32 scales, K = 2048", (long long)(S * KD / 128));
    free(y), free(q), free(s), free(gq), free(gs), free(g2);
  }
  expect_flag("mxfp8 shapes", CK_OK);
  dfree_all();
}

/* FP8 GEMM with 1x128 block scales (cuBLASLt VEC128_32F) on operands from the 128-shared
 * quantize: against the exact product of the values the quantization holds (ck_mxfp8_qdq),
 * in double. Every 128-block of a row gets its own binade, so a scale read from the wrong
 * place shows. Tolerance: Hopper's FP8 MMA accumulates 128 products in reduced precision
 * before the fp32 promotion; 2^-10 of the largest |C| bounds it here (bf16 C: one rounding more). */
static void test_gemm_fp8(void) {
  printf("fp8 gemm, 1x128 block scales (cuBLASLt):\n");
  char err[512];
  gpu_blas *bl = gpu_blas_new(G, err, sizeof err);
  if (!bl) {
    printf("  SKIP: %s\n", err);
    return;
  }
  static const int64_t shapes[][3] = {{96, 64, 384}, {48, 144, 512}};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    const int64_t m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
    float *x = falloc(m * k), *w = falloc(n * k), *xd = falloc(m * k), *wd = falloc(n * k), *want = falloc(m * n),
          *got = falloc(m * n);
    float *ops[2] = {x, w};
    const int64_t rows[2] = {m, n};
    for (int o = 0; o < 2; o++)
      for (int64_t r = 0; r < rows[o]; r++)
        for (int64_t b = 0; b < k / 128; b++) {
          int ex = (int)rng_int(17) - 8;
          for (int64_t i = 0; i < 128; i++) ops[o][r * k + b * 128 + i] = ldexpf(rng_float(-1.0f, 1.0f), ex);
        }
    ck_round_bf16(x, m * k), ck_round_bf16(w, n * k);
    const int64_t dx[2] = {m, k}, dw[2] = {n, k};
    CHECK(ck_mxfp8_qdq(x, xd, 2, dx, 1, 32, 1, NULL, 0) == CK_OK && ck_mxfp8_qdq(w, wd, 2, dw, 1, 32, 1, NULL, 0) == CK_OK,
          "ck_mxfp8_qdq");
    gemm_nt_ref(xd, wd, m, n, k, want);
    gpu_ptr gx = up_f(x, m * k, CG_DT_BF16), gw = up_f(w, n * k, CG_DT_BF16);
    gpu_ptr qx = dmalloc((size_t)(m * k)), qw = dmalloc((size_t)(n * k)), sx = dmalloc((size_t)(m * k / 32)),
            sw = dmalloc((size_t)(n * k / 32)), fx = dmalloc((size_t)(m * k / 128) * 4), fw = dmalloc((size_t)(n * k / 128) * 4);
    RUN(rt_cuda_mxfp8_quantize(K, CG_DT_BF16, gx, m, k, 32, 1, qx, sx));
    RUN(rt_cuda_mxfp8_quantize(K, CG_DT_BF16, gw, n, k, 32, 1, qw, sw));
    RUN(rt_cuda_mxfp8_scales_vec128(K, sx, m, k, 32, 0, 0, 0, fx));
    RUN(rt_cuda_mxfp8_scales_vec128(K, sw, n, k, 32, 0, 0, 0, fw));
    for (int ct = 0; ct < CG_DT_COUNT; ct++) {
      gpu_mat C = {(cg_dtype)ct, dmalloc((size_t)(m * n) * 4), n, 0, 0};
      if (gpu_gemm_fp8(bl, m, n, k, qx, fx, qw, fw, &C, err, sizeof err) != 0) {
        CHECK(0, "gpu_gemm_fp8 %lld x %lld x %lld: %s", (long long)m, (long long)n, (long long)k, err);
        continue;
      }
      get_f(got, C.p, m * n, (cg_dtype)ct);
      double worst = 0, mx = maxabs(want, m * n);
      for (int64_t i = 0; i < m * n; i++) worst = fmax(worst, fabs((double)got[i] - want[i]));
      char what[96];
      snprintf(what, sizeof what, "fp8 gemm %lldx%lldx%lld -> %s (max err %.2g of %.2g)", (long long)m, (long long)n,
               (long long)k, cg_dtype_name((cg_dtype)ct), worst, mx);
      cmp(what, got, want, m * n, (cg_dtype)ct, 0, 0x1p-10 * mx);
    }
    expect_flag("fp8 gemm", CK_OK);
    free(x), free(w), free(xd), free(wd), free(want), free(got);
    dfree_all();
  }
  char e2[512];
  gpu_mat C = {CG_DT_F32, 0, 64, 0, 0};
  CHECK(gpu_gemm_fp8(bl, 64, 64, 100, 0, 0, 0, 0, &C, e2, sizeof e2) != 0 && strstr(e2, "multiple of 128"),
        "fp8 gemm accepted k = 100: %s", e2);
  CHECK(gpu_gemm_fp8(bl, 37, 64, 128, 0, 0, 0, 0, &C, e2, sizeof e2) != 0 && strstr(e2, "m and n of 16"),
        "fp8 gemm accepted m = 37: %s", e2);
  gpu_blas_free(bl);
}

static void test_oom(void) {
  gpu_ptr p = 0;
  int rc = gpu_alloc(G, &p, (size_t)1 << 50, "a 1 PiB test buffer");
  CHECK(rc != 0, "a 1 PiB allocation succeeded");
  const char *m = gpu_error(G);
  CHECK(strstr(m, "out of GPU memory allocating a 1 PiB test buffer: asked") && strstr(m, "free of") &&
            strstr(m, "mxfp8"),
        "out-of-memory message: %s", m);
  printf("  out of memory: %s\n", m);
  if (rc == 0) gpu_free(G, p);
}

int main(void) {
  double t0 = ck_now();
  uint64_t seed;
  int st = gpu_test_start(&seed);
  if (st) return st < 0;
  const gpu_device_info *d = gpu_info(G);
  char mem[32];
  printf("GPU 0: %s, sm_%d%d, %d SMs, %s, driver %d.%d; seed %llu (MOEC_TEST_SEED repeats it)\n", d->name,
         d->cc_major, d->cc_minor, d->sm_count, gpu_fmt_bytes(d->total_mem, mem, sizeof mem),
         d->driver_version / 1000, d->driver_version % 1000 / 10, (unsigned long long)seed);
  printf("kernels built for %s\n", rt_cuda_arch(K));
  if (rt_cuda_load_all(K) != 0) {
    printf("FAIL: %s\n", rt_cuda_error(K));
    return 1;
  }
  test_cast();
  for (int t = 0; t < CG_DT_COUNT; t++) {
    test_elementwise((cg_dtype)t);
    test_embedding((cg_dtype)t);
    for (int w = 0; w < CG_DT_COUNT; w++) test_rmsnorm((cg_dtype)t, (cg_dtype)w);
    test_rope((cg_dtype)t, HD);
    test_rope((cg_dtype)t, 12);
    test_route((cg_dtype)t, 1);
    test_route((cg_dtype)t, 0);
    test_cross_entropy((cg_dtype)t);
    test_mxfp8((cg_dtype)t, 32, 0);
    test_mxfp8((cg_dtype)t, 32, 1);
    test_fp8_operands((cg_dtype)t);
    test_mxfp8_shapes((cg_dtype)t);
    for (int y = 0; y < CG_DT_COUNT; y++)
      for (int share = 0; share < 2; share++) test_mxfp8_qdq((cg_dtype)t, (cg_dtype)y, share);
  }
  test_router();
  test_optim();
  test_gemm();
  test_gemm_fp8();
  test_oom();
  rt_cuda_free(K);
  printf("peak GPU memory held by the test: %s\n", gpu_fmt_bytes(gpu_peak_bytes(G), mem, sizeof mem));
  gpu_close(G);
  return ck_finish("test_gpu_kernels", t0);
}
