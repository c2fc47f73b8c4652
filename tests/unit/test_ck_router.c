/* test_ck_router.c -- router kernels (ck_router.c): top-k, routing weights, aux and z
 * losses, route_rows / dispatch / combine, against naive double loops; backward by finite
 * differences of those loops with the expert ids held fixed. */
#include "ck_test.h"

enum { T = 6, E = 5, K = 2, H = 12 };

/* ---- topk ---- */

/* Is (a, ia) ranked before (b, ib)? NaN is the smallest value; equal values: lower id. */
static int naive_before(float a, int ia, float b, int ib) {
  if (isnan(a) || isnan(b)) return isnan(a) && isnan(b) ? ia < ib : isnan(b);
  return a > b || (a == b && ia < ib);
}
static void naive_topk(const float *x, int64_t rows, int64_t n, int64_t k, int32_t *idx) {
  for (int64_t t = 0; t < rows; t++) {
    int used[64] = {0};
    for (int64_t j = 0; j < k; j++) {
      int best = -1;
      for (int e = 0; e < n; e++)
        if (!used[e] && (best < 0 || naive_before(x[t * n + e], e, x[t * n + best], best)))
          best = e;
      used[best] = 1;
      idx[t * k + j] = best;
    }
  }
}

static void test_topk(void) {
  printf("topk (exact ids against a selection-sort reference):\n");
  enum { R = 200, N = 9 };
  float x[R * N];
  int32_t got[R * N], want[R * N];
  for (int64_t i = 0; i < R * N; i++) {
    x[i] = (float)(rng_int(7) - 3) * 0.5f; /* few distinct values: many ties */
    if (rng_int(13) == 0) x[i] = NAN;
    if (rng_int(17) == 0) x[i] = -0.0f;
    if (rng_int(19) == 0) x[i] = rng_int(2) ? INFINITY : -INFINITY;
  }
  int differ = 0;
  for (int k = 1; k <= N; k++) {
    CHECK(ck_topk(x, got, R, N, k) == CK_OK, "topk rc");
    naive_topk(x, R, N, k, want);
    for (int64_t i = 0; i < R * k; i++) differ += got[i] != want[i];
  }
  CHECK(differ == 0, "topk: %d ids differ from the reference", differ);
  printf("  %d rows x %d experts with ties, NaN, +-0, +-inf; k = 1..%d: %d ids differ\n", R, N, N,
         differ);
  float row[E] = {0.5f, NAN, 2.0f, 0.5f, 2.0f};
  int32_t id[3];
  ck_topk(row, id, 1, E, 3);
  CHECK(id[0] == 2 && id[1] == 4 && id[2] == 0, "topk {0.5,NaN,2,0.5,2} k=3 -> 2,4,0 got %d,%d,%d",
        id[0], id[1], id[2]);
  printf("  {0.5, NaN, 2, 0.5, 2}, k=3 -> {2, 4, 0} (ties to the lower id)\n");
  CHECK(ck_topk(row, id, 1, E, E + 1) == CK_ESHAPE && ck_topk(row, id, 1, E, 0) == CK_ESHAPE,
        "k outside [1, E] must fail");
  printf("  k = 0 and k = E+1 return CK_ESHAPE\n");
}

/* ---- routing weights, aux loss, z loss: ids are fixed data ---- */

typedef struct {
  const int32_t *idx;
  double coef;
} route_op;

static void naive_softmax(const double *x, int64_t n, double *p) {
  double mx = -INFINITY, s = 0.0;
  for (int64_t e = 0; e < n; e++) mx = fmax(mx, x[e]);
  for (int64_t e = 0; e < n; e++) s += (p[e] = exp(x[e] - mx));
  for (int64_t e = 0; e < n; e++) p[e] /= s;
}
static void naive_route_weights(const void *op, double *const *in, double *out) {
  const route_op *o = op;
  for (int64_t t = 0; t < T; t++) {
    double p[E], s = 0.0;
    naive_softmax(in[0] + t * E, E, p);
    for (int64_t j = 0; j < K; j++) s += p[o->idx[t * K + j]];
    for (int64_t j = 0; j < K; j++) out[t * K + j] = p[o->idx[t * K + j]] / s;
  }
}
/* HF load_balancing_loss_func, literally: tokens_per_expert[j,e] = mean_t onehot(idx[t,j])_e,
 * router_prob_per_expert[e] = mean_t softmax_t[e], loss = E * sum_{j,e} of their product. */
