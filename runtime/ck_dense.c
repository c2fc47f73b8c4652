/* ck_dense.c -- CPU reference kernels of the dense ops: matmul and linear (OpenBLAS),
 * embedding, RMSNorm, the elementwise ops (silu, mul, add) and row softmax / logsumexp. */
#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"

const char *ck_strerror(int rc) {
  switch (rc) {
  case CK_OK: return "ok";
  case CK_EINDEX: return "index out of range";
  case CK_ESHAPE: return "unsupported shape";
  case CK_ENOMEM: return "out of memory";
  default: return "unknown error";
  }
}

/* BLAS takes int sizes; a dimension beyond that is a caller bug we refuse loudly. */
static int blas_dim(int64_t d) {
  if (d < 0 || d > INT_MAX) {
    fprintf(stderr, "ck_gemm: size %lld does not fit a BLAS int\n", (long long)d);
    abort();
  }
  return (int)d;
}

void ck_gemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
             const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
             int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) { /* empty sum: C = beta*C, never reading C when beta = 0 (as BLAS does) */
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < n; j++) C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
    return;
  }
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, blas_dim(m), blas_dim(n), blas_dim(k), alpha,
              A, blas_dim(lda), B, blas_dim(ldb), beta, C, blas_dim(ldc));
}

void ck_matmul(const float *A, const float *B, float *C, int64_t m, int64_t k, int64_t n,
               int trans_a, int trans_b, float beta) {
  ck_gemm(trans_a, trans_b, m, n, k, 1.0f, A, trans_a ? m : k, B, trans_b ? k : n, beta, C, n);
}

int ck_ids_ok(const int32_t *ids, int64_t n, int64_t limit) {
  for (int64_t i = 0; i < n; i++)
    if (ids[i] < 0 || ids[i] >= limit) return 0;
  return 1;
}

void ck_linear_fwd(const float *x, const float *w, const float *b, float *y, int64_t n,
                   int64_t in, int64_t out) {
  if (b) {
    for (int64_t r = 0; r < n; r++) memcpy(y + r * out, b, (size_t)out * sizeof(float));
  }
  ck_matmul(x, w, y, n, in, out, 0, 0, b ? 1.0f : 0.0f);
}

void ck_linear_bwd(const float *x, const float *w, const float *dy, float *dx, float *dw,
                   float *db, int64_t n, int64_t in, int64_t out) {
  if (dx) ck_matmul(dy, w, dx, n, out, in, 0, 1, 0.0f); /* (n,out)·(in,out)^T */
  if (dw) ck_matmul(x, dy, dw, in, n, out, 1, 0, 1.0f); /* (n,in)^T·(n,out) */
  if (db) {
    for (int64_t r = 0; r < n; r++) {
      const float *row = dy + r * out;
      for (int64_t c = 0; c < out; c++) db[c] += row[c];
    }
  }
}

int ck_embedding_fwd(const float *table, const int32_t *tokens, float *out, int64_t T,
                     int64_t V, int64_t H) {
  if (!ck_ids_ok(tokens, T, V)) return CK_EINDEX;
  for (int64_t t = 0; t < T; t++)
    memcpy(out + t * H, table + (int64_t)tokens[t] * H, (size_t)H * sizeof(float));
  return CK_OK;
}

int ck_embedding_bwd(const int32_t *tokens, const float *dout, float *dtable, int64_t T,
                     int64_t V, int64_t H) {
  if (!ck_ids_ok(tokens, T, V)) return CK_EINDEX;
  for (int64_t t = 0; t < T; t++) {
    float *dst = dtable + (int64_t)tokens[t] * H;
    const float *src = dout + t * H;
    for (int64_t i = 0; i < H; i++) dst[i] += src[i];
  }
  return CK_OK;
}

/* rsqrt(mean(x^2) + eps) of one row; the mean in double, the result in fp32 as HF does. */
static float rms_scale(const float *x, int64_t H, float eps) {
  double ss = 0.0;
  for (int64_t i = 0; i < H; i++) ss += (double)x[i] * x[i];
  float var = (float)(ss / (double)H);
  return 1.0f / sqrtf(var + eps);
}

