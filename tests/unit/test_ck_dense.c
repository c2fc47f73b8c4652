/* test_ck_dense.c -- CPU reference kernels of ck_dense.c against naive double-precision
 * loops (forward) and finite differences of those loops (backward): matmul, linear,
 * embedding, rmsnorm, silu, mul, add, row softmax and logsumexp. */
#include "ck_test.h"

enum { T = 6, H = 12, V = 11, N_OUT = 5 };

/* ---- matmul ---- */

static void test_matmul(void) {
  printf("matmul (m=%d k=%d n=%d, all transpose flags, beta 0 / 0.5):\n", T, H, N_OUT);
  const int64_t m = T, k = H, n = N_OUT;
  float *A = falloc(m * k), *B = falloc(k * n), *C = falloc(m * n), *C0 = falloc(m * n);
  double *want = dalloc(m * n);
  fill(A, m * k, -1, 1);
  fill(B, k * n, -1, 1);
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++)
      for (int bi = 0; bi < 2; bi++) {
        float beta = bi ? 0.5f : 0.0f;
        fill(C0, m * n, -1, 1);
        if (!bi) C0[3] = NAN; /* beta = 0 must not read C */
        memcpy(C, C0, sizeof(float) * m * n);
        /* A and B hold the same numbers whatever the flags; only their reading changes */
        for (int64_t i = 0; i < m; i++)
          for (int64_t j = 0; j < n; j++) {
            double s = bi ? (double)beta * C0[i * n + j] : 0.0;
            for (int64_t p = 0; p < k; p++)
              s += (double)(ta ? A[p * m + i] : A[i * k + p]) * (tb ? B[j * k + p] : B[p * n + j]);
            want[i * n + j] = s;
          }
        ck_matmul(A, B, C, m, k, n, ta, tb, beta);
        char what[64];
        snprintf(what, sizeof what, "matmul trans_a=%d trans_b=%d beta=%g", ta, tb, beta);
        check_close(what, C, want, m * n, 1e-5, 1e-6);
      }
  /* ck_gemm on a strided block: alpha 0.5, A^T read from a wider buffer, C written into
   * columns 0..n-1 of rows of stride n + 3 (the other columns must stay untouched) */
  {
    const int64_t lda = m + 2, ldc = n + 3;
    float *Aw = falloc(k * lda), *Cw = falloc(m * ldc);
    double *wantw = dalloc(m * ldc);
    fill(Aw, k * lda, -1, 1), fill(Cw, m * ldc, -1, 1);
    for (int64_t i = 0; i < m * ldc; i++) wantw[i] = Cw[i];
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < n; j++) {
        double s = 0.0;
        for (int64_t p = 0; p < k; p++) s += (double)Aw[p * lda + i] * B[p * n + j];
        wantw[i * ldc + j] = 0.5 * s + 0.25 * Cw[i * ldc + j];
      }
    ck_gemm(1, 0, m, n, k, 0.5f, Aw, lda, B, n, 0.25f, Cw, ldc);
    check_close("gemm strided (lda, ldc), alpha 0.5", Cw, wantw, m * ldc, 1e-5, 1e-6);
    free(Aw), free(Cw), free(wantw);
  }
  /* empty sizes: an expert with no tokens gives m = 0; k = 0 is an empty sum */
  ck_matmul(A, B, C, 0, k, n, 0, 0, 0.0f);
  for (int64_t i = 0; i < m * n; i++) C[i] = 2.0f;
  ck_matmul(A, B, C, m, 0, n, 0, 0, 0.5f);
  int ok = 1;
  for (int64_t i = 0; i < m * n; i++) ok &= C[i] == 1.0f;
  CHECK(ok, "matmul with k = 0 must give beta*C");
  printf("  matmul m=0 is a no-op, k=0 gives beta*C\n");
  free(A), free(B), free(C), free(C0), free(want);
}

/* ---- linear ---- */

typedef struct {
  int64_t n, in, out;
  int bias;
} linear_op;
static void naive_linear(const void *p, double *const *in, double *out) {
  const linear_op *o = p;
  for (int64_t r = 0; r < o->n; r++)
    for (int64_t c = 0; c < o->out; c++) {
      double s = o->bias ? in[2][c] : 0.0;
      for (int64_t i = 0; i < o->in; i++) s += in[0][r * o->in + i] * in[1][i * o->out + c];
      out[r * o->out + c] = s;
    }
}

