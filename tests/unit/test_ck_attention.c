/* test_ck_attention.c -- rotary embedding and grouped-query attention (ck_attention.c)
 * against naive double-precision loops, backward by finite differences of those loops. */
#include "ck_test.h"

/* ---- rope ---- */

typedef struct {
  int64_t T, nh, hd, seq;
  double theta;
} rope_op;
static void naive_rope(const void *p, double *const *in, double *out) {
  const rope_op *o = p;
  int64_t half = o->hd / 2;
  for (int64_t t = 0; t < o->T; t++)
    for (int64_t h = 0; h < o->nh; h++)
      for (int64_t i = 0; i < half; i++) {
        double a = (double)(t % o->seq) * pow(o->theta, -2.0 * (double)i / (double)o->hd);
        const double *x = in[0] + (t * o->nh + h) * o->hd;
        double *y = out + (t * o->nh + h) * o->hd;
        y[i] = x[i] * cos(a) - x[i + half] * sin(a);
        y[i + half] = x[i + half] * cos(a) + x[i] * sin(a);
      }
}

static void test_rope_case(rope_op op, int grad) {
  int64_t n = op.T * op.nh * op.hd;
  printf("rope (T=%lld nh=%lld hd=%lld seq=%lld theta=%g):\n", (long long)op.T, (long long)op.nh,
         (long long)op.hd, (long long)op.seq, op.theta);
  float *x = falloc(n), *y = falloc(n), *r = falloc(n), *dx = falloc(n);
  fill(x, n, -1, 1), fill(r, n, -1, 1);
  ck_fd fd = {naive_rope, &op, {to_double(x, n)}, to_double(r, n), dalloc(n), n};
  CHECK(ck_rope_fwd(x, y, op.T, op.nh, op.hd, op.seq, op.theta) == CK_OK, "rope fwd rc");
  naive_rope(&op, fd.in, fd.out);
  check_close("rope fwd", y, fd.out, n, 1e-5, 1e-6);
  if (grad) {
    CHECK(ck_rope_bwd(r, dx, op.T, op.nh, op.hd, op.seq, op.theta) == CK_OK, "rope bwd rc");
    check_grad("rope bwd dx", fd_objective, &fd, fd.in[0], dx, n, 1, 1e-4);
    /* in place */
    ck_rope_fwd(x, x, op.T, op.nh, op.hd, op.seq, op.theta);
    CHECK(memcmp(x, y, sizeof(float) * n) == 0, "rope in place differs");
    printf("  in place (y = x) gives identical bits\n");
  }
  free(x), free(y), free(r), free(dx), free(fd.in[0]), free((void *)fd.r), free(fd.out);
}

static void test_rope(void) {
  test_rope_case((rope_op){6, 3, 4, 3, 1e4}, 1); /* two sequences of 3 */
  test_rope_case((rope_op){6, 2, 8, 6, 5e5}, 1);
  test_rope_case((rope_op){8192, 1, 8, 8192, 5e7}, 0); /* angles up to 8191 rad */
  float x[6] = {1, 2, 3, 4, 5, 6};
  CHECK(ck_rope_fwd(x, x, 2, 1, 3, 2, 1e4) == CK_ESHAPE, "odd head dim must fail");
  printf("  odd head dim returns CK_ESHAPE\n");
}

/* ---- attention ---- */

typedef struct {
  int64_t B, seq, nh, nkv, hd;
  int causal;
} att_op;
/* out (B*seq, nh*hd); also the logsumexp into lse when it is not NULL */
static void naive_attention_lse(const att_op *o, double *const *in, double *out, double *lse) {
  const int64_t group = o->nh / o->nkv, ldq = o->nh * o->hd, ldk = o->nkv * o->hd;
  const double scale = 1.0 / sqrt((double)o->hd);
  double *s = dalloc(o->seq);
  for (int64_t b = 0; b < o->B; b++)
    for (int64_t h = 0; h < o->nh; h++)
      for (int64_t i = 0; i < o->seq; i++) {
        const double *q = in[0] + (b * o->seq + i) * ldq + h * o->hd;
        int64_t lim = o->causal ? i + 1 : o->seq;
        double mx = -INFINITY, sum = 0.0;
        for (int64_t j = 0; j < lim; j++) {
          const double *k = in[1] + (b * o->seq + j) * ldk + (h / group) * o->hd;
          double d = 0.0;
          for (int64_t c = 0; c < o->hd; c++) d += q[c] * k[c];
          s[j] = d * scale;
          mx = fmax(mx, s[j]);
        }
        for (int64_t j = 0; j < lim; j++) sum += (s[j] = exp(s[j] - mx));
        double *y = out + (b * o->seq + i) * ldq + h * o->hd;
        for (int64_t c = 0; c < o->hd; c++) y[c] = 0.0;
        for (int64_t j = 0; j < lim; j++) {
          const double *v = in[2] + (b * o->seq + j) * ldk + (h / group) * o->hd;
          for (int64_t c = 0; c < o->hd; c++) y[c] += s[j] / sum * v[c];
        }
        if (lse) lse[(b * o->nh + h) * o->seq + i] = mx + log(sum);
      }
  free(s);
}
static void naive_attention(const void *p, double *const *in, double *out) {
  naive_attention_lse(p, in, out, NULL);
}

