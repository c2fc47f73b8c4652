/* test_gpu_wgmma.c -- the device-driven FP8 grouped GEMM (runtime/gpu_wgmma.h) against a CPU
 * reference in double, on fresh random E4M3 operands and random power-of-two scales, every
 * variant, both output types: the rows mode (uneven experts: 37, 0, 200, 129, 64 rows; K of
 * three 128-chunks; N = 272: partial tiles of 128 and 256 columns) and the wgrad mode
 * (tokens 300, 0, 128, 77, padded to 128; M = 144, N = 272; the experts' blocks one after
 * another, and columns of one matrix). Scale slots the kernel must not use (row padding) hold NaN,
 * and C is prefilled with NaN: every output element must be written (an expert without tokens
 * gets zeros in wgrad) and nothing past the experts' rows. The rows mode also runs with the
 * weights' scales as 128 x 128 squares (N = 384; the squares' padding NaN). The cuBLASLt path
 * (gpu_fp8_grouped_gemm) runs on the same operands for comparison.
 * Tolerance: |got - want| <= 2^-8 sum_k |a_k b_k| sa sb (+ bf16 rounding), i.e. relative
 * to the sum of absolute products: Hopper's FP8 tensor-core sums keep about 14 bits within a
 * 128-chunk (the H200 measured up to 0.9 x 2^-10 here, cuBLASLt's FP8 path the same); a
 * layout slip gives errors of the order of the bound itself. Skips (and passes) without a GPU or on a GPU other than sm_90. */
#pragma GCC diagnostic ignored "-Wunused-function" /* gpu_test.h helpers this test does not need */
#include "gpu_test.h"
#include "runtime/gpu_blas.h"
#include "runtime/gpu_fp8.h"
#include "runtime/gpu_wgmma.h"

static gpu_wgmma *W;
static gpu_blas *BL;

static uint8_t rnd_e4m3(void) { /* any finite E4M3 code (0x7F / 0xFF are NaN) */
  uint8_t b;
  do b = (uint8_t)rng_u64(); while ((b & 0x7F) == 0x7F);
  return b;
}
static float rnd_scale(void) { return ldexpf(1.0f, rng_int(9) - 4); }

/* C_e (m, n) = A_e (m, k) . B_e (n, k)^T with per-(row, 128-chunk) scales: want and the bound */
static void ref_gemm(const uint8_t *a, int64_t lda, const float *sa, int64_t sa_ld, const uint8_t *b, int64_t ldb,
                     const float *sb, int64_t sb_ld, int64_t m, int64_t n, int64_t k, double *want, double *bound,
                     int64_t ldw) {
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) {
      double s = 0, abs = 0;
      for (int64_t kc = 0; kc < k / 128; kc++) {
        double part = 0, pabs = 0;
        for (int64_t q = kc * 128; q < kc * 128 + 128; q++) {
          double x = (double)ck_e4m3_to_float(a[i * lda + q]) * ck_e4m3_to_float(b[j * ldb + q]);
          part += x, pabs += fabs(x);
        }
        double sc = (double)sa[kc * sa_ld + i] * sb[kc * sb_ld + j];
        s += part * sc, abs += pabs * sc;
      }
      want[i * ldw + j] = s, bound[i * ldw + j] = abs;
    }
}

/* got (n values stored as tc) against want within 2^-8 bound (+ bf16 rounding) */
static int64_t count_bad(const float *got, const double *want, const double *bound, int64_t n, cg_dtype tc,
                         double *worst) {
  int64_t bad = 0;
  for (int64_t i = 0; i < n; i++) {
    double tol = 0x1p-8 * bound[i] + (tc == CG_DT_BF16 ? 0x1p-8 * fabs(want[i]) : 0) + 1e-30;
    double err = fabs((double)got[i] - want[i]);
    if (!(err <= tol) && bad++ < 4) /* the first few, to tell a layout slip from rounding */
      printf("    output %lld: got %.6g, want %.6g (bound %.3g)\n", (long long)i, got[i], want[i], bound[i]);
    if (err / tol > *worst || isnan(got[i])) *worst = isnan(got[i]) ? INFINITY : err / tol;
  }
  return bad;
}

