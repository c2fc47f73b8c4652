/* ck_loss.c -- CPU reference kernel of the language-model loss: token cross-entropy with
 * masked labels (-1; Hugging Face uses -100 for the same thing), mean over unmasked rows. */
#include <math.h>
#include <string.h>

#include "cpu_kernels.h"

/* CK_EINDEX if a label is neither -1 nor in [0, V); else the number of unmasked rows. */
static int64_t count_valid(const int32_t *labels, int64_t T, int64_t V) {
  int64_t n = 0;
  for (int64_t t = 0; t < T; t++) {
    if (labels[t] == -1) continue;
    if (labels[t] < 0 || labels[t] >= V) return CK_EINDEX;
    n++;
  }
  return n;
}

int ck_cross_entropy_fwd(const float *logits, const int32_t *labels, float *loss, int64_t T,
                         int64_t V) {
  int64_t n = count_valid(labels, T, V);
  if (n < 0) return (int)n;
  double s = 0.0;
  for (int64_t t = 0; t < T; t++) {
    if (labels[t] == -1) continue;
    double lse;
    ck_logsumexp_rows(logits + t * V, &lse, 1, V);
    s += lse - (double)logits[t * V + labels[t]];
  }
  *loss = n > 0 ? (float)(s / (double)n) : 0.0f;
  return CK_OK;
}

int ck_cross_entropy_bwd(const float *logits, const int32_t *labels, float dloss,
                         float *dlogits, int64_t T, int64_t V) {
  int64_t n = count_valid(labels, T, V);
  if (n < 0) return (int)n;
  const double f = n > 0 ? (double)dloss / (double)n : 0.0;
  for (int64_t t = 0; t < T; t++) {
    float *dl = dlogits + t * V;
    if (labels[t] == -1) {
      memset(dl, 0, (size_t)V * sizeof(float));
      continue;
    }
    const float *row = logits + t * V;
    double lse;
    ck_logsumexp_rows(row, &lse, 1, V);
    for (int64_t i = 0; i < V; i++) dl[i] = (float)(f * exp((double)row[i] - lse));
    dl[labels[t]] = (float)(f * (exp((double)row[labels[t]] - lse) - 1.0));
  }
  return CK_OK;
}

int64_t ck_label_count(const int32_t *labels, int64_t T) {
  int64_t n = 0;
  for (int64_t t = 0; t < T; t++) n += labels[t] >= 0;
  return n;
}

/* The factor that makes this rank's mean its share of the global mean, in float as the
 * executors multiply by it. */
static float share_of(const int32_t *labels, int64_t T, float n_global) {
  return n_global > 0 ? (float)((double)ck_label_count(labels, T) / (double)n_global) : 0.0f;
}

int ck_cross_entropy_share_fwd(const float *logits, const int32_t *labels, float n_global, float *loss, int64_t T,
                               int64_t V) {
  int rc = ck_cross_entropy_fwd(logits, labels, loss, T, V);
  if (rc == CK_OK) *loss *= share_of(labels, T, n_global);
  return rc;
}

int ck_cross_entropy_share_bwd(const float *logits, const int32_t *labels, float n_global, float dloss,
                               float *dlogits, int64_t T, int64_t V) {
  return ck_cross_entropy_bwd(logits, labels, dloss * share_of(labels, T, n_global), dlogits, T, V);
}