static void naive_aux_loss(const void *op, double *const *in, double *out) {
  const route_op *o = op;
  double tpe[K][E] = {{0}}, ppe[E] = {0}, s = 0.0;
  for (int64_t t = 0; t < T; t++) {
    double p[E];
    naive_softmax(in[0] + t * E, E, p);
    for (int64_t e = 0; e < E; e++) ppe[e] += p[e] / T;
    for (int64_t j = 0; j < K; j++) tpe[j][o->idx[t * K + j]] += 1.0 / T;
  }
  for (int64_t j = 0; j < K; j++)
    for (int64_t e = 0; e < E; e++) s += tpe[j][e] * ppe[e];
  out[0] = o->coef * E * s;
}
static void naive_z_loss(const void *op, double *const *in, double *out) {
  const route_op *o = op;
  double s = 0.0;
  for (int64_t t = 0; t < T; t++) {
    double mx = -INFINITY, z = 0.0;
    for (int64_t e = 0; e < E; e++) mx = fmax(mx, in[0][t * E + e]);
    for (int64_t e = 0; e < E; e++) z += exp(in[0][t * E + e] - mx);
    s += (mx + log(z)) * (mx + log(z));
  }
  out[0] = o->coef * s / T;
}

static void test_router_losses(void) {
  printf("route_weights, aux_loss, z_loss (T=%d E=%d k=%d, ids from ck_topk, held fixed):\n", T, E,
         K);
  float logits[T * E], w[T * K], r[T * K], dl[T * E], dl1[T * E], loss;
  int32_t idx[T * K];
  fill(logits, T * E, -3, 3), fill(r, T * K, -1, 1);
  ck_topk(logits, idx, T, E, K);
  route_op op = {idx, 1e-2};
  ck_fd fd = {naive_route_weights, &op,           {to_double(logits, T * E)},
              to_double(r, T * K), dalloc(T * K), T * K};

  CHECK(ck_route_weights_fwd(logits, idx, w, T, E, K) == CK_OK, "route_weights fwd rc");
  naive_route_weights(&op, fd.in, fd.out);
  check_close("route_weights fwd", w, fd.out, T * K, 1e-6, 1e-7);
  CHECK(ck_route_weights_bwd(logits, idx, r, dl, T, E, K) == CK_OK, "route_weights bwd rc");
  check_grad("route_weights bwd dlogits", fd_objective, &fd, fd.in[0], dl, T * E, 1, 1e-3);

  /* scalar losses: L = r0 * loss with a random r0, dloss = r0 */
  double r0 = 0.7;
  free((void *)fd.r);
  fd.r = &r0, fd.n_out = 1;
  fd.fwd = naive_aux_loss;
  CHECK(ck_aux_loss_fwd(logits, idx, &loss, T, E, K, (float)op.coef) == CK_OK, "aux fwd rc");
  naive_aux_loss(&op, fd.in, fd.out);
  check_close("aux_loss fwd (HF formula)", &loss, fd.out, 1, 1e-6, 0);
  memset(dl, 0, sizeof dl);
  CHECK(ck_aux_loss_bwd(logits, idx, (float)r0, dl, T, E, K, (float)op.coef) == CK_OK,
        "aux bwd rc");
  check_grad("aux_loss bwd dlogits", fd_objective, &fd, fd.in[0], dl, T * E, 1, 1e-3);
  memcpy(dl1, dl, sizeof dl);
  ck_aux_loss_bwd(logits, idx, (float)r0, dl, T, E, K, (float)op.coef);
  check_accumulates("aux_loss bwd dlogits +=", dl, dl1, T * E);

  fd.fwd = naive_z_loss;
  ck_z_loss_fwd(logits, &loss, T, E, (float)op.coef);
  naive_z_loss(&op, fd.in, fd.out);
  check_close("z_loss fwd", &loss, fd.out, 1, 1e-6, 0);
  memset(dl, 0, sizeof dl);
  ck_z_loss_bwd(logits, (float)r0, dl, T, E, (float)op.coef);
  check_grad("z_loss bwd dlogits", fd_objective, &fd, fd.in[0], dl, T * E, 1, 1e-3);
  memcpy(dl1, dl, sizeof dl);
  ck_z_loss_bwd(logits, (float)r0, dl, T, E, (float)op.coef);
  check_accumulates("z_loss bwd dlogits +=", dl, dl1, T * E);

  int32_t bad[T * K];
  memcpy(bad, idx, sizeof bad);
  bad[5] = E;
  CHECK(ck_route_weights_fwd(logits, bad, w, T, E, K) == CK_EINDEX, "route_weights bad id");
  CHECK(ck_aux_loss_fwd(logits, bad, &loss, T, E, K, 1.0f) == CK_EINDEX, "aux bad id");
  bad[5] = -1;
  CHECK(ck_route_weights_bwd(logits, bad, r, dl, T, E, K) == CK_EINDEX, "route_weights bwd bad id");
  CHECK(ck_aux_loss_bwd(logits, bad, 1.0f, dl, T, E, K, 1.0f) == CK_EINDEX, "aux bwd bad id");
  printf("  expert ids E and -1 return CK_EINDEX\n");
  free(fd.in[0]), free(fd.out);
}

