/* test_ck_optim.c -- AdamW, the learning-rate schedule and gradient clipping (ck_optim.c)
 * against values worked out from the formulas. */
#include "ck_test.h"

/* AdamW in double, written from the formula (not from the kernel's operation order). */
static void adamw_formula(double *p, const double *g, double *m, double *v, int n, int step,
                          double scale, double lr, double b1, double b2, double eps, double wd) {
  for (int i = 0; i < n; i++) {
    double gi = g[i] * scale;
    p[i] *= 1.0 - lr * wd;
    m[i] = b1 * m[i] + (1.0 - b1) * gi;
    v[i] = b2 * v[i] + (1.0 - b2) * gi * gi;
    double mh = m[i] / (1.0 - pow(b1, step)), vh = v[i] / (1.0 - pow(b2, step));
    p[i] -= lr * mh / (sqrt(vh) + eps);
  }
}

static void test_adamw(void) {
  printf("AdamW (torch.optim.AdamW semantics):\n");
  /* by hand: p = 1, g = 0.5, lr 1e-3, betas (0.9, 0.95), eps 1e-8, wd 0.1, step 1:
   * m = 0.05, v = 0.0125, m^ = 0.5, v^ = 0.25, p = 1 * (1 - 1e-4) - 1e-3 * 0.5 / (0.5 + 1e-8)
   *   = 0.9999 - 0.00099999998 = 0.99890000002 */
  float p = 1.0f, g = 0.5f, m = 0.0f, v = 0.0f;
  ck_adamw_step(&p, &g, &m, &v, 1, 1, 1.0f, 1e-3, 0.9, 0.95, 1e-8, 0.1);
  CHECK(fabs(p - 0.99890000002) < 1e-7 && fabsf(m - 0.05f) < 1e-8f && fabsf(v - 0.0125f) < 1e-9f,
        "AdamW step 1 by hand: p %.9g m %.9g v %.9g", p, m, v);
  printf("  step 1 by hand: p 1 -> %.8f (want 0.99890000), m %.6g, v %.6g\n", p, m, v);

  enum { N = 7, STEPS = 5 };
  const double cases[3][6] = {
      /* lr, b1, b2, eps, wd, grad_scale */
      {3e-4, 0.9, 0.95, 1e-8, 0.1, 1.0},
      {1e-2, 0.8, 0.999, 1e-6, 0.0, 0.5}, /* no decay (norm weights), clipped gradient */
      {5e-3, 0.3, 0.9, 1e-8, 0.01, 1.0},  /* 1 - b1 >= 0.5: torch's other lerp formula */
  };
  for (int c = 0; c < 3; c++) {
    const double *k = cases[c];
    float pf[N], gf[N], mf[N] = {0}, vf[N] = {0};
    double pd[N], gd[N], md[N] = {0}, vd[N] = {0};
    fill(pf, N, -1, 1);
    for (int i = 0; i < N; i++) pd[i] = pf[i];
    for (int s = 1; s <= STEPS; s++) {
      fill(gf, N, -2, 2);
      gf[0] = 1e-6f; /* a tiny gradient: eps matters */
      for (int i = 0; i < N; i++) gd[i] = gf[i];
      ck_adamw_step(pf, gf, mf, vf, N, s, (float)k[5], k[0], k[1], k[2], k[3], k[4]);
      adamw_formula(pd, gd, md, vd, N, s, k[5], k[0], k[1], k[2], k[3], k[4]);
    }
    printf("  %d steps, lr %g, betas (%g, %g), eps %g, wd %g, grad_scale %g:\n", STEPS, k[0], k[1],
           k[2], k[3], k[4], k[5]);
    check_close("adamw p", pf, pd, N, 1e-6, 1e-7);
    check_close("adamw m", mf, md, N, 1e-5, 1e-9);
    check_close("adamw v", vf, vd, N, 1e-5, 1e-12);
  }
}