static void test_linear(void) {
  printf("linear (n=%d in=%d out=%d, weight [in,out], with and without bias):\n", T, H, N_OUT);
  for (int bias = 0; bias < 2; bias++) {
    linear_op op = {T, H, N_OUT, bias};
    float *x = falloc(T * H), *w = falloc(H * N_OUT), *b = falloc(N_OUT), *y = falloc(T * N_OUT);
    float *r = falloc(T * N_OUT), *dx = falloc(T * H), *dw = falloc(H * N_OUT), *db = falloc(N_OUT);
    fill(x, T * H, -1, 1), fill(w, H * N_OUT, -1, 1), fill(b, N_OUT, -1, 1),
        fill(r, T * N_OUT, -1, 1);
    ck_fd fd = {naive_linear,
                &op,
                {to_double(x, T * H), to_double(w, H * N_OUT), to_double(b, N_OUT)},
                to_double(r, T * N_OUT),
                dalloc(T * N_OUT),
                T * N_OUT};
    ck_linear_fwd(x, w, bias ? b : NULL, y, T, H, N_OUT);
    naive_linear(&op, fd.in, fd.out);
    check_close(bias ? "linear fwd, bias" : "linear fwd", y, fd.out, T * N_OUT, 1e-5, 1e-6);
    ck_linear_bwd(x, w, r, dx, dw, bias ? db : NULL, T, H, N_OUT);
    check_grad("linear bwd dx", fd_objective, &fd, fd.in[0], dx, T * H, 1, 1e-3);
    check_grad("linear bwd dw", fd_objective, &fd, fd.in[1], dw, H * N_OUT, 1, 1e-3);
    if (bias) check_grad("linear bwd db", fd_objective, &fd, fd.in[2], db, N_OUT, 1, 1e-3);
    /* parameter gradients accumulate: a second call doubles them */
    float *dw1 = falloc(H * N_OUT), *db1 = falloc(N_OUT);
    memcpy(dw1, dw, sizeof(float) * H * N_OUT), memcpy(db1, db, sizeof(float) * N_OUT);
    ck_linear_bwd(x, w, r, NULL, dw, bias ? db : NULL, T, H, N_OUT);
    check_accumulates("linear bwd dw +=", dw, dw1, H * N_OUT);
    if (bias) check_accumulates("linear bwd db +=", db, db1, N_OUT);
    free(x), free(w), free(b), free(y), free(r), free(dx), free(dw), free(db), free(dw1), free(db1);
    free(fd.in[0]), free(fd.in[1]), free(fd.in[2]), free((void *)fd.r), free(fd.out);
  }
}

/* ---- embedding ---- */

typedef struct {
  const int32_t *tok;
} emb_op;
static void naive_embedding(const void *p, double *const *in, double *out) {
  const emb_op *o = p;
  for (int64_t t = 0; t < T; t++)
    for (int64_t i = 0; i < H; i++) out[t * H + i] = in[0][o->tok[t] * H + i];
}

static void test_embedding(void) {
  printf("embedding (V=%d H=%d T=%d, repeated tokens, out-of-range ids):\n", V, H, T);
  int32_t tok[T] = {3, 0, 10, 3, 7, 3}; /* token 3 three times: its gradient rows add up */
  emb_op op = {tok};
  float *table = falloc(V * H), *out = falloc(T * H), *r = falloc(T * H), *dt = falloc(V * H);
  fill(table, V * H, -1, 1), fill(r, T * H, -1, 1);
  ck_fd fd = {naive_embedding,     &op,           {to_double(table, V * H)},
              to_double(r, T * H), dalloc(T * H), T * H};
  CHECK(ck_embedding_fwd(table, tok, out, T, V, H) == CK_OK, "embedding fwd rc");
  naive_embedding(&op, fd.in, fd.out);
  check_close("embedding fwd", out, fd.out, T * H, 0, 0);
  CHECK(ck_embedding_bwd(tok, r, dt, T, V, H) == CK_OK, "embedding bwd rc");
  check_grad("embedding bwd dtable", fd_objective, &fd, fd.in[0], dt, V * H, 1, 1e-3);
  float *dt0 = falloc(V * H);
  memcpy(dt0, dt, sizeof(float) * V * H);
  ck_embedding_bwd(tok, r, dt, T, V, H);
  check_accumulates("embedding bwd dtable +=", dt, dt0, V * H);
  /* out of range: an error code and no write */
  int32_t bad_hi[T] = {1, 2, V, 0, 0, 0}, bad_lo[T] = {1, -1, 0, 0, 0, 0};
  for (int64_t i = 0; i < T * H; i++) out[i] = 42.0f;
  memcpy(dt, dt0, sizeof(float) * V * H);
  CHECK(ck_embedding_fwd(table, bad_hi, out, T, V, H) == CK_EINDEX, "token V must fail");
  CHECK(ck_embedding_fwd(table, bad_lo, out, T, V, H) == CK_EINDEX, "token -1 must fail");
  CHECK(ck_embedding_bwd(bad_hi, r, dt, T, V, H) == CK_EINDEX, "bwd token V must fail");
  int untouched = memcmp(dt, dt0, sizeof(float) * V * H) == 0;
  for (int64_t i = 0; i < T * H; i++) untouched &= out[i] == 42.0f;
  CHECK(untouched, "a failed embedding call must not write");
  printf("  tokens V and -1 return CK_EINDEX (%s) and write nothing\n", ck_strerror(CK_EINDEX));
  free(table), free(out), free(r), free(dt), free(dt0), free(fd.in[0]), free((void *)fd.r),
      free(fd.out);
}

