/* ck_grouped.c -- CPU reference of the expert ops over expert-sorted tokens (sort, permute,
 * grouped GEMMs, the fused GroupedMLP) and of MXFP8 quantize-dequantize along any axis.
 * The grouped GEMMs call ck_matmul on each expert's rows, exactly the products the naive
 * per-expert graph computes, so the two agree to the summation order of the BLAS. */
#include "ck_grouped.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int ck_expert_counts(const int32_t *idx, int64_t T, int64_t k, int64_t E, int32_t *counts) {
  if (!ck_ids_ok(idx, T * k, E)) return CK_EINDEX;
  memset(counts, 0, (size_t)E * sizeof *counts);
  for (int64_t p = 0; p < T * k; p++) counts[idx[p]]++;
  return CK_OK;
}

int ck_expert_sort(const int32_t *idx, int64_t T, int64_t k, int64_t E, int32_t *perm) {
  if (!ck_ids_ok(idx, T * k, E)) return CK_EINDEX;
  int64_t *next = calloc((size_t)E + 1, sizeof *next); /* (E+1) write position of each expert */
  if (!next) return CK_ENOMEM;
  for (int64_t p = 0; p < T * k; p++) next[idx[p] + 1]++;
  for (int64_t e = 0; e < E; e++) next[e + 1] += next[e];
  for (int64_t p = 0; p < T * k; p++) perm[next[idx[p]]++] = (int32_t)p;
  free(next);
  return CK_OK;
}

/* 1 when perm is a permutation of [0, n); fills inv (n) when not NULL. */
static int is_permutation(const int32_t *perm, int64_t n, int32_t *inv) {
  unsigned char *seen = calloc((size_t)n + 1, 1);
  if (!seen) return 0;
  int ok = 1;
  for (int64_t r = 0; r < n && ok; r++) {
    if (perm[r] < 0 || perm[r] >= n || seen[perm[r]]) ok = 0;
    else {
      seen[perm[r]] = 1;
      if (inv) inv[perm[r]] = (int32_t)r;
    }
  }
  free(seen);
  return ok;
}

int ck_expert_permute(const float *x, const int32_t *perm, const float *w, float *xs, int64_t T, int64_t k,
                      int64_t H) {
  if (!is_permutation(perm, T * k, NULL)) return CK_EINDEX;
  for (int64_t r = 0; r < T * k; r++) {
    const float *src = x + (perm[r] / k) * H;
    float *dst = xs + r * H;
    if (w) {
      const float s = w[perm[r]];
      for (int64_t c = 0; c < H; c++) dst[c] = s * src[c];
    } else {
      memcpy(dst, src, (size_t)H * sizeof(float));
    }
  }
  return CK_OK;
}

int ck_expert_unpermute(const float *ys, const int32_t *perm, const float *w, float *out, int64_t T, int64_t k,
                        int64_t H) {
  int32_t *inv = malloc((size_t)(T * k + 1) * sizeof *inv); /* (T*k) sorted row of each pair */
  if (!inv) return CK_ENOMEM;
  if (!is_permutation(perm, T * k, inv)) {
    free(inv);
    return CK_EINDEX;
  }
  for (int64_t t = 0; t < T; t++) {
    float *o = out + t * H;
    memset(o, 0, (size_t)H * sizeof(float));
    for (int64_t j = 0; j < k; j++) {
      const float *y = ys + (int64_t)inv[t * k + j] * H;
      const float s = w ? w[t * k + j] : 1.0f;
      if (w)
        for (int64_t c = 0; c < H; c++) o[c] += s * y[c];
      else
        for (int64_t c = 0; c < H; c++) o[c] += y[c];
    }
  }
  free(inv);
  return CK_OK;
}

int ck_expert_weight_grad(const float *a, const float *b, const int32_t *perm, float *dw, int64_t T, int64_t k,
                          int64_t H) {
  if (!is_permutation(perm, T * k, NULL)) return CK_EINDEX;
  for (int64_t r = 0; r < T * k; r++) {
    const float *ar = a + (perm[r] / k) * H, *br = b + r * H;
    double d = 0.0;
    for (int64_t c = 0; c < H; c++) d += (double)ar[c] * br[c];
    dw[perm[r]] = (float)d;
  }
  return CK_OK;
}

