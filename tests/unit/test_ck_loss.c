/* test_ck_loss.c -- token cross-entropy (ck_loss.c) against a naive double loop; backward by
 * finite differences; masked labels, no unmasked rows, bad labels. */
#include "ck_test.h"

typedef struct {
  int64_t T, V;
  const int32_t *labels;
} ce_op;
static void naive_ce(const void *p, double *const *in, double *out) {
  const ce_op *o = p;
  double s = 0.0;
  int64_t n = 0;
  for (int64_t t = 0; t < o->T; t++) {
    if (o->labels[t] < 0) continue;
    const double *x = in[0] + t * o->V;
    double mx = -INFINITY, z = 0.0;
    for (int64_t i = 0; i < o->V; i++) mx = fmax(mx, x[i]);
    for (int64_t i = 0; i < o->V; i++) z += exp(x[i] - mx);
    s += mx + log(z) - x[o->labels[t]];
    n++;
  }
  out[0] = n ? s / n : 0.0;
}

static void test_case(int64_t T, int64_t V, const int32_t *labels, float shift) {
  int64_t masked = 0;
  for (int64_t t = 0; t < T; t++) masked += labels[t] == -1;
  printf("cross_entropy (T=%lld V=%lld, %lld masked rows, logits shifted by %g):\n", (long long)T,
         (long long)V, (long long)masked, shift);
  ce_op op = {T, V, labels};
  float *x = falloc(T * V), *dl = falloc(T * V), loss = -1.0f;
  fill(x, T * V, -4, 4);
  for (int64_t i = 0; i < T * V; i++) x[i] += shift;
  double r0 = 1.3;
  ck_fd fd = {naive_ce, &op, {to_double(x, T * V)}, &r0, dalloc(1), 1};
  CHECK(ck_cross_entropy_fwd(x, labels, &loss, T, V) == CK_OK, "ce fwd rc");
  naive_ce(&op, fd.in, fd.out);
  check_close("cross_entropy fwd", &loss, fd.out, 1, 1e-6, 1e-7);
  fill(dl, T * V, -1, 1); /* written, not accumulated */
  CHECK(ck_cross_entropy_bwd(x, labels, (float)r0, dl, T, V) == CK_OK, "ce bwd rc");
  int zero = 1;
  for (int64_t t = 0; t < T; t++)
    for (int64_t i = 0; i < V && labels[t] == -1; i++) zero &= dl[t * V + i] == 0.0f;
  CHECK(zero, "masked rows must have exactly zero gradient");
  if (masked < T) {
    check_grad("cross_entropy bwd dlogits", fd_objective, &fd, fd.in[0], dl, T * V,
               T * V > 2000 ? 7 : 1, 1e-3);
  } else {
    CHECK(loss == 0.0f, "no unmasked rows: loss must be 0, got %g", loss);
    printf("  no unmasked rows: loss %g and an all-zero gradient\n", loss);
  }
  free(x), free(dl), free(fd.in[0]), free(fd.out);
}

int main(void) {
  double t0 = ck_now();
  printf("test_ck_loss: forward vs a naive double loop; backward vs central differences of it\n"
         "(step %g, relative to max(|numeric|, %g * max|numeric|))\n",
         FD_H, FD_FLOOR);
  enum { T = 6, V = 11 };
  int32_t labels[T] = {3, -1, 0, 10, -1, 7};
  test_case(T, V, labels, 0.0f);
  test_case(T, V, labels, 200.0f); /* exp(200) overflows fp32: needs the max shift */
  int32_t none[T] = {-1, -1, -1, -1, -1, -1};
  test_case(T, V, none, 0.0f);
  int32_t big[64];
  for (int i = 0; i < 64; i++) big[i] = i % 9 == 0 ? -1 : rng_int(256);
  test_case(64, 256, big, 0.0f);

  float x[T * V], dl[T * V], loss = 5.0f;
  fill(x, T * V, -1, 1);
  for (int64_t i = 0; i < T * V; i++) dl[i] = 9.0f;
  int32_t bad_hi[T] = {3, -1, 0, V, -1, 7}, bad_lo[T] = {3, -2, 0, 1, -1, 7};
  CHECK(ck_cross_entropy_fwd(x, bad_hi, &loss, T, V) == CK_EINDEX, "label V must fail");
  CHECK(ck_cross_entropy_fwd(x, bad_lo, &loss, T, V) == CK_EINDEX, "label -2 must fail");
  CHECK(ck_cross_entropy_bwd(x, bad_hi, 1.0f, dl, T, V) == CK_EINDEX, "bwd label V must fail");
  int untouched = loss == 5.0f;
  for (int64_t i = 0; i < T * V; i++) untouched &= dl[i] == 9.0f;
  CHECK(untouched, "a failed cross_entropy call must not write");
  printf("labels V and -2 return CK_EINDEX and write nothing\n");
  return ck_finish("test_ck_loss", t0);
}
