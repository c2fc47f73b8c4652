/* test_gpu_tiles.c -- the weight-tile recipe on the GPU (mxfp8(block = 128, weight_tile = 128)):
 * rt_cuda_mxfp8_quantize_tiles against the CPU's square quantize (ck_mxfp8_quantize_group on
 * each 128 x 128 square), bit for bit, both orientations, f32 and bf16 weights, one square
 * holding a NaN; then cuBLASLt's FP8 GEMM with the weight's scales in 128 x 128 blocks
 * (gpu_gemm_fp8_blocks) against the exact product of the values (ck_mxfp8_qdq, ck_mxfp8_qdq_tiles)
 * in double, tolerance 2^-10 of the largest |C| as for the 1 x 128 GEMM (test_gpu_kernels); and
 * AdamW writing the squares (rt_cuda_adamw_squares) against AdamW then the quantizes, bit for bit.
 * Fresh random inputs (MOEC_TEST_SEED repeats a run); each square gets its own binade, so a
 * scale read from the wrong square shows. Skips where there is no CUDA driver or GPU;
 * scripts/cuda_emu/run.sh build test_gpu_tiles runs it on the CPU emulator (whose cuBLASLt
 * stand-in models the square scales' order this test confirms on the H200). */
#include "gpu_test.h"

#include "runtime/ck_grouped.h"
#include "runtime/gpu_blas.h"

/* x (E, A, B) with square (e, i, j) scaled by 2^(its own exponent in [-8, 8]). */
static float *square_binades(int64_t E, int64_t A, int64_t B, cg_dtype t) {
  float *x = rnd(E * A * B, -1.0f, 1.0f, CG_DT_F32);
  for (int64_t e = 0; e < E; e++)
    for (int64_t i = 0; i < A; i += 128)
      for (int64_t j = 0; j < B; j += 128) {
        int ex = (int)rng_int(17) - 8;
        for (int64_t r = i; r < i + 128 && r < A; r++) /* (a last partial square: the GEMM's X rows) */
          for (int64_t c = j; c < j + 128; c++) x[e * A * B + r * B + c] = ldexpf(x[e * A * B + r * B + c], ex);
      }
  if (t == CG_DT_BF16) ck_round_bf16(x, E * A * B);
  return x;
}