/* ---- rmsnorm ---- */

typedef struct {
  double eps;
} rms_op;
static void naive_rmsnorm(const void *p, double *const *in, double *out) {
  const rms_op *o = p;
  for (int64_t t = 0; t < T; t++) {
    double ss = 0.0;
    for (int64_t i = 0; i < H; i++) ss += in[0][t * H + i] * in[0][t * H + i];
    double rs = 1.0 / sqrt(ss / H + o->eps);
    for (int64_t i = 0; i < H; i++) out[t * H + i] = in[0][t * H + i] * rs * in[1][i];
  }
}

static void test_rmsnorm(void) {
  const float eps = 1e-5f;
  printf("rmsnorm (T=%d H=%d eps=%g):\n", T, H, eps);
  rms_op op = {eps};
  float *x = falloc(T * H), *w = falloc(H), *y = falloc(T * H), *r = falloc(T * H);
  float *dx = falloc(T * H), *dw = falloc(H), *dw0 = falloc(H);
  fill(x, T * H, -2, 2), fill(w, H, 0.5f, 1.5f), fill(r, T * H, -1, 1);
  ck_fd fd = {naive_rmsnorm,       &op,           {to_double(x, T * H), to_double(w, H)},
              to_double(r, T * H), dalloc(T * H), T * H};
  ck_rmsnorm_fwd(x, w, y, T, H, eps);
  naive_rmsnorm(&op, fd.in, fd.out);
  check_close("rmsnorm fwd", y, fd.out, T * H, 1e-6, 1e-7);
  ck_rmsnorm_bwd(x, w, r, dx, dw, T, H, eps);
  check_grad("rmsnorm bwd dx", fd_objective, &fd, fd.in[0], dx, T * H, 1, 1e-3);
  check_grad("rmsnorm bwd dw", fd_objective, &fd, fd.in[1], dw, H, 1, 1e-3);
  memcpy(dw0, dw, sizeof(float) * H);
  ck_rmsnorm_bwd(x, w, r, dx, dw, T, H, eps);
  check_accumulates("rmsnorm bwd dw +=", dw, dw0, H);
  /* in place: y aliasing x, dx aliasing dy */
  float *xy = falloc(T * H), *g = falloc(T * H);
  memcpy(xy, x, sizeof(float) * T * H), memcpy(g, r, sizeof(float) * T * H);
  ck_rmsnorm_fwd(xy, w, xy, T, H, eps);
  ck_rmsnorm_bwd(x, w, g, g, NULL, T, H, eps);
  CHECK(memcmp(xy, y, sizeof(float) * T * H) == 0 && memcmp(g, dx, sizeof(float) * T * H) == 0,
        "rmsnorm in place differs");
  printf("  in place (y = x, dx = dy) gives identical bits\n");
  free(x), free(w), free(y), free(r), free(dx), free(dw), free(dw0), free(xy), free(g);
  free(fd.in[0]), free(fd.in[1]), free((void *)fd.r), free(fd.out);
}

/* ---- elementwise ---- */

enum { NE = T * H };
static void naive_silu(const void *p, double *const *in, double *out) {
  (void)p;
  for (int64_t i = 0; i < NE; i++) out[i] = in[0][i] / (1.0 + exp(-in[0][i]));
}
static void naive_mul(const void *p, double *const *in, double *out) {
  (void)p;
  for (int64_t i = 0; i < NE; i++) out[i] = in[0][i] * in[1][i];
}
static void naive_add(const void *p, double *const *in, double *out) {
  (void)p;
  for (int64_t i = 0; i < NE; i++) out[i] = in[0][i] + in[1][i];
}

