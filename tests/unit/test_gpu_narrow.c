/* test_gpu_narrow.c -- the narrow f32 GEMMs (rt_cuda_narrow_gemm: the router's logits and
 * their gradients) against the product in double, on fresh random inputs (MOEC_TEST_SEED
 * repeats a run): every kernel (n <= 8 and <= 16 columns, the reduction over a long k with its
 * partial sums), both operand layouts, padded rows, an unaligned
 * operand (the scalar path), k past one staged chunk and not a multiple of 4. Tolerance per
 * value: 2e-5 of sum |a b| (f32 sums of at most a few hundred terms in a chain; a term lost
 * or doubled is 1 / k of it on average, 2e-4 at k = 5000). Skips where there is no CUDA driver or GPU;
 * scripts/cuda_emu/run.sh build test_gpu_narrow runs it on the CPU emulator. */
#include "gpu_test.h"

typedef struct {
  int64_t m, n, k;
  int ta, tb, pad, unaligned; /* pad: extra floats a row of every operand; unaligned: a one float in */
  const char *what;
} narrow_case;

static void run_case(const narrow_case *t) {
  const int64_t m = t->m, n = t->n, k = t->k, off = t->unaligned ? 1 : 0;
  const int64_t ar = t->ta ? k : m, ac = t->ta ? m : k, br = t->tb ? n : k, bc = t->tb ? k : n;
  const int64_t lda = ac + t->pad, ldb = bc + t->pad, ldc = n + t->pad;
  float *a = rnd(ar * lda + off, -1, 1, CG_DT_F32), *b = rnd(br * ldb, -1, 1, CG_DT_F32);
  float *want = falloc(m * ldc), *bound = falloc(m * ldc), *got = falloc(m * ldc);
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) {
      double s = 0, sa = 0;
      for (int64_t p = 0; p < k; p++) {
        double x = a[off + (t->ta ? p * lda + i : i * lda + p)], y = b[t->tb ? j * ldb + p : p * ldb + j];
        s += x * y, sa += fabs(x * y);
      }
      want[i * ldc + j] = (float)s, bound[i * ldc + j] = (float)(2e-5 * sa + 1e-30);
    }
  gpu_ptr da = up_f(a, ar * lda + off, CG_DT_F32), db = up_f(b, br * ldb, CG_DT_F32);
  /* C starts as -7 everywhere: the padding past n must keep it */
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = n; j < ldc; j++) want[i * ldc + j] = -7.0f, bound[i * ldc + j] = 0.0f;
  float *fill = falloc(m * ldc);
  for (int64_t i = 0; i < m * ldc; i++) fill[i] = -7.0f;
  gpu_ptr dc = up_f(fill, m * ldc, CG_DT_F32);
  free(fill);
  CHECK(rt_cuda_narrow_gemm(K, m, n, k, da + (gpu_ptr)off * 4, lda, t->ta, db, ldb, t->tb, dc, ldc) == 0, "%s: %s", t->what,
        rt_cuda_error(K));
  get_f(got, dc, m * ldc, CG_DT_F32);
  int64_t bad = -1;
  double worst = 0;
  for (int64_t e = 0; e < m * ldc && bad < 0; e++) {
    double d = fabs((double)got[e] - want[e]);
    if (!(d <= bound[e])) bad = e;
    if (bound[e] > 0) worst = fmax(worst, d / bound[e] * 2e-5);
  }
  CHECK(bad < 0, "%s: C[%lld, %lld] = %.9g, want %.9g (bound %.3g)", t->what, (long long)(bad / ldc), (long long)(bad % ldc),
        bad >= 0 ? got[bad] : 0.0, bad >= 0 ? want[bad] : 0.0, bad >= 0 ? bound[bad] : 0.0);
  printf("  %-54s %lld x %lld x %lld%s%s: worst %.2g of sum |ab|\n", t->what, (long long)m, (long long)n, (long long)k,
         t->ta ? " (A^T)" : "", t->tb ? " (B^T)" : "", worst);
  expect_flag(t->what, CK_OK);
  free(a), free(b), free(want), free(bound), free(got);
  dfree_all();
}

int main(void) {
  double t0 = ck_now();
  uint64_t seed;
  int st = gpu_test_start(&seed);
  if (st) return st < 0;
  printf("GPU 0: %s; seed %llu (MOEC_TEST_SEED repeats it)\n", gpu_info(G)->name, (unsigned long long)seed);
  const narrow_case cases[] = {
      /* the router at a small genos_1b: logits, their input gradient, the gate's gradient */
      {1000, 8, 1024, 0, 0, 0, 0, "logits x . gate (narrow_n, 8)"},
      {1024, 8, 3000, 1, 0, 0, 0, "dgate = x^T . dlogits (partials + their sum)"},
      /* shapes and layouts around them */
      {77, 13, 300, 0, 0, 3, 0, "n 13 (narrow_n, 16), k past a chunk, padded rows"},
      {77, 5, 37, 0, 1, 0, 1, "k 37, B^T, unaligned A (the scalar path)"},
      {130, 16, 516, 0, 1, 4, 0, "n 16, B^T, padded rows"},
      {33, 12, 16, 1, 0, 2, 0, "k 16, A^T, padded rows"},
      {5, 7, 3, 1, 1, 0, 1, "k 3, both transposed, unaligned A"},
      {300, 13, 129, 1, 1, 1, 0, "A^T and B^T, n 13, k one past a partial sum"},
      {1, 8, 5000, 1, 0, 0, 0, "one row of C, k 5000"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i]);
  /* too wide: refused with the sizes named, nothing launched */
  CHECK(!rt_cuda_narrow_ok(64, 17, 17) && rt_cuda_narrow_ok(64, 16, 1000) && !rt_cuda_narrow_ok(8192, 1024, 8) &&
            !rt_cuda_narrow_ok(64, 8, (int64_t)1 << 20),
        "rt_cuda_narrow_ok: more than 16 columns (the router's dx among them: cuBLASLt is faster there), or k past "
        "the partials' scratch, must go to cuBLASLt");
  CHECK(rt_cuda_narrow_gemm(K, 64, 17, 17, 0, 17, 0, 0, 17, 0, 0, 17) != 0 && strstr(rt_cuda_error(K), "17 x 17"),
        "a 64 x 17 x 17 product was not refused: %s", rt_cuda_error(K));
  printf("  64 x 17 x 17 refused: %s\n", rt_cuda_error(K));
  rt_cuda_free(K);
  gpu_close(G);
  return ck_finish("test_gpu_narrow", t0);
}