static void test_attention_case(att_op op, int64_t max_checks) {
  const int64_t T = op.B * op.seq, nq = T * op.nh * op.hd, nk = T * op.nkv * op.hd;
  printf("attention (B=%lld seq=%lld nh=%lld nkv=%lld hd=%lld, %s):\n", (long long)op.B,
         (long long)op.seq, (long long)op.nh, (long long)op.nkv, (long long)op.hd,
         op.causal ? "causal" : "not causal");
  float *q = falloc(nq), *k = falloc(nk), *v = falloc(nk), *out = falloc(nq), *r = falloc(nq);
  float *lse = falloc(op.B * op.nh * op.seq), *dq = falloc(nq), *dk = falloc(nk), *dv = falloc(nk);
  fill(q, nq, -1.5f, 1.5f), fill(k, nk, -1.5f, 1.5f), fill(v, nk, -1, 1), fill(r, nq, -1, 1);
  ck_fd fd = {naive_attention,  &op,        {to_double(q, nq), to_double(k, nk), to_double(v, nk)},
              to_double(r, nq), dalloc(nq), nq};
  double *wl = dalloc(op.B * op.nh * op.seq);
  CHECK(ck_attention_fwd(q, k, v, out, lse, op.B, op.seq, op.nh, op.nkv, op.hd, op.causal) == CK_OK,
        "attention fwd rc");
  naive_attention_lse(&op, fd.in, fd.out, wl);
  check_close("attention fwd out", out, fd.out, nq, 1e-5, 1e-6);
  check_close("attention fwd lse", lse, wl, op.B * op.nh * op.seq, 1e-6, 1e-6);
  fill(dk, nk, -1, 1), fill(dv, nk, -1, 1); /* dk, dv are written, not accumulated */
  CHECK(ck_attention_bwd(q, k, v, out, lse, r, dq, dk, dv, op.B, op.seq, op.nh, op.nkv, op.hd,
                         op.causal) == CK_OK,
        "attention bwd rc");
  check_grad("attention bwd dq", fd_objective, &fd, fd.in[0], dq, nq,
             (nq + max_checks - 1) / max_checks, 1e-3);
  check_grad("attention bwd dk", fd_objective, &fd, fd.in[1], dk, nk,
             (nk + max_checks - 1) / max_checks, 1e-3);
  check_grad("attention bwd dv", fd_objective, &fd, fd.in[2], dv, nk,
             (nk + max_checks - 1) / max_checks, 1e-3);
  free(q), free(k), free(v), free(out), free(r), free(lse), free(dq), free(dk), free(dv), free(wl);
  free(fd.in[0]), free(fd.in[1]), free(fd.in[2]), free((void *)fd.r), free(fd.out);
}

static void test_attention(void) {
  const int64_t all = INT64_MAX / 2;
  test_attention_case((att_op){2, 3, 3, 1, 4, 1}, all); /* T=6, GQA: 3 query heads on 1 kv */
  test_attention_case((att_op){2, 3, 3, 1, 4, 0}, all);
  test_attention_case((att_op){1, 6, 2, 2, 4, 1}, all); /* plain multi-head */
  /* bigger: crosses the 64-row query block, GQA 2:1 */
  test_attention_case((att_op){2, 70, 4, 2, 8, 1}, 150);
  float x[8] = {0};
  CHECK(ck_attention_fwd(x, x, x, x, x, 1, 1, 3, 2, 1, 1) == CK_ESHAPE, "nh %% nkv != 0 must fail");
  printf("  nh not a multiple of nkv returns CK_ESHAPE\n");
}

int main(void) {
  double t0 = ck_now();
  printf("test_ck_attention: forward vs naive double loops; backward vs central differences\n"
         "of the naive forward (step %g, relative to max(|numeric|, %g * max|numeric|))\n",
         FD_H, FD_FLOOR);
  test_rope();
  test_attention();
  return ck_finish("test_ck_attention", t0);
}