static void test_elementwise(void) {
  printf("elementwise silu, mul, add (%d values; silu also at +-30 and +-90):\n", NE);
  float *a = falloc(NE), *b = falloc(NE), *y = falloc(NE), *r = falloc(NE);
  float *da = falloc(NE), *db = falloc(NE);
  fill(a, NE, -6, 6), fill(b, NE, -2, 2), fill(r, NE, -1, 1);
  a[0] = 30.0f, a[1] = -30.0f, a[2] = 90.0f, a[3] = -90.0f; /* saturated sigmoid, no inf/NaN */
  ck_fd fd = {naive_silu,       NULL,       {to_double(a, NE), to_double(b, NE)},
              to_double(r, NE), dalloc(NE), NE};

  ck_silu_fwd(a, y, NE);
  naive_silu(NULL, fd.in, fd.out);
  check_close("silu fwd", y, fd.out, NE, 1e-6, 1e-30);
  ck_silu_bwd(a, r, da, NE);
  check_grad("silu bwd", fd_objective, &fd, fd.in[0], da, NE, 1, 1e-3);

  fd.fwd = naive_mul;
  ck_mul_fwd(a, b, y, NE);
  naive_mul(NULL, fd.in, fd.out);
  check_close("mul fwd", y, fd.out, NE, 1e-7, 0);
  ck_mul_bwd(a, b, r, da, db, NE);
  check_grad("mul bwd da", fd_objective, &fd, fd.in[0], da, NE, 1, 1e-3);
  check_grad("mul bwd db", fd_objective, &fd, fd.in[1], db, NE, 1, 1e-3);

  fd.fwd = naive_add;
  ck_add_fwd(a, b, y, NE);
  naive_add(NULL, fd.in, fd.out);
  check_close("add fwd", y, fd.out, NE, 1e-7, 0);
  ck_add_bwd(r, da, db, NE);
  check_grad("add bwd da", fd_objective, &fd, fd.in[0], da, NE, 1, 1e-3);
  check_grad("add bwd db", fd_objective, &fd, fd.in[1], db, NE, 1, 1e-3);
  free(a), free(b), free(y), free(r), free(da), free(db);
  free(fd.in[0]), free(fd.in[1]), free((void *)fd.r), free(fd.out);
}

static void test_softmax(void) {
  printf("row softmax and logsumexp (T=%d E=%d, one row with logits near 80):\n", T, V);
  float *x = falloc(T * V), *y = falloc(T * V);
  double *lse = dalloc(T), *want = dalloc(T * V), *wl = dalloc(T);
  fill(x, T * V, -4, 4);
  for (int64_t e = 0; e < V; e++) x[V + e] += 80.0f; /* exp would overflow without the max */
  for (int64_t t = 0; t < T; t++) {
    double mx = -INFINITY, s = 0.0;
    for (int64_t e = 0; e < V; e++) mx = fmax(mx, x[t * V + e]);
    for (int64_t e = 0; e < V; e++) s += exp(x[t * V + e] - mx);
    for (int64_t e = 0; e < V; e++) want[t * V + e] = exp(x[t * V + e] - mx) / s;
    wl[t] = mx + log(s);
  }
  ck_softmax_rows(x, y, T, V);
  ck_logsumexp_rows(x, lse, T, V);
  check_close("softmax rows", y, want, T * V, 1e-6, 1e-9);
  float *lf = falloc(T);
  for (int64_t t = 0; t < T; t++) lf[t] = (float)(lse[t] - wl[t]);
  double *zero = dalloc(T);
  check_close("logsumexp rows (double, diff to naive)", lf, zero, T, 0, 1e-12);
  free(x), free(y), free(lse), free(want), free(wl), free(lf), free(zero);
}

int main(void) {
  double t0 = ck_now();
  printf("test_ck_dense: forward vs naive double loops; backward vs central differences of\n"
         "the naive forward (step %g, relative to max(|numeric|, %g * max|numeric|))\n",
         FD_H, FD_FLOOR);
  test_matmul();
  test_linear();
  test_embedding();
  test_rmsnorm();
  test_elementwise();
  test_softmax();
  return ck_finish("test_ck_dense", t0);
}