int ck_expert_probs(const float *w, const int32_t *perm, float *p, int64_t T, int64_t k) {
  if (!is_permutation(perm, T * k, NULL)) return CK_EINDEX;
  for (int64_t r = 0; r < T * k; r++) p[r] = w[perm[r]];
  return CK_OK;
}

int ck_expert_probs_bwd(const float *dp, const int32_t *perm, float *dw, int64_t T, int64_t k) {
  if (!is_permutation(perm, T * k, NULL)) return CK_EINDEX;
  for (int64_t r = 0; r < T * k; r++) dw[perm[r]] = dp[r];
  return CK_OK;
}

int ck_group_offsets(const int32_t *counts, int64_t E, int64_t S, int64_t *off) {
  off[0] = 0;
  for (int64_t e = 0; e < E; e++) {
    if (counts[e] < 0) return CK_EINDEX;
    off[e + 1] = off[e] + counts[e];
  }
  return off[E] == S ? CK_OK : CK_EINDEX;
}

/* Offsets into a fresh (E+1) array, or NULL with *rc set. */
static int64_t *offsets(const int32_t *counts, int64_t E, int64_t S, int *rc) {
  int64_t *off = malloc((size_t)(E + 1) * sizeof *off);
  *rc = off ? ck_group_offsets(counts, E, S, off) : CK_ENOMEM;
  if (*rc != CK_OK) {
    free(off);
    return NULL;
  }
  return off;
}

int ck_grouped_linear_fwd(const float *xs, const float *w, const float *b, const int32_t *counts, float *y,
                          int64_t S, int64_t E, int64_t in, int64_t out) {
  int rc;
  int64_t *off = offsets(counts, E, S, &rc);
  if (!off) return rc;
  for (int64_t e = 0; e < E; e++) {
    int64_t n = off[e + 1] - off[e];
    if (n > 0) ck_linear_fwd(xs + off[e] * in, w + e * in * out, b ? b + e * out : NULL, y + off[e] * out, n, in, out);
  }
  free(off);
  return CK_OK;
}

int ck_grouped_linear_dgrad(const float *dy, const float *w, const int32_t *counts, float *dx, int64_t S, int64_t E,
                            int64_t in, int64_t out) {
  int rc;
  int64_t *off = offsets(counts, E, S, &rc);
  if (!off) return rc;
  for (int64_t e = 0; e < E; e++) {
    int64_t n = off[e + 1] - off[e];
    if (n > 0) ck_matmul(dy + off[e] * out, w + e * in * out, dx + off[e] * in, n, out, in, 0, 1, 0.0f);
  }
  free(off);
  return CK_OK;
}

int ck_grouped_linear_wgrad(const float *xs, const float *dy, const int32_t *counts, float *dw, int64_t S, int64_t E,
                            int64_t in, int64_t out) {
  int rc;
  int64_t *off = offsets(counts, E, S, &rc);
  if (!off) return rc;
  for (int64_t e = 0; e < E; e++) {
    int64_t n = off[e + 1] - off[e];
    float *d = dw + e * in * out;
    if (n > 0) ck_matmul(xs + off[e] * in, dy + off[e] * out, d, in, n, out, 1, 0, 0.0f);
    else memset(d, 0, (size_t)(in * out) * sizeof(float));
  }
  free(off);
  return CK_OK;
}

int ck_grouped_colsum(const float *dy, const int32_t *counts, float *db, int64_t S, int64_t E, int64_t out) {
  int rc;
  int64_t *off = offsets(counts, E, S, &rc);
  if (!off) return rc;
  memset(db, 0, (size_t)(E * out) * sizeof(float));
  for (int64_t e = 0; e < E; e++)
    for (int64_t r = off[e]; r < off[e + 1]; r++)
      for (int64_t c = 0; c < out; c++) db[e * out + c] += dy[r * out + c];
  free(off);
  return CK_OK;
}

