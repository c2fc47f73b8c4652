/* ck_test.h -- helpers shared by the CPU-kernel unit tests (tests/unit/test_ck_*.c):
 * a seeded generator, comparison against a naive double-precision reference, and a
 * finite-difference gradient check.
 *
 * Gradient checks. The objective is L = sum(r ⊙ out) for a random r; the kernel's backward,
 * fed dout = r, gives the analytic gradient. The numeric one is a central difference of the
 * test's naive forward evaluated in DOUBLE, with step h = FD_H * max(1, |x|): truncation error
 * ~h^2, rounding ~1e-16/h, both far below the float kernel's own rounding. An element passes when
 *   |analytic - numeric| <= tol * max(|numeric|, FD_FLOOR * max_i |numeric_i|),
 * i.e. a relative error, except that gradients tiny next to the largest one of the same
 * tensor are judged against FD_FLOOR of that largest one (there the float kernel's absolute
 * rounding, not the gradient, sets the error).
 */
#ifndef MOEC_CK_TEST_H
#define MOEC_CK_TEST_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/cpu_kernels.h"

#define FD_H 1e-4
#define FD_FLOOR 1e-2

static int ck_failures = 0, ck_checks = 0;

#define CHECK(cond, ...)                                                                           \
  do {                                                                                             \
    ck_checks++;                                                                                   \
    if (!(cond)) {                                                                                 \
      ck_failures++;                                                                               \
      printf("FAIL %s:%d: ", __FILE__, __LINE__);                                                  \
      printf(__VA_ARGS__);                                                                         \
      printf("\n");                                                                                \
    }                                                                                              \
  } while (0)

/* splitmix64: deterministic across platforms */
static uint64_t ck_rng_state = 0x9E3779B97F4A7C15ull;
static inline uint64_t rng_u64(void) {
  uint64_t z = (ck_rng_state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
static inline double rng_unit(void) { return (double)(rng_u64() >> 11) * 0x1.0p-53; } /* [0, 1) */
/* uniform in [lo, hi), nudged away from exact zero */
static inline float rng_float(float lo, float hi) {
  float x = (float)(lo + (hi - lo) * rng_unit());
  return x == 0.0f ? 0.5f * hi : x;
}
static inline void fill(float *x, int64_t n, float lo, float hi) {
  for (int64_t i = 0; i < n; i++) x[i] = rng_float(lo, hi);
}
static inline int32_t rng_int(int32_t n) { return (int32_t)(rng_u64() % (uint64_t)n); }

static inline float *falloc(int64_t n) { return calloc((size_t)(n > 0 ? n : 1), sizeof(float)); }
static inline double *dalloc(int64_t n) { return calloc((size_t)(n > 0 ? n : 1), sizeof(double)); }
static inline double *to_double(const float *x, int64_t n) {
  double *d = dalloc(n);
  for (int64_t i = 0; i < n; i++) d[i] = x[i];
  return d;
}

/* Forward check: |got - want| <= atol + rtol |want| elementwise. Prints one line. */
static inline void check_close(const char *what, const float *got, const double *want, int64_t n,
                               double rtol, double atol) {
  double worst = 0.0;
  int64_t bad = -1;
  for (int64_t i = 0; i < n; i++) {
    double err = fabs((double)got[i] - want[i]), lim = atol + rtol * fabs(want[i]);
    double ratio = err == 0.0 ? 0.0 : err / lim;
    if (!(ratio <= 1.0) && bad < 0) bad = i;
    if (ratio > worst || isnan(ratio)) worst = ratio;
  }
  CHECK(bad < 0, "%s: element %lld got %.9g want %.9g", what, (long long)bad,
        bad >= 0 ? got[bad] : 0.0, bad >= 0 ? want[bad] : 0.0);
  printf("  %-44s %6lld values, worst err/tol %.2e (rtol %.0e, atol %.0e)\n", what, (long long)n,
         worst, rtol, atol);
}

/* Accumulation check: `acc` is a gradient buffer after two identical backward calls that
 * add into it, starting from zero, and `once` its value after the first. */
static inline void check_accumulates(const char *what, const float *acc, const float *once,
                                     int64_t n) {
  double *want = dalloc(n), big = 0.0;
  for (int64_t i = 0; i < n; i++) want[i] = 2.0 * once[i], big = fmax(big, fabs(2.0 * once[i]));
  check_close(what, acc, want, n, 1e-6, 1e-6 * big);
  free(want);
}

/* Objective of a gradient check: evaluates sum(r ⊙ naive_forward(inputs)) in double. */
typedef double (*ck_objective)(void *ctx);

/* Central-difference check of the analytic gradient g (n values) of x, the double input that
 * the objective reads through ctx. Checks every `stride`-th element (1 = all). */
static inline void check_grad(const char *what, ck_objective f, void *ctx, double *x,
                              const float *g, int64_t n, int64_t stride, double tol) {
  int64_t m = (n + stride - 1) / stride;
  double *num = dalloc(m), big = 0.0;
  for (int64_t c = 0; c < m; c++) {
    int64_t i = c * stride;
    double x0 = x[i], h = FD_H * fmax(1.0, fabs(x0));
    x[i] = x0 + h;
    double lp = f(ctx);
    x[i] = x0 - h;
    double lm = f(ctx);
    x[i] = x0;
    num[c] = (lp - lm) / (2.0 * h);
    big = fmax(big, fabs(num[c]));
  }
  double worst = 0.0;
  int64_t bad = -1;
  for (int64_t c = 0; c < m; c++) {
    int64_t i = c * stride;
    double err = fabs((double)g[i] - num[c]) / fmax(fabs(num[c]), FD_FLOOR * big);
    if (big == 0.0) err = fabs((double)g[i]);
    if (!(err <= tol) && bad < 0) bad = i;
    if (err > worst || isnan(err)) worst = err;
  }
  CHECK(bad < 0, "%s: element %lld analytic %.9g numeric %.9g", what, (long long)bad,
        bad >= 0 ? g[bad] : 0.0, bad >= 0 ? num[bad / stride] : 0.0);
  CHECK(big > 0.0, "%s: numeric gradient is identically zero", what);
  printf("  %-44s %6lld of %6lld checked, worst rel err %.2e (tol %.0e)\n", what, (long long)m,
         (long long)n, worst, tol);
  free(num);
}

/* The usual objective: ctx is a ck_fd; L = sum(r ⊙ fwd(in)), fwd a naive double forward. */
typedef struct {
  void (*fwd)(const void *op, double *const *in, double *out);
  const void *op;  /* sizes and attributes, read by fwd */
  double *in[4];   /* double inputs; check_grad perturbs one of them */
  const double *r; /* (n_out) */
  double *out;     /* (n_out) scratch */
  int64_t n_out;
} ck_fd;

static inline double fd_objective(void *ctx) {
  ck_fd *c = ctx;
  c->fwd(c->op, c->in, c->out);
  double s = 0.0;
  for (int64_t i = 0; i < c->n_out; i++) s += c->r[i] * c->out[i];
  return s;
}

static inline double ck_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static inline int ck_finish(const char *name, double t0) {
  printf("%s: %d checks, %d failed (%.2f s)\n", name, ck_checks, ck_failures, ck_now() - t0);
  return ck_failures ? 1 : 0;
}

#endif
