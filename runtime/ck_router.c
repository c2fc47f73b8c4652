/* ck_router.c -- CPU reference kernels of the MoE router: top-k selection, routing weights,
 * the load-balancing (aux) and z losses, and token dispatch / combine.
 *
 * Parity with Hugging Face Mixtral:
 *  - HF takes topk of softmax(logits); softmax is monotone, so topk of the logits picks the
 *    same experts except where two probabilities round to the same float.
 *  - HF's aux loss concatenates the router logits of ALL layers into one [L*T, E] matrix and
 *    evaluates load_balancing_loss_func once; that is not the sum of per-layer losses. Calling
 *    ck_aux_loss_* once on the stacked [L*T, E] logits and ids reproduces HF exactly.
 *  - HF has no router z-loss; ours is the ST-MoE one, coef * mean_t logsumexp(logits_t)^2.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"

/* Does logit a (expert ia) come before b (expert ib)? Larger first, NaN last, ties (and two
 * NaNs) to the lower id. */
static int before(float a, int64_t ia, float b, int64_t ib) {
  int na = isnan(a), nb = isnan(b);
  if (na != nb) return nb;
  if (!na && a != b) return a > b;
  return ia < ib;
}

int ck_topk(const float *logits, int32_t *idx, int64_t T, int64_t E, int64_t k) {
  if (k < 1 || k > E) return CK_ESHAPE;
  for (int64_t t = 0; t < T; t++) {
    const float *row = logits + t * E;
    int32_t *out = idx + t * k;
    int64_t n = 0; /* insertion into the sorted list out[0..n) of the best so far */
    for (int64_t e = 0; e < E; e++) {
      if (n == k && !before(row[e], e, row[out[k - 1]], out[k - 1])) continue;
      int64_t pos = n < k ? n++ : k - 1;
      while (pos > 0 && before(row[e], e, row[out[pos - 1]], out[pos - 1])) {
        out[pos] = out[pos - 1];
        pos--;
      }
      out[pos] = (int32_t)e;
    }
  }
  return CK_OK;
}

int ck_route_weights_fwd(const float *logits, const int32_t *idx, float *w, int64_t T,
                         int64_t E, int64_t k) {
  if (!ck_ids_ok(idx, T * k, E)) return CK_EINDEX;
  float *p = malloc((size_t)E * sizeof(float));
  if (!p) return CK_ENOMEM;
  for (int64_t t = 0; t < T; t++) {
    ck_softmax_rows(logits + t * E, p, 1, E);
    const int32_t *id = idx + t * k;
    float *wr = w + t * k, s = 0.0f;
    for (int64_t j = 0; j < k; j++) s += (wr[j] = p[id[j]]);
    for (int64_t j = 0; j < k; j++) wr[j] /= s;
  }
  free(p);
  return CK_OK;
}

/* The full softmax's denominator cancels in the renormalisation, so w_j is the softmax of the
 * selected logits alone: w_j = exp(l_{id_j}) / sum_j' exp(l_{id_j'}). Its gradient is
 *   dlogits[id_j] += w_j (dw_j - sum_j' w_j' dw_j'),   0 for the experts not selected.
 * (Chaining through the full softmax and the division gives the same, up to rounding.) */
int ck_route_weights_bwd(const float *logits, const int32_t *idx, const float *dw,
                         float *dlogits, int64_t T, int64_t E, int64_t k) {
  if (!ck_ids_ok(idx, T * k, E)) return CK_EINDEX;
  float *w = malloc((size_t)k * sizeof(float));
  if (!w) return CK_ENOMEM;
  for (int64_t t = 0; t < T; t++) {
    const float *row = logits + t * E, *g = dw + t * k;
    const int32_t *id = idx + t * k;
    float *dl = dlogits + t * E;
    float mx = -INFINITY;
    for (int64_t j = 0; j < k; j++) mx = fmaxf(mx, row[id[j]]);
    double s = 0.0;
    for (int64_t j = 0; j < k; j++) s += (w[j] = expf(row[id[j]] - mx));
    double wg = 0.0;
    for (int64_t j = 0; j < k; j++) {
      w[j] = (float)(w[j] / s);
      wg += (double)w[j] * g[j];
    }
    memset(dl, 0, (size_t)E * sizeof(float));
    for (int64_t j = 0; j < k; j++) dl[id[j]] += w[j] * (float)(g[j] - wg);
  }
  free(w);
  return CK_OK;
}

/* c_e = number of (t, j) routed to e, as double. */
static void count_routes(const int32_t *idx, int64_t n, int64_t E, double *c) {
  for (int64_t e = 0; e < E; e++) c[e] = 0.0;
  for (int64_t i = 0; i < n; i++) c[idx[i]] += 1.0;
}