static void test_schedule(void) {
  printf("learning-rate schedule (lr 3e-4, min_lr 3e-5, warmup 100, steps 1000):\n");
  const double lr = 3e-4, mn = 3e-5;
  const moec_schedule all[3] = {SCHED_COSINE, SCHED_LINEAR, SCHED_CONSTANT};
  const char *names[3] = {"cosine", "linear", "constant"};
  for (int s = 0; s < 3; s++) {
    double a = ck_lr_at(1, 1000, 100, lr, mn, all[s]), b = ck_lr_at(100, 1000, 100, lr, mn, all[s]);
    double mid = ck_lr_at(550, 1000, 100, lr, mn, all[s]),
           end = ck_lr_at(1000, 1000, 100, lr, mn, all[s]);
    double after = ck_lr_at(1200, 1000, 100, lr, mn, all[s]);
    double want_mid = all[s] == SCHED_CONSTANT ? lr : (lr + mn) / 2; /* half way: cos(pi/2) = 0 */
    double want_end = all[s] == SCHED_CONSTANT ? lr : mn;
    CHECK(fabs(a - lr / 100) < 1e-18 && fabs(b - lr) < 1e-18, "%s warmup", names[s]);
    CHECK(fabs(mid - want_mid) < 1e-15 && fabs(end - want_end) < 1e-18 &&
              fabs(after - want_end) < 1e-18,
          "%s decay: mid %g end %g after %g", names[s], mid, end, after);
    printf(
        "  %-8s step 1 %.3g (lr/warmup), step 100 %.3g, step 550 %.4g, step 1000 %.3g, 1200 %.3g\n",
        names[s], a, b, mid, end, after);
  }
  /* cosine at a quarter of the decay: min + (lr - min) (1 + cos(pi/4)) / 2 */
  double q = ck_lr_at(325, 1000, 100, lr, mn, SCHED_COSINE);
  CHECK(fabs(q - (mn + (lr - mn) * (1 + sqrt(0.5)) / 2)) < 1e-15, "cosine quarter %g", q);
  /* no warmup */
  CHECK(fabs(ck_lr_at(1, 10, 0, 1.0, 0.0, SCHED_LINEAR) - 0.9) < 1e-15, "linear, warmup 0");
  printf("  cosine at a quarter: %.6g; warmup 0, linear over 10 steps, step 1: 0.9\n", q);
}

static void test_clip(void) {
  printf("global grad norm and clip coefficient:\n");
  float a[5], b[3], c[1];
  fill(a, 5, -2, 2), fill(b, 3, -2, 2), fill(c, 1, -2, 2);
  const float *bufs[3] = {a, b, c};
  const int64_t sizes[3] = {5, 3, 1};
  double ss = 0.0;
  for (int i = 0; i < 5; i++) ss += (double)a[i] * a[i];
  for (int i = 0; i < 3; i++) ss += (double)b[i] * b[i];
  ss += (double)c[0] * c[0];
  double norm = ck_grad_norm(bufs, sizes, 3);
  CHECK(fabs(norm - sqrt(ss)) < 1e-12, "grad norm %g want %g", norm, sqrt(ss));
  float c1 = ck_clip_coef(2.0, 1.0), c2 = ck_clip_coef(0.5, 1.0), c3 = ck_clip_coef(NAN, 1.0);
  CHECK(c1 == 1.0f / (2.0f + 1e-6f), "clip coef at norm 2: %.9g", c1);
  CHECK(c2 == 1.0f && isnan(c3), "clip coef: %g %g", c2, c3);
  printf("  norm over 3 buffers %.6f (= naive); coef(norm 2, clip 1) = %.9g, coef(0.5) = %g, "
         "coef(NaN) = %g\n",
         norm, c1, c2, c3);
}

int main(void) {
  double t0 = ck_now();
  printf("test_ck_optim: AdamW against the formula in double, the schedule and clipping against\n"
         "values worked out by hand\n");
  test_adamw();
  test_schedule();
  test_clip();
  return ck_finish("test_ck_optim", t0);
}