static void fill_nan(gpu_ptr p, int64_t n, cg_dtype t) {
  if (t == CG_DT_F32) CHECK(gpu_memset32(G, p, 0x7fc00000u, (size_t)n) == 0, "memset");
  else CHECK(gpu_memset32(G, p, 0x7fc07fc0u, (size_t)n / 2) == 0, "memset");
}

/* squares 1: B's scales one per 128 x 128 of each weight (the weight-tile recipe; N three
 * squares wide: the wide variants' second tile has one half, K's three chunks padded to the layout's 4 with NaN); the vec128 table, NaN,
 * goes unused (gpu_wgmma_fp8_rows passes the kernel no sb with squares) */
static void test_rows(int variant, cg_dtype tc, int squares) {
  enum { E = 5 };
  const int32_t counts[E] = {37, 0, 200, 129, 64};
  const int64_t K = 384, N = squares ? 384 : 272, KB = K / 128, S = 430, SLACK = 16, LDK = (KB + 3) / 4 * 4,
                SEG = N / 128 * LDK;
  printf("wgmma fp8 rows mode, variant %d, C %s: experts 37, 0, 200, 129, 64 rows, K %lld, N %lld%s\n", variant,
         cg_dtype_name(tc), (long long)K, (long long)N, squares ? ", weights' scales as squares" : "");
  uint8_t *a = malloc((size_t)((S + SLACK) * K)), *b = malloc((size_t)(E * N * K));
  for (int64_t i = 0; i < (S + SLACK) * K; i++) a[i] = rnd_e4m3();
  for (int64_t i = 0; i < E * N * K; i++) b[i] = rnd_e4m3();
  int64_t nsa = 0;
  for (int e = 0; e < E; e++) nsa += fp8_scale_floats(fp8_rows(counts[e]), K);
  const int64_t wsb = fp8_scale_floats(fp8_rows(N), K);
  float *sa = malloc((size_t)nsa * 4), *sb = malloc((size_t)(E * wsb) * 4);
  for (int64_t i = 0; i < nsa; i++) sa[i] = NAN; /* padding stays NaN: the kernel must not use it */
  float *sq = malloc((size_t)(E * SEG) * 4);
  for (int64_t i = 0; i < E * wsb; i++) sb[i] = squares ? NAN : rnd_scale();
  for (int64_t i = 0; i < E * SEG; i++) sq[i] = i % LDK < KB ? rnd_scale() : NAN;
  if (squares) /* the reference reads each column's scale: its square's */
    for (int e = 0; e < E; e++)
      for (int64_t kc = 0; kc < KB; kc++)
        for (int64_t j = 0; j < N; j++) sb[e * wsb + kc * N + j] = sq[e * SEG + j / 128 * LDK + kc];
  int64_t so = 0, r0 = 0;
  double *want = dalloc(S * N), *bound = dalloc(S * N);
  for (int e = 0; e < E; e++) {
    const int64_t m = counts[e], ld = fp8_rows(m);
    for (int64_t kc = 0; kc < KB; kc++)
      for (int64_t i = 0; i < m; i++) sa[so + kc * ld + i] = rnd_scale();
    ref_gemm(a + r0 * K, K, sa + so, ld, b + e * N * K, K, sb + e * wsb, N, m, N, K, want + r0 * N, bound + r0 * N, N);
    so += fp8_scale_floats(ld, K), r0 += m;
  }
  if (squares) /* the kernel reads the squares; the vec128 scales are NaN again */
    for (int64_t i = 0; i < E * wsb; i++) sb[i] = NAN;
  gpu_ptr da = up_raw(a, (size_t)((S + SLACK) * K)), db = up_raw(b, (size_t)(E * N * K)),
          dsa = up_raw(sa, (size_t)nsa * 4), dsb = up_raw(sb, (size_t)(E * wsb) * 4), dc_ = up_raw(counts, sizeof counts),
          dcm = dmalloc((size_t)((S + SLACK) * N) * dts(tc)), dsq = squares ? up_raw(sq, (size_t)(E * SEG) * 4) : 0;
  fill_nan(dcm, (S + SLACK) * N, tc);
  char err[1024];
  gpu_wgmma_set_variant(W, variant);
  CHECK(gpu_wgmma_fp8_rows(W, dc_, E, S, N, K, da, dsa, db, dsb, dsq, tc, dcm, N, err, sizeof err) == 0, "%s", err);
  float *got = falloc((S + SLACK) * N);
  get_f(got, dcm, (S + SLACK) * N, tc);
  double worst = 0;
  int64_t bad = count_bad(got, want, bound, S * N, tc, &worst);
  CHECK(bad == 0, "rows mode: %lld of %lld outputs outside the tolerance (worst %.3g x the bound)", (long long)bad,
        (long long)(S * N), worst);
  int64_t touched = 0;
  for (int64_t i = S * N; i < (S + SLACK) * N; i++) touched += !isnan(got[i]);
  CHECK(touched == 0, "rows mode wrote %lld values past the last expert's rows", (long long)touched);
  { /* counts past S (the last expert's inflated by 100): cut at S, the same outputs, nothing past */
    int32_t big[E];
    memcpy(big, counts, sizeof big);
    big[E - 1] += 100;
    gpu_ptr dbig = up_raw(big, sizeof big);
    fill_nan(dcm, (S + SLACK) * N, tc);
    CHECK(gpu_wgmma_fp8_rows(W, dbig, E, S, N, K, da, dsa, db, dsb, dsq, tc, dcm, N, err, sizeof err) == 0, "%s", err);
    float *g2 = falloc((S + SLACK) * N);
    get_f(g2, dcm, (S + SLACK) * N, tc);
    int64_t past = 0, differ = 0;
    for (int64_t i = 0; i < S * N; i++) differ += memcmp(&g2[i], &got[i], sizeof *g2) != 0;
    for (int64_t i = S * N; i < (S + SLACK) * N; i++) past += !isnan(g2[i]);
    CHECK(differ == 0 && past == 0, "counts summing past S: %lld outputs changed, %lld written past S", (long long)differ,
          (long long)past);
    free(g2);
  }
  /* the cuBLASLt path on the same operands (it writes up to 15 rows of slack; the 16 allow it) */
  if (BL) {
    float *cub = falloc((S + SLACK) * N);
    int32_t hc[E];
    memcpy(hc, counts, sizeof hc);
    CHECK(gpu_fp8_grouped_gemm(BL, hc, E, N, K, da, dsa, db, dsb, dsq, tc, dcm, N, err, sizeof err) == 0, "%s", err);
    get_f(cub, dcm, S * N, tc);
    double w2 = 0;
    int64_t bad2 = count_bad(cub, want, bound, S * N, tc, &w2);
    printf("  wgmma: worst error %.3g x the bound; cuBLASLt on the same operands: %.3g x (%lld outside)\n", worst, w2,
           (long long)bad2);
    free(cub);
  }
  free(a), free(b), free(sa), free(sb), free(sq), free(want), free(bound), free(got);
  dfree_all();
}

