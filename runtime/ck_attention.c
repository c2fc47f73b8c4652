/* ck_attention.c -- CPU reference kernels of rotary embedding and causal grouped-query
 * attention.
 *
 * Attention works on one (sequence, query head) pair at a time and on blocks of ATT_BQ query
 * rows, so scratch is ATT_BQ x seq floats rather than seq x seq. Heads are read in place: the
 * rows of head h in q[T, nh*hd] are a matrix with leading dimension nh*hd, which cblas_sgemm
 * takes directly. The backward recomputes the probabilities from the saved logsumexp
 * (P = exp(S - lse)) and uses D_i = sum_d dO[i,d] O[i,d] = sum_j P[i,j] dP[i,j], as
 * FlashAttention does.
 *
 * Parity with Hugging Face: HF computes inv_freq and the angle p*inv_freq in fp32, which at
 * positions in the thousands is off by up to ~1e-3 rad; we compute the angle in double (as
 * the op's definition asks), so cos/sin agree with HF to ~1e-7 only for short sequences.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"

enum { ATT_BQ = 64 }; /* query rows per block */

static int rope(const float *x, float *y, int64_t T, int64_t nh, int64_t hd, int64_t seq,
                double theta, float sign) {
  if (hd < 0 || hd % 2 != 0 || seq < 1 || nh < 0 || T < 0) return CK_ESHAPE;
  int64_t half = hd / 2, P = T < seq ? T : seq;
  if (half == 0 || P == 0) {
    if (y != x) memcpy(y, x, (size_t)(T * nh * hd) * sizeof(float));
    return CK_OK;
  }
  float *cs = malloc((size_t)(P * half * 2) * sizeof(float)); /* (P, half, {cos, sin}) */
  if (!cs) return CK_ENOMEM;
  for (int64_t i = 0; i < half; i++) {
    double inv_freq = pow(theta, -2.0 * (double)i / (double)hd);
    for (int64_t p = 0; p < P; p++) {
      double a = (double)p * inv_freq;
      cs[(p * half + i) * 2] = (float)cos(a);
      cs[(p * half + i) * 2 + 1] = sign * (float)sin(a);
    }
  }
  for (int64_t t = 0; t < T; t++) {
    const float *c = cs + (t % seq) * half * 2;
    for (int64_t h = 0; h < nh; h++) {
      const float *xr = x + (t * nh + h) * hd;
      float *yr = y + (t * nh + h) * hd;
      for (int64_t i = 0; i < half; i++) {
        float x1 = xr[i], x2 = xr[i + half], co = c[2 * i], si = c[2 * i + 1];
        yr[i] = x1 * co - x2 * si;
        yr[i + half] = x2 * co + x1 * si;
      }
    }
  }
  free(cs);
  return CK_OK;
}

int ck_rope_fwd(const float *x, float *y, int64_t T, int64_t nh, int64_t hd, int64_t seq,
                double theta) {
  return rope(x, y, T, nh, hd, seq, theta, 1.0f);
}

/* The forward is an orthogonal rotation R(angle); its adjoint is R(-angle). */
int ck_rope_bwd(const float *dy, float *dx, int64_t T, int64_t nh, int64_t hd, int64_t seq,
                double theta) {
  return rope(dy, dx, T, nh, hd, seq, theta, -1.0f);
}

static int att_shape_ok(int64_t B, int64_t seq, int64_t nh, int64_t nkv, int64_t hd) {
  return B >= 0 && seq >= 1 && nh >= 1 && nkv >= 1 && hd >= 1 && nh % nkv == 0;
}