int ck_grouped_mlp_fwd(const float *xs, const float *w_gu, const float *w_down, const int32_t *counts,
                       const float *probs, float *out, int64_t S, int64_t E, int64_t H, int64_t F,
                       ck_mlp_precision prec) {
  int rc;
  int64_t *off = offsets(counts, E, S, &rc);
  if (!off) return rc;
  const int64_t W = H + 2 * F;
  float *gu = malloc((size_t)(S * 2 * F + 1) * sizeof(float));  /* (S, 2F) */
  float *act = malloc((size_t)(S * F + 1) * sizeof(float));     /* (S, F) */
  float *y = malloc((size_t)(S * H + 1) * sizeof(float));       /* (S, H) */
  rc = gu && act && y ? CK_OK : CK_ENOMEM;
  for (int64_t e = 0; rc == CK_OK && e < E; e++) {
    int64_t n = off[e + 1] - off[e], r0 = off[e];
    if (n == 0) continue;
    ck_matmul(xs + r0 * H, w_gu + e * H * 2 * F, gu + r0 * 2 * F, n, H, 2 * F, 0, 0, 0.0f);
    if (prec.round_bf16) ck_round_bf16(gu + r0 * 2 * F, n * 2 * F);
    for (int64_t r = r0; r < r0 + n; r++) {
      const float *g = gu + r * 2 * F, *u = g + F;
      float *a = act + r * F;
      ck_silu_fwd(g, a, F);
      for (int64_t c = 0; c < F; c++) a[c] = probs[r] * (a[c] * u[c]);
    }
    if (prec.round_bf16) ck_round_bf16(act + r0 * F, n * F);
    if (prec.mx_block > 0) {
      int64_t dims[2] = {n, F};
      rc = ck_mxfp8_qdq(act + r0 * F, act + r0 * F, 2, dims, 1, prec.mx_block, prec.share128, NULL, 0);
    }
    if (rc == CK_OK) ck_matmul(act + r0 * F, w_down + e * F * H, y + r0 * H, n, F, H, 0, 0, 0.0f);
  }
  for (int64_t r = 0; rc == CK_OK && r < S; r++) {
    memcpy(out + r * W, y + r * H, (size_t)H * sizeof(float));
    memcpy(out + r * W + H, gu + r * 2 * F, (size_t)(2 * F) * sizeof(float));
  }
  free(gu);
  free(act);
  free(y);
  free(off);
  return rc;
}

int ck_grouped_mlp_bwd(const float *dy, const float *gate_up, const float *w_down, const int32_t *counts,
                       const float *probs, float *out, int64_t S, int64_t E, int64_t H, int64_t F, int64_t W) {
  if (W < 3 * F + 1) return CK_ESHAPE;
  int rc;
  int64_t *off = offsets(counts, E, S, &rc);
  if (!off) return rc;
  float *dact = malloc((size_t)(S * F + 1) * sizeof(float)); /* (S, F) */
  float *s = malloc((size_t)(F + 1) * sizeof(float));        /* (F) silu(g) of one row */
  float *da = malloc((size_t)(F + 1) * sizeof(float));       /* (F) */
  rc = dact && s && da ? CK_OK : CK_ENOMEM;
  for (int64_t e = 0; rc == CK_OK && e < E; e++) {
    int64_t n = off[e + 1] - off[e];
    if (n > 0) ck_matmul(dy + off[e] * H, w_down + e * F * H, dact + off[e] * F, n, H, F, 0, 1, 0.0f);
  }
  for (int64_t r = 0; rc == CK_OK && r < S; r++) {
    const float *g = gate_up + r * 2 * F, *u = g + F, *d = dact + r * F;
    float *o = out + r * W; /* dg | du | act | dp */
    const float p = probs[r];
    ck_silu_fwd(g, s, F);
    double dp = 0.0;
    for (int64_t c = 0; c < F; c++) {
      const float a = s[c] * u[c];
      dp += (double)d[c] * a;
      da[c] = p * d[c];
      o[F + c] = da[c] * s[c];  /* du */
      o[2 * F + c] = p * a;     /* act */
      da[c] *= u[c];            /* d silu(g) */
    }
    ck_silu_bwd(g, da, o, F); /* dg */
    o[3 * F] = (float)dp;
    for (int64_t c = 3 * F + 1; c < W; c++) o[c] = 0.0f; /* the padding */
  }
  free(dact);
  free(s);
  free(da);
  free(off);
  return rc;
}