/* one_matrix 0: A_e, B_e are (M, P_e), (N, P_e) blocks one after another; 1: columns Poff_e..
 * of one (M, ld) and one (N, ld) matrix, ld a tile past the sum of P_e */
static void test_wgrad(int variant, cg_dtype tc, int one_matrix) {
  enum { E = 4 };
  const int32_t counts[E] = {300, 0, 128, 77};
  const int64_t M = 144, N = 272;
  int64_t P[E], Ptot = 0;
  for (int e = 0; e < E; e++) Ptot += P[e] = (counts[e] + 127) / 128 * 128;
  const int64_t ld = one_matrix ? Ptot + 128 : 0, cols = one_matrix ? ld : Ptot;
  printf("wgmma fp8 wgrad mode, variant %d, C %s: experts of 300, 0, 128, 77 tokens, M %lld, N %lld, %s\n", variant,
         cg_dtype_name(tc), (long long)M, (long long)N, one_matrix ? "one matrix" : "blocks");
  uint8_t *a = malloc((size_t)(M * cols)), *b = malloc((size_t)(N * cols));
  for (int64_t i = 0; i < M * cols; i++) a[i] = rnd_e4m3();
  for (int64_t i = 0; i < N * cols; i++) b[i] = rnd_e4m3();
  float *sa = malloc((size_t)(M * Ptot / 128) * 4 + 4), *sb = malloc((size_t)(N * Ptot / 128) * 4 + 4);
  for (int64_t i = 0; i < M * Ptot / 128; i++) sa[i] = rnd_scale();
  for (int64_t i = 0; i < N * Ptot / 128; i++) sb[i] = rnd_scale();
  double *want = dalloc(E * M * N), *bound = dalloc(E * M * N);
  int64_t po = 0;
  for (int e = 0; e < E; e++) {
    if (one_matrix)
      ref_gemm(a + po, ld, sa + M * po / 128, M, b + po, ld, sb + N * po / 128, N, M, N, P[e], want + e * M * N,
               bound + e * M * N, N);
    else
      ref_gemm(a + M * po, P[e], sa + M * po / 128, M, b + N * po, P[e], sb + N * po / 128, N, M, N, P[e],
               want + e * M * N, bound + e * M * N, N);
    po += P[e];
  }
  gpu_ptr da = up_raw(a, (size_t)(M * cols)), db = up_raw(b, (size_t)(N * cols)),
          dsa = up_raw(sa, (size_t)(M * Ptot / 128) * 4 + 4), dsb = up_raw(sb, (size_t)(N * Ptot / 128) * 4 + 4),
          dc_ = up_raw(counts, sizeof counts), dcm = dmalloc((size_t)(E * M * N + 64) * dts(tc));
  fill_nan(dcm, E * M * N + 64, tc);
  char err[1024];
  gpu_wgmma_set_variant(W, variant);
  int64_t S = 0;
  for (int e = 0; e < E; e++) S += counts[e];
  CHECK(gpu_wgmma_fp8_wgrad(W, dc_, E, S, M, N, ld, da, dsa, db, dsb, tc, dcm, err, sizeof err) == 0, "%s", err);
  float *got = falloc(E * M * N + 64);
  get_f(got, dcm, E * M * N + 64, tc);
  double worst = 0;
  int64_t bad = count_bad(got, want, bound, E * M * N, tc, &worst);
  CHECK(bad == 0, "wgrad mode: %lld of %lld outputs outside the tolerance (worst %.3g x the bound)", (long long)bad,
        (long long)(E * M * N), worst);
  int64_t zeros = 0, touched = 0;
  for (int64_t i = M * N; i < 2 * M * N; i++) zeros += got[i] == 0.0f;
  for (int64_t i = E * M * N; i < E * M * N + 64; i++) touched += !isnan(got[i]);
  CHECK(zeros == M * N, "wgrad mode: the expert without tokens got %lld zeros of %lld", (long long)zeros, (long long)(M * N));
  CHECK(touched == 0, "wgrad mode wrote %lld values past the last expert", (long long)touched);
  printf("  wgmma: worst error %.3g x the bound\n", worst);
  free(a), free(b), free(sa), free(sb), free(want), free(bound), free(got);
  dfree_all();
}

