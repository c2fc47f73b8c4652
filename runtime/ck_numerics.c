/* ck_numerics.c -- CPU reference of the reduced-precision formats: bf16 rounding, and OCP
 * FP8 E4M3 with MXFP8 block scaling (E8M0 scales).
 *
 * MXFP8 scale choice. The OCP MX v1.0 reference conversion takes the shared exponent
 * floor(log2(amax)) - 8 and lets the largest elements saturate to 448; we follow the design
 * (and NVIDIA's recipe) instead: exponent s = ceil(log2(amax / 448)), the smallest power of
 * two with amax / 2^s <= 448, so no element saturates. It is computed exactly from frexp:
 * amax = f * 2^ex with f in [0.5, 1), and 448 = 0.875 * 2^9, so s = ex - 9 if f <= 0.875,
 * else ex - 8. No floating log2 is involved.
 *
 * Non-finite input. E4M3 has no infinity. The OCP spec lets a block's scale be NaN (E8M0
 * 0xFF), which makes the whole block NaN; we use it for a block holding a NaN and also for a
 * block holding an inf (an inf cannot be represented, and giving it a finite scale would turn
 * every other element of the block into 0). The elements of such a block are written 0x7F.
 */
#include <math.h>
#include <string.h>

#include "cpu_kernels.h"

uint16_t ck_float_to_bf16(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x0040u); /* quiet NaN */
  u += 0x7FFFu + ((u >> 16) & 1u); /* round to nearest, ties to even; may carry into inf */
  return (uint16_t)(u >> 16);
}

float ck_bf16_to_float(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

void ck_round_bf16(float *x, int64_t n) {
  for (int64_t i = 0; i < n; i++) x[i] = ck_bf16_to_float(ck_float_to_bf16(x[i]));
}

/* Nearest-even E4M3 of a double, saturating at ±448 (infinities too); NaN -> 0x7F | sign. */
static uint8_t e4m3_from_double(double x) {
  uint8_t sign = signbit(x) ? 0x80 : 0x00;
  if (isnan(x)) return sign | 0x7F;
  double a = fabs(x);
  /* 448 = 1.75 * 2^8 is the largest value; (448, 464] rounds down to it (464 is the tie with
   * the missing 480, and 448 has the even mantissa), beyond that satfinite clamps. */
  if (a >= 448.0) return sign | 0x7E;
  if (a == 0.0) return sign;
  int ex;
  frexp(a, &ex); /* a = f * 2^ex, f in [0.5, 1): floor(log2 a) = ex - 1 */
  int e = ex - 1 < -6 ? -6 : ex - 1; /* below 2^-6 the spacing stays 2^-9 (subnormals) */
  double r = nearbyint(ldexp(a, 3 - e)); /* a / 2^(e-3), exact; rounds half to even */
  if (r < 8.0) return sign | (uint8_t)r; /* subnormal (only when e == -6), or zero */
  if (r == 16.0) { /* rounded up into the next binade */
    e++;
    r = 8.0;
  }
  return sign | (uint8_t)((e + 7) << 3) | (uint8_t)(r - 8.0);
}

uint8_t ck_float_to_e4m3(float x) { return e4m3_from_double(x); }

float ck_e4m3_to_float(uint8_t b) {
  int E = (b >> 3) & 15, M = b & 7;
  float v = E == 15 && M == 7 ? NAN
          : E == 0            ? ldexpf((float)M, -9)              /* M * 2^-9 */
                              : ldexpf((float)(8 + M), E - 10);   /* (1 + M/8) 2^(E-7) */
  return b & 0x80 ? -v : v;
}

/* E8M0 code of the scale for a finite block maximum (see the top of the file). */
static uint8_t e8m0_for_amax(float amax) {
  if (amax == 0.0f) return 0;
  int ex;
  float f = frexpf(amax, &ex);
  int s = f <= 0.875f ? ex - 9 : ex - 8;
  if (s < -127) s = -127;
  if (s > 127) s = 127; /* unreachable for fp32 input (amax < 2^128 gives s <= 120) */
  return (uint8_t)(s + 127);
}

uint8_t ck_mxfp8_quantize_group(const float *x, int64_t n, uint8_t *q) {
  float amax = 0.0f;
  int finite = 1;
  for (int64_t i = 0; i < n; i++) {
    float a = fabsf(x[i]);
    if (!isfinite(a)) finite = 0;
    else if (a > amax) amax = a;
  }
  uint8_t code = finite ? e8m0_for_amax(amax) : 0xFF;
  if (finite) {
    int s = (int)code - 127;
    for (int64_t i = 0; i < n; i++) q[i] = e4m3_from_double(ldexp(x[i], -s));
  } else {
    memset(q, 0x7F, (size_t)n);
  }
  return code;
}

int ck_mxfp8_quantize(const float *x, int64_t rows, int64_t cols, int64_t block, int share128,
                      uint8_t *q, uint8_t *scale) {
  if (block < 1 || cols % block != 0) return CK_ESHAPE;
  if (share128 && (128 % block != 0 || cols % 128 != 0)) return CK_ESHAPE;
  const int64_t group = share128 ? 128 : block; /* elements that share one scale */
  const int64_t nb = cols / block;
  for (int64_t r = 0; r < rows; r++)
    for (int64_t g0 = 0; g0 < cols; g0 += group) {
      uint8_t code = ck_mxfp8_quantize_group(x + r * cols + g0, group, q + r * cols + g0);
      memset(scale + r * nb + g0 / block, code, (size_t)(group / block));
    }
  return CK_OK;
}

int ck_mxfp8_dequantize(const uint8_t *q, const uint8_t *scale, int64_t rows, int64_t cols,
                        int64_t block, float *x) {
  if (block < 1 || cols % block != 0) return CK_ESHAPE;
  const int64_t nb = cols / block;
  for (int64_t r = 0; r < rows; r++) {
    for (int64_t b = 0; b < nb; b++) {
      uint8_t code = scale[r * nb + b];
      const uint8_t *qs = q + r * cols + b * block;
      float *xs = x + r * cols + b * block;
      for (int64_t i = 0; i < block; i++)
        xs[i] = code == 0xFF ? NAN : ldexpf(ck_e4m3_to_float(qs[i]), (int)code - 127);
    }
  }
  return CK_OK;
}