void ck_rmsnorm_fwd(const float *x, const float *w, float *y, int64_t T, int64_t H, float eps) {
  for (int64_t t = 0; t < T; t++) {
    const float *xr = x + t * H;
    float *yr = y + t * H;
    float r = rms_scale(xr, H, eps);
    for (int64_t i = 0; i < H; i++) yr[i] = w[i] * (xr[i] * r); /* HF: w * (x * rsqrt) */
  }
}

/* y_i = w_i x_i r, r = (mean(x^2) + eps)^-1/2, dr/dx_j = -r^3 x_j / H, so
 *   dx_j = r w_j dy_j - (r^3 / H) x_j sum_i dy_i w_i x_i,   dw_i += dy_i x_i r. */
void ck_rmsnorm_bwd(const float *x, const float *w, const float *dy, float *dx, float *dw,
                    int64_t T, int64_t H, float eps) {
  for (int64_t t = 0; t < T; t++) {
    const float *xr = x + t * H, *dyr = dy + t * H;
    float *dxr = dx + t * H;
    float r = rms_scale(xr, H, eps);
    double dot = 0.0;
    for (int64_t i = 0; i < H; i++) dot += (double)dyr[i] * w[i] * xr[i];
    float c = (float)(dot * r * r * r / (double)H);
    if (dw)
      for (int64_t i = 0; i < H; i++) dw[i] += dyr[i] * xr[i] * r;
    for (int64_t i = 0; i < H; i++) dxr[i] = r * w[i] * dyr[i] - c * xr[i];
  }
}

/* sigmoid without overflow warnings: exp of a non-positive argument only. */
static float sigmoidf(float x) {
  if (x >= 0.0f) return 1.0f / (1.0f + expf(-x));
  float e = expf(x);
  return e / (1.0f + e);
}

void ck_silu_fwd(const float *x, float *y, int64_t n) {
  for (int64_t i = 0; i < n; i++) y[i] = x[i] * sigmoidf(x[i]);
}

/* d/dx x s(x) = s + x s (1 - s) = s (1 + x (1 - s)). */
void ck_silu_bwd(const float *x, const float *dy, float *dx, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    float s = sigmoidf(x[i]);
    dx[i] = dy[i] * s * (1.0f + x[i] * (1.0f - s));
  }
}

void ck_mul_fwd(const float *a, const float *b, float *y, int64_t n) {
  for (int64_t i = 0; i < n; i++) y[i] = a[i] * b[i];
}

void ck_mul_bwd(const float *a, const float *b, const float *dy, float *da, float *db,
                int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    float g = dy[i], ai = a[i], bi = b[i]; /* read all before writing: da/db may alias dy */
    if (da) da[i] = g * bi;
    if (db) db[i] = g * ai;
  }
}

void ck_add_fwd(const float *a, const float *b, float *y, int64_t n) {
  for (int64_t i = 0; i < n; i++) y[i] = a[i] + b[i];
}

void ck_add_bwd(const float *dy, float *da, float *db, int64_t n) {
  if (da && da != dy) memcpy(da, dy, (size_t)n * sizeof(float));
  if (db && db != dy) memcpy(db, dy, (size_t)n * sizeof(float));
}

void ck_softmax_rows(const float *x, float *y, int64_t T, int64_t E) {
  for (int64_t t = 0; t < T; t++) {
    const float *xr = x + t * E;
    float *yr = y + t * E;
    float mx = -INFINITY;
    for (int64_t e = 0; e < E; e++) mx = fmaxf(mx, xr[e]);
    double sum = 0.0;
    for (int64_t e = 0; e < E; e++) {
      yr[e] = expf(xr[e] - mx);
      sum += yr[e];
    }
    for (int64_t e = 0; e < E; e++) yr[e] = (float)(yr[e] / sum);
  }
}

void ck_logsumexp_rows(const float *x, double *lse, int64_t T, int64_t E) {
  for (int64_t t = 0; t < T; t++) {
    const float *xr = x + t * E;
    float mx = -INFINITY;
    for (int64_t e = 0; e < E; e++) mx = fmaxf(mx, xr[e]);
    double sum = 0.0;
    for (int64_t e = 0; e < E; e++) sum += exp((double)xr[e] - mx);
    lse[t] = mx + log(sum);
  }
}