/* ---- route_rows, dispatch, combine ---- */

/* Expert e's rows live at Y + off[e]*H. */
typedef struct {
  const int32_t *idx;
  int64_t off[E + 1];
} comb_op;
static void naive_combine(const void *op, double *const *in, double *out) {
  const comb_op *o = op;
  int64_t seen[E] = {0};
  for (int64_t i = 0; i < T * H; i++) out[i] = 0.0;
  for (int64_t t = 0; t < T; t++)
    for (int64_t j = 0; j < K; j++) {
      int e = o->idx[t * K + j];
      const double *y = in[1] + (o->off[e] + seen[e]++) * H;
      for (int64_t i = 0; i < H; i++) out[t * H + i] += in[0][t * K + j] * y[i];
    }
}
/* A whole MoE layer: out[t] = sum_j w[t,j] * (x[t] · W_{idx[t,j]}), W_e (H, H). */
static void naive_moe(const void *op, double *const *in, double *out) {
  const comb_op *o = op;
  for (int64_t i = 0; i < T * H; i++) out[i] = 0.0;
  for (int64_t t = 0; t < T; t++)
    for (int64_t j = 0; j < K; j++) {
      const double *W = in[1] + o->idx[t * K + j] * H * H;
      for (int64_t c = 0; c < H; c++) {
        double s = 0.0;
        for (int64_t i = 0; i < H; i++) s += in[0][t * H + i] * W[i * H + c];
        out[t * H + c] += in[2][t * K + j] * s;
      }
    }
}