int main(void) {
  double t0 = ck_now();
  uint64_t seed;
  int st = gpu_test_start(&seed);
  if (st) return st < 0;
  printf("GPU 0: %s (%s); seed %llu (MOEC_TEST_SEED repeats it)\n", gpu_info(G)->name, gpu_info(G)->arch,
         (unsigned long long)seed);
  char err[4096];
  W = gpu_wgmma_new(G, gpu_info(G)->arch, "", err, sizeof err);
  if (!W && !err[0]) {
    printf("SKIP: wgmma needs sm_90a; this GPU is %s\n", gpu_info(G)->arch);
    rt_cuda_free(K);
    gpu_close(G);
    return 0;
  }
  CHECK(W != NULL, "gpu_wgmma_new: %s", err);
  if (W) {
    BL = gpu_blas_new(G, err, sizeof err);
    if (!BL) printf("  (no cuBLASLt for the comparison: %s)\n", err);
    for (int v = 0; v < gpu_wgmma_n_variants(); v++)
      for (int t = 0; t < CG_DT_COUNT; t++) {
        test_rows(v, (cg_dtype)t, 0);
        test_rows(v, (cg_dtype)t, 1);
        test_wgrad(v, (cg_dtype)t, 0);
        test_wgrad(v, (cg_dtype)t, 1);
      }
    if (BL) gpu_blas_free(BL);
    gpu_wgmma_free(W);
  }
  rt_cuda_free(K);
  gpu_close(G);
  return ck_finish("test_gpu_wgmma", t0);
}