static void test_quantize_tiles(cg_dtype t, int tr) {
  const int64_t E = 2, A = 256, B = 384, n = E * A * B, nA = A / 128, nB = B / 128,
                seg = tr ? rt_cuda_tile_blk_floats(B, A) : rt_cuda_tile_blk_floats(A, B), ldk = ((tr ? nA : nB) + 3) / 4 * 4;
  float *x = square_binades(E, A, B, t);
  x[1 * A * B + 130 * B + 260] = NAN; /* square (1, 1, 2) */
  /* the reference: each square's bytes and code, laid out as the kernel's outputs */
  uint8_t *wq = malloc((size_t)n), *wc = malloc((size_t)(n / 32)), *gq = malloc((size_t)n), *gc = malloc((size_t)(n / 32));
  float *wb = falloc(E * seg), *gb = falloc(E * seg), *sq = falloc(128 * 128);
  uint8_t *q1 = malloc(128 * 128);
  const int64_t K_ = tr ? A : B; /* q's rows are K_ long */
  for (int64_t e = 0; e < E; e++)
    for (int64_t i = 0; i < nA; i++)
      for (int64_t j = 0; j < nB; j++) {
        for (int64_t r = 0; r < 128; r++)
          memcpy(sq + r * 128, x + e * A * B + (i * 128 + r) * B + j * 128, 128 * sizeof(float));
        uint8_t code = ck_mxfp8_quantize_group(sq, 128 * 128, q1);
        for (int64_t r = 0; r < 128; r++)
          for (int64_t c = 0; c < 128; c++) {
            int64_t wr = i * 128 + r, wcol = j * 128 + c; /* in the weight */
            int64_t qr = e * (tr ? B : A) + (tr ? wcol : wr), qc = tr ? wr : wcol;
            wq[qr * K_ + qc] = q1[r * 128 + c];
            if (qc % 32 == 0) wc[qr * (K_ / 32) + qc / 32] = code;
          }
        int64_t nb = tr ? j : i, kb = tr ? i : j;
        wb[e * seg + nb * ldk + kb] = code == 0xFF ? NAN : ldexpf(1.0f, (int)code - 127);
      }
  gpu_ptr dx = up_f(x, n, t), dq = dmalloc((size_t)n), dc = dmalloc((size_t)(n / 32)), db = dmalloc((size_t)(E * seg) * 4);
  RUN(rt_cuda_mxfp8_quantize_tiles(K, t, dx, 0, E, A, B, 32, tr, dq, dc, db));
  download(gq, dq, (size_t)n);
  download(gc, dc, (size_t)(n / 32));
  get_f(gb, db, E * seg, CG_DT_F32);
  int64_t bad = -1;
  for (int64_t i = 0; i < n && bad < 0; i++)
    if (gq[i] != wq[i]) bad = i;
  CHECK(bad < 0, "quantize_tiles [%s%s]: byte %lld got 0x%02x want 0x%02x", cg_dtype_name(t), tr ? ", transposed" : "",
        (long long)bad, bad >= 0 ? gq[bad] : 0, bad >= 0 ? wq[bad] : 0);
  CHECK(memcmp(gc, wc, (size_t)(n / 32)) == 0, "quantize_tiles [%s%s]: the row codes differ", cg_dtype_name(t),
        tr ? ", transposed" : "");
  int same = 1;
  for (int64_t i = 0; i < E; i++)
    for (int64_t r = 0; r < (tr ? nB : nA); r++)
      for (int64_t c = 0; c < (tr ? nA : nB); c++) {
        float g = gb[i * seg + r * ldk + c], w = wb[i * seg + r * ldk + c];
        if (!(g == w || (isnan(g) && isnan(w)))) same = 0;
      }
  CHECK(same, "quantize_tiles [%s%s]: the square scales differ", cg_dtype_name(t), tr ? ", transposed" : "");
  printf("  quantize_tiles [%s%s] %lld values, bit-exact (bytes, row codes, square scales; a NaN square)\n",
         cg_dtype_name(t), tr ? ", transposed" : "", (long long)n);
  /* a f32 weight read through a bf16 cast (round_bf16) gives the bf16 weight's bytes */
  if (t == CG_DT_F32) {
    float *xr = dup(x, n);
    ck_round_bf16(xr, n);
    gpu_ptr dr = up_f(xr, n, CG_DT_BF16), dq2 = dmalloc((size_t)n), dc2 = dmalloc((size_t)(n / 32));
    RUN(rt_cuda_mxfp8_quantize_tiles(K, CG_DT_F32, dx, 1, E, A, B, 32, tr, dq, dc, db));
    RUN(rt_cuda_mxfp8_quantize_tiles(K, CG_DT_BF16, dr, 0, E, A, B, 32, tr, dq2, dc2, db));
    download(gq, dq, (size_t)n);
    download(wq, dq2, (size_t)n);
    CHECK(memcmp(gq, wq, (size_t)n) == 0, "quantize_tiles: f32 rounded to bf16 differs from the bf16 weight's");
    free(xr);
  }
  CHECK(rt_cuda_mxfp8_quantize_tiles(K, t, dx, 0, E, A, 200, 32, tr, dq, dc, db) != 0,
        "quantize_tiles accepted B = 200 (not a multiple of 128)");
  expect_flag("quantize_tiles", CK_OK);
  free(x), free(wq), free(wc), free(gq), free(gc), free(wb), free(gb), free(sq), free(q1);
  dfree_all();
}