static void test_dispatch_combine(void) {
  printf("route_rows, dispatch, combine (T=%d k=%d E=%d H=%d, expert 4 gets no token):\n", T, K, E,
         H);
  /* expert 3 is everyone's second choice, expert 4 nobody's */
  int32_t idx[T * K] = {0, 3, 1, 3, 2, 3, 3, 0, 1, 3, 3, 2};
  int32_t rows[E][T], slots[E][T];
  int64_t n[E];
  comb_op op = {idx, {0}};
  for (int32_t e = 0; e < E; e++) {
    n[e] = ck_route_rows(idx, T, K, e, rows[e], slots[e]);
    op.off[e + 1] = op.off[e] + n[e];
    int64_t m = 0, ok = 1;
    for (int64_t t = 0; t < T; t++)
      for (int64_t j = 0; j < K; j++)
        if (idx[t * K + j] == e) ok &= m < n[e] && rows[e][m] == t && slots[e][m] == j, m++;
    CHECK(ok && m == n[e], "route_rows expert %d", e);
  }
  CHECK(n[3] == 6 && n[4] == 0, "route_rows counts");
  printf("  route_rows: counts {%lld,%lld,%lld,%lld,%lld}, ascending tokens and their slots\n",
         (long long)n[0], (long long)n[1], (long long)n[2], (long long)n[3], (long long)n[4]);

  const int64_t NY = op.off[E];
  float *x = falloc(T * H), *xe = falloc(T * H), *dx = falloc(T * H), *dx0 = falloc(T * H);
  float *Y = falloc(NY * H), *dY = falloc(NY * H), w[T * K], dw[T * K], *out = falloc(T * H);
  float *r = falloc(T * H);
  fill(x, T * H, -1, 1), fill(Y, NY * H, -1, 1), fill(w, T * K, 0.1f, 1), fill(r, T * H, -1, 1);
  fill(dx0, T * H, -1, 1);
  /* dispatch: exact gather; scatter-add back */
  int ok = 1;
  memcpy(dx, dx0, sizeof(float) * T * H);
  for (int32_t e = 0; e < E; e++) {
    CHECK(ck_dispatch_fwd(x, rows[e], xe, T, n[e], H) == CK_OK, "dispatch fwd rc");
    for (int64_t m = 0; m < n[e]; m++)
      ok &= memcmp(xe + m * H, x + rows[e][m] * H, sizeof(float) * H) == 0;
    CHECK(ck_dispatch_bwd(r, rows[e], dx, T, n[e], H) == CK_OK, "dispatch bwd rc");
  }
  CHECK(ok, "dispatch fwd rows");
  /* expert e scattered dxe = the first n_e rows of r */
  double *want = dalloc(T * H);
  for (int64_t i = 0; i < T * H; i++) want[i] = dx0[i];
  for (int32_t e = 0; e < E; e++)
    for (int64_t m = 0; m < n[e]; m++)
      for (int64_t i = 0; i < H; i++) want[rows[e][m] * H + i] += r[m * H + i];
  check_close("dispatch fwd (gather) + bwd (dx +=)", dx, want, T * H, 1e-6, 1e-7);
  int32_t badrow[1] = {T};
  CHECK(ck_dispatch_fwd(x, badrow, xe, T, 1, H) == CK_EINDEX, "dispatch row T must fail");
  CHECK(ck_dispatch_bwd(r, badrow, dx, T, 1, H) == CK_EINDEX, "dispatch bwd row T must fail");

  /* combine */
  const float *yp[E];
  float *dyp[E];
  for (int e = 0; e < E; e++) {
    yp[e] = n[e] ? Y + op.off[e] * H : NULL; /* the empty expert passes NULL */
    dyp[e] = n[e] ? dY + op.off[e] * H : NULL;
  }
  ck_fd fd = {naive_combine,       &op,           {to_double(w, T * K), to_double(Y, NY * H)},
              to_double(r, T * H), dalloc(T * H), T * H};
  CHECK(ck_combine_fwd(idx, w, yp, out, T, K, E, H) == CK_OK, "combine fwd rc");
  naive_combine(&op, fd.in, fd.out);
  check_close("combine fwd", out, fd.out, T * H, 1e-6, 1e-7);
  CHECK(ck_combine_bwd(idx, w, yp, r, dyp, dw, T, K, E, H) == CK_OK, "combine bwd rc");
  check_grad("combine bwd dw", fd_objective, &fd, fd.in[0], dw, T * K, 1, 1e-3);
  check_grad("combine bwd dy (all experts)", fd_objective, &fd, fd.in[1], dY, NY * H, 1, 1e-3);
  int32_t bad[T * K];
  memcpy(bad, idx, sizeof bad);
  bad[0] = E;
  CHECK(ck_combine_fwd(bad, w, yp, out, T, K, E, H) == CK_EINDEX, "combine bad id");
  CHECK(ck_combine_bwd(bad, w, yp, r, dyp, dw, T, K, E, H) == CK_EINDEX, "combine bwd bad id");
  printf("  bad row / expert ids return CK_EINDEX\n");
  free(fd.in[0]), free(fd.in[1]), free((void *)fd.r), free(fd.out);

  /* a whole MoE layer: dispatch -> per-expert linear -> combine, gradient w.r.t. x and w */
  float *We = falloc(E * H * H), *ye = falloc(NY * H), *dye = falloc(NY * H), *dxe = falloc(T * H);
  fill(We, E * H * H, -0.5f, 0.5f);
  for (int e = 0; e < E; e++) {
    ck_dispatch_fwd(x, rows[e], xe, T, n[e], H);
    ck_linear_fwd(xe, We + e * H * H, NULL, ye + op.off[e] * H, n[e], H, H);
    yp[e] = ye + op.off[e] * H, dyp[e] = dye + op.off[e] * H;
  }
  ck_combine_fwd(idx, w, yp, out, T, K, E, H);
  ck_combine_bwd(idx, w, yp, r, dyp, dw, T, K, E, H);
  memset(dx, 0, sizeof(float) * T * H);
  for (int e = 0; e < E; e++) {
    ck_linear_bwd(NULL, We + e * H * H, dyp[e], dxe, NULL, NULL, n[e], H, H);
    ck_dispatch_bwd(dxe, rows[e], dx, T, n[e], H);
  }
  ck_fd moe = {naive_moe,
               &op,
               {to_double(x, T * H), to_double(We, E * H * H), to_double(w, T * K)},
               to_double(r, T * H),
               dalloc(T * H),
               T * H};
  naive_moe(&op, moe.in, moe.out);
  check_close("moe layer fwd (dispatch, linear, combine)", out, moe.out, T * H, 1e-5, 1e-6);
  check_grad("moe layer bwd dx", fd_objective, &moe, moe.in[0], dx, T * H, 1, 1e-3);
  check_grad("moe layer bwd dw", fd_objective, &moe, moe.in[2], dw, T * K, 1, 1e-3);
  free(moe.in[0]), free(moe.in[1]), free(moe.in[2]), free((void *)moe.r), free(moe.out);
  free(We), free(ye), free(dye), free(dxe);
  free(x), free(xe), free(dx), free(dx0), free(Y), free(dY), free(out), free(r), free(want);
}

int main(void) {
  double t0 = ck_now();
  printf("test_ck_router: forward vs naive double loops; backward vs central differences\n"
         "of the naive forward (step %g, relative to max(|numeric|, %g * max|numeric|))\n",
         FD_H, FD_FLOOR);
  test_topk();
  test_router_losses();
  test_dispatch_combine();
  return ck_finish("test_ck_router", t0);
}