/* The load-balancing loss over these T rows, given the routed counts c (E) and the global
 * token count Tg (T itself on one rank; all ranks' tokens under data parallelism):
 *   loss = coef E sum_e (c_e / Tg) (P_e / Tg),  P_e = sum_t softmax(logits_t)_e. */
static int aux_fwd(const float *logits, const double *c, int64_t T, int64_t E, double Tg, float coef, float *loss) {
  if (T == 0 || Tg <= 0) {
    *loss = 0.0f;
    return CK_OK;
  }
  double *P = malloc((size_t)E * sizeof(double));
  float *p = malloc((size_t)E * sizeof(float));
  if (!P || !p) {
    free(P);
    free(p);
    return CK_ENOMEM;
  }
  for (int64_t e = 0; e < E; e++) P[e] = 0.0;
  for (int64_t t = 0; t < T; t++) {
    ck_softmax_rows(logits + t * E, p, 1, E);
    for (int64_t e = 0; e < E; e++) P[e] += p[e];
  }
  double s = 0.0;
  for (int64_t e = 0; e < E; e++) s += (c[e] / Tg) * (P[e] / Tg);
  *loss = (float)((double)coef * (double)E * s);
  free(P);
  free(p);
  return CK_OK;
}

/* loss = sum_e a_e P_e with a_e = coef E c_e / Tg (constant: ids are not differentiable), and
 * dP_e / dl[t,e'] = p[t,e] (delta_ee' - p[t,e']), so
 *   dlogits[t,e'] += dloss p[t,e'] (a_e' - sum_e a_e p[t,e]) / Tg. */
static int aux_bwd(const float *logits, const double *c, int64_t T, int64_t E, double Tg, float coef, float dloss,
                   float *dlogits) {
  if (T == 0 || Tg <= 0) return CK_OK;
  double *a = malloc((size_t)E * sizeof(double));
  float *p = malloc((size_t)E * sizeof(float));
  if (!a || !p) {
    free(a);
    free(p);
    return CK_ENOMEM;
  }
  for (int64_t e = 0; e < E; e++) a[e] = c[e] * ((double)coef * (double)E / Tg);
  const double f = (double)dloss / Tg;
  for (int64_t t = 0; t < T; t++) {
    ck_softmax_rows(logits + t * E, p, 1, E);
    double ap = 0.0;
    for (int64_t e = 0; e < E; e++) ap += a[e] * p[e];
    float *dl = dlogits + t * E;
    for (int64_t e = 0; e < E; e++) dl[e] += (float)(f * p[e] * (a[e] - ap));
  }
  free(a);
  free(p);
  return CK_OK;
}

/* Counts as doubles: from the routing ids of these rows, or from given (global) counts. */
static double *counts_of_ids(const int32_t *idx, int64_t n, int64_t E) {
  double *c = malloc((size_t)(E > 0 ? E : 1) * sizeof(double));
  if (c) count_routes(idx, n, E, c);
  return c;
}

static double *counts_given(const int32_t *counts, int64_t E, int64_t k, double *Tg) {
  double *c = malloc((size_t)(E > 0 ? E : 1) * sizeof(double));
  double n = 0;
  for (int64_t e = 0; c && e < E; e++) n += c[e] = counts[e];
  *Tg = n / (double)k; /* every token is routed k times */
  return c;
}

int ck_aux_loss_fwd(const float *logits, const int32_t *idx, float *loss, int64_t T, int64_t E, int64_t k,
                    float coef) {
  if (!ck_ids_ok(idx, T * k, E)) return CK_EINDEX;
  double *c = counts_of_ids(idx, T * k, E);
  int rc = c ? aux_fwd(logits, c, T, E, (double)T, coef, loss) : CK_ENOMEM;
  free(c);
  return rc;
}

int ck_aux_loss_bwd(const float *logits, const int32_t *idx, float dloss, float *dlogits, int64_t T, int64_t E,
                    int64_t k, float coef) {
  if (!ck_ids_ok(idx, T * k, E)) return CK_EINDEX;
  double *c = counts_of_ids(idx, T * k, E);
  int rc = c ? aux_bwd(logits, c, T, E, (double)T, coef, dloss, dlogits) : CK_ENOMEM;
  free(c);
  return rc;
}

int ck_aux_loss_share_fwd(const float *logits, const int32_t *counts, float *loss, int64_t T, int64_t E, int64_t k,
                          float coef) {
  double Tg;
  double *c = counts_given(counts, E, k, &Tg);
  int rc = c ? aux_fwd(logits, c, T, E, Tg, coef, loss) : CK_ENOMEM;
  free(c);
  return rc;
}