/* Quantize-dequantize one line of n elements (gathered, contiguous) in units of `unit`
 * (the block, or 128 with share128), the last one padded with zeros. */
static int qdq_line(float *v, int64_t n, int64_t block, int share128, float *pad, uint8_t *q, uint8_t *sc) {
  const int64_t unit = share128 ? 128 : block;
  for (int64_t s = 0; s < n; s += unit) {
    int64_t m = n - s < unit ? n - s : unit;
    memcpy(pad, v + s, (size_t)m * sizeof(float));
    memset(pad + m, 0, (size_t)(unit - m) * sizeof(float));
    int rc = ck_mxfp8_quantize(pad, 1, unit, block, share128, q, sc);
    if (rc == CK_OK) rc = ck_mxfp8_dequantize(q, sc, 1, unit, block, pad);
    if (rc != CK_OK) return rc;
    memcpy(v + s, pad, (size_t)m * sizeof(float));
  }
  return CK_OK;
}

int ck_mxfp8_qdq(const float *x, float *y, int rank, const int64_t *dims, int axis, int64_t block, int share128,
                 const int32_t *counts, int64_t E) {
  if (rank < 1 || rank > 4 || axis < 0 || axis >= rank || block < 1 || (share128 && 128 % block)) return CK_ESHAPE;
  if (counts && axis != 0) return CK_ESHAPE;
  int64_t outer = 1, L = dims[axis], inner = 1;
  for (int d = 0; d < axis; d++) outer *= dims[d];
  for (int d = axis + 1; d < rank; d++) inner *= dims[d];
  int64_t *off = NULL;
  int rc = CK_OK;
  if (counts) {
    off = offsets(counts, E, L, &rc);
    if (!off) return rc;
  }
  const int64_t unit = share128 ? 128 : block;
  float *line = malloc((size_t)(L + 1) * sizeof(float)), *pad = malloc((size_t)unit * sizeof(float));
  uint8_t *q = malloc((size_t)unit), *sc = malloc((size_t)(unit / block + 1));
  if (!line || !pad || !q || !sc) rc = CK_ENOMEM;
  for (int64_t o = 0; rc == CK_OK && o < outer; o++)
    for (int64_t i = 0; rc == CK_OK && i < inner; i++) {
      const float *src = x + o * L * inner + i;
      for (int64_t l = 0; l < L; l++) line[l] = src[l * inner];
      if (off) {
        for (int64_t e = 0; rc == CK_OK && e < E; e++)
          rc = qdq_line(line + off[e], off[e + 1] - off[e], block, share128, pad, q, sc);
      } else {
        rc = qdq_line(line, L, block, share128, pad, q, sc);
      }
      float *dst = y + o * L * inner + i;
      for (int64_t l = 0; rc == CK_OK && l < L; l++) dst[l * inner] = line[l];
    }
  free(line);
  free(pad);
  free(q);
  free(sc);
  free(off);
  return rc;
}

int ck_mxfp8_qdq_tiles(const float *x, float *y, int64_t E, int64_t A, int64_t B, int64_t tile) {
  if (E < 0 || tile < 1 || A % tile || B % tile) return CK_ESHAPE;
  float *t = malloc((size_t)(tile * tile) * sizeof(float));
  uint8_t *q = malloc((size_t)(tile * tile));
  if (!t || !q) {
    free(t), free(q);
    return CK_ENOMEM;
  }
  for (int64_t e = 0; e < E; e++)
    for (int64_t a0 = 0; a0 < A; a0 += tile)
      for (int64_t b0 = 0; b0 < B; b0 += tile) {
        const int64_t base = e * A * B + a0 * B + b0;
        for (int64_t i = 0; i < tile; i++) memcpy(t + i * tile, x + base + i * B, (size_t)tile * sizeof(float));
        const uint8_t code = ck_mxfp8_quantize_group(t, tile * tile, q);
        for (int64_t i = 0; i < tile; i++)
          for (int64_t j = 0; j < tile; j++)
            y[base + i * B + j] = code == 0xFF ? NAN : ldexpf(ck_e4m3_to_float(q[i * tile + j]), (int)code - 127);
      }
  free(t);
  free(q);
  return CK_OK;
}