/* C (m, n) = X (m, k) . W (n, k)^T with W in squares, the square scales in the layout the
 * runtime writes (k = 384: three square columns, the rows padded to four). The first H200 run
 * tried two unpadded orders; neither matched (errors of 1e23 from the padding's garbage). */
static void test_gemm_tiles(void) {
  char err[512];
  gpu_blas *bl = gpu_blas_new(G, err, sizeof err);
  if (!bl) {
    printf("  SKIP fp8 gemm with square scales: %s\n", err);
    return;
  }
  const int64_t m = 96, n = 256, k = 384;
  float *x = square_binades(1, m, k, CG_DT_BF16), *w = square_binades(1, n, k, CG_DT_BF16);
  float *xd = falloc(m * k), *wd = falloc(n * k), *want = falloc(m * n), *got = falloc(m * n);
  const int64_t dx[2] = {m, k};
  CHECK(ck_mxfp8_qdq(x, xd, 2, dx, 1, 32, 1, NULL, 0) == CK_OK && ck_mxfp8_qdq_tiles(w, wd, 1, n, k, 128) == CK_OK,
        "the CPU quantizes");
  gemm_nt_ref(xd, wd, m, n, k, want);
  gpu_ptr gx = up_f(x, m * k, CG_DT_BF16), gw = up_f(w, n * k, CG_DT_BF16);
  gpu_ptr qx = dmalloc((size_t)(m * k)), sx = dmalloc((size_t)(m * k / 32)), fx = dmalloc((size_t)(m * k / 128) * 4);
  gpu_ptr qw = dmalloc((size_t)(n * k)), cw = dmalloc((size_t)(n * k / 32)),
          bw = dmalloc((size_t)rt_cuda_tile_blk_floats(n, k) * 4);
  /* the padding poisoned: a layout that read it would show */
  float *poison = falloc(rt_cuda_tile_blk_floats(n, k));
  for (int64_t i = 0; i < rt_cuda_tile_blk_floats(n, k); i++) poison[i] = 0x1p100f;
  upload(bw, poison, (size_t)rt_cuda_tile_blk_floats(n, k) * 4);
  RUN(rt_cuda_mxfp8_quantize(K, CG_DT_BF16, gx, m, k, 32, 1, qx, sx));
  RUN(rt_cuda_mxfp8_scales_vec128(K, sx, m, k, 32, 0, 0, 0, fx));
  RUN(rt_cuda_mxfp8_quantize_tiles(K, CG_DT_BF16, gw, 0, 1, n, k, 32, 0, qw, cw, bw));
  for (int ct = 0; ct < CG_DT_COUNT; ct++) {
    gpu_mat C = {(cg_dtype)ct, dmalloc((size_t)(m * n) * 4), n, 0, 0};
    if (gpu_gemm_fp8_blocks(bl, m, n, k, qx, fx, qw, bw, 1, &C, err, sizeof err) != 0) {
      CHECK(0, "gpu_gemm_fp8_blocks: %s", err);
      break;
    }
    get_f(got, C.p, m * n, (cg_dtype)ct);
    double worst = 0, mx = maxabs(want, m * n);
    for (int64_t i = 0; i < m * n; i++) worst = fmax(worst, fabs((double)got[i] - want[i]));
    printf("  fp8 gemm %lldx%lldx%lld, square scales -> %s: max err %.2g of %.2g\n", (long long)m, (long long)n,
           (long long)k, cg_dtype_name((cg_dtype)ct), worst, mx);
    cmp("fp8 gemm, square scales", got, want, m * n, (cg_dtype)ct, 0, 0x1p-10 * mx);
  }
  expect_flag("fp8 gemm, square scales", CK_OK);
  free(x), free(w), free(xd), free(wd), free(want), free(got), free(poison);
  dfree_all();
  gpu_blas_free(bl);
}