int ck_attention_fwd(const float *q, const float *k, const float *v, float *out, float *lse,
                     int64_t B, int64_t seq, int64_t nh, int64_t nkv, int64_t hd, int causal) {
  if (!att_shape_ok(B, seq, nh, nkv, hd)) return CK_ESHAPE;
  const int64_t group = nh / nkv, ldq = nh * hd, ldk = nkv * hd;
  const float scale = (float)(1.0 / sqrt((double)hd));
  float *S = malloc((size_t)(ATT_BQ * seq) * sizeof(float)); /* (nq, L) scores, then P */
  if (!S) return CK_ENOMEM;
  for (int64_t b = 0; b < B; b++) {
    for (int64_t h = 0; h < nh; h++) {
      const float *Q = q + b * seq * ldq + h * hd;            /* (seq, hd) ld ldq */
      const float *K = k + b * seq * ldk + (h / group) * hd;  /* (seq, hd) ld ldk */
      const float *V = v + b * seq * ldk + (h / group) * hd;  /* (seq, hd) ld ldk */
      float *O = out + b * seq * ldq + h * hd;                /* (seq, hd) ld ldq */
      float *LSE = lse + (b * nh + h) * seq;                  /* (seq) */
      for (int64_t i0 = 0; i0 < seq; i0 += ATT_BQ) {
        int64_t nq = seq - i0 < ATT_BQ ? seq - i0 : ATT_BQ;
        int64_t L = causal ? i0 + nq : seq; /* keys any row of this block may see */
        ck_gemm(0, 1, nq, L, hd, scale, Q + i0 * ldq, ldq, K, ldk, 0.0f, S, L);
        for (int64_t r = 0; r < nq; r++) {
          float *row = S + r * L;
          int64_t lim = causal ? i0 + r + 1 : L;
          float mx = -INFINITY;
          for (int64_t j = 0; j < lim; j++) mx = fmaxf(mx, row[j]);
          double sum = 0.0;
          for (int64_t j = 0; j < lim; j++) {
            row[j] = expf(row[j] - mx);
            sum += row[j];
          }
          float inv = (float)(1.0 / sum);
          for (int64_t j = 0; j < lim; j++) row[j] *= inv;
          for (int64_t j = lim; j < L; j++) row[j] = 0.0f;
          LSE[i0 + r] = (float)(mx + log(sum));
        }
        ck_gemm(0, 0, nq, hd, L, 1.0f, S, L, V, ldk, 0.0f, O + i0 * ldq, ldq);
      }
    }
  }
  free(S);
  return CK_OK;
}

int ck_attention_bwd(const float *q, const float *k, const float *v, const float *out,
                     const float *lse, const float *dout, float *dq, float *dk, float *dv,
                     int64_t B, int64_t seq, int64_t nh, int64_t nkv, int64_t hd, int causal) {
  if (!att_shape_ok(B, seq, nh, nkv, hd)) return CK_ESHAPE;
  const int64_t group = nh / nkv, ldq = nh * hd, ldk = nkv * hd;
  const float scale = (float)(1.0 / sqrt((double)hd));
  float *P = malloc((size_t)(2 * ATT_BQ * seq) * sizeof(float));
  if (!P) return CK_ENOMEM;
  float *dP = P + ATT_BQ * seq; /* (nq, L): dO V^T, then dS */
  memset(dk, 0, (size_t)(B * seq * ldk) * sizeof(float));
  memset(dv, 0, (size_t)(B * seq * ldk) * sizeof(float));
  for (int64_t b = 0; b < B; b++) {
    for (int64_t h = 0; h < nh; h++) {
      const int64_t qo = b * seq * ldq + h * hd, ko = b * seq * ldk + (h / group) * hd;
      const float *Q = q + qo, *O = out + qo, *dO = dout + qo;
      const float *K = k + ko, *V = v + ko;
      const float *LSE = lse + (b * nh + h) * seq;
      float *dQ = dq + qo, *dK = dk + ko, *dV = dv + ko;
      for (int64_t i0 = 0; i0 < seq; i0 += ATT_BQ) {
        int64_t nq = seq - i0 < ATT_BQ ? seq - i0 : ATT_BQ;
        int64_t L = causal ? i0 + nq : seq;
        ck_gemm(0, 1, nq, L, hd, scale, Q + i0 * ldq, ldq, K, ldk, 0.0f, P, L);
        ck_gemm(0, 1, nq, L, hd, 1.0f, dO + i0 * ldq, ldq, V, ldk, 0.0f, dP, L);
        for (int64_t r = 0; r < nq; r++) {
          const int64_t i = i0 + r, lim = causal ? i + 1 : L;
          const float *o = O + i * ldq, *go = dO + i * ldq;
          double d = 0.0;
          for (int64_t c = 0; c < hd; c++) d += (double)go[c] * o[c];
          float D = (float)d, l = LSE[i];
          float *pr = P + r * L, *dsr = dP + r * L;
          for (int64_t j = 0; j < lim; j++) {
            pr[j] = expf(pr[j] - l);
            dsr[j] = pr[j] * (dsr[j] - D);
          }
          for (int64_t j = lim; j < L; j++) pr[j] = dsr[j] = 0.0f;
        }
        ck_gemm(0, 0, nq, hd, L, scale, dP, L, K, ldk, 0.0f, dQ + i0 * ldq, ldq);
        ck_gemm(1, 0, L, hd, nq, scale, dP, L, Q + i0 * ldq, ldq, 1.0f, dK, ldk);
        ck_gemm(1, 0, L, hd, nq, 1.0f, P, L, dO + i0 * ldq, ldq, 1.0f, dV, ldk);
      }
    }
  }
  free(P);
  return CK_OK;
}