int ck_aux_loss_share_bwd(const float *logits, const int32_t *counts, float dloss, float *dlogits, int64_t T,
                          int64_t E, int64_t k, float coef) {
  double Tg;
  double *c = counts_given(counts, E, k, &Tg);
  int rc = c ? aux_bwd(logits, c, T, E, Tg, coef, dloss, dlogits) : CK_ENOMEM;
  free(c);
  return rc;
}

void ck_z_loss_fwd(const float *logits, float *loss, int64_t T, int64_t E, float coef) {
  double s = 0.0;
  for (int64_t t = 0; t < T; t++) {
    double l;
    ck_logsumexp_rows(logits + t * E, &l, 1, E);
    s += l * l;
  }
  *loss = T > 0 ? (float)((double)coef * s / (double)T) : 0.0f;
}

/* d/dl[t,e] coef mean_t lse_t^2 = coef (2 / T) lse_t softmax(l_t)_e. */
void ck_z_loss_bwd(const float *logits, float dloss, float *dlogits, int64_t T, int64_t E,
                   float coef) {
  for (int64_t t = 0; t < T; t++) {
    const float *row = logits + t * E;
    float *dl = dlogits + t * E;
    double l;
    ck_logsumexp_rows(row, &l, 1, E);
    double f = (double)dloss * coef * 2.0 / (double)T * l;
    for (int64_t e = 0; e < E; e++) dl[e] += (float)(f * exp((double)row[e] - l));
  }
}

int64_t ck_route_rows(const int32_t *idx, int64_t T, int64_t k, int32_t e, int32_t *rows,
                      int32_t *slots) {
  int64_t n = 0;
  for (int64_t t = 0; t < T; t++)
    for (int64_t j = 0; j < k; j++)
      if (idx[t * k + j] == e) {
        rows[n] = (int32_t)t;
        if (slots) slots[n] = (int32_t)j;
        n++;
      }
  return n;
}

int ck_dispatch_fwd(const float *x, const int32_t *rows, float *xe, int64_t T, int64_t n,
                    int64_t H) {
  if (!ck_ids_ok(rows, n, T)) return CK_EINDEX;
  for (int64_t r = 0; r < n; r++)
    memcpy(xe + r * H, x + (int64_t)rows[r] * H, (size_t)H * sizeof(float));
  return CK_OK;
}

int ck_dispatch_bwd(const float *dxe, const int32_t *rows, float *dx, int64_t T, int64_t n,
                    int64_t H) {
  if (!ck_ids_ok(rows, n, T)) return CK_EINDEX;
  for (int64_t r = 0; r < n; r++) {
    float *dst = dx + (int64_t)rows[r] * H;
    const float *src = dxe + r * H;
    for (int64_t i = 0; i < H; i++) dst[i] += src[i];
  }
  return CK_OK;
}

/* Both walk (t, j) in ascending order, so row[e], the number of pairs of expert e seen so
 * far, is the row of (t, j) in y_e. */
int ck_combine_fwd(const int32_t *idx, const float *w, const float *const *y, float *out,
                   int64_t T, int64_t k, int64_t E, int64_t H) {
  if (!ck_ids_ok(idx, T * k, E)) return CK_EINDEX;
  int64_t *row = calloc((size_t)(E > 0 ? E : 1), sizeof(int64_t));
  if (!row) return CK_ENOMEM;
  for (int64_t t = 0; t < T; t++) {
    float *o = out + t * H;
    memset(o, 0, (size_t)H * sizeof(float));
    for (int64_t j = 0; j < k; j++) {
      int32_t e = idx[t * k + j];
      const float *ye = y[e] + row[e]++ * H;
      const float wt = w[t * k + j];
      for (int64_t i = 0; i < H; i++) o[i] += wt * ye[i];
    }
  }
  free(row);
  return CK_OK;
}

int ck_combine_bwd(const int32_t *idx, const float *w, const float *const *y, const float *dout,
                   float *const *dy, float *dw, int64_t T, int64_t k, int64_t E, int64_t H) {
  if (!ck_ids_ok(idx, T * k, E)) return CK_EINDEX;
  int64_t *row = calloc((size_t)(E > 0 ? E : 1), sizeof(int64_t));
  if (!row) return CK_ENOMEM;
  for (int64_t t = 0; t < T; t++) {
    const float *g = dout + t * H;
    for (int64_t j = 0; j < k; j++) {
      int32_t e = idx[t * k + j];
      int64_t r = row[e]++;
      const float *ye = y[e] + r * H;
      const float wt = w[t * k + j];
      float *dye = dy[e] + r * H;
      double d = 0.0;
      for (int64_t i = 0; i < H; i++) {
        d += (double)g[i] * ye[i];
        dye[i] = wt * g[i];
      }
      dw[t * k + j] = (float)d;
    }
  }
  free(row);
  return CK_OK;
}