/* rt_cuda_adamw_squares against what it replaces: rt_cuda_adamw_multi writing the bf16 copies
 * into the stack, then rt_cuda_mxfp8_quantize_tiles both ways -- weights, moments, both
 * orientations' bytes and square scales bit for bit. A stack (E, 256, 384) of two parts, 128
 * and 256 columns wide (a square's part found by its column), gradients of dtype gt in the
 * stack's layout, a norm that clips; then the quantize-only form (no gradient) against the
 * quantize of the bf16 copy, the weights left alone. */
static void test_adamw_squares(cg_dtype gt, int moments_bf16) {
  const int64_t E = 2, A = 256, B = 384, n = E * A * B, parts = 2, cols[2] = {128, 256}, c0s[2] = {0, 128};
  const rt_cuda_adamw_hp hp = {1e-3, 0.9, 0.95, 1e-8, 0.1, 3, 1.0, moments_bf16};
  const cg_dtype mt = moments_bf16 ? CG_DT_BF16 : CG_DT_F32; /* the moments' storage */
  const float norm = 4.0f; /* > clip: every gradient scaled by 1 / 4 */
  float *g = square_binades(E, A, B, gt);
  gpu_ptr dg = up_f(g, n, gt), dnorm = up_f(&norm, 1, CG_DT_F32);
  gpu_ptr w[2][4], m[2][4], v[2][4]; /* [path][part * E + e] */
  rt_cuda_adamw_tensor t[4];
  rt_cuda_sq_param tab[4];
  gpu_ptr stack = dmalloc((size_t)n * 2);
  for (int64_t part = 0; part < parts; part++)
    for (int64_t e = 0; e < E; e++) {
      const int64_t k = part * E + e, np = A * cols[part];
      float *wh = square_binades(1, A, cols[part], CG_DT_F32), *mh = rnd(np, -0.01f, 0.01f, mt), *vh = rnd(np, 0.0f, 1e-4f, mt);
      for (int p = 0; p < 2; p++) w[p][k] = up_f(wh, np, CG_DT_F32), m[p][k] = up_f(mh, np, mt), v[p][k] = up_f(vh, np, mt);
      const size_t es = gt == CG_DT_BF16 ? 2 : 4;
      t[k] = (rt_cuda_adamw_tensor){w[0][k], dg + (gpu_ptr)((size_t)(e * A * B + c0s[part]) * es), m[0][k], v[0][k],
                                    stack + (gpu_ptr)((size_t)(e * A * B + c0s[part]) * 2), np, 0.1,
                                    {cols[part], B, cols[part], B}};
      tab[k] = (rt_cuda_sq_param){w[1][k], m[1][k], v[1][k], c0s[part], cols[part]};
      free(wh), free(mh), free(vh);
    }
  gpu_ptr dtab = up_raw(tab, sizeof tab), q[2][2], blk[2][2], codes = dmalloc((size_t)n / 32);
  const int64_t segs[2] = {E * rt_cuda_tile_blk_floats(A, B), E * rt_cuda_tile_blk_floats(B, A)};
  for (int p = 0; p < 2; p++)
    for (int tr = 0; tr < 2; tr++) q[p][tr] = dmalloc((size_t)n), blk[p][tr] = dmalloc((size_t)segs[tr] * 4);
  /* the padding of the scale rows is never written: zero both so that it compares equal */
  for (int p = 0; p < 2; p++)
    for (int tr = 0; tr < 2; tr++) {
      float *z = falloc(segs[tr]);
      upload(blk[p][tr], z, (size_t)segs[tr] * 4);
      free(z);
    }
  for (int pass = 0; pass < 2; pass++) { /* 0: an AdamW step; 1: the squares of the weights as they are */
    if (pass == 0) RUN(rt_cuda_adamw_multi(K, gt, t, 4, dnorm, &hp));
    else
      for (int k = 0; k < 4; k++)
        RUN(rt_cuda_copy_cols(K, CG_DT_F32, CG_DT_BF16, w[0][k], t[k].win.wb_cols, 0, t[k].wb, B, 0, A, t[k].win.wb_cols));
    for (int tr = 0; tr < 2; tr++) RUN(rt_cuda_mxfp8_quantize_tiles(K, CG_DT_BF16, stack, 0, E, A, B, 32, tr, q[0][tr], codes, blk[0][tr]));
    RUN(rt_cuda_adamw_squares(K, dtab, (int)parts, E, A, B, gt, pass == 0 ? dg : 0, dnorm, &hp, 0.1, 32, q[1][0], blk[1][0],
                              q[1][1], blk[1][1]));
    int same = 1;
    for (int k = 0; k < 4; k++) {
      const int64_t np = A * cols[k / E];
      gpu_ptr a[3] = {w[0][k], m[0][k], v[0][k]}, b[3] = {w[1][k], m[1][k], v[1][k]};
      for (int i = 0; i < 3; i++) {
        const size_t bytes = (size_t)np * (i && moments_bf16 ? 2 : 4);
        float *x0 = falloc(np), *x1 = falloc(np);
        download(x0, a[i], bytes);
        download(x1, b[i], bytes);
        same &= memcmp(x0, x1, bytes) == 0;
        free(x0), free(x1);
      }
    }
    CHECK(same, "adamw_squares [%s%s%s]: weights or moments differ from adamw_multi's", cg_dtype_name(gt),
          moments_bf16 ? ", bf16 moments" : "", pass ? ", no gradient" : "");
    for (int tr = 0; tr < 2; tr++) {
      uint8_t *a = malloc((size_t)n), *b = malloc((size_t)n);
      float *fa = falloc(segs[tr]), *fb = falloc(segs[tr]);
      download(a, q[0][tr], (size_t)n);
      download(b, q[1][tr], (size_t)n);
      get_f(fa, blk[0][tr], segs[tr], CG_DT_F32);
      get_f(fb, blk[1][tr], segs[tr], CG_DT_F32);
      CHECK(memcmp(a, b, (size_t)n) == 0, "adamw_squares [%s%s]: the %s bytes differ from the quantize's", cg_dtype_name(gt),
            pass ? ", no gradient" : "", tr ? "transposed" : "row");
      CHECK(memcmp(fa, fb, (size_t)segs[tr] * 4) == 0, "adamw_squares [%s%s]: the %s square scales differ", cg_dtype_name(gt),
            pass ? ", no gradient" : "", tr ? "transposed" : "row");
      free(a), free(b), free(fa), free(fb);
    }
    printf("  adamw_squares [%s%s%s]: weights, moments, both orientations' bytes and scales bit-exact\n", cg_dtype_name(gt),
           moments_bf16 ? ", bf16 moments" : "", pass ? ", no gradient" : ", clipped step");
  }
  CHECK(rt_cuda_adamw_squares(K, dtab, (int)parts, E, A, 200, gt, dg, dnorm, &hp, 0.1, 32, q[1][0], blk[1][0], q[1][1],
                              blk[1][1]) != 0,
        "adamw_squares accepted B = 200 (not a multiple of 128)");
  expect_flag("adamw_squares", CK_OK);
  free(g);
  dfree_all();
}

int main(void) {
  double t0 = ck_now();
  uint64_t seed;
  int st = gpu_test_start(&seed);
  if (st) return st < 0;
  printf("GPU 0: %s; seed %llu (MOEC_TEST_SEED repeats it)\n", gpu_info(G)->name, (unsigned long long)seed);
  for (int t = 0; t < CG_DT_COUNT; t++)
    for (int tr = 0; tr < 2; tr++) test_quantize_tiles((cg_dtype)t, tr);
  for (int t = 0; t < CG_DT_COUNT; t++)
    for (int mb = 0; mb < 2; mb++) test_adamw_squares((cg_dtype)t, mb);
  if (gpu_info(G)->cc_major >= 9) test_gemm_tiles();
  else printf("  fp8 gemm with square scales: needs sm_90 (skipped on this GPU)\n");
  rt_cuda_free(K);
  gpu_close(G);
  return ck_finish("test_gpu_tiles", t0);
}
